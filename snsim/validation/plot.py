"""Predicted against measured: peak memory and step time, one point per case."""

from __future__ import annotations

import json
from pathlib import Path

from snsim.fileio import write_with
from snsim.plots.style import color, marker


def scatter(df, path: str | Path, provenance: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
    panels = [("predicted_peak_bytes", "measured_peak_bytes", 2**20, "peak memory (MiB)"),
              ("predicted_step_ms", "measured_step_ms", 1.0, "step time (ms)")]
    for ax, (px, mx, scale, title) in zip(axes, panels):
        for policy, sub in df.groupby("policy"):
            ax.scatter(sub[px] / scale, sub[mx] / scale, color=color(policy),
                       marker=marker(policy), label=policy, s=36)
        lo = min((df[px] / scale).min(), (df[mx] / scale).min()) * 0.9
        hi = max((df[px] / scale).max(), (df[mx] / scale).max()) * 1.1
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="measured = predicted")
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):  # 1-2-5 ticks as plain numbers
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"predicted {title}")
        ax.set_ylabel(f"measured {title}")
        ax.set_title(title)
    axes[0].legend(fontsize=7)
    fig.suptitle("snsim validation: simulator against real execution")
    fig.tight_layout()
    meta = {"Software": "snsim", "Description": json.dumps(provenance)}
    write_with(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120, metadata=meta))
    plt.close(fig)
