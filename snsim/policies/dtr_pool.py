"""``dtr``'s two data structures: the evicted classes and the candidate pool.

:class:`Classes` keeps the evicted storage nodes as union-find classes of
connected ones (through reads, both ways), with their summed forward time and
a front (the nodes next to the class): evicting a node makes a class of it and
joins its evicted neighbours' classes.  A candidate's cost (its directed
regions, :meth:`snsim.policies.dtr.Planner.cost`) lies inside the classes
next to it, so when a member comes back only the candidates on its class's
front may cost less: their cached bounds are reset (``lowered``).  A class
that loses a member is rebuilt into its connected pieces while it has at most
:data:`SPLIT_MAX` members (a member with at most one evicted neighbour cannot
disconnect it: it only leaves the class, no rebuild, the usual case along a
recomputed chain); a larger class is left joined through its returned
members (rebuilding it costs its size on every recompute, quadratic on a deep
evicted chain), which only makes its front larger than needed.

:class:`Pool` holds the resident evictable tensors in numpy arrays (last
access, own forward time, cached cost, size, pinned, evictable order), so
that a lower bound of every candidate's score (its cached cost: regions only
grow until a reset) is one vectorized pass; the planner then scores exactly
only the candidates whose bound is below the best exact score found (branch
and bound), which gives the full scan's choice at a fraction of its work.
"""

from __future__ import annotations

import math

import numpy as np

# A class with more members is not rebuilt when one comes back (only its front is reset).
SPLIT_MAX = 256


class Classes:
    """Union-find over the evicted storage nodes (``evicted``; the planner's nodes,
    named layers here: on most traces a node is a layer)."""

    def __init__(self, near, fwd, lowered=None, scored=None):
        self.near, self.fwd = near, fwd
        # lowered(layers): the neighbourhood cost of these layers' tensors may have
        # dropped; scored(j): layer j has a resident candidate (an evicted layer's
        # saved extras may stay resident, scored next to its class)
        self.lowered = lowered or (lambda nodes: None)
        self.scored = scored or (lambda j: False)
        self.front: dict[int, list[int]] = {}   # root -> layers next to it
        self.evicted: set[int] = set()
        self.node: dict[int, int] = {}   # evicted layer -> its node
        self.layer: list[int] = []       # node -> layer
        self.parent: list[int] = []      # node -> parent node
        self.members: dict[int, list[int]] = {}   # root -> nodes (present or returned)
        self.live: dict[int, int] = {}   # root -> members still evicted
        self.ms: dict[int, float] = {}   # root -> their forward ms
        self.dirty: set[int] = set()     # roots to rebuild into components

    def _new(self, j: int) -> int:
        nd = len(self.parent)
        self.parent.append(nd)
        self.layer.append(j)
        self.node[j] = nd
        self.members[nd] = [nd]
        self.live[nd] = 1
        self.ms[nd] = self.fwd[j]
        self.front[nd] = []
        return nd

    def find(self, nd: int) -> int:
        parent = self.parent
        root = nd
        while parent[root] != root:
            root = parent[root]
        while parent[nd] != root:   # path compression
            parent[nd], nd = root, parent[nd]
        return root

    def root(self, j: int) -> int:
        return self.find(self.node[j])

    def size(self, root: int) -> int:
        return self.live[root]

    def _join(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        if len(self.members[ra]) < len(self.members[rb]):
            ra, rb = rb, ra
        self.parent[rb] = ra
        self.members[ra].extend(self.members.pop(rb))
        self.live[ra] += self.live.pop(rb)
        self.ms[ra] += self.ms.pop(rb)
        fa, fb = self.front[ra], self.front.pop(rb)
        if len(fa) < len(fb):
            fa, fb = fb, fa
        fa.extend(fb)
        self.front[ra] = fa
        if rb in self.dirty:
            self.dirty.discard(rb)
            self.dirty.add(ra)

    def add(self, j: int) -> None:
        """X_j is evicted: a class of its own, joined with its evicted neighbours'."""
        if j in self.evicted:
            return
        if self.dirty:
            self.rebuild()
        self.evicted.add(j)
        nd = self._new(j)
        node = self.node
        front = [j] if self.scored(j) else []
        for k in self.near[j]:
            if k in node:
                self._join(nd, node[k])
            else:
                front.append(k)
        self.front[self.find(nd)].extend(front)

    def remove(self, j: int) -> None:
        """X_j is back (or no longer needed): its time leaves its class; a small
        class is rebuilt into its components (lazily, before the next use)."""
        if j not in self.evicted:
            return
        if self.dirty:   # rebuilt before the next change, not when scored: a class's
            self.rebuild()   # membership then never depends on which candidates were scored
        ev = self.evicted
        ev.discard(j)
        nd = self.node.pop(j)
        r = self.find(nd)
        self.live[r] -= 1
        self.ms[r] -= self.fwd[j]
        if self.live[r] == 0:
            self.ms[r] = 0.0
        members = self.members[r]
        if len(members) <= SPLIT_MAX and self.live[r] and \
                len({k for k in self.near[j] if k in ev}) <= 1:
            # an end of its (exact, connected) class: the rest stays connected, so
            # the class only loses X_j, as a rebuild would find (without its cost)
            members.remove(nd)
            scored = self.scored
            front = list(dict.fromkeys(k for k in self.front[r] if k not in ev or scored(k)))
            self.lowered(front)
            front.append(j)
            self.front[r] = front
        elif len(members) <= SPLIT_MAX or self.live[r] == 0:
            # split: a neighbour may lose more than X_j's time
            scored = self.scored
            front = list(dict.fromkeys(k for k in self.front[r] if k not in ev or scored(k)))
            self.dirty.add(r)
            self.lowered(front)
            front.append(j)
            self.front[r] = front
        else:
            # a large class stays joined through X_j (no rebuild), but a neighbour's
            # region may have reached much of it through X_j: every neighbour's
            # cached cost is reset, as in a split
            scored = self.scored
            front = list(dict.fromkeys(k for k in self.front[r] if k not in ev or scored(k)))
            self.lowered(front)
            front.append(j)
            self.front[r] = front

    def rebuild(self) -> None:
        node, layer, near = self.node, self.layer, self.near
        for r in self.dirty:
            old = self.members.pop(r)
            del self.live[r], self.ms[r], self.front[r]
            present = [layer[x] for x in old if node.get(layer[x]) == x]
            for m in present:
                del node[m]
            for m in present:
                if m in node:
                    continue
                stack = [m]
                nd = self._new(m)
                front = []
                while stack:
                    k = stack.pop()
                    if self.scored(k):
                        front.append(k)
                    for q in near[k]:
                        if q not in self.evicted:
                            front.append(q)
                        elif q not in node:
                            self._join(nd, self._new(q))
                            stack.append(q)
                self.front[self.find(nd)] = list(dict.fromkeys(front))
        self.dirty.clear()


class Pool:
    """The resident evictable tensors, one slot each, with numpy columns:
    ``A`` last access (ms), ``F`` own forward ms, ``K`` a lower bound of the
    neighbourhood cost (the last exact one, reset to ``F`` when an evicted
    node near it comes back), ``S`` bytes, ``P`` 0 or inf (pinned), ``E`` when
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

    def reset(self, i: int) -> None:
        self.K[i] = self.F[i]

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
