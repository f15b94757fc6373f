"""What a planner gets and what the registry keeps about it."""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass
from typing import Any, Callable, Mapping

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
    # planner options by name (e.g. optimal's "time_limit"); others ignore them
    options: Mapping[str, Any] | None = None
    # recomputation may add at most (thrash_limit - 1) x the route's compute (dtr; simrd)
    thrash_limit: float = 2.0

    @property
    def capacity_bytes(self) -> int:
        if self.budget_bytes is not None:
            return self.budget_bytes
        return self.graph.trace.device.memory_bytes


Planner = Callable[[PlanContext], Schedule]


# Trace features a policy may need (simrd's policies declare theirs the same way):
#   "backward": the trace models a backward pass.  A trace whose ``source``
#   says ``"forward_only": true`` (an op log replayed as one sequence, say)
#   does not: a policy that offloads or recomputes *for backward* cannot plan it.
FEATURES = ("backward",)

# Options a policy may accept (register(..., options=...)):
#   "offload_optimizer": the optimizer's state lives on the host and its step
#   runs there (ZeRO-Offload); the swapping policies accept it (DESIGN 3a).
OPTIONS = ("offload_optimizer",)


def trace_features(graph: Graph) -> frozenset[str]:
    """The :data:`FEATURES` that ``graph``'s trace has."""
    have = set()
    if not graph.trace.source.get("forward_only"):
        have.add("backward")
    return frozenset(have)


@dataclass(frozen=True)
class PolicyInfo:
    name: str
    summary: str
    planner: Planner
    order: int = 100
    needs: frozenset[str] = frozenset()   # trace features it cannot plan without
    reference: bool = False   # an expensive reference (optimal): not among names() / "all"
    options: frozenset[str] = frozenset()   # plan options it accepts (OPTIONS)


@contextlib.contextmanager
def no_cyclic_gc():
    """Pause Python's cyclic garbage collector while planning.

    A plan for a 10^4-layer trace allocates ~10^5 small objects and no
    reference cycles (refcounting frees them); with other large graphs alive
    in the process, the collector's full passes cost 15-20% of the planning
    time.  The previous state is restored on exit.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
