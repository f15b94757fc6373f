"""Schedules: the explicit plans policies produce and executors run."""

from snsim.schedule.ops import Compute, Free, Offload, Op, Prefetch, Schedule, Wait
from snsim.schedule.verify import verify

__all__ = ["Compute", "Free", "Offload", "Prefetch", "Wait", "Op", "Schedule", "verify"]
