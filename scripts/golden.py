"""Record every shipped trace's ``--json`` result under every policy (tests/golden).

    .venv/bin/python scripts/golden.py        # rewrites tests/golden/simulate.json

Two budgets per trace: the trace device's memory and 1.5x the lower bound.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from snsim import policies
from snsim.graph import Graph
from snsim.policies.base import PlanContext
from snsim.schedule import verify
from snsim.sim import simulate
from snsim.trace import load
from snsim.units import parse_budget

ROOT = Path(__file__).resolve().parent.parent
BUDGETS = (None, "1.5xlb")


def record(path: Path, keys: set[str] | None = None) -> dict[str, dict]:
    """``"trace|budget|policy"`` -> the ``--json`` object, for one trace."""
    g = Graph(load(str(path)))
    out = {}
    for b in BUDGETS:
        budget = parse_budget(b, g.lower_bound_bytes) if b else None
        ctx = PlanContext(g, budget)
        for name in policies.names():
            key = f"{path.name}|{b}|{name}"
            if keys is not None and key not in keys:
                continue
            if keys is None and "2500" in path.name and name == "dtr":
                continue
            schedule = policies.plan(name, ctx)
            verify(g, schedule)
            d = simulate(g, schedule, budget).to_dict()
            d["trace"] = path.name
            out[key] = d
    return out


def main() -> int:
    out = {}
    for p in sorted((ROOT / "traces").glob("*.json")):
        out.update(record(p))
        print(p.name, file=sys.stderr)
    from snsim.fileio import write_atomic

    write_atomic(ROOT / "tests" / "golden" / "simulate.json",
                 json.dumps(out, indent=0, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
