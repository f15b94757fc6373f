"""``sqrt-n``: sublinear-memory checkpointing (Chen et al., 2016).

Of the m candidate checkpoints (SuperNeurons' checkpoint layers other than the
data layer and the loss, in forward order), every ``round(sqrt(m))``-th is
kept, with the data layer and the loss; every other layer's output is dropped
after forward.  A segment is then the run of dropped layers between kept ones
(it may span several residual or inception blocks); backward re-runs what each
segment needs once, speed-centric, and liveness frees it (Chen's
"recompute each segment once").  Without a budget it is static, like the
other recompute plans;
note 2 of :mod:`snsim.policies.recompute` applies.

With a budget (``--budget``), the plan reads it, as Chen et al.'s
budget-driven search does: if keeping every output (no recomputation) fits,
nothing is dropped; otherwise the stride is the smallest in
1 .. round(sqrt(m)) whose plan fits under the simulator's rules
(:func:`replay.estimate_ms`) -- the least recomputation that fits.  When none
fits, the default plan (stride round(sqrt(m))) is kept and the simulator
reports the shortfall.  Without a budget the plan is the static one above.
"""

from __future__ import annotations

import math

from snsim.policies import register
from snsim.policies import layers
from snsim.policies import replay
from snsim.policies import sequences
from snsim.policies.base import PlanContext
from snsim.policies.recompute import plan_recompute
from snsim.schedule.ops import Schedule


def candidates(graph) -> list[int]:
    """The candidate checkpoints: SuperNeurons' checkpoint layers but the data
    layer and the loss, in forward order."""
    ckpt = layers.checkpoints(graph)
    lays = graph.layers
    return [i for i in range(1, graph.n - 1) if ckpt[i] and lays[i].kind != "data"]


def stride_of(cands: list[int]) -> int:
    """The default stride over ``cands``: ``round(sqrt(m))``, at least 1."""
    return max(1, round(math.sqrt(len(cands))))


def sqrt_n_keep(graph, stride: int | None = None, cands: list[int] | None = None) -> list[bool]:
    """Kept layers with ``stride`` (default ``round(sqrt(m))``); ``cands``:
    :func:`candidates`, when the caller has them."""
    if cands is None:
        cands = candidates(graph)
    if stride is None:
        stride = stride_of(cands)
    keep = [layer.kind == "data" for layer in graph.layers]
    keep[graph.n - 1] = True
    for i in cands[stride - 1::stride]:   # the k-th candidate for k % stride == stride - 1
        keep[i] = True
    return keep


def default_stride(graph) -> int:
    return stride_of(candidates(graph))


def read_in_backward(graph) -> list[int] | None:
    """The layers whose output a backward step reads (:func:`forward_floor`), or
    None where tensors are held past their uses (op-log traces): no floor."""
    if graph.holds:
        return None
    n, last = graph.n, graph.last_use
    return [i for i in range(n) if last.get(("X", i), -1) >= n]


def forward_floor(graph, keep: list[bool], reads: list[int] | None = None) -> int | None:
    """A floor under the planned level at the last forward step of the plan that
    keeps ``keep`` (a plan above the budget there cannot fit, so the scan need not
    build it): the static bytes and the output of every kept layer that a
    backward step reads, all resident then (made in forward, never recomputed,
    freed after their last use in backward).  None where tensors are held past
    their uses (op-log traces): no floor.  ``reads``:
    :func:`read_in_backward`, when the caller has it (the scan asks per stride)."""
    if reads is None:
        reads = read_in_backward(graph)
        if reads is None:
            return None
    x = graph.x_bytes
    return graph.trace.static_bytes + sum([x[i] for i in reads if keep[i]])


@register("sqrt-n", "keep every sqrt(n)-th checkpoint, recompute segments once",
          order=45, needs=("backward",))
def plan_sqrt_n(ctx: PlanContext) -> Schedule:
    g = ctx.graph
    cands = candidates(g)   # once: the scan below asks per stride
    stride = stride_of(cands)
    keep = sqrt_n_keep(g, stride, cands)
    s = None    # the default plan, built only where it is the answer
    if ctx.budget_bytes is not None:
        cap = ctx.budget_bytes
        # a copy-free plan fits under the simulator's rules (a finite
        # replay.estimate_ms) iff its planned peak (frees immediate) does
        every = [True] * g.n
        reads = read_in_backward(g)

        def over(k: list[bool]) -> bool:   # certainly over the budget (forward_floor)
            return reads is not None and forward_floor(g, k, reads) > cap

        whole = None if over(every) else plan_recompute("sqrt-n", ctx, every, "speed")
        if whole is not None and replay.schedule_fits(g, whole, cap):
            keep, s, stride = every, whole, 0
        else:
            # The fitting peak is not monotone in the stride (a longer segment
            # recomputes more at once), so scan up from 1: least recompute first.
            for st in range(1, stride):
                k = sqrt_n_keep(g, st, cands)
                if over(k):
                    continue
                ops = sequences.liveness_seq(g, sequences.recompute_sequence(g, k, every))
                if replay.fits(g, ops, cap):
                    keep, stride = k, st
                    s = plan_recompute("sqrt-n", ctx, keep, "speed", ops)   # these ops
                    break
    if s is None:
        s = plan_recompute("sqrt-n", ctx, keep, "speed")
    s.stats["kept_layers"] = sum(keep)
    s.stats["stride"] = stride
    return s
