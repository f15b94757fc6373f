"""A declarative validation suite: TOML in, CSV + markdown + scatter plot out.

Suite file (see ``validate/cpu.toml``)::

    [suite]
    name = "cpu"
    device = "cpu"
    repeats = 5
    warmup = 2
    [tolerance]              # |relative error| limits
    peak_error_median = 0.03
    peak_error_max = 0.10
    time_error_median = 0.10
    time_error_max = 0.25
    grad_abs_max = 1e-5
    [[case]]
    model = "resnet18"
    batch = 8
    input_shape = [3, 64, 64]
    policies = ["liveness", "cost-aware", "utp", "superneurons"]
    budget = "1.2xlb"        # optional

The run exits non-zero when any case or median breaks its tolerance.
"""

from __future__ import annotations

import json
import statistics
import tomllib
from pathlib import Path
from typing import Any

from snsim.errors import SnsimError

_TOL_KEYS = ("peak_error_median", "peak_error_max", "time_error_median", "time_error_max",
             "grad_abs_max")


def load_suite(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SnsimError(f"{p}: no such suite file") from None
    except tomllib.TOMLDecodeError as exc:
        raise SnsimError(f"{p}: invalid TOML: {exc}") from None
    suite = doc.get("suite", {})
    tol = doc.get("tolerance", {})
    for k in _TOL_KEYS:
        if not isinstance(tol.get(k), (int, float)):
            raise SnsimError(f"{p}: [tolerance] needs a number for {k}")
    cases = doc.get("case")
    if not isinstance(cases, list) or not cases:
        raise SnsimError(f"{p}: needs at least one [[case]]")
    for k, c in enumerate(cases):
        for key in ("model", "batch", "policies"):
            if key not in c:
                raise SnsimError(f"{p}: case {k + 1} has no {key}")
    return {"name": suite.get("name", p.stem), "device": suite.get("device", "cpu"),
            "repeats": int(suite.get("repeats", 5)), "warmup": int(suite.get("warmup", 2)),
            "tolerance": {k: float(tol[k]) for k in _TOL_KEYS}, "cases": cases,
            "baselines": bool(suite.get("baselines", True)), "path": str(p)}


def measure_baselines(case, outcome=None) -> list[dict[str, Any]]:
    """Measured peak and step time of plain autograd, checkpointing, save_on_cpu."""
    import torch

    from snsim.execute.baselines import BASELINES
    from snsim.execute.memory import measure_peak, time_ms
    from snsim.validation.run import build_program

    dev = torch.device(case.device)
    threads = torch.get_num_threads()
    if dev.type == "cpu":
        torch.set_num_threads(1)
    rows = []
    try:
        ms, example, program = build_program(case)
        batch = example.cpu()
        existing = program.existing_bytes()
        for name, make in BASELINES.items():
            step = make(program, batch)
            if step is None:
                continue

            def once(step=step) -> None:
                for p in program.param_list:
                    p.grad = torch.zeros_like(p)
                step()

            def release() -> None:
                for p in program.param_list:
                    p.grad = None

            peak = measure_peak(once, dev, existing, release=release)
            ms_, _ = time_ms(step, dev, case.warmup, case.repeats)
            rows.append({"model": case.model, "batch": case.batch, "method": name,
                         "measured_peak_bytes": peak.peak_bytes, "measured_step_ms": ms_})
    finally:
        torch.set_num_threads(threads)
    if outcome is not None:
        rows.append({"model": case.model, "batch": case.batch,
                     "method": f"snsim {outcome.policy}",
                     "measured_peak_bytes": outcome.measured_peak_bytes,
                     "measured_step_ms": outcome.measured_step_ms})
    return rows


def run_suite(path: str, out_dir: str | None, device: str | None = None) -> int:
    """Run every case; write the report; return 0 only if all tolerances hold."""
    import pandas as pd
    from tqdm import tqdm

    from snsim.validation.run import Case, Session, validate_case

    suite = load_suite(path)
    dev = device or suite["device"]
    out = Path(out_dir) if out_dir else Path(path).parent / f"report-{suite['name']}"
    out.mkdir(parents=True, exist_ok=True)
    cases = []
    for c in suite["cases"]:
        for pol in c["policies"]:
            cases.append(Case(model=c["model"], batch=int(c["batch"]), policy=pol,
                              input_shape=tuple(c["input_shape"]) if c.get("input_shape")
                              else None, budget=c.get("budget"), device=dev,
                              repeats=suite["repeats"], warmup=suite["warmup"]))
    session = Session()
    rows, base_rows = [], []
    for case in tqdm(cases, desc="validate", unit="case"):
        o = validate_case(case, session)
        row = o.to_dict()
        row["label"] = f"{case.model}/{o.policy}"
        row["budget"] = case.budget or ""
        rows.append(row)
    if suite["baselines"]:
        seen = set()
        for case in cases:
            key = (case.model, case.batch, case.input_shape)
            if key not in seen:
                seen.add(key)
                base_rows += measure_baselines(case)
    df = pd.DataFrame(rows)
    verdict = check(df, suite["tolerance"])
    _write_report(out, suite, df, pd.DataFrame(base_rows), verdict, dev)
    for line in verdict["failures"]:
        print(f"FAIL {line}")
    print(f"{len(df)} cases: peak error median {verdict['peak_median']:.1%} max "
          f"{verdict['peak_max']:.1%}; time error median {verdict['time_median']:.1%} max "
          f"{verdict['time_max']:.1%}; report in {out}")
    return 0 if not verdict["failures"] else 1


def check(df, tol: dict[str, float]) -> dict[str, Any]:
    peak = df["peak_error"].abs()
    time = df["time_error"].abs()
    failures = []
    for _, r in df.iterrows():
        if abs(r.peak_error) > tol["peak_error_max"]:
            failures.append(f"{r.label}: peak error {r.peak_error:+.1%} > "
                            f"{tol['peak_error_max']:.0%}")
        if abs(r.time_error) > tol["time_error_max"]:
            failures.append(f"{r.label}: time error {r.time_error:+.1%} > "
                            f"{tol['time_error_max']:.0%}")
        if r.max_grad_abs_diff > tol["grad_abs_max"]:
            failures.append(f"{r.label}: gradient differs by {r.max_grad_abs_diff:.3g}")
    v = {"peak_median": float(statistics.median(peak)), "peak_max": float(peak.max()),
         "time_median": float(statistics.median(time)), "time_max": float(time.max())}
    if v["peak_median"] > tol["peak_error_median"]:
        failures.append(f"median peak error {v['peak_median']:.1%} > "
                        f"{tol['peak_error_median']:.0%}")
    if v["time_median"] > tol["time_error_median"]:
        failures.append(f"median time error {v['time_median']:.1%} > "
                        f"{tol['time_error_median']:.0%}")
    v["failures"] = failures
    return v


def machine(dev: str) -> str:
    import os

    import torch

    from snsim.profile.profiler import cpu_name

    text = f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, 1 thread"
    if dev == "cuda" and torch.cuda.is_available():
        text += f", GPU {torch.cuda.get_device_name()}"
    return text


def _write_report(out: Path, suite, df, base, verdict, dev) -> None:
    from snsim.fileio import provenance, write_atomic, write_json
    from snsim.validation.plot import scatter

    prov = provenance({"suite": suite["path"], "device": dev, "tolerance": suite["tolerance"]})
    prov["machine"] = machine(dev)
    cols = ["label", "model", "batch", "policy", "budget", "budget_bytes", "feasible",
            "predicted_peak_bytes", "measured_peak_bytes", "peak_error", "predicted_step_ms",
            "measured_step_ms", "time_error", "max_grad_abs_diff", "lower_bound_bytes",
            "compute_ms", "measured_reserved_bytes", "device"]
    csv = f"# {json.dumps(prov)}\n" + df[cols].to_csv(index=False)
    write_atomic(out / "results.csv", csv)
    write_json(out / "results.json", {"provenance": prov, "verdict": verdict,
                                      "results": df.to_dict(orient="records"),
                                      "baselines": base.to_dict(orient="records")})
    scatter(df, out / "scatter.png", prov)
    write_atomic(out / "report.md", _markdown(suite, df, base, verdict, prov))


def _markdown(suite, df, base, verdict, prov) -> str:
    from snsim.units import fmt_bytes

    tol = suite["tolerance"]
    lines = [f"# Validation report: {suite['name']}", "",
             f"Machine: {prov['machine']}  ", f"Run: {prov['created']}, snsim "
             f"{prov['versions']['snsim']}, `{prov['command']}`", "",
             "Predicted (simulator, from the trace alone) against measured (snsim's executor "
             "running the same schedule). Errors are (measured - predicted) / measured.", "",
             f"| | median | max | tolerance (median / max) |", "|---|---|---|---|",
             f"| peak memory error | {verdict['peak_median']:.1%} | {verdict['peak_max']:.1%} "
             f"| {tol['peak_error_median']:.0%} / {tol['peak_error_max']:.0%} |",
             f"| step time error | {verdict['time_median']:.1%} | {verdict['time_max']:.1%} "
             f"| {tol['time_error_median']:.0%} / {tol['time_error_max']:.0%} |", "",
             "**Verdict: " + ("PASS" if not verdict["failures"] else "FAIL") + "**", ""]
    lines += [f"- {f}" for f in verdict["failures"]]
    lines += ["", "| case | batch | budget | predicted peak | measured peak | error | "
              "predicted ms | measured ms | error | max grad diff |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in df.iterrows():
        lines.append(f"| {r.label} | {r.batch} | {r.budget or '-'} | "
                     f"{fmt_bytes(r.predicted_peak_bytes)} | {fmt_bytes(r.measured_peak_bytes)} "
                     f"| {r.peak_error:+.1%} | {r.predicted_step_ms:.1f} | "
                     f"{r.measured_step_ms:.1f} | {r.time_error:+.1%} | "
                     f"{r.max_grad_abs_diff:.2g} |")
    if len(base):
        lines += ["", "## What a user would run instead (measured)", "",
                  "| model | method | peak | step ms |", "|---|---|---|---|"]
        for _, r in base.iterrows():
            lines.append(f"| {r.model} | {r.method} | {fmt_bytes(r.measured_peak_bytes)} | "
                         f"{r.measured_step_ms:.1f} |")
        lines.append("")
        lines.append("snsim rows for comparison: the cases above (same model and batch).")
    lines += ["", "Files: `results.csv`, `results.json`, `scatter.png`.", ""]
    return "\n".join(lines)
