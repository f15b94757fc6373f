"""``dtr``'s candidate pool and its storage nodes.

:class:`Pool` holds the resident evictable tensors in numpy arrays (last
access, own forward time, cached cost, size, pinned, evictable order per
slot), so that a lower bound of every candidate's score (its cached cost:
a candidate's regions only grow until an evicted node in them comes back,
when the planner lowers the bound) is one vectorized pass; the planner then
scores exactly only the candidates whose bound is below the best exact score
found (branch and bound), which gives the full scan's choice at a fraction of
its work.  :class:`StorageNodes` are the nodes the regions are made of.
"""

from __future__ import annotations

import math

import numpy as np

from snsim.graph import Graph, Tensor


class Pool:
    """The resident evictable tensors, one slot each, with numpy columns:
    ``A`` last access (ms), ``K`` a lower bound of the neighbourhood cost (the
    last exact one, lowered by the planner when an evicted node in its regions
    comes back), ``N`` another: its own time plus its evicted neighbours' (the
    planner keeps it up to date on every eviction and return), ``S`` bytes, ``P`` 0 or inf (pinned), ``E`` when
    it last became evictable (made, or its last pin released): simrd's pool
    order, which breaks ties (the latest wins, as its scan's ``<=`` does)."""

    def __init__(self, capacity: int):
        self.t: list = []
        self.slot: dict = {}
        n = max(1, capacity)
        self.A = np.zeros(n)
        self.K = np.zeros(n)
        self.N = np.zeros(n)
        self.S = np.zeros(n)
        self.P = np.zeros(n)
        self.E = np.zeros(n)
        self.seq = 0.0
        # the last :meth:`bounds` of the whole pool while the planner keeps it (one
        # ``make_room``: the clock stands still and bounds only rise); a dropped
        # slot's entry moves as the slot does
        self.lb: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.t)

    def add(self, t, last: float, fwd: float, size: int, pinned: bool) -> None:
        k = len(self.t)
        self.slot[t] = k
        self.t.append(t)
        self.A[k], self.K[k], self.N[k], self.S[k] = last, fwd, fwd, size
        self.P[k] = math.inf if pinned else 0.0
        self.lb = None
        self.seq += 1
        self.E[k] = self.seq

    def unpinned(self, i: int) -> None:
        """Slot i's last pin is released: evictable again, latest in the order."""
        self.P[i] = 0.0
        self.lb = None
        self.seq += 1
        self.E[i] = self.seq

    def drop(self, t) -> None:
        k = self.slot.pop(t)
        last = self.t.pop()
        n = len(self.t)
        lb = self.lb
        if lb is not None:
            if k < n:
                lb[k] = lb[n]
            self.lb = lb[:n]
        if last is not t and last != t:
            self.t[k] = last
            self.slot[last] = k
            self.A[k], self.K[k], self.N[k], self.S[k], self.P[k], self.E[k] = (
                self.A[n], self.K[n], self.N[n], self.S[n], self.P[n], self.E[n])

    def bounds(self, score, clock: float, at: np.ndarray | None = None) -> np.ndarray:
        """Per slot (or per slot of ``at``), ``score`` with the larger of the cached
        cost and the neighbours' bound (``N``) as the cost: a lower bound of the true score for a
        score non-decreasing in the cost; inf where the staleness is not positive
        or the tensor is pinned."""
        if at is None:
            n = len(self.t)
            A, K, N, S, P = self.A[:n], self.K[:n], self.N[:n], self.S[:n], self.P[:n]
        else:
            A, K, N, S, P = self.A[at], self.K[at], self.N[at], self.S[at], self.P[at]
        stale = clock - A
        with np.errstate(divide="ignore", invalid="ignore"):
            lb = score(np.maximum(K, N), S, stale)
        lb = np.asarray(lb, dtype=float) + P   # a new array: the score may return a column
        lb[stale <= 0] = math.inf
        return lb


class StorageNodes:
    """simrd's storages as nodes over a graph's tensors, for ``dtr``'s regions.

    A node per layer (its output X_j, and its saved extras' place) and one per
    other result of an op with several (``output_sizes``); a view
    (``alias_of``, ``storage`` maps it to the tensors it shares) is its
    storage's node (simrd: a storage's tensors are the views too, and its
    compute their ops' time summed).  A node's neighbours: the tensors its ops
    read (``up``), and every result of each op that reads one of its tensors
    (``down``: an op's results are neighbours through its readers, not through
    each other).  ``cands`` per node: the tensors eviction may take there (with
    bytes; never the data layer's)."""

    def __init__(self, graph: Graph, storage: dict[Tensor, tuple[Tensor, ...]]) -> None:
        size = graph.size
        fwd = [layer.fwd_ms for layer in graph.layers]
        n = graph.n
        self.node_of: dict[Tensor, int] = {("X", j): j for j in range(n)}
        self.layer_of = list(range(n))
        for t in sorted(graph.result_bytes, key=lambda t: (t[1], t[0])):
            self.node_of[t] = len(self.layer_of)
            self.layer_of.append(t[1])
        node_of = self.node_of
        for v in range(n):   # views, after their storage (log order)
            base = storage.get(("X", v))
            if base and graph.size(("X", v)) == 0 and base[-1] in node_of:
                node_of[("X", v)] = node_of[base[-1]]
        self.views_of: set[int] = {v for v in range(n) if node_of[("X", v)] != v}
        nodes = len(self.layer_of)
        self.nfwd = [fwd[j] for j in self.layer_of]
        for v in self.views_of:
            self.nfwd[node_of[("X", v)]] += fwd[v]
        results: list[list[int]] = [[node_of[("X", j)]] for j in range(n)]
        for t, nd in node_of.items():
            if nd >= n:
                results[t[1]].append(nd)
        readers: list[list[int]] = [[] for _ in range(nodes)]
        made: list[list[int]] = [[] for _ in range(nodes)]   # layers making its tensors
        for j in range(n):
            for nd in results[j]:
                made[nd].append(j)
        self.inputs: list[tuple[int, ...]] = []   # per layer, the nodes its op reads
        for j in range(n):
            ins = tuple(dict.fromkeys(node_of[t] for t in graph.needs(("F", j))
                                      if t in node_of))
            self.inputs.append(ins)
            for nd in ins:
                readers[nd].append(j)
        # per node: the nodes its ops read (up) and the results of its readers (down)
        self.up = [tuple(k for k in dict.fromkeys(
            i for j in dict.fromkeys(made[nd]) for i in self.inputs[j]) if k != nd)
            for nd in range(nodes)]
        self.down = [tuple(k for k in dict.fromkeys(
            r for c in dict.fromkeys(readers[nd]) for r in results[c]) if k != nd)
            for nd in range(nodes)]
        self.near = [u + tuple(k for k in d if k not in u) for u, d in zip(self.up, self.down)]
        # per node, the tensors eviction may take (with bytes; never the data layer's):
        # a layer's node holds X_j and its saved extras, another result's node it
        self.cands: list[tuple[Tensor, ...]] = [() for _ in range(nodes)]
        for j in range(1, n):
            for t in graph.allocs(("F", j)):
                if size(t) > 0:
                    nd = node_of.get(t, j)
                    self.cands[nd] = self.cands[nd] + (t,)
