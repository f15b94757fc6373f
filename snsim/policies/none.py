"""``none``: run the route and free nothing (workspaces aside).

The baseline every framework without memory planning gets: every forward
output, saved extra and gradient stays allocated until the iteration ends.
"""

from snsim.policies import register
from snsim.policies.base import PlanContext
from snsim.schedule.ops import Compute, Schedule


@register("none", "keep every tensor until the iteration ends", order=0)
def plan_none(ctx: PlanContext) -> Schedule:
    ops = [Compute(phase, i) for phase, i in ctx.graph.route]
    return Schedule("none", ops, ctx.budget_bytes)
