"""peak-memory and budget-sweep: what each policy needs, and how fast it runs as
the budget shrinks to the lower bound."""

from __future__ import annotations

from snsim.experiments.base import (GiB, PAPER_POLICIES, Options, Outcome, network,
                                    networks)
from snsim.sweep import grid, run_sweep

FACTORS = (1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 3.0)
QUICK_FACTORS = (1.0, 1.25, 2.0)


def sweep(points, opts: Options):
    return run_sweep(points, opts.cache, workers=opts.workers, scheduler=opts.scheduler,
                     progress=opts.progress).table


LADDER = (1.0, 1.1, 1.25, 1.5, 2.0, None)  # x lower bound; None = the device's memory


def run_peak_memory(opts: Options) -> Outcome:
    """The least peak each policy trains each network in: every policy planned at a
    ladder of budgets (multiples of the lower bound, and the whole device), the
    smallest feasible peak kept (``least`` marks its row).  At the device's memory
    alone, utp and superneurons keep everything they can (their caches spill only
    when memory is short), which hides what they save."""
    nets = networks(opts)
    specs = [network(n, b, opts.device_model) for n, b in nets.items()]
    table = sweep(grid(specs, PAPER_POLICIES, budget_factor=LADDER), opts)
    table.insert(0, "network", [s.model for s in specs for _ in PAPER_POLICIES for _ in LADDER])
    ok = table[table.feasible]
    least = ok.groupby(["network", "policy"]).peak_bytes.idxmin()
    table["least"] = table.index.isin(least.values)
    return Outcome(table, _draw_peaks, {"networks": nets, "policies": list(PAPER_POLICIES),
                                        "budget_ladder": ["device" if f is None else f
                                                          for f in LADDER]})


def _draw_peaks(t, plt):
    from snsim.plots.style import color

    nets = list(dict.fromkeys(t.network))
    pols = list(dict.fromkeys(t.policy))
    # the least peak per (network, policy); a pair that never fits is drawn hatched
    best = t[t.least].set_index(["network", "policy"])
    dev = t[t.budget_factor.isna()].set_index(["network", "policy"])
    fig, ax = plt.subplots(figsize=(11, 4.5))
    w = 0.8 / len(pols)
    for k, p in enumerate(pols):
        keys = [(n, p) for n in nets]
        sub = best.reindex(keys).combine_first(dev.reindex(keys))
        sub["feasible"] = sub.feasible.fillna(False).astype(bool)
        xs = [i + (k - (len(pols) - 1) / 2) * w for i in range(len(nets))]
        peak = sub.peak_bytes.where(sub.feasible, sub.capacity_bytes) / GiB
        bars = ax.bar(xs, peak, w, color=color(p), label=p)
        for bar, ok in zip(bars, sub.feasible):
            if not ok:  # over the budget: drawn at the capacity, hatched
                bar.set_hatch("//")
                bar.set_alpha(0.45)
    lb = t.groupby("network", sort=False).lower_bound_bytes.first().reindex(nets) / GiB
    ax.scatter(range(len(nets)), lb, marker="_", s=900, color="k", zorder=3,
               label="lower bound")
    cap = t[t.budget_factor.isna()].capacity_bytes.dropna()
    if len(cap):
        ax.axhline(cap.iloc[0] / GiB, color="k", ls=":", lw=1, label="device memory")
    labels = [f"{n}\nb{b}" for n, b in t.groupby("network", sort=False).batch.first()
              .reindex(nets).items()]
    ax.set_xticks(range(len(nets)), labels)
    ax.set_ylabel("least peak memory (GiB); hatched = does not fit")
    ax.set_title("Least memory each policy trains each network in (modeled K40c, 12 GB)")
    ax.legend(fontsize=8, ncol=4)
    fig.tight_layout()
    return fig


def run_budget_sweep(opts: Options) -> Outcome:
    from snsim import policies

    nets = networks(opts) if not opts.quick else {"resnet50": 16}
    pols = list(PAPER_POLICIES) if opts.quick else policies.names()
    factors = QUICK_FACTORS if opts.quick else FACTORS
    specs = [network(n, b, opts.device_model) for n, b in nets.items()]
    table = sweep(grid(specs, pols, budget_factor=factors), opts)
    table.insert(0, "network", [s.model for s in specs for _ in pols for _ in factors])
    table["time_over_compute"] = (table.iteration_ms / table.compute_ms).where(table.feasible)
    return Outcome(table, _draw_budget, {"networks": nets, "policies": pols,
                                         "budget_factors": list(factors)})


def _draw_budget(t, plt):
    from snsim.plots.panels import budget_axes, finish, panels
    from snsim.plots.style import color, marker

    nets = list(dict.fromkeys(t.network))
    fig, axes = panels(plt, len(nets))
    for ax, net in zip(axes, nets):
        sub = t[t.network == net]
        for p, s in sub.groupby("policy", sort=False):
            ok = s[s.feasible]
            ax.plot(ok.budget_factor, ok.time_over_compute, color=color(p), marker=marker(p),
                    ms=4, lw=1, label=p)
        budget_axes(ax, net)
    return finish(fig, axes, len(nets),
                  "Time against budget: where each policy becomes feasible, how fast it is")
