"""Step sequences: the route with recomputed forwards, and liveness frees on any sequence.

:func:`recompute_sequence` turns a keep/drop decision into the route with
recomputed forwards (``R`` steps) inserted; :func:`liveness_seq` adds a
:class:`Free` after each tensor's last use on any such step sequence.  A
helper of the policies, not a policy (the registry skips it).
"""

from __future__ import annotations

from itertools import chain, repeat
from weakref import WeakKeyDictionary

from snsim.graph import Graph, Step, Tensor, kind
from snsim.trace.model import make_records
from snsim.schedule.ops import Compute, Free, Offload, Op, Prefetch, Wait

# per graph, the route's use positions and liveness ops: every policy of an
# ``all`` run (and every probe of a budget search) asks for the same ones
_ROUTE_USES: WeakKeyDictionary = WeakKeyDictionary()
_ROUTE_LIVENESS: WeakKeyDictionary = WeakKeyDictionary()
_COPY_USES: WeakKeyDictionary = WeakKeyDictionary()
_ROUTE_FREES: WeakKeyDictionary = WeakKeyDictionary()
_OP_TABLES: WeakKeyDictionary = WeakKeyDictionary()


class OpTable(dict):
    """Key -> its op, made on first lookup (``table[key]``) and shared after.

    Ops are immutable values: a plan that frees ``X5`` twice, or two candidate
    plans of one policy, can hold the same ``Free(("X", 5))``.  Making a frozen
    op costs ten times a lookup, and a deep trace's plan has ~10^5 of them.
    """

    def __init__(self, make):
        super().__init__()
        self.make = make

    def __missing__(self, key):
        op = self[key] = self.make(key)
        return op


def tensor_op_maker(cls):
    """``cls(tensor)`` for a frozen, slotted op class of one field (``tensor``),
    its field set through the slot descriptor as :func:`make_records` does: the
    same object without the generated ``__init__``'s frame (a plan with 10^4
    evictions makes that many waits, prefetches and offloads one at a time)."""
    new, set_tensor = object.__new__, cls.tensor.__set__

    def make(tensor):
        op = new(cls)
        set_tensor(op, tensor)
        return op

    return make


class _PhaseComputes(dict):
    """Phase (``F``, ``R``, ``B``) -> the ``Compute`` op of each of the ``n``
    layers in that phase, made whole on first lookup (a lookup of a list is
    cheaper than of a step: no tuple to hash)."""

    def __init__(self, n: int, ids: list[int] | None = None):
        super().__init__()
        self.n = n
        # the layer indices as the graph's own int objects (Graph.steps), so an
        # op's layer and its step's are one object (compared by identity)
        self.ids = ids if ids is not None else range(n)

    def __missing__(self, phase):
        if phase not in ("F", "R", "B"):
            raise KeyError(phase)
        n = self.n
        ops = self[phase] = make_records(Compute, repeat(phase, n), self.ids, repeat(0, n))
        return ops


class OpTables:
    """Per graph, one :class:`OpTable` per op kind: ``compute`` (by step, the
    first algorithm), ``free``, ``wait``, ``prefetch``, ``offload`` (by tensor)."""

    def __init__(self, n: int = 0, ids: list[int] | None = None):
        self.compute = OpTable(lambda step: Compute(step[0], step[1]))
        self.by_phase = _PhaseComputes(n, ids)   # for computes: F, R, B by layer
        self.free = OpTable(tensor_op_maker(Free))
        self.wait = OpTable(tensor_op_maker(Wait))
        self.prefetch = OpTable(tensor_op_maker(Prefetch))
        self.offload = OpTable(tensor_op_maker(Offload))
        self.all_frees = False   # a Free for every tensor of the graph (add_all_frees)

    def computes(self, seq: list[Step]) -> list[Compute]:
        """The ``Compute`` op of each step of ``seq`` (its first algorithm): of an
        ``F``, ``R`` or ``B`` step, read from that phase's list (every layer's op,
        made in one pass on first use); of another, by step, the missing ones
        made in one pass (:func:`~snsim.trace.model.make_records`)."""
        by = self.by_phase
        if by.n:
            try:
                return [by[ph][i] for ph, i in seq]
            except KeyError:   # another phase
                pass
        table = self.compute
        new = list(set(seq).difference(table))
        if new:
            phases, layers = zip(*new)
            table.update(zip(new, make_records(Compute, phases, layers, repeat(0, len(new)))))
        return list(map(table.__getitem__, seq))

    def add_frees(self, tensors) -> None:
        """Make the ``Free`` ops of ``tensors`` that are not in the table yet."""
        table = self.free
        new = list(set(tensors).difference(table))
        if new:
            table.update(zip(new, make_records(Free, new)))

    def add_all_frees(self, graph: Graph) -> None:
        """:meth:`add_frees` of every tensor of ``graph`` (the graph of these
        tables), once: a planner run per candidate plan asks each time."""
        if not self.all_frees:
            if self.free:
                self.add_frees(graph.sizes)
            else:   # none made yet: all of them, without the set difference
                tensors = list(graph.sizes)
                self.free.update(zip(tensors, make_records(Free, tensors)))
            self.all_frees = True


def op_tables(graph: Graph) -> OpTables:
    """The graph's shared op tables (:class:`OpTables`), made once per graph."""
    got = _OP_TABLES.get(graph)
    if got is None:
        got = _OP_TABLES[graph] = OpTables(graph.n, [i for _, i in graph.steps["F"]])
    return got


def recompute_sequence(graph: Graph, keep: list[bool], speed: list[bool]) -> list[Step]:
    """The route with ``R`` steps inserted for dropped layers.

    A dropped layer's output (and saved extras) is freed after its forward
    uses; before a backward step that needs it, it is recomputed from the
    nearest kept ancestors (recursively through dropped inputs).  Per layer,
    ``speed[i]`` says how long a recomputed tensor is reused: speed-centric
    keeps it for every later step (each layer recomputed at most once),
    memory-centric only while the next route step needs it too (so the
    segment is re-run from its checkpoint for each backward step).
    """
    n = graph.n
    seq: list[Step] = graph.route[:n]   # the graph's step tuples (Graph.steps)
    rsteps = graph.steps["R"]
    kept: set[int] = set()    # speed-centric layers recomputed: reused to the end
    avail: set[int] = set()   # memory-centric ones reusable for the next step only
    layers = graph.layers
    back = graph.route[n:]

    def ensure(j: int) -> None:
        # Recompute j after its dropped inputs (depth-first, iteratively: a run
        # of dropped layers can be longer than Python's recursion limit).
        stack = [(j, False)]
        while stack:
            k, inputs_done = stack.pop()
            if k in kept or k in avail:
                continue
            if inputs_done:
                seq.append(rsteps[k])
                (kept if speed[k] else avail).add(k)
                continue
            stack.append((k, True))
            stack.extend((x, False) for x in reversed(layers[k].inputs) if not keep[x])

    needs_of = graph.needs_map   # graph.needs, without a call per step
    for k, step in enumerate(back):
        for t in needs_of[step]:
            j = t[1]
            if kind(t) not in ("G", "P") and not keep[j] and j not in kept and j not in avail:
                ensure(j)
        seq.append(step)
        if avail:
            nxt = {t[1] for t in needs_of[back[k + 1]] if kind(t) not in ("G", "P")} \
                if k + 1 < len(back) else ()
            avail = {j for j in avail if j in nxt}
    return seq


def use_positions(graph: Graph, seq: list[Step]) -> tuple[dict, list[list[Tensor]]]:
    """Positions where each tensor is needed or allocated, and liveness frees.

    Returns ``uses`` (tensor -> sorted positions) and ``frees`` (position ->
    tensors whose current instance is last used there: a tensor that is
    allocated again later is freed after its last use before that).  For the
    route itself (``seq is graph.route``), and for a copy of it, they are computed
    once per graph and shared: read them, never change them.
    """
    if seq is graph.route:
        got = _ROUTE_USES.get(graph)
        if got is None:
            got = _ROUTE_USES[graph] = _use_positions(graph, seq)
        return got
    if len(seq) == len(graph.route) and seq == graph.route:
        # a copy of the route (the cache planners' walk; no holds: see _use_positions)
        got = _COPY_USES.get(graph)
        if got is None:
            got = _COPY_USES[graph] = _use_positions(graph, seq)
        return got
    return _use_positions(graph, seq)


def _use_positions(graph: Graph, seq: list[Step]) -> tuple[dict, list[list[Tensor]]]:
    # a tensor's last position so far is the last of its uses (one dict, not two;
    # its keys come in the order a separate ``last`` dict's would); the steps'
    # needs and allocs looked up in C ahead of the loop
    needs, allocs = graph.needs_map, graph.allocs_map
    uses: dict[Tensor, list[int]] = {}
    get = uses.get
    frees: list[list[Tensor]] = [[] for _ in seq]
    p = 0
    for nd, al in zip(map(needs.__getitem__, seq), map(allocs.__getitem__, seq)):
        for t in nd:
            try:   # a tensor is needed after a step made it: seen already
                uses[t].append(p)
            except KeyError:
                uses[t] = [p]
        for t in al:
            u = get(t)
            if u is None:
                uses[t] = [p]
            else:
                q = u[-1]
                if q != p:
                    frees[q].append(t)
                u.append(p)
        p += 1
    holds = graph.holds if seq is graph.route else {}   # route indices (op-log traces)
    if holds:
        for t, u in uses.items():
            frees[max(u[-1], holds.get(t, -1))].append(t)
    else:
        for t, u in uses.items():
            frees[u[-1]].append(t)
    return uses, frees


def liveness_seq(graph: Graph, seq: list[Step]) -> list[Op]:
    """Compute each step of ``seq`` and free each tensor after its last use
    (a new list each call; the ops themselves are immutable)."""
    if seq is graph.route:
        got = _ROUTE_LIVENESS.get(graph)
        if got is None:
            got = _ROUTE_LIVENESS[graph] = _liveness_seq(graph, seq)
        return list(got)
    return _liveness_seq(graph, seq)


def _frees(graph: Graph, seq: list[Step]) -> list[list[Tensor]]:
    """``use_positions(graph, seq)[1]`` without the positions (liveness reads only
    the frees): the same lists, in the same order."""
    needs, allocs = graph.needs_map, graph.allocs_map
    last: dict[Tensor, int] = {}
    frees: list[list[Tensor]] = [[] for _ in seq]
    get = last.get
    p = 0
    for nd, al in zip(map(needs.__getitem__, seq), map(allocs.__getitem__, seq)):
        for t in nd:
            last[t] = p
        for t in al:
            q = get(t)
            if q is not None and q != p:
                frees[q].append(t)
            last[t] = p
        p += 1
    holds = graph.holds if seq is graph.route else {}   # route indices (op-log traces)
    if holds:
        for t, q in last.items():
            frees[max(q, holds.get(t, -1))].append(t)
    else:
        for t, q in last.items():
            frees[q].append(t)
    return frees


def _route_frees(graph: Graph) -> list[list[Tensor]]:
    """The route's liveness frees: those of its use positions where another
    policy has asked for them, else :func:`_frees` (a third faster: ``liveness``
    alone needs no positions), once per graph."""
    got = _ROUTE_USES.get(graph)
    if got is not None:
        return got[1]
    frees = _ROUTE_FREES.get(graph)
    if frees is None:
        frees = _ROUTE_FREES[graph] = _frees(graph, graph.route)
    return frees


def _liveness_seq(graph: Graph, seq: list[Step]) -> list[Op]:
    frees = _route_frees(graph) if seq is graph.route else _frees(graph, seq)
    tables = op_tables(graph)   # the ops made in C (make_records), shared with other plans
    tables.add_frees(chain.from_iterable(frees))
    free = tables.free.__getitem__
    ops: list[Op] = []
    append, extend = ops.append, ops.extend
    for compute, fp in zip(tables.computes(seq), frees):
        append(compute)
        if fp:
            extend(map(free, fp))
    return ops
