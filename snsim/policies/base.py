"""What a planner gets and what the registry keeps about it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from snsim.graph import Graph
from snsim.schedule.ops import Schedule


@dataclass(frozen=True)
class PlanContext:
    """Everything a policy may look at: the trace's graph and the budget.

    ``capacity_bytes`` is the memory the schedule must fit in (the budget, or
    the device's memory when no budget is given).
    """

    graph: Graph
    budget_bytes: int | None = None

    @property
    def capacity_bytes(self) -> int:
        if self.budget_bytes is not None:
            return self.budget_bytes
        return self.graph.trace.device.memory_bytes


Planner = Callable[[PlanContext], Schedule]


@dataclass(frozen=True)
class PolicyInfo:
    name: str
    summary: str
    planner: Planner
    order: int = 100
