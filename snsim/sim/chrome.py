"""Chrome trace event format export of a simulated iteration (open in Perfetto).

Streams become threads of one process; memory level is a counter track.
Timestamps are microseconds, as the format requires.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from snsim.sim.result import SimResult

_TIDS = {"compute": 1, "h2d": 2, "d2h": 3}
_STEP = re.compile(r"^([A-Z]+)(\d+)$")


def event_name(name: str, layer_names: Sequence[str] | None) -> str:
    """``F23`` -> ``F23 blocks.1.conv3.0`` (the step or tensor and its layer)."""
    m = _STEP.match(name)
    if m is None or layer_names is None or int(m.group(2)) >= len(layer_names):
        return name
    return f"{name} {layer_names[int(m.group(2))]}"


def chrome_trace(result: SimResult, provenance: dict[str, Any] | None = None,
                 layer_names: Sequence[str] | None = None) -> dict[str, Any]:
    """The Chrome trace document of ``result``; events are named by step (or
    tensor) and layer when ``layer_names`` (the trace's, by layer id) is given."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": 1, "name": "process_name",
         "args": {"name": f"snsim {result.policy} on {result.model}"}},
    ]
    for stream, tid in _TIDS.items():
        events.append({"ph": "M", "pid": 1, "tid": tid, "name": "thread_name",
                       "args": {"name": stream}})
    for iv in result.intervals:
        cat = "stall" if iv.name == "stall" else (
            "recompute" if iv.name.startswith("R") and iv.stream == "compute" else iv.stream)
        ev = {"ph": "X", "pid": 1, "tid": _TIDS[iv.stream],
              "name": event_name(iv.name, layer_names), "cat": cat, "ts": iv.start_ms * 1e3,
              "dur": (iv.end_ms - iv.start_ms) * 1e3}
        if iv.detail:
            ev["args"] = {"detail": iv.detail}
        events.append(ev)
    for p in result.timeline:
        events.append({"ph": "C", "pid": 1, "name": "memory", "ts": p.time_ms * 1e3,
                       "args": {"MiB": round(p.level_bytes / 2**20, 3)}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"snsim": provenance or {}, "result": result.to_dict()}}
