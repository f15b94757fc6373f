"""The simulator: replay a schedule with simpy (compute + two copy engines)."""

from snsim.sim.engine import simulate
from snsim.sim.result import Interval, MemoryPoint, SimResult

__all__ = ["simulate", "SimResult", "Interval", "MemoryPoint"]
