"""``liveness``: free every tensor right after the last step that needs it.

SuperNeurons' first optimization (DESIGN section 2): the step that allocates
a tensor counts as a use, so an output nobody reads is freed right after it
is made.
"""

from snsim.policies import register
from snsim.policies.base import PlanContext
from snsim.policies.sequences import liveness_seq
from snsim.schedule.ops import Op, Schedule


def liveness_ops(graph) -> list[Op]:
    """The route with a :class:`Free` after each tensor's last use."""
    return liveness_seq(graph, graph.route)


@register("liveness", "free each tensor after its last use", order=10)
def plan_liveness(ctx: PlanContext) -> Schedule:
    return Schedule("liveness", liveness_ops(ctx.graph), ctx.budget_bytes)
