#!/usr/bin/env python3
"""README's optimality-gap table (issue 15) from ``snsim experiment optimality-gap``'s CSV.

One row a trace and budget: ``optimal``'s time over pure compute and the plan it
returned (``source``), the solver's status, its gap to ``bound`` (the larger of the
class's and the schedule bound), to ``sbound`` (valid for every schedule), its
planning seconds (``plan_s``, what ``benchmarks/bench_optimal.py`` prints), and
each heuristic's time over the optimum's (``-``: infeasible).  Prints markdown.

    python scripts/optimality_table.py OUT/optimality-gap.csv
"""

from __future__ import annotations

import math
import sys

import pandas as pd

HEURISTICS = ("superneurons", "dtr", "utp", "sqrt-n", "vdnn-all")
HEADER = ("trace", "budget", "`optimal`: time (plan)", "status", "gap (bound)",
          "sgap (sbound)", "solve s") + HEURISTICS


def num(x, spec=".4f") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, spec)


def status(s) -> str:
    """The solver's status as the README writes it (``optimal: ...`` is a heuristic
    already at a bound: no MILP was solved)."""
    s = "-" if pd.isna(s) else str(s)
    if s.startswith("optimal:"):
        for bound in ("moment", "window"):
            if bound in s:
                return f"at {bound} bound"
        return "at compute bound"
    return s.replace("-", " ")


def rows(t: pd.DataFrame) -> list[tuple[str, ...]]:
    over = t[t.policy.isin(HEURISTICS)].set_index(["network", "budget_factor", "policy"])
    out = []
    for r in t[t.policy == "optimal"].itertuples():
        c = r.compute_ms
        time = f"{num(r.time_over_compute)} ({r.source})" if r.feasible else "-"
        gap = f"{num(r.optimality_gap, '.2%')} ({num(r.bound_ms / c)})"
        sgap = f"{num(r.schedule_gap, '.2%')} ({num(r.schedule_bound_ms / c)})"
        heur = tuple(num(over.over_optimal.get((r.network, r.budget_factor, h), math.nan))
                     for h in HEURISTICS)
        out.append((r.network.replace("_", " "), f"{r.budget_factor:.2f}x", time,
                    status(r.status), gap, sgap, f"{r.plan_s:.1f}") + heur)
    return out


def markdown(t: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(t)]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    print(markdown(pd.read_csv(argv[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
