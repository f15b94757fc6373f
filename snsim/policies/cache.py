"""The unified tensor pool's LRU cache, planned ahead under a budget.

A helper of the swapping policies, not a policy (the registry skips it).
It builds on :mod:`snsim.policies.replay` and :mod:`snsim.policies.sequences`.

Note 1 (what a step allocates anew).  Liveness frees each instance of a
tensor after its last use before the step that makes it again
(:func:`~snsim.policies.sequences.use_positions`), so when a step runs, of what
it allocates exactly those it also needs are resident (made resident by its
own needs): the rest are new, known before the walk with their bytes, without
asking the cache's state per tensor.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections import OrderedDict
from itertools import compress, repeat
from operator import add
from weakref import WeakKeyDictionary

from snsim.graph import Graph, Step, Tensor
from snsim.policies.replay import shortfall
from snsim.policies.sequences import op_tables, use_positions
from snsim.schedule.ops import Compute, Op

_RES, _HOST, _IN = 1, 2, 3
# graph -> {dyn_ws: per phase (F, R, B), per layer, the workspace a step reserves}
_WS_TABLES: WeakKeyDictionary = WeakKeyDictionary()


def _ws_table(graph: Graph, dyn_ws: bool) -> dict[str, list[int]]:
    """Per phase (``F``, ``R``, ``B``), per layer: the workspace the cache reserves
    for that step, its smallest (``dyn_ws``) or its first algorithm's; once per
    graph (each candidate plan of ``superneurons`` reads it)."""
    per = _WS_TABLES.get(graph)
    if per is None:
        per = _WS_TABLES[graph] = {}
    got = per.get(dyn_ws)
    if got is None:
        ws = graph.min_workspace_bytes if dyn_ws else graph.workspace_bytes
        fwd = [ws(("F", i)) if layer.workspace else 0 for i, layer in enumerate(graph.layers)]
        bwd = [ws(("B", i)) if layer.workspace else 0 for i, layer in enumerate(graph.layers)]
        got = per[dyn_ws] = {"F": fwd, "R": fwd, "B": bwd}
    return got


_OVERLAP: WeakKeyDictionary = WeakKeyDictionary()   # graph -> _overlap


def _overlap(graph: Graph) -> frozenset:
    """The steps that allocate a tensor they also need (note 1), once per graph:
    per phase, each layer's needs and allocs compared in C."""
    got = _OVERLAP.get(graph)
    if got is None:
        out = []
        for phase, (needs, allocs) in graph.step_tables.items():
            if phase == "R":
                continue   # its steps are F's: added with them
            has = [i for i, a in enumerate(allocs) if a is not None]
            apart = map(set.isdisjoint, map(set, map(needs.__getitem__, has)),
                        map(allocs.__getitem__, has))
            for i, disjoint in zip(has, apart):
                if not disjoint:
                    out.extend([("F", i), ("R", i)] if phase == "F" else [(phase, i)])
        got = _OVERLAP[graph] = frozenset(out)
    return got


class CachePlanner:
    """Plan a step sequence with an LRU tensor cache under a memory budget.

    Walks ``seq`` (route steps and recomputations) and emits ops: liveness
    frees, and for every tensor an eviction when an allocation would exceed
    ``capacity`` (least recently used first), a prefetch of evicted tensors
    needed up to the ``ahead``-th next ``boundary`` position (issued at each
    boundary, so copies overlap compute;
    only into memory that the steps before their use leave free, evicting
    nothing needed sooner), and a synchronous fetch of anything still missing
    when a step needs it.

    Modes: ``sync=False`` (paper) copies a tensor out asynchronously right
    after the step that makes it, so an eviction only frees it; only tensors
    the plan evicts get that copy, as the whole route is known when planning
    (``offload_all=True`` copies every tensor it could evict, like the paper's
    runtime; with ``prefer``, every preferred tensor plus whatever else is
    evicted).  ``sync=True`` (release) copies out at eviction time and waits
    for it, and brings tensors back on demand only (no prefetch).
    ``prefer`` (a set of tensors) makes eviction take the least recently used
    preferred tensors first, and others only when those are not enough.
    ``dyn_ws`` picks, for each step with workspace choices, the fastest
    algorithm whose workspace fits the memory then free, else the smallest.
    """

    def __init__(self, graph: Graph, seq: list[Step], capacity: int, boundary=None,
                 sync: bool = False, dyn_ws: bool = False,
                 offload_all: bool = False, ahead: int = 1, prefer=None):
        self.g, self.seq, self.cap = graph, seq, capacity
        self.ahead = ahead
        self.prefer = prefer
        self.boundary = boundary if boundary is not None and not sync else None
        self.sync, self.dyn_ws, self.offload_all = sync, dyn_ws, offload_all
        self.uses, self.frees = use_positions(graph, seq)
        self.tables = op_tables(graph)
        self.sz = graph.sizes
        self.level = graph.trace.static_bytes
        self.state: dict[Tensor, int] = {}
        # Evictable resident tensors, least recently used first: preferred
        # victims, then the others.
        self.lru_p: OrderedDict = OrderedDict()
        self.lru_o: OrderedDict = OrderedDict()
        self.home: dict = {}   # evictable tensor -> the LRU list it belongs to
        self.ops: list[Op] = []
        self.made_at: dict = {}   # tensor -> op index right after the step that made it
        self.copies: set = set()  # (that index, tensor) of the instances evicted
        self.offloaded: list = []  # the tensor of each Offload op (once run)
        self.reason: str | None = None
        self.n_evict = self.hits = self.misses = self.prefetched = 0
        self.bytes_in = 0
        self.n_landed = 0
        self.pos = 0
        self.host_heap: list = []   # (next use, tensor) of evicted tensors
        # the boundary positions, in order (the prefetch window of position p ends
        # at the ahead-th one after p, or at the last position)
        self.end = len(seq) - 1
        self.bpos = list(compress(range(len(seq)), self.boundary)) \
            if self.boundary is not None else []
        # Per position: what the step allocates plus its smallest workspace
        # (prefetches ahead leave room for the steps before their use), read from
        # per-layer tables (the graph's alloc_bytes_table, _ws_table)
        ws_tab, all_bytes = _ws_table(graph, dyn_ws), graph.alloc_bytes_table
        self.ws_need = [ws_tab[ph][i] for ph, i in seq]
        self.alloc_bytes = [all_bytes[ph][i] for ph, i in seq]
        self.step_need = list(map(add, self.alloc_bytes, self.ws_need))
        # parameter gradients a backward step makes (set-to-none): resident from
        # that step on, never evictable
        if graph.grads_born:
            self.born = [graph.param_grad_bytes(st) for st in seq]
            self.step_need = list(map(add, self.step_need, self.born))
        else:
            self.born = None

    # ---- memory
    def _make_room(self, need: int, pinned, p: int, until: int | None = None) -> bool:
        """Evict LRU tensors until ``need`` more bytes fit.  With ``until``,
        only tensors not needed before that position (for prefetches)."""
        if self.level + need <= self.cap:
            return True
        size = self.sz.__getitem__
        uses = self.uses
        victims = []
        free = self.cap - self.level
        for lru in (self.lru_p, self.lru_o):
            for t in lru:
                if t in pinned:
                    continue
                if until is not None:   # its next use (bisect: after position p)
                    u = uses[t]
                    k = bisect_right(u, p)
                    if k < len(u) and u[k] <= until:
                        continue
                victims.append(t)
                free += size(t)
                if free >= need:
                    break
            if free >= need:
                break
        if free < need:
            if until is not None:
                return False
            # A step must run: evict what we can, then land and evict prefetches
            # that are still copying (a stall, but the step fits), else overshoot.
            self._evict(victims)
            for t in [t for t, s in self.state.items() if s == _IN and t not in pinned]:
                if self.level + need <= self.cap:
                    return True
                self.ops.append(self.tables.wait[t])
                self.state[t] = _RES
                self.home[t][t] = None
                self._evict((t,))
                self.n_landed += 1
            return self.level + need <= self.cap
        self._evict(victims)
        return True

    def _evict(self, ts) -> None:
        """Evict the tensors ``ts``, in order."""
        home, state, made_at, copies, ops = self.home, self.state, self.made_at, self.copies, \
            self.ops
        uses, pos, heap, sz, free = self.uses, self.pos, self.host_heap, self.sz, self.tables.free
        sync = self.sync
        level = self.level
        for t in ts:
            del home[t][t]
            state[t] = _HOST
            copy = (made_at[t], t)   # this instance of t
            if sync and copy not in copies:
                ops.append(self.tables.offload[t])
                ops.append(self.tables.wait[t])
            copies.add(copy)
            u = uses[t]   # its next use (bisect: after this position)
            k = bisect_right(u, pos)
            heapq.heappush(heap, (u[k] if k < len(u) else 1 << 60, t))
            ops.append(free[t])
            level -= sz[t]
        self.level = level
        self.n_evict += len(ts)

    def _fetch(self, t: Tensor) -> None:
        self.ops.append(self.tables.prefetch[t])
        self.state[t] = _IN
        self.level += self.sz[t]
        self.bytes_in += self.sz[t]

    # ---- walk
    def run(self) -> list[Op]:
        g, sz, state, home, ops = self.g, self.sz, self.state, self.home, self.ops
        prefer, lru_p, lru_o = self.prefer, self.lru_p, self.lru_o
        seq = self.seq
        # per position, looked up in C before the walk: what the step needs and
        # allocates anew (note 1), its Compute op (the first algorithm), whether it
        # has several workspace algorithms to choose from
        needs_seq = list(map(g.needs_map.__getitem__, seq))
        fresh_seq, fresh_bytes = self._fresh(needs_seq)
        tables = op_tables(g)
        computes = tables.computes(seq)
        tables.add_all_frees(g)   # every tensor the walk may free
        wait, free = tables.wait, tables.free
        layers = g.layers
        multi = [len(layer.workspace) > 1 for layer in layers] if self.dyn_ws else ()
        choose = [multi[i] for _, i in seq] if any(multi) else [False] * len(seq)
        ws_need, frees = self.ws_need, self.frees
        window = self._windows()
        host_heap = self.host_heap
        made_at = self.made_at
        written = self.g.written
        made: list = []      # (op index right after the step, tensor) for offload_all
        keep_made = self.offload_all
        cap = self.cap
        append = ops.append
        # every tensor's LRU list, set before the walk (in C: the others', then the
        # preferred ones'); a tensor is in its list exactly while it is resident
        # (its state _RES)
        self.home = home = dict.fromkeys(self.uses, lru_p if prefer is None else lru_o)
        if prefer is not None:
            home.update(zip(prefer, repeat(lru_p)))
        RES, HOST = _RES, _HOST
        level = self.level   # kept here; self.level around the calls that read or move it
        for p, (step, needs, new, nb, comp, algos, wsn, last, fp) in enumerate(zip(
                seq, needs_seq, fresh_seq, fresh_bytes, computes, choose, ws_need,
                window, frees)):
            # 1. what this step needs: resident (hit), inbound (prefetched) or on host
            for t in needs:
                d = home[t]
                if t in d:   # resident: a hit (counted below)
                    d.move_to_end(t)
                    continue
                if state[t] == HOST:
                    self.misses += 1
                    self.level, self.pos = level, p
                    if not self._make_room(sz[t], needs + new, p):
                        self._fail(step, sz[t])
                    self._fetch(t)
                    level = self.level
                else:
                    self.prefetched += 1
                append(wait[t])
                state[t] = RES
                d[t] = None
            # 2. room for what it allocates, with its smallest workspace
            need = nb + wsn
            if level + need > cap:
                self.level, self.pos = level, p
                if not self._make_room(need, needs + new, p):
                    self._fail(step, need)
                level = self.level
            # 3. prefetch ahead (at a boundary: ``last`` ends its window), leaving
            # room for this step; nothing to do unless an evicted tensor is needed
            # within the window
            if host_heap and host_heap[0][0] <= last:
                self.level, self.pos = level, p
                self._prefetch_window(p, last, need, needs + new)
                level = self.level
            # 4. the step, with its workspace algorithm
            # (one workspace entry: its algorithm 0, whatever is free)
            if algos:
                self.level = level
                algo = self._algo(step, nb)
                append(comp if algo == 0 else Compute(step[0], step[1], algo))
            else:
                append(comp)
            k = len(ops)
            level += nb
            for t in new:
                state[t] = RES
                home[t][t] = None
                made_at[t] = k
            for t in written.get(step, ()):   # a new instance: its old copy is stale
                made_at[t] = k
            if keep_made:
                made.extend(zip(repeat(k), new))
            # 5. liveness
            for t in fp:
                if state.pop(t, None) == RES:
                    append(free[t])
                    level -= sz[t]
                    del home[t][t]
        self.level = level
        # every need is a hit, a miss or a prefetch hit
        self.hits = sum(map(len, needs_seq)) - self.misses - self.prefetched
        if not self.sync:   # paper mode: copy out right after the step that made it
            offload = tables.offload
            at: dict[int, list] = {}
            copies = set(self.copies)
            if self.offload_all:   # every preferred tensor (checkpoint outputs)
                copies.update((k, t) for k, t in made if prefer is None or t in prefer)
            for k, t in copies:
                at.setdefault(k, []).append(t)
            out: list[Op] = []
            prev = 0
            for k in sorted(at):   # each offload group before op k (or at the end)
                group = at[k]
                if len(group) > 1:
                    group.sort()   # in (k, t) order, as the copies sorted
                out.extend(ops[prev:k])
                out.extend(map(offload.__getitem__, group))
                prev = k
            out.extend(ops[prev:])
            self.ops = out
            self.offloaded = [t for _, t in copies]
        else:
            self.offloaded = [t for _, t in self.copies]
        return self.ops

    def _algo(self, step: Step, nb: int) -> int:
        free = self.cap - self.level - nb
        best, best_ms, small, small_b = None, math.inf, 0, math.inf
        for k, (b, ms) in enumerate(self.g.algorithms[step[0]][step[1]]):
            if b <= free and ms < best_ms:
                best, best_ms = k, ms
            if b < small_b:
                small, small_b = k, b
        return small if best is None else best

    def _windows(self) -> list[int]:
        """Per position, the last position of its prefetch window: at a boundary,
        the ``ahead``-th boundary after it (or the last position); elsewhere -1
        (no window)."""
        out = [-1] * len(self.seq)
        bpos, ahead = self.bpos, self.ahead
        if ahead <= 0:
            for p in bpos:
                out[p] = p
            return out
        ends = bpos[ahead:] + [self.end] * min(ahead, len(bpos))
        for p, last in zip(bpos, ends):
            out[p] = last
        return out

    def _fresh(self, needs_seq: list) -> tuple[list, list[int]]:
        """Per position, what the step allocates anew (note 1), and its bytes plus
        the parameter gradients it makes."""
        g, seq = self.g, self.seq
        allocs_seq = list(map(g.allocs_map.__getitem__, seq))
        nbs = self.alloc_bytes if self.born is None else list(map(add, self.alloc_bytes,
                                                                   self.born))
        overlap = _overlap(g)
        if overlap:   # no shipped trace has such a step
            nbs, size = list(nbs), self.sz.__getitem__
            for p, (step, needs, allocs) in enumerate(zip(seq, needs_seq, allocs_seq)):
                if step in overlap:
                    new = tuple(t for t in allocs if t not in needs)
                    allocs_seq[p] = new
                    nbs[p] -= sum(map(size, allocs)) - sum(map(size, new))
        return allocs_seq, nbs

    def _prefetch_window(self, p: int, last: int, reserve: int, pinned) -> None:
        heap, state, uses = self.host_heap, self.state, self.uses
        want, seen = [], set()
        while heap and heap[0][0] <= last:
            u, t = heapq.heappop(heap)
            # stale entries: fetched since, freed, or evicted again later
            if state.get(t) == _HOST and t not in seen:
                us = uses[t]   # its next use (bisect: after position p)
                k = bisect_right(us, p)
                if u == (us[k] if k < len(us) else 1 << 60):
                    want.append((u, t))
                    seen.add(t)
        if not want:
            return
        reserve = max([reserve] + self.step_need[p + 1:last + 1])
        for k, (u, t) in enumerate(want):   # soonest needed first
            if not self._make_room(reserve + self.sz[t], pinned, p, until=last):
                for entry in want[k:]:
                    heapq.heappush(heap, entry)
                break
            self._fetch(t)

    def _fail(self, step: Step, need: int) -> None:
        if self.reason is None:
            short = self.level + need - self.cap
            self.reason = "after evicting every evictable tensor, " + shortfall(
                self.g, step, short, self.cap)

    def stats(self) -> dict:
        off = self.offloaded   # the tensors of the Offload ops run() made
        return {"offloaded_bytes": sum(map(self.sz.__getitem__, off)),
                "offloaded_tensors": len(off),
                "prefetched_bytes": self.bytes_in, "evictions": self.n_evict,
                "cache_hits": self.hits, "cache_misses": self.misses,
                "prefetch_hits": self.prefetched, "prefetches_landed_early": self.n_landed}
