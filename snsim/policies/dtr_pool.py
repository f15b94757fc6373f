"""``dtr``'s two data structures: the evicted neighbourhoods and the candidate pool.

:class:`Classes` keeps DTR's evicted neighbourhoods as union-find classes
over the evicted layers, each with the summed forward time of its members
(simrd's ``eq_class`` optimisation, ``DTREqClass``): evicting a layer makes
a class of it and joins its evicted neighbours' classes, so a candidate's
neighbourhood cost is a few ``find`` calls (O(alpha) amortized).  simrd never
splits a class: a member that comes back (recomputed) only takes its time
off the class, so the class may stay joined through it.  Here a class that
loses a member is rebuilt into its connected pieces (exactly the
components) while it has at most :data:`SPLIT_MAX` members (a member with
at most one evicted neighbour cannot disconnect it: it only leaves the class,
no rebuild, the usual case along a recomputed chain); a larger class
is left joined through its returned members, as simrd's approximation
does, since rebuilding it costs its size on every recompute (quadratic on a
deep evicted chain).  Its summed time is always exact for its present
members; only its connectivity is approximate, and only beyond
:data:`SPLIT_MAX` members (``tests/test_dtr.py`` checks the exact choice on
small graphs, where every class is split).

:class:`Pool` holds the resident evictable tensors in numpy arrays (last
access, own forward time, size, pinned), so that a lower bound of every
candidate's score (its own forward time as the cost: the neighbourhood only
adds) is one vectorized pass; the planner then scores exactly only the
candidates whose bound is below the best exact score found (branch and
bound), which gives the full scan's choice at a fraction of its work.
"""

from __future__ import annotations

import math

import numpy as np

# A class with more members is not rebuilt when one comes back (simrd's approximation).
SPLIT_MAX = 256


class Classes:
    """Union-find over the evicted layers; ``evicted`` is the set of them."""

    def __init__(self, near, fwd, lowered=None, scored=None):
        self.near, self.fwd = near, fwd
        # lowered(layers, by): the neighbourhood cost of these layers' tensors
        # dropped by ``by`` ms (None: by an unknown amount); scored(j): layer j has a resident candidate (an evicted layer's
        # saved extras or other results may stay resident, scored next to its class)
        self.lowered = lowered or (lambda layers, by: None)
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
            self.lowered(front, None)
            front.append(j)
            self.front[r] = front
        elif len(members) <= SPLIT_MAX or self.live[r] == 0:
            # split: a neighbour may lose more than X_j's time
            scored = self.scored
            front = list(dict.fromkeys(k for k in self.front[r] if k not in ev or scored(k)))
            self.dirty.add(r)
            self.lowered(front, None)
            front.append(j)
            self.front[r] = front
        else:
            # every neighbour loses X_j's time: one global drop (Pool.drop_all);
            # X_j's own neighbours may lose the whole class (reached through X_j)
            self.lowered((), self.fwd[j])
            self.lowered(self.near[j] + (j,), None)
            self.front[r].append(j)

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

    def cost(self, j: int, nb) -> tuple[float, int]:
        """Forward ms of the distinct classes next to layer j through ``nb``, and
        their members."""
        ev = self.evicted
        if ev.isdisjoint(nb):
            return 0.0, 0
        if self.dirty:
            self.rebuild()
        node, find = self.node, self.find
        roots = {find(node[k]) for k in nb if k in ev}
        return sum(self.ms[r] for r in roots), sum(self.live[r] for r in roots)


class Pool:
    """The resident evictable tensors, one slot each, with numpy columns:
    ``A`` last access (ms), ``F`` own forward ms, ``K`` a lower bound of the
    neighbourhood cost (the last exact one, lowered to ``F`` when a class next
    to it loses time), ``S`` bytes, ``P`` 0 or inf (pinned)."""

    def __init__(self, capacity: int):
        self.t: list = []
        self.slot: dict = {}
        n = max(1, capacity)
        self.A = np.zeros(n)
        self.F = np.zeros(n)
        self.K = np.zeros(n)
        self.D = np.zeros(n)    # ``dropped`` when K was cached
        self.dropped = 0.0      # ms taken off large classes so far
        self.S = np.zeros(n)
        self.P = np.zeros(n)

    def __len__(self) -> int:
        return len(self.t)

    def add(self, t, last: float, fwd: float, size: int, pinned: bool) -> None:
        k = len(self.t)
        self.slot[t] = k
        self.t.append(t)
        self.A[k], self.F[k], self.K[k], self.S[k] = last, fwd, fwd, size
        self.D[k] = self.dropped
        self.P[k] = math.inf if pinned else 0.0

    def drop(self, t) -> None:
        k = self.slot.pop(t)
        last = self.t.pop()
        if last is not t and last != t:
            n = len(self.t)
            self.t[k] = last
            self.slot[last] = k
            self.A[k], self.F[k], self.K[k], self.S[k], self.P[k], self.D[k] = (
                self.A[n], self.F[n], self.K[n], self.S[n], self.P[n], self.D[n])

    def drop_all(self, ms: float) -> None:
        """Every cached cost may have dropped by ``ms`` (a large class lost a member)."""
        self.dropped += ms

    def cached(self, i: int, cost: float) -> None:
        self.K[i] = cost
        self.D[i] = self.dropped

    def reset(self, i: int) -> None:
        self.K[i] = self.F[i]
        self.D[i] = self.dropped

    def bounds(self, score, clock: float, at: np.ndarray | None = None) -> np.ndarray:
        """Per slot (or per slot of ``at``), ``score`` with the cached cost (at least
        the own forward time) as the cost: a lower bound of the true score for a
        score non-decreasing in the cost; inf where the staleness is not positive
        or the tensor is pinned."""
        n = len(self.t)
        ix = slice(0, n) if at is None else at
        stale = clock - self.A[ix]
        with np.errstate(divide="ignore", invalid="ignore"):
            cost = self.K[ix] - (self.dropped - self.D[ix])
            lb = score(np.maximum(cost, self.F[ix]), self.S[ix], stale)
        lb = np.asarray(lb, dtype=float) + self.P[ix]
        lb[stale <= 0] = math.inf
        return lb
