"""The last step of every planner: its ops as a :class:`Schedule`, with the
recompute counters added to its statistics.  A helper of the policies, not a
policy (the registry skips it).
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import is_

from snsim.graph import Graph
from snsim.policies import replay
from snsim.schedule.ops import Compute, Op, Schedule


def recompute_stats(graph: Graph, ops: list[Op]) -> dict:
    # the compute ops picked out in C; a recompute's time with its first algorithm
    # is its layer's forward time (graph.step_ms), added in the same order
    computes = compress(ops, map(is_, map(type, ops), repeat(Compute)))
    rs = [op for op in computes if op.phase == "R"]
    layers, step_ms = graph.layers, graph.step_ms
    times = [step_ms(op.step, op.algo) if op.algo else layers[op.layer].fwd_ms for op in rs]
    return {"recomputed_layers": len(rs), "recompute_planned_ms": round(sum(times), 6)}


def finish(name: str, graph: Graph, ops: list[Op], budget: int | None, stats: dict,
           reason: str | None = None) -> Schedule:
    """A schedule with the recompute counters added to ``stats``; under a budget,
    infeasible when the optimizer step the plan ends with does not fit after it
    (its temporaries over what the route leaves resident)."""
    stats = {**stats, **recompute_stats(graph, ops)}
    if (reason is None and budget is not None and graph.optimizer_step is not None
            and graph.optimizer_transient_bytes):
        end = replay.planned_peak(graph, ops, budget)[1]
        if end is not None:
            reason = end
    return Schedule(name, ops, budget, stats, reason)
