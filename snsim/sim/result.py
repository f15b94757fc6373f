"""Typed results of one simulated iteration (DESIGN.md section 4)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class Stream(str, Enum):
    """Where an interval ran (equal to its plain string, so JSON and old callers read it)."""

    COMPUTE = "compute"
    H2D = "h2d"
    D2H = "d2h"


class IntervalKind(str, Enum):
    STEP = "step"            # a route step, F or B
    RECOMPUTE = "recompute"  # an R step
    COPY = "copy"            # an offload or prefetch on a copy engine
    STALL = "stall"          # the compute stream waiting (for a copy or for memory)


class LevelKind(str, Enum):
    """What changed the memory level at a :class:`MemoryPoint`."""

    STATIC = "static"        # weights and weight gradients, at time 0
    STEP = "step"            # a compute step's allocations and workspace
    WORKSPACE_END = "workspace"
    FREE = "free"            # a free (or the end of an offload a free waited for)
    PREFETCH = "prefetch"


@dataclass(frozen=True, slots=True)
class Interval:
    """Something that ran on a stream: compute step, copy, or a stall."""

    start_ms: float
    end_ms: float
    stream: Stream
    name: str     # "F3", "B3", "R3", "X3", "stall"
    detail: str = ""
    kind: IntervalKind = IntervalKind.STEP


@dataclass(frozen=True, slots=True)
class MemoryPoint:
    """The memory level right after something changed it."""

    time_ms: float
    level_bytes: int
    what: str     # "F3", "free X3", "prefetch X3", "workspace", "static"
    kind: LevelKind = LevelKind.STEP


@dataclass(frozen=True)
class SimResult:
    policy: str
    trace: str
    model: str
    batch: int
    budget_bytes: int | None
    capacity_bytes: int
    feasible: bool
    peak_bytes: int
    static_bytes: int
    lower_bound_bytes: int
    iteration_ms: float
    compute_ms: float
    recompute_ms: float
    stall_ms: float
    h2d_bytes: int
    d2h_bytes: int
    samples_per_s: float
    reason: str | None = None
    optimizer_state_bytes: int = 0
    optimizer_ms: float = 0.0
    forward_end_ms: float = 0.0
    # False for a plan its planner declared infeasible: the simulator did not
    # replay it, so there is no partial time, peak or traffic to report
    replayed: bool = True
    policy_stats: dict[str, Any] = field(default_factory=dict)
    timeline: tuple[MemoryPoint, ...] = ()
    intervals: tuple[Interval, ...] = ()
    # TO_HOST op index -> index of the first op the compute stream had not begun
    # when that copy ended (its device memory, if freed meanwhile, is released
    # before that op takes its own); the CPU executor's memory runs keep this order
    offload_ends: dict[int, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` object: DESIGN section 4 keys first, then extras, then ``policy_stats``."""
        d = {k: getattr(self, k) for k in (
            "policy", "trace", "budget_bytes", "feasible", "peak_bytes", "static_bytes",
            "lower_bound_bytes", "iteration_ms", "compute_ms", "recompute_ms", "stall_ms",
            "h2d_bytes", "d2h_bytes", "samples_per_s", "optimizer_state_bytes",
            "optimizer_ms")}
        if not self.feasible:
            # a run that stopped part-way has no iteration time and no peak: what
            # it reached before stopping is kept under its own name, not as a number
            # that reads as a result (a time too short, a peak below the lower bound)
            d["reason"] = self.reason
            d["partial_iteration_ms"], d["iteration_ms"] = d["iteration_ms"], None
            d["partial_peak_bytes"], d["peak_bytes"] = d["peak_bytes"], None
            d["replayed"] = self.replayed
            if not self.replayed:   # nothing ran: no partial figures (the planner's
                # own counters are in policy_stats)
                d["partial_iteration_ms"] = d["partial_peak_bytes"] = None
        d["model"] = self.model
        d["batch"] = self.batch
        d["capacity_bytes"] = self.capacity_bytes
        d["peak_over_lower_bound"] = (round(self.peak_bytes / self.lower_bound_bytes, 6)
                                      if self.feasible else None)
        d["time_over_compute"] = (round(self.iteration_ms / self.compute_ms, 6)
                                  if self.compute_ms > 0 and self.feasible else None)
        # the planner's own counters, under their own key: never beside (or over) a contract key
        d["policy_stats"] = dict(self.policy_stats)
        return d

    def event_log(self) -> list[dict[str, Any]]:
        return [asdict(iv) for iv in self.intervals]
