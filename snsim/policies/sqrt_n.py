"""``sqrt-n``: sublinear-memory checkpointing (Chen et al., 2016).

Of the m candidate checkpoints (SuperNeurons' checkpoint layers other than the
data layer and the loss, in forward order), every ``round(sqrt(m))``-th is
kept, with the data layer and the loss; every other layer's output is dropped
after forward.  A segment is then the run of dropped layers between kept ones
(it may span several residual or inception blocks); backward re-runs what each
segment needs once, speed-centric, and liveness frees it (Chen's
"recompute each segment once").  Static, like the other recompute plans;
note 2 of :mod:`snsim.policies.recompute` applies.
"""

from __future__ import annotations

import math

from snsim.policies import register
from snsim.policies import layers
from snsim.policies.base import PlanContext
from snsim.policies.recompute import plan_recompute
from snsim.schedule.ops import Schedule


def sqrt_n_keep(graph) -> list[bool]:
    ckpt = layers.checkpoints(graph)
    n = graph.n
    cands = [i for i in range(1, n - 1) if ckpt[i] and graph.layers[i].kind != "data"]
    stride = max(1, round(math.sqrt(len(cands))))
    keep = [layer.kind == "data" for layer in graph.layers]
    keep[n - 1] = True
    for k, i in enumerate(cands):
        if k % stride == stride - 1:
            keep[i] = True
    return keep


@register("sqrt-n", "keep every sqrt(n)-th checkpoint, recompute segments once",
          order=45, needs=("backward",))
def plan_sqrt_n(ctx: PlanContext) -> Schedule:
    keep = sqrt_n_keep(ctx.graph)
    s = plan_recompute("sqrt-n", ctx, keep, "speed")
    s.stats["kept_layers"] = sum(keep)
    return s
