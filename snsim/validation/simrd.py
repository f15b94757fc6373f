"""snsim's ``dtr`` head to head with the DTR authors' simulator (simrd).

    python -m snsim.validation.simrd validate/dtr-simrd.toml [--corpus DIR] [--out DIR]

The suite file names the corpus (the authors' op logs and simrd's
overheads on them, ``simrd_expected.csv``), the policy and the tolerances.
Each log is imported (:mod:`snsim.importers.dtr_log`), each cell planned at
``ratio x baseline_peak_bytes`` and simulated; the overhead is (compute +
recompute) / compute, simrd's ``oom`` is snsim infeasible.  Prints the
side-by-side table and exits 1 when a cell is off by more than
``cell_max``, the median by more than ``median_max``, or feasibility
differs; writes ``report.json`` and ``report.md`` whole (with provenance)
under ``--out``.  Torch-free.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
import tomllib
from pathlib import Path

from snsim.errors import SnsimError


def load_suite(path: Path, corpus: str | None) -> dict:
    try:
        suite = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SnsimError(f"{path}: cannot read the suite: {exc}") from None
    for key in ("corpus", "policy", "cell_max", "median_max"):
        if key not in suite:
            raise SnsimError(f"{path}: missing key {key!r}")
    root = Path(corpus) if corpus else find_corpus(path, suite["corpus"])
    suite["corpus_dir"] = root
    for name in ("logs.zip", "simrd_expected.csv"):
        if not (root / name).exists():
            raise SnsimError(f"{root / name}: no such file (pass --corpus DIR)")
    return suite


def find_corpus(suite_path: Path, corpus: str) -> Path:
    """The suite's ``corpus`` folder: relative to the repository (the suite's
    folder's parent), else, walking up from the repository and from the working
    directory, the first ``shared/corpus/<name>`` found (a worktree beside
    ``shared/``, or a checkout inside it), else the first guess, for the error."""
    repo = suite_path.resolve().parent.parent
    first = (repo / corpus).resolve()
    if (first / "logs.zip").exists():
        return first
    name = Path(corpus).name
    for start in (repo, Path.cwd().resolve()):
        for up in (start, *start.parents):
            cand = up / "shared" / "corpus" / name
            if (cand / "logs.zip").exists():
                return cand
    return first


def expected(root: Path) -> list[dict]:
    with open(root / "simrd_expected.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def run_cell(graph, policy: str, budget: int, thrash: float) -> dict:
    from snsim import policies
    from snsim.policies.base import PlanContext
    from snsim.schedule import verify
    from snsim.sim import simulate

    t = time.perf_counter()
    schedule = policies.plan(policy, PlanContext(graph, budget, thrash))
    verify(graph, schedule)
    r = simulate(graph, schedule, budget, record=False)
    over = (r.compute_ms + r.recompute_ms) / r.compute_ms if r.feasible else None
    return {"feasible": r.feasible, "overhead": over, "reason": r.reason,
            "seconds": round(time.perf_counter() - t, 3)}


def run(suite: dict) -> list[dict]:
    from snsim.graph import Graph
    from snsim.importers.dtr_log import model_name, parse, read_text, to_document
    from snsim.trace.io import from_dict

    root = suite["corpus_dir"]
    want = expected(root)
    logs = {model_name(label): (label, lines) for label, lines in
            read_text(root / "logs.zip")}
    rows = []
    for name in dict.fromkeys(w["log"] for w in want):
        if name not in logs:
            raise SnsimError(f"{root}: simrd_expected.csv names log {name!r}, not in logs.zip")
        t = time.perf_counter()
        label, lines = logs[name]
        trace = from_dict(to_document(parse(lines, label), label), label)
        graph = Graph(trace)
        load_s = time.perf_counter() - t
        base = trace.source["baseline_peak_bytes"]
        for w in (w for w in want if w["log"] == name):
            ratio = float(w["ratio"])
            cell = run_cell(graph, suite["policy"], int(ratio * base),
                            float(suite.get("thrash_limit", 2.0)))
            simrd = None if w["simrd_overhead"] == "oom" else float(w["simrd_overhead"])
            diff = None if simrd is None or cell["overhead"] is None \
                else cell["overhead"] - simrd
            rows.append({"model": w["model"], "log": name, "ratio": ratio,
                         "budget_bytes": int(ratio * base), "simrd": simrd,
                         "snsim": cell["overhead"], "diff": diff,
                         "same_feasibility": (simrd is None) == (cell["overhead"] is None),
                         "reason": cell["reason"], "plan_s": cell["seconds"],
                         "load_s": round(load_s, 3)})
    return rows


def verdict(rows: list[dict], suite: dict) -> tuple[bool, dict]:
    diffs = [abs(r["diff"]) for r in rows if r["diff"] is not None]
    summary = {"cells": len(rows), "compared": len(diffs),
               "median_abs_diff": round(statistics.median(diffs), 4) if diffs else None,
               "max_abs_diff": round(max(diffs), 4) if diffs else None,
               "feasibility_mismatches": sum(not r["same_feasibility"] for r in rows),
               "cell_max": suite["cell_max"], "median_max": suite["median_max"]}
    ok = (summary["feasibility_mismatches"] == 0 and bool(diffs)
          and summary["max_abs_diff"] <= suite["cell_max"]
          and summary["median_abs_diff"] <= suite["median_max"])
    return ok, summary


def _fmt(x) -> str:
    return "oom" if x is None else f"{x:.3f}"


def table(rows: list[dict]) -> str:
    lines = ["| model | ratio | simrd | snsim dtr | diff | plan s |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        flag = "" if r["same_feasibility"] else " (feasibility differs)"
        d = "" if r["diff"] is None else f"{r['diff']:+.3f}"
        lines.append(f"| {r['model']} | {r['ratio']} | {_fmt(r['simrd'])} | "
                     f"{_fmt(r['snsim'])} | {d}{flag} | {r['plan_s']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m snsim.validation.simrd",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("suite", help="suite file (validate/dtr-simrd.toml)")
    ap.add_argument("--corpus", help="folder with logs.zip and simrd_expected.csv "
                    "(default: the suite's corpus relative to the repository, else "
                    "shared/corpus/<name> in the nearest folder above it or the "
                    "working directory that has one)")
    ap.add_argument("--out", help="folder for report.json and report.md")
    args = ap.parse_args(argv)
    try:
        suite = load_suite(Path(args.suite), args.corpus)
        if args.out:
            if not Path(args.out).parent.is_dir():
                raise SnsimError(f"--out {args.out}: folder {Path(args.out).parent} "
                                 "does not exist")
            Path(args.out).mkdir(exist_ok=True)
        rows = run(suite)
    except SnsimError as exc:
        print(f"snsim: error: {exc}", file=sys.stderr)
        return 2
    ok, summary = verdict(rows, suite)
    text = table(rows)
    print(text)
    print(json.dumps(summary))
    if args.out:
        from snsim.fileio import provenance, write_atomic, write_json

        prov = provenance({"suite": args.suite, "policy": suite["policy"],
                           "thrash_limit": suite.get("thrash_limit", 2.0)})
        write_json(Path(args.out) / "report.json",
                   {"provenance": prov, "summary": summary, "pass": ok, "rows": rows})
        write_atomic(Path(args.out) / "report.md",
                     f"# dtr vs simrd ({prov['created']}, snsim "
                     f"{prov['versions']['snsim']})\n\n{text}\n\n"
                     f"{json.dumps(summary)}\n\n{'PASS' if ok else 'FAIL'}\n")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
