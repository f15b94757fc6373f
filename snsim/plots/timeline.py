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

    Forward and backward are shaded (from the first result), the lower bound
    and the budget are horizontal lines.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gib = 2**30
    fig, ax = plt.subplots(figsize=(9, 4.5))
    first = results[0]
    end = max(r.iteration_ms for r in results) or 1.0
    ax.axvspan(0, first.forward_end_ms, color="#dde8f5", label="forward")
    ax.axvspan(first.forward_end_ms, first.iteration_ms, color="#f7e3d7", label="backward")
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
    ax.set_xlim(0, end)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("time in iteration (ms)")
    ax.set_ylabel("device memory (GiB)")
    ax.set_title(f"{first.model}, batch {first.batch}: memory over one iteration")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    meta = {"Software": "snsim", "Description": json.dumps(provenance or {})}
    write_with(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120, metadata=meta))
    plt.close(fig)
