"""Recomputation after SuperNeurons: ``recompute-speed``, ``recompute-memory``,
``cost-aware``.

All three keep only checkpoint outputs after forward (conv, fc, add, concat,
data, loss, softmax and forks; :func:`layers.checkpoints`) and recompute the
rest in backward as ``R`` steps; liveness frees everything after its last use.
They differ per segment (the run of non-checkpoint layers after a checkpoint):

* speed-centric: the segment is re-run once, before the first backward step
  that needs one of its tensors, and its results are kept until liveness frees
  them (linear extra compute);
* memory-centric: before each backward step, the segment is re-run from its
  checkpoint up to what that step needs, each recomputed tensor freed once the
  next one exists; a tensor the next backward step also needs is kept for it
  (quadratic extra compute, least memory);
* cost-aware (DESIGN section 3): speed-centric when the sum of the segment's
  layers' forward memory (inputs, output, saved extras, workspace) is at most
  ``l_peak``, the largest layer's backward memory; else memory-centric.

These plans are static: a budget does not change them (the simulator reports a
shortfall).  Note 2: when recomputation would raise the peak above what
``liveness`` reaches (possible on small graphs, where a recomputed tensor
briefly coexists with tensors liveness had already freed), the planner keeps
the ``liveness`` plan instead and says so in ``stats["fallback"]``.
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

from snsim.graph import Graph
from snsim.policies import register
from snsim.policies import finishing
from snsim.policies import layers
from snsim.policies import replay
from snsim.policies import sequences
from snsim.policies.base import PlanContext
from snsim.policies.liveness import liveness_ops
from snsim.schedule import ledger
from snsim.schedule.ops import Schedule


def segment_modes(graph: Graph, keep: list[bool], mode: str) -> tuple[list[bool], dict]:
    """Per layer: speed-centric (True) or memory-centric, and a summary."""
    segs, _ = layers.segments(graph, keep)
    speed = [True] * graph.n
    lp = layers.l_peak(graph)
    n_speed = 0
    for seg in segs:
        if mode == "speed":
            fast = True
        elif mode == "memory":
            fast = False
        else:
            fast = layers.fwd_bytes_sum(graph, seg) <= lp
        n_speed += fast
        for i in seg:
            speed[i] = fast
    return speed, {"segments": len(segs), "speed_segments": n_speed,
                   "memory_segments": len(segs) - n_speed, "l_peak_bytes": lp}


_LIVENESS_PEAK: WeakKeyDictionary = WeakKeyDictionary()   # graph -> liveness's planned peak


def liveness_peak(graph: Graph) -> int:
    """The planned peak of ``liveness`` on ``graph`` (note 2), once per graph."""
    peak = _LIVENESS_PEAK.get(graph)
    if peak is None:
        peak = _LIVENESS_PEAK[graph] = replay.planned_peak(graph, liveness_ops(graph))[0]
    return peak


def plan_recompute(name: str, ctx: PlanContext, keep: list[bool], mode: str,
                   ops: list | None = None) -> Schedule:
    """Recompute what ``keep`` drops, each segment in ``mode``; ``ops``: the
    plan's ops where the caller has just made them (``liveness_seq`` of the
    ``recompute_sequence`` of ``keep`` and the mode's speeds: ``sqrt-n``'s scan),
    not made again."""
    g = ctx.graph
    speed, stats = segment_modes(g, keep, mode)
    if ops is None:
        ops = sequences.liveness_seq(g, sequences.recompute_sequence(g, keep, speed))
    fx = None
    if g.optimizer_step is None:
        # the verifier's own walk (its rules checked), kept on the schedule for
        # it and the simulator: one walk of the plan where there were two
        fx = ledger.walk(g, ops, name)
        peak = ledger.peak_of(g, fx)[0]
    else:   # the plan ends with the optimizer step, appended after planning
        peak = replay.planned_peak(g, ops)[0]
    if peak > liveness_peak(g):
        ops, stats, fx = liveness_ops(g), {**stats, "fallback": "liveness"}, None   # note 2
    schedule = finishing.finish(name, g, ops, ctx.budget_bytes, stats)
    if fx is not None:
        schedule.checked = (g, len(ops), fx)
    return schedule


@register("recompute-speed", "recompute non-checkpoint layers once per segment",
          order=40, needs=("backward",))
def plan_speed(ctx: PlanContext) -> Schedule:
    return plan_recompute("recompute-speed", ctx, layers.checkpoints(ctx.graph), "speed")


@register("recompute-memory", "recompute each segment from its checkpoint per backward step",
          order=41, needs=("backward",))
def plan_memory(ctx: PlanContext) -> Schedule:
    return plan_recompute("recompute-memory", ctx, layers.checkpoints(ctx.graph), "memory")


@register("cost-aware", "speed- or memory-centric recomputation per segment by l_peak",
          order=42, needs=("backward",))
def plan_cost_aware(ctx: PlanContext) -> Schedule:
    return plan_recompute("cost-aware", ctx, layers.checkpoints(ctx.graph), "cost")
