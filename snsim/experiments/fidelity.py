"""fidelity: predicted against measured, read from the validation suite's report
(``snsim validate --suite validate/cpu.toml`` writes ``results.csv``)."""

from __future__ import annotations

from pathlib import Path

from snsim.errors import SnsimError
from snsim.experiments.base import Options, Outcome, checkout_file

REPORT = Path("validate") / "report-cpu" / "results.csv"


def report_path() -> Path:
    """The report in the current folder, else in the source checkout snsim runs from."""
    found = checkout_file(REPORT)
    if found is not None:
        return found
    raise SnsimError(f"fidelity reads the validation report {REPORT}, not found here or "
                     "in the source checkout: run snsim validate --suite validate/cpu.toml "
                     "--out validate/report-cpu first")


def check_fidelity() -> None:
    report_path()


def run_fidelity(opts: Options) -> Outcome:
    import pandas as pd

    path = report_path()
    table = pd.read_csv(path, comment="#")
    need = {"model", "policy", "predicted_peak_bytes", "measured_peak_bytes",
            "predicted_step_ms", "measured_step_ms"}
    if not need <= set(table.columns):
        raise SnsimError(f"{path} lacks columns {sorted(need - set(table.columns))}")
    table.insert(0, "report", str(path))
    return Outcome(table, _draw, {"report": str(path)},
                   f"fidelity: {len(table)} validated cases from {path}")


def _draw(t, plt):
    from snsim.plots.style import color, marker

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.6))
    for p, s in t.groupby("policy", sort=False):
        a1.scatter(s.measured_peak_bytes / 2**20, s.predicted_peak_bytes / 2**20,
                   color=color(p), marker=marker(p), label=p, s=24)
        a2.scatter(s.measured_step_ms, s.predicted_step_ms, color=color(p), marker=marker(p),
                   label=p, s=24)
    peaks = list(t.measured_peak_bytes / 2**20) + list(t.predicted_peak_bytes / 2**20)
    times = list(t.measured_step_ms) + list(t.predicted_step_ms)
    for ax, what, vals in ((a1, "peak memory (MiB)", peaks), (a2, "step time (ms)", times)):
        vals = [v for v in vals if v == v and v > 0]
        lim = (min(vals) * 0.8, max(vals) * 1.25)
        ax.plot(lim, lim, color="k", lw=0.8, ls=":", label="predicted = measured")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"measured {what}")
        ax.set_ylabel(f"predicted {what}")
    a1.set_title("Peak memory: simulator against the executor", fontsize=10)
    a2.set_title("Step time: simulator against the executor", fontsize=10)
    a2.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig
