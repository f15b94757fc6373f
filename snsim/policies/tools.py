"""Planning helpers shared by the swap and recompute policies.

Not a policy (the registry skips a module named ``tools``).  Four pieces:

* SuperNeurons' layer classes: :func:`checkpoints`, :func:`segments`,
  :func:`l_peak` (DESIGN section 3);
* :func:`recompute_sequence` turns a keep/drop decision into the route with
  recomputed forwards (``R`` steps) inserted, and :func:`liveness_seq` adds a
  :class:`Free` after each tensor's last use on any such step sequence;
* :func:`planned_peak` and :func:`estimate_ms`: the simulator's memory and
  time rules replayed without simpy, for planners that choose between plans
  (a policy never imports the simulator);
* :class:`snsim.policies.cache.CachePlanner` (its own module, built on
  these helpers): the unified tensor pool's LRU cache, with eviction under the budget
  and prefetch ahead.

Note 1 (frees and the budget).  The simulator releases a freed tensor whose
offload is still copying when the copy ends, and an allocation that does not
fit waits for such frees.  A planner may therefore count every ``Free`` as
immediate: whatever fits in the planner's count fits in the simulator once
the copies under way have ended (the wait is a stall, not a failure).
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict

from snsim.graph import Graph, Step, Tensor, step_name, tensor_name
from snsim.schedule import ledger
from snsim.schedule.ops import Compute, Free, Offload, Op, Prefetch, Schedule, Wait
from snsim.units import fmt_bytes

CHECKPOINT_KINDS = frozenset({"conv", "fc", "add", "concat", "data", "loss", "softmax"})


# ------------------------------------------------------------ layer classes
def checkpoints(graph: Graph) -> list[bool]:
    """SuperNeurons' checkpoint layers: conv, fc, add, concat, data, loss,
    softmax, the last layer, and any layer with several consumers (a fork)."""
    n = graph.n
    return [layer.kind in CHECKPOINT_KINDS or len(graph.consumers[i]) > 1 or i == n - 1
            for i, layer in enumerate(graph.layers)]


def segments(graph: Graph, keep: list[bool]) -> tuple[list[list[int]], list[int]]:
    """Segments: connected runs of dropped (not kept) layers.

    Returns the segments (layer ids in forward order) and ``seg_of`` (segment
    index per layer, -1 for kept layers).  With SuperNeurons' checkpoints a
    dropped layer has at most one consumer, so a segment is the run of layers
    after a checkpoint along one branch, up to the next checkpoint.
    """
    parent = list(range(graph.n))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for layer in graph.layers:
        if keep[layer.id]:
            continue
        for j in layer.inputs:
            if not keep[j]:
                parent[find(j)] = find(layer.id)
    index: dict[int, int] = {}
    segs: list[list[int]] = []
    seg_of = [-1] * graph.n
    for i in range(graph.n):
        if keep[i]:
            continue
        r = find(i)
        if r not in index:
            index[r] = len(segs)
            segs.append([])
        seg_of[i] = index[r]
        segs[index[r]].append(i)
    return segs, seg_of


def layer_bwd_bytes(graph: Graph, i: int) -> int:
    """``l_i``: bytes B_i needs and allocates plus its workspace (no params)."""
    step = ("B", i)
    return graph.step_bytes(step) + graph.workspace_bytes(step)


def layer_fwd_bytes(graph: Graph, i: int) -> int:
    """Forward memory of a layer: inputs, output, saved extras, workspace."""
    step = ("F", i)
    return graph.step_bytes(step) + graph.workspace_bytes(step)


def l_peak(graph: Graph) -> int:
    """``l_peak = max l_i`` over the route's backward steps."""
    return max((layer_bwd_bytes(graph, i) for p, i in graph.route if p == "B"), default=0)


# ------------------------------------------------------------ sequences
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
    seq: list[Step] = [("F", i) for i in range(n)]
    kept: set[int] = set()    # speed-centric layers recomputed: reused to the end
    avail: set[int] = set()   # memory-centric ones reusable for the next step only
    needs = graph.needs
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
                seq.append(("R", k))
                (kept if speed[k] else avail).add(k)
                continue
            stack.append((k, True))
            stack.extend((x, False) for x in reversed(layers[k].inputs) if not keep[x])

    for k, step in enumerate(back):
        for t in needs(step):
            if t[0] != "G" and not keep[t[1]]:
                ensure(t[1])
        seq.append(step)
        if avail:
            nxt = {t[1] for t in needs(back[k + 1]) if t[0] != "G"} if k + 1 < len(back) else ()
            avail = {j for j in avail if j in nxt}
    return seq


def use_positions(graph: Graph, seq: list[Step]) -> tuple[dict, list[list[Tensor]]]:
    """Positions where each tensor is needed or allocated, and liveness frees.

    Returns ``uses`` (tensor -> sorted positions) and ``frees`` (position ->
    tensors whose current instance is last used there: a tensor that is
    allocated again later is freed after its last use before that).
    """
    needs, allocs = graph.needs_map, graph.allocs_map
    uses: dict[Tensor, list[int]] = defaultdict(list)
    last: dict[Tensor, int] = {}
    frees: list[list[Tensor]] = [[] for _ in seq]
    for p, step in enumerate(seq):
        for t in needs[step]:
            last[t] = p
            uses[t].append(p)
        for t in allocs[step]:
            q = last.get(t)
            if q is not None and q != p:
                frees[q].append(t)
            last[t] = p
            uses[t].append(p)
    for t, q in last.items():
        frees[q].append(t)
    return uses, frees


def liveness_seq(graph: Graph, seq: list[Step]) -> list[Op]:
    """Compute each step of ``seq`` and free each tensor after its last use."""
    _, frees = use_positions(graph, seq)
    ops: list[Op] = []
    for p, (phase, i) in enumerate(seq):
        ops.append(Compute(phase, i))
        ops.extend(Free(t) for t in frees[p])
    return ops


def recompute_stats(graph: Graph, ops: list[Op]) -> dict:
    rs = [op for op in ops if type(op) is Compute and op.phase == "R"]
    return {"recomputed_layers": len(rs),
            "recompute_planned_ms": round(sum(graph.step_ms(op.step, op.algo) for op in rs), 6)}


# ------------------------------------------------------------ replay rules
def planned_peak(graph: Graph, ops: list[Op], capacity: int | None = None
                 ) -> tuple[int, str | None]:
    """Peak level of ``ops`` counting frees as immediate (note 1), and why the
    first op that does not fit ``capacity`` does not (None if all fit)."""
    peak, first = ledger.planned_peak(graph, ops, capacity)
    if first is None:
        return peak, None
    op = ops[first]
    if type(op) is Compute:
        level = ledger.planned_peak(graph, ops[:first + 1])[0]
        return peak, shortfall(graph, op.step, level - capacity, capacity)
    return peak, (f"prefetch of {tensor_name(op.tensor)} does not fit the "
                  f"{fmt_bytes(capacity)} budget")


def shortfall(graph: Graph, step: Step, short: int, capacity: int) -> str:
    return (f"step {step_name(step)} ({graph.layers[step[1]].name}) is {short} bytes "
            f"({fmt_bytes(short)}) short of the {fmt_bytes(capacity)} budget")


def estimate_ms(graph: Graph, ops: list[Op], capacity: int) -> float:
    """Makespan of ``ops`` under the simulator's rules (DESIGN section 2,
    "Time"), without simpy; ``inf`` when an allocation can never fit.  Memory
    per op is the ledger's (:func:`snsim.schedule.ledger.walk`)."""
    size = Sizes(graph)
    layers = graph.layers
    dev = graph.trace.device
    d2h_ms, h2d_ms = 1e3 / dev.d2h_Bps, 1e3 / dev.h2d_Bps
    now = d2h = h2d = 0.0
    level = graph.trace.static_bytes
    off_done: dict = {}
    in_done: dict = {}
    pending: list = []   # (time, bytes) of frees under way
    heappop = heapq.heappop

    def fit(need: int) -> bool:
        nonlocal now, level
        while pending and pending[0][0] <= now:
            level -= heappop(pending)[1]
        while level + need > capacity:
            if not pending:
                return False
            t, b = heappop(pending)
            now = max(now, t)
            level -= b
        return True

    for op, (_, nb, ws, freed) in zip(ops, ledger.walk(graph, ops, route=False)):
        tp = type(op)
        if tp is Compute:
            if level + nb + ws > capacity and not fit(nb + ws):
                return math.inf
            level += nb
            if op.algo:
                now += graph.step_ms(op.step, op.algo)
            else:
                layer = layers[op.layer]
                now += layer.bwd_ms if op.phase == "B" else layer.fwd_ms
        elif tp is Free:
            done = off_done.get(op.tensor, 0.0)
            if done > now:
                heapq.heappush(pending, (done, freed))
            else:
                level -= freed
        elif tp is Offload:
            d2h = max(d2h, now) + size[op.tensor] * d2h_ms
            off_done[op.tensor] = d2h
        elif tp is Prefetch:
            t = op.tensor
            if level + nb > capacity and not fit(nb):
                return math.inf
            level += nb
            h2d = max(h2d, now, off_done.get(t, 0.0)) + nb * h2d_ms
            in_done[t] = h2d
        elif tp is Wait:
            t = op.tensor
            done = in_done.pop(t, None)
            now = max(now, off_done.get(t, 0.0) if done is None else done)
    return max(now, d2h, h2d)


class Sizes(dict):
    """Tensor sizes of one graph, filled on first use."""

    def __init__(self, graph: Graph):
        super().__init__()
        self.size = graph.size

    def __missing__(self, t):
        b = self[t] = self.size(t)
        return b


def finish(name: str, graph: Graph, ops: list[Op], budget: int | None, stats: dict,
           reason: str | None = None) -> Schedule:
    """A schedule with the recompute counters added to ``stats``."""
    stats = {**stats, **recompute_stats(graph, ops)}
    return Schedule(name, ops, budget, stats, reason)
