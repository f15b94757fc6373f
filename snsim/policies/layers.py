"""SuperNeurons' layer classes (DESIGN section 3): checkpoints, segments, ``l_peak``.

A helper of the policies, not a policy (the registry skips it).
"""

from __future__ import annotations

from operator import add
from weakref import WeakKeyDictionary

from snsim.graph import Graph


CHECKPOINT_KINDS = frozenset({"conv", "fc", "add", "concat", "data", "loss", "softmax"})


_CHECKPOINTS: WeakKeyDictionary = WeakKeyDictionary()   # graph -> checkpoints


def checkpoints(graph: Graph) -> list[bool]:
    """SuperNeurons' checkpoint layers: conv, fc, add, concat, data, loss,
    softmax, the last layer, and any layer with several consumers (a fork)
    (worked out once per graph; a new list each call)."""
    got = _CHECKPOINTS.get(graph)
    if got is None:
        n = graph.n
        got = _CHECKPOINTS[graph] = [
            layer.kind in CHECKPOINT_KINDS or len(graph.consumers[i]) > 1 or i == n - 1
            for i, layer in enumerate(graph.layers)]
    return list(got)


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
    return step_bytes_table(graph)["B"][i]


_STEP_BYTES: WeakKeyDictionary = WeakKeyDictionary()   # graph -> step_bytes_table


def step_bytes_table(graph: Graph) -> dict[str, list]:
    """Per phase (``F``, ``B``), per layer: the bytes its step needs and allocates
    plus its first algorithm's workspace (``graph.step_bytes`` +
    ``graph.workspace_bytes``; None where the layer has no such step), once per
    graph from the graph's per-phase tables (~10^4 steps on a deep trace)."""
    got = _STEP_BYTES.get(graph)
    if got is None:
        reads, all_bytes = graph.needs_bytes_table, graph.alloc_bytes_table
        wss = [layer.workspace for layer in graph.layers]
        ws_f = [ws[0].fwd_bytes if ws else 0 for ws in wss]
        ws_b = [ws[0].backward_bytes if ws else 0 for ws in wss]
        fwd = list(map(add, map(add, reads["F"], all_bytes["F"]), ws_f))
        bwd = [None if r is None else r + ab + w
               for r, ab, w in zip(reads["B"], all_bytes["B"], ws_b)]
        got = _STEP_BYTES[graph] = {"F": fwd, "B": bwd}
    return got


def fwd_bytes_sum(graph: Graph, ids) -> int:
    """The forward memory of layers ``ids`` summed: each F step's inputs, output,
    saved extras and workspace."""
    return sum(map(step_bytes_table(graph)["F"].__getitem__, ids))


_L_PEAK: WeakKeyDictionary = WeakKeyDictionary()   # graph -> l_peak


def l_peak(graph: Graph) -> int:
    """``l_peak = max l_i`` over the route's backward steps (once per graph: the
    recomputation policies, sqrt-n and superneurons each read it)."""
    got = _L_PEAK.get(graph)
    if got is None:
        bwd = step_bytes_table(graph)["B"]
        got = _L_PEAK[graph] = max([bwd[i] for phase, i in graph.route if phase == "B"],
                                   default=0)
    return got
