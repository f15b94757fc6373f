"""A declarative validation suite: TOML in, CSV + markdown + scatter plot out.

Suite file (see ``validate/cpu.toml``)::

    [suite]
    name = "cpu"
    device = "cpu"
    repeats = 5
    warmup = 2
    time_limit = 60          # optional: policy optimal's planning deadline, seconds
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from snsim.errors import SnsimError
from snsim.training import AMPS, GRADS, OPTIMIZERS

_TOL_KEYS = ("peak_error_median", "peak_error_max", "time_error_median", "time_error_max",
             "grad_abs_max")
_SUITE_KEYS = {"name", "device", "repeats", "warmup", "baselines", "time_limit"}
_CASE_KEYS = {"model", "batch", "input_shape", "policies", "budget", "optimizer", "grads",
              "amp", "offload_optimizer"}


@dataclass(frozen=True)
class Tolerance:
    """|relative error| limits of a suite, and the largest gradient difference."""

    peak_error_median: float
    peak_error_max: float
    time_error_median: float
    time_error_max: float
    grad_abs_max: float


@dataclass(frozen=True)
class SuiteCase:
    """One ``[[case]]``: a model run under each of ``policies``."""

    model: str
    batch: int | None   # None: the example batch of a package.module:function model
    policies: tuple[str, ...]
    input_shape: tuple[int, ...] | None = None
    budget: str | None = None
    optimizer: str | None = None   # a training record (snsim.training): whole step
    grads: str | None = None
    amp: str | None = None
    offload_optimizer: bool = False


@dataclass(frozen=True)
class Suite:
    name: str
    device: str
    repeats: int
    warmup: int
    tolerance: Tolerance
    cases: tuple[SuiteCase, ...]
    baselines: bool
    path: str
    time_limit: float = 60.0   # policy optimal's planning deadline (seconds)


@dataclass(frozen=True)
class Verdict:
    """The suite's medians and maxima, and every tolerance it breaks."""

    peak_median: float
    peak_max: float
    time_median: float
    time_max: float
    failures: tuple[str, ...]
    plain_median: float = 0.0   # |liveness vs plain PyTorch| over the suite's models
    plain_max: float = 0.0


@dataclass(frozen=True)
class BaselineRow:
    """What a user would run instead, measured (or snsim's own run, for comparison)."""

    model: str
    batch: int
    method: str
    measured_peak_bytes: int
    measured_step_ms: float


def _int(p: Path, where: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise SnsimError(f"{p}: {where} must be an integer of at least {least}, not {value!r}")
    return value


def _table(p: Path, doc: dict, key: str) -> dict:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise SnsimError(f"{p}: [{key}] must be a table, not {type(value).__name__}")
    return value


def load_suite(path: str | Path) -> Suite:
    """The suite in ``path``, every field checked (one-line :class:`SnsimError`)."""
    p = Path(path)
    if p.is_dir():
        raise SnsimError(f"{p}: is a directory, not a suite file")
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SnsimError(f"{p}: no such suite file") from None
    except UnicodeDecodeError:
        raise SnsimError(f"{p}: not a text (TOML) file") from None
    except tomllib.TOMLDecodeError as exc:
        raise SnsimError(f"{p}: invalid TOML: {exc}") from None
    unknown = set(doc) - {"suite", "tolerance", "case"}
    if unknown:
        raise SnsimError(f"{p}: unknown table {sorted(unknown)[0]!r} (suite, tolerance, case)")
    suite, tol = _table(p, doc, "suite"), _table(p, doc, "tolerance")
    for key in sorted(set(suite) - _SUITE_KEYS):
        raise SnsimError(f"{p}: [suite] has unknown key {key!r} ({', '.join(sorted(_SUITE_KEYS))})")
    for key in sorted(set(tol) - set(_TOL_KEYS)):
        raise SnsimError(f"{p}: [tolerance] has unknown key {key!r}")
    for k in _TOL_KEYS:
        if isinstance(tol.get(k), bool) or not isinstance(tol.get(k), (int, float)):
            raise SnsimError(f"{p}: [tolerance] needs a number for {k}")
    raw = doc.get("case")
    if not isinstance(raw, list) or not raw:
        raise SnsimError(f"{p}: needs at least one [[case]]")
    cases = []
    for k, c in enumerate(raw, 1):
        where = f"case {k}"
        if not isinstance(c, dict):
            raise SnsimError(f"{p}: {where} must be a table")
        for key in ("model", "batch", "policies"):
            if key not in c and not (key == "batch" and _is_function(c.get("model"))):
                raise SnsimError(f"{p}: {where} has no {key}")
        for key in sorted(set(c) - _CASE_KEYS):
            raise SnsimError(f"{p}: {where} has unknown key {key!r} "
                             f"({', '.join(sorted(_CASE_KEYS))})")
        pols = c["policies"]
        if (not isinstance(pols, list) or not pols
                or not all(isinstance(x, str) and x for x in pols)):
            raise SnsimError(f"{p}: {where}: policies must be a non-empty list of names, "
                             f"not {pols!r}")
        shape = c.get("input_shape")
        if shape is not None and (not isinstance(shape, list) or not shape or not all(
                isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in shape)):
            raise SnsimError(f"{p}: {where}: input_shape must be a list of positive integers, "
                             f"not {shape!r}")
        budget = c.get("budget")
        if budget is not None and not isinstance(budget, str):
            raise SnsimError(f"{p}: {where}: budget must be a string such as \"1.2xlb\"")
        if not isinstance(c["model"], str) or not c["model"]:
            raise SnsimError(f"{p}: {where}: model must be a name")
        batch = _int(p, f"{where}: batch", c["batch"], 1) if "batch" in c else None
        for key, allowed in (("optimizer", OPTIMIZERS), ("grads", GRADS), ("amp", AMPS)):
            if key in c and c[key] not in allowed:
                raise SnsimError(f"{p}: {where}: {key} must be one of {', '.join(allowed)}, "
                                 f"not {c[key]!r}")
        offload = c.get("offload_optimizer", False)
        if not isinstance(offload, bool):
            raise SnsimError(f"{p}: {where}: offload_optimizer must be true or false")
        if offload and c.get("optimizer") in (None, "none"):
            raise SnsimError(f"{p}: {where}: offload_optimizer needs an optimizer with a step")
        cases.append(SuiteCase(model=c["model"], batch=batch,
                               policies=tuple(pols),
                               input_shape=tuple(shape) if shape else None, budget=budget,
                               optimizer=c.get("optimizer"), grads=c.get("grads"),
                               amp=c.get("amp"), offload_optimizer=offload))
    name = suite.get("name", p.stem)
    device = suite.get("device", "cpu")
    if not isinstance(name, str) or not isinstance(device, str):
        raise SnsimError(f"{p}: [suite] name and device must be strings")
    baselines = suite.get("baselines", True)
    if not isinstance(baselines, bool):
        raise SnsimError(f"{p}: [suite] baselines must be true or false")
    limit = suite.get("time_limit", 60.0)
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not (
            0 < limit < float("inf")):
        raise SnsimError(f"{p}: [suite] time_limit must be a positive number of seconds, "
                         f"not {limit!r}")
    return Suite(name=name, device=device,
                 repeats=_int(p, "[suite] repeats", suite.get("repeats", 5), 1),
                 warmup=_int(p, "[suite] warmup", suite.get("warmup", 2), 0),
                 tolerance=Tolerance(**{k: float(tol[k]) for k in _TOL_KEYS}),
                 cases=tuple(cases), baselines=baselines, path=str(p),
                 time_limit=float(limit))


def measure_baselines(case, outcome=None) -> list[BaselineRow]:
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
            rows.append(BaselineRow(case.model, batch.shape[0], name, peak.peak_bytes, ms_))
    finally:
        torch.set_num_threads(threads)
    if outcome is not None:
        rows.append(BaselineRow(case.model, outcome.batch, f"snsim {outcome.policy}",
                                outcome.measured_peak_bytes, outcome.measured_step_ms))
    return rows


def run_suite(path: str, out_dir: str | None, device: str | None = None,
              progress: bool = True) -> int:
    """Run every case; write the report; return 0 only if all tolerances hold."""
    import pandas as pd
    from tqdm import tqdm

    from snsim.validation.run import Case, Session, validate_case

    suite = load_suite(path)
    dev = device or suite.device
    out = Path(out_dir) if out_dir else Path(path).parent / f"report-{suite.name}"
    if out.exists() and not out.is_dir():
        raise SnsimError(f"{out}: exists and is not a folder (the report goes in a folder)")
    cases = [Case(model=c.model, batch=c.batch, policy=pol, input_shape=c.input_shape,
                  budget=c.budget, device=dev, repeats=suite.repeats, warmup=suite.warmup,
                  optimizer=c.optimizer, grads=c.grads, amp=c.amp,
                  offload_optimizer=c.offload_optimizer, time_limit=suite.time_limit)
             for c in suite.cases for pol in c.policies]
    _check_cases(suite)  # every policy and budget, before any model is profiled
    _make_report_folder(out)
    session = Session()
    rows, base_rows = [], []
    for case in tqdm(cases, desc="validate", unit="case", disable=not progress):
        o = validate_case(case, session)
        row = o.to_dict()
        row.pop("policy_stats")   # per policy, not a column of the report
        row["label"] = f"{case.model}/{o.policy}" + (
            f"/{case.optimizer or 'sgd'}/{case.grads or 'resident'}/{case.amp or 'off'}"
            + ("/offload" if case.offload_optimizer else "") if case.training else "")
        row["budget"] = case.budget or ""
        rows.append(row)
    if suite.baselines:
        firsts: dict = {}
        for case in cases:
            firsts.setdefault((case.model, case.batch, case.input_shape), case)
        for case in tqdm(list(firsts.values()), desc="baselines", unit="model",
                         disable=not progress):
            base_rows += measure_baselines(case)
    df = pd.DataFrame(rows)
    verdict = check(df, suite.tolerance)
    _write_report(out, suite, df, pd.DataFrame([asdict(r) for r in base_rows]), verdict, dev)
    for line in verdict.failures:
        print(f"FAIL {line}")
    print(f"{len(df)} cases: peak error median {verdict.peak_median:.1%} max "
          f"{verdict.peak_max:.1%}; time error median {verdict.time_median:.1%} max "
          f"{verdict.time_max:.1%}; liveness vs plain PyTorch peak median "
          f"{verdict.plain_median:.1%} max {verdict.plain_max:.1%}; report in {out}")
    return 0 if not verdict.failures else 1


def _is_function(model) -> bool:
    return isinstance(model, str) and ":" in model and "=" not in model.partition(":")[2]


def _make_report_folder(out: Path) -> None:
    """Create ``out`` and make sure a report can be written in it, before any
    work; one line (and no folder left behind) if it cannot."""
    from snsim.fileio import check_writable

    existed = out.is_dir()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SnsimError(f"cannot create report folder {out}: {exc.strerror or exc}") from None
    try:
        check_writable(out / "report.md")
    except SnsimError:
        if not existed:
            out.rmdir()
        raise


def _check_cases(suite: Suite) -> None:
    """Refuse an unknown policy or a malformed budget before any work starts."""
    from snsim import policies
    from snsim.units import parse_budget

    from snsim.profile.command import check_model

    for k, c in enumerate(suite.cases, 1):
        try:
            check_model(c.model, c.input_shape)
            for pol in c.policies:
                if pol != "best":
                    policies.get(pol)
                if c.offload_optimizer and "offload_optimizer" not in policies.get(pol).options:
                    raise SnsimError(f"offload_optimizer is an option of the swapping "
                                     f"policies, not of {pol}")
            if c.budget is not None:
                parse_budget(c.budget, 1)  # its form; its value is checked against the trace
        except SnsimError as exc:
            if c.budget is not None and "size" in str(exc):
                exc = SnsimError(f"budget {c.budget!r}: {exc}")
            raise SnsimError(f"{suite.path}: case {k} ({c.model}): {exc}") from None


def check(df, tol: Tolerance) -> Verdict:
    """The verdict over the cases the simulator predicted feasible: an
    infeasible prediction's peak and time are those of a truncated run and
    do not enter the statistics (its row stays in the report)."""
    df = df[df["feasible"].astype(bool)]
    if df.empty:
        nan = float("nan")
        return Verdict(nan, nan, nan, nan, ("no case was predicted feasible: nothing to compare",))
    peak = df["peak_error"].abs()
    time = df["time_error"].abs()
    failures = []
    for _, r in df.iterrows():
        if abs(r.peak_error) > tol.peak_error_max:
            failures.append(f"{r.label}: peak error {r.peak_error:+.1%} > "
                            f"{tol.peak_error_max:.0%}")
        if abs(r.time_error) > tol.time_error_max:
            failures.append(f"{r.label}: time error {r.time_error:+.1%} > "
                            f"{tol.time_error_max:.0%}")
        if r.max_grad_abs_diff > tol.grad_abs_max:
            failures.append(f"{r.label}: gradient of {r.get('worst_grad_param')} differs by "
                            f"{r.max_grad_abs_diff:.3g}")
    peak_median, time_median = float(statistics.median(peak)), float(statistics.median(time))
    if peak_median > tol.peak_error_median:
        failures.append(f"median peak error {peak_median:.1%} > {tol.peak_error_median:.0%}")
    if time_median > tol.time_error_median:
        failures.append(f"median time error {time_median:.1%} > {tol.time_error_median:.0%}")
    plain = (df.groupby(["model", "batch"])["plain_peak_error"].first().abs()
             if "plain_peak_error" in df else peak.iloc[:0])
    return Verdict(peak_median, float(peak.max()), time_median, float(time.max()),
                   tuple(failures),
                   float(statistics.median(plain)) if len(plain) else 0.0,
                   float(plain.max()) if len(plain) else 0.0)


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

    config = {"suite": suite.path, "device": dev, "tolerance": asdict(suite.tolerance)}
    if any("optimal" in c.policies for c in suite.cases):
        config["time_limit"] = suite.time_limit
    prov = provenance(config)
    prov["machine"] = machine(dev)
    cols = ["label", "model", "batch", "policy", "budget", "budget_bytes", "feasible",
            "predicted_peak_bytes", "measured_peak_bytes", "peak_error", "predicted_step_ms",
            "measured_step_ms", "time_error", "max_grad_abs_diff", "worst_grad_param",
            "liveness_predicted_peak_bytes", "plain_peak_bytes", "plain_peak_error",
            "lower_bound_bytes", "compute_ms", "measured_reserved_bytes", "device"]
    csv = f"# {json.dumps(prov)}\n" + df[cols].to_csv(index=False)
    write_atomic(out / "results.csv", csv)
    write_json(out / "results.json", {"provenance": prov, "verdict": asdict(verdict),
                                      "results": df.to_dict(orient="records"),
                                      "baselines": base.to_dict(orient="records")})
    scatter(df, out / "scatter.png", prov)
    write_atomic(out / "report.md", _markdown(suite, df, base, verdict, prov))


def _markdown(suite, df, base, verdict, prov) -> str:
    from snsim.units import fmt_bytes

    tol = suite.tolerance
    lines = [f"# Validation report: {suite.name}", "",
             f"Machine: {prov['machine']}  ", f"Run: {prov['created']}, snsim "
             f"{prov['versions']['snsim']}, `{prov['command']}`", "",
             "Predicted (simulator, from the trace alone) against measured (snsim's executor "
             "running the same schedule), and `liveness`'s prediction against plain PyTorch "
             "autograd's measured peak (forward, cross entropy, `loss.backward()`, every "
             "`.grad` allocated). Errors are (measured - predicted) / measured.", "",
             "| | median | max | tolerance (median / max) |", "|---|---|---|---|",
             f"| peak memory error | {verdict.peak_median:.1%} | {verdict.peak_max:.1%} "
             f"| {tol.peak_error_median:.0%} / {tol.peak_error_max:.0%} |",
             f"| step time error | {verdict.time_median:.1%} | {verdict.time_max:.1%} "
             f"| {tol.time_error_median:.0%} / {tol.time_error_max:.0%} |",
             f"| liveness vs plain PyTorch peak error (one per model) | "
             f"{verdict.plain_median:.1%} | {verdict.plain_max:.1%} | reported, not a "
             "tolerance |", "",
             "**Verdict: " + ("PASS" if not verdict.failures else "FAIL") + "**", ""]
    lines += [f"- {f}" for f in verdict.failures]
    lines += ["", "| case | batch | budget | predicted peak | measured peak | error | "
              "predicted ms | measured ms | error | max grad diff | liveness predicted | "
              "plain PyTorch | error |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in df.iterrows():
        lines.append(f"| {r.label} | {r.batch} | {r.budget or '-'} | "
                     f"{fmt_bytes(r.predicted_peak_bytes)} | {fmt_bytes(r.measured_peak_bytes)} "
                     f"| {r.peak_error:+.1%} | {r.predicted_step_ms:.1f} | "
                     f"{r.measured_step_ms:.1f} | {r.time_error:+.1%} | "
                     f"{r.max_grad_abs_diff:.2g} | {fmt_bytes(r.liveness_predicted_peak_bytes)} | "
                     f"{fmt_bytes(r.plain_peak_bytes)} | {r.plain_peak_error:+.1%} |")
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
