"""Memory level over one simulated iteration."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from snsim.fileio import write_with
from snsim.plots.style import color
from snsim.sim.result import SimResult


def plot_timeline(results: Sequence[SimResult], path: str | Path,
                  provenance: dict[str, Any] | None = None) -> None:
    """Draw memory level (GiB) against time for each result; write ``path`` whole.

    The format follows the extension (png, svg, pdf; anything else is
    refused).  Forward and backward are shaded from the first feasible result
    (an infeasible one stops early), the lower bound and the budget (the
    device's memory when none was given) are horizontal lines, and the legend
    sits right of the axes, off the data.
    """
    from snsim.inputs import plot_format

    fmt = plot_format(str(path))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gib = 2**30
    fig, ax = plt.subplots(figsize=(11, 4.5))
    first = results[0]
    shade = next((r for r in results if r.feasible), None)
    end = max(r.iteration_ms for r in results) or 1.0
    if shade is not None:
        ax.axvspan(0, shade.forward_end_ms, color="#dde8f5", label="forward")
        ax.axvspan(shade.forward_end_ms, shade.iteration_ms, color="#f7e3d7", label="backward")
    for r in results:
        times = [p.time_ms for p in r.timeline] + [r.iteration_ms]
        levels = [p.level_bytes / gib for p in r.timeline]
        levels.append(levels[-1])
        label = f"{r.policy} (peak {r.peak_bytes / gib:.2f} GiB)"
        if not r.feasible:
            label += " infeasible"
        ax.step(times, levels, where="post", color=color(r.policy), lw=1.2, label=label)
    ax.axhline(first.lower_bound_bytes / gib, color="k", ls="--", lw=1, label="lower bound")
    if first.budget_bytes is not None:
        ax.axhline(first.budget_bytes / gib, color="#d62728", ls=":", lw=1, label="budget")
    else:
        ax.axhline(first.capacity_bytes / gib, color="#d62728", ls=":", lw=1,
                   label="budget (device memory)")
    ax.set_xlim(0, end)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("time in iteration (ms)")
    ax.set_ylabel("device memory (GiB)")
    ax.set_title(f"{first.model}, batch {first.batch}: memory over one iteration")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, borderaxespad=0)
    fig.tight_layout()
    desc = json.dumps(provenance or {})
    meta = ({"Software": "snsim", "Description": desc} if fmt == "png" else
            {"Creator": "snsim", "Description": desc} if fmt == "svg" else
            {"Creator": "snsim", "Subject": desc})
    try:
        write_with(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=120, metadata=meta))
    finally:
        plt.close(fig)
