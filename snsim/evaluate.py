"""One point of the evaluation: plan a policy on a graph under a budget, verify
the schedule against the ledger, simulate it (a plan its planner declared
infeasible is not verified: the simulator does not replay it).

This is the one copy of that sequence; the CLI (``simulate``), the validation
runner, the capacity searches, the sweeps and the benchmarks call it.  The
record it returns is typed and frozen; an infeasible point is a record whose
``result.feasible`` is false with its ``reason``, never an exception.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from snsim.graph import Graph
from snsim.schedule.ops import Schedule
from snsim.sim.result import SimResult


@dataclass(frozen=True)
class Evaluation:
    """One evaluated (trace, policy, budget) point."""

    policy: str
    budget_bytes: int | None
    schedule: Schedule
    result: SimResult
    plan_s: float      # wall time of planning (and verifying) the schedule
    simulate_s: float  # wall time of the simulation

    @property
    def feasible(self) -> bool:
        return self.result.feasible

    def row(self) -> dict[str, Any]:
        """The point as one flat row of a tidy table (contract keys of ``--json``,
        then the wall times); ``policy_stats`` are left out (they differ per policy)."""
        d = self.result.to_dict()
        d.pop("policy_stats", None)
        d.setdefault("reason", None)
        d["plan_s"] = round(self.plan_s, 6)
        d["simulate_s"] = round(self.simulate_s, 6)
        return d


def evaluate(graph: Graph, policy: str, budget_bytes: int | None = None, *,
             record: bool = False, options: Mapping[str, Any] | None = None,
             context=None) -> Evaluation:
    """Plan ``policy`` (a registered name) for ``graph`` under ``budget_bytes``
    (None: the trace device's memory), verify, simulate (a plan its planner
    declared infeasible is not verified: the simulator does not replay it).

    ``context`` is a :class:`~snsim.policies.base.PlanContext` to share between
    policies of one graph and budget (planners cache their analysis on it).
    """
    from snsim import policies
    from snsim.policies.base import PlanContext
    from snsim.schedule import verify
    from snsim.sim import simulate

    ctx = context if context is not None else PlanContext(graph, budget_bytes, options)
    # the cyclic collector paused for the whole point, not only inside each phase:
    # re-enabled between them, its first pass walked every op just made (the plan,
    # then the effects), which is acyclic and freed by reference counting
    was = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        schedule = policies.plan(policy, ctx)
        if schedule.infeasible_reason is None:
            # what is simulated is verified first; an infeasible plan is not
            # replayed (its record is the reason and the planner's stats), and
            # whatever runs it (the executor, ``snsim schedule``) checks it then
            verify(graph, schedule)
        t1 = time.perf_counter()
        result = simulate(graph, schedule, budget_bytes, record=record)
        t2 = time.perf_counter()
    finally:
        if was:
            gc.enable()
    return Evaluation(policy, budget_bytes, schedule, result, t1 - t0, t2 - t1)


def evaluate_many(graph: Graph, names: Iterable[str], budget_bytes: int | None = None, *,
                  record: bool = False,
                  options: Mapping[str, Any] | None = None) -> list[Evaluation]:
    """:func:`evaluate` for each policy in ``names`` with one shared plan context."""
    from snsim.policies.base import PlanContext

    ctx = PlanContext(graph, budget_bytes, options)
    return [evaluate(graph, n, budget_bytes, record=record, context=ctx) for n in names]
