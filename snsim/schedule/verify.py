"""Check that a schedule can run: the rules both executors rely on.

A schedule is rejected (:class:`ScheduleError`, naming the op index) when it

* leaves out, repeats or reorders a route step (``F``/``B``),
* computes a step whose needed tensors are not resident, or are being
  prefetched and not yet waited for,
* uses a tensor after freeing it, or recomputes an output that is resident,
* frees, offloads or waits for a tensor it does not hold,
* prefetches a tensor that has no host copy or is already on the device.
"""

from __future__ import annotations

from snsim.errors import ScheduleError
from snsim.graph import Graph, step_name, tensor_name
from snsim.schedule.ops import Compute, Free, Offload, Prefetch, Schedule, Wait

_ABSENT, _RESIDENT, _INBOUND = 0, 1, 2


def verify(graph: Graph, schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` if ``schedule`` breaks a rule; else return None."""
    state: dict = {}          # tensor -> _RESIDENT | _INBOUND (absent if missing)
    host: set = set()         # tensors with a host copy (offload issued)
    freed_at: dict = {}       # tensor -> op index of its last free
    route = graph.route
    pos = 0

    def fail(k: int, msg: str) -> None:
        raise ScheduleError(f"schedule of {schedule.policy}: op {k} ({schedule.ops[k]}): {msg}")

    for k, op in enumerate(schedule.ops):
        if isinstance(op, Compute):
            step = op.step
            if op.phase in ("F", "B"):
                if pos >= len(route) or route[pos] != step:
                    want = step_name(route[pos]) if pos < len(route) else "nothing"
                    fail(k, f"route step out of order: expected {want}")
                pos += 1
            elif op.phase != "R" or step not in graph._needs:
                fail(k, "unknown step")
            ws = graph.layers[op.layer].workspace
            if op.algo and not 0 <= op.algo < len(ws):
                fail(k, f"layer has no workspace algorithm {op.algo}")
            for t in graph.needs(step):
                s = state.get(t, _ABSENT)
                if s == _INBOUND:
                    fail(k, f"needs {tensor_name(t)}, prefetched but not waited for")
                if s != _RESIDENT:
                    if t in freed_at:
                        fail(k, f"uses {tensor_name(t)} after it was freed at op {freed_at[t]}")
                    fail(k, f"needs {tensor_name(t)}, which is not resident")
            for t in graph.allocs(step):
                s = state.get(t, _ABSENT)
                if s == _INBOUND:
                    fail(k, f"allocates {tensor_name(t)} while it is being prefetched")
                if s == _RESIDENT and t[0] != "S":
                    fail(k, f"allocates {tensor_name(t)}, which is already resident")
                state[t] = _RESIDENT
        elif isinstance(op, Free):
            t = op.tensor
            if state.get(t, _ABSENT) != _RESIDENT:
                fail(k, f"frees {tensor_name(t)}, which it does not hold"
                     + (f" (freed at op {freed_at[t]})" if t in freed_at else ""))
            del state[t]
            freed_at[t] = k
        elif isinstance(op, Offload):
            t = op.tensor
            if state.get(t, _ABSENT) != _RESIDENT:
                fail(k, f"offloads {tensor_name(t)}, which is not resident")
            host.add(t)
        elif isinstance(op, Prefetch):
            t = op.tensor
            if t not in host:
                fail(k, f"prefetches {tensor_name(t)}, which has no host copy")
            if state.get(t, _ABSENT) != _ABSENT:
                fail(k, f"prefetches {tensor_name(t)}, which is already on the device")
            state[t] = _INBOUND
        elif isinstance(op, Wait):
            t = op.tensor
            s = state.get(t, _ABSENT)
            if s == _INBOUND:
                state[t] = _RESIDENT
            elif not (s == _RESIDENT and t in host):
                fail(k, f"waits for {tensor_name(t)}, which has no copy in flight")
        else:
            fail(k, f"unknown operation {type(op).__name__}")
    if pos != len(route):
        raise ScheduleError(f"schedule of {schedule.policy}: ends before route step "
                            f"{step_name(route[pos])}")
