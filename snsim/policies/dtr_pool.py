"""``dtr``'s candidate pool: the resident evictable tensors in numpy arrays.

Last access, own forward time, cached cost, size, pinned and evictable order
per slot, so that a lower bound of every candidate's score (its cached cost:
a candidate's regions only grow until an evicted node in them comes back,
when the planner lowers the bound) is one vectorized pass; the planner then
scores exactly only the candidates whose bound is below the best exact score
found (branch and bound), which gives the full scan's choice at a fraction of
its work.
"""

from __future__ import annotations

import math

import numpy as np


class Pool:
    """The resident evictable tensors, one slot each, with numpy columns:
    ``A`` last access (ms), ``F`` own forward ms, ``K`` a lower bound of the
    neighbourhood cost (the last exact one, lowered by the planner when an
    evicted node in its regions comes back), ``S`` bytes, ``P`` 0 or inf (pinned), ``E`` when
    it last became evictable (made, or its last pin released): simrd's pool
    order, which breaks ties (the latest wins, as its scan's ``<=`` does)."""

    def __init__(self, capacity: int):
        self.t: list = []
        self.slot: dict = {}
        n = max(1, capacity)
        self.A = np.zeros(n)
        self.F = np.zeros(n)
        self.K = np.zeros(n)
        self.S = np.zeros(n)
        self.P = np.zeros(n)
        self.E = np.zeros(n)
        self.seq = 0.0

    def __len__(self) -> int:
        return len(self.t)

    def add(self, t, last: float, fwd: float, size: int, pinned: bool) -> None:
        k = len(self.t)
        self.slot[t] = k
        self.t.append(t)
        self.A[k], self.F[k], self.K[k], self.S[k] = last, fwd, fwd, size
        self.P[k] = math.inf if pinned else 0.0
        self.seq += 1
        self.E[k] = self.seq

    def unpinned(self, i: int) -> None:
        """Slot i's last pin is released: evictable again, latest in the order."""
        self.P[i] = 0.0
        self.seq += 1
        self.E[i] = self.seq

    def drop(self, t) -> None:
        k = self.slot.pop(t)
        last = self.t.pop()
        if last is not t and last != t:
            n = len(self.t)
            self.t[k] = last
            self.slot[last] = k
            self.A[k], self.F[k], self.K[k], self.S[k], self.P[k], self.E[k] = (
                self.A[n], self.F[n], self.K[n], self.S[n], self.P[n], self.E[n])

    def cached(self, i: int, cost: float) -> None:
        self.K[i] = cost

    def bounds(self, score, clock: float, at: np.ndarray | None = None) -> np.ndarray:
        """Per slot (or per slot of ``at``), ``score`` with the cached cost (at least
        the own forward time) as the cost: a lower bound of the true score for a
        score non-decreasing in the cost; inf where the staleness is not positive
        or the tensor is pinned."""
        n = len(self.t)
        ix = slice(0, n) if at is None else at
        stale = clock - self.A[ix]
        with np.errstate(divide="ignore", invalid="ignore"):
            lb = score(np.maximum(self.K[ix], self.F[ix]), self.S[ix], stale)
        lb = np.asarray(lb, dtype=float) + self.P[ix]
        lb[stale <= 0] = math.inf
        return lb
