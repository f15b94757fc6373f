"""optimality-gap: every heuristic's time over the optimum's (policy ``optimal``,
a MILP solved by HiGHS) on the shipped K40c traces, budgets 1.05x ... 3x the
lower bound, with the optimum's proven gap and solve time (issue 15).

Not part of ``snsim experiment all`` (the paper's figures): each of its 66
budgets is a MILP of up to a minute (``TIME_LIMIT_S``), and it needs the
solver (``pip install 'snsim[optimal]'``).  ``--quick``: AlexNet b128 and
VGG-16 b16 at three budgets, 20 s each at most.
"""

from __future__ import annotations

from pathlib import Path

from snsim.errors import SnsimError
from snsim.experiments.base import Options, Outcome, checkout_file
from snsim.sweep import TraceSpec, grid

HEURISTICS = ("superneurons", "dtr", "utp", "cost-aware", "sqrt-n", "vdnn-all")
FACTORS = (1.05, 1.1, 1.25, 1.5, 2.0, 3.0)
QUICK_FACTORS = (1.05, 1.1, 1.5)
QUICK_TRACES = ("k40c_alexnet_b128", "k40c_vgg16_b16")
TIME_LIMIT_S = 60.0
QUICK_TIME_LIMIT_S = 20.0
TRACES = Path("traces")
LEGEND_IN = 3.2   # the figure's legend names the bounds: wider than the policies'


def trace_dir() -> Path:
    """The shipped traces in the current folder, else in the source checkout."""
    found = checkout_file(TRACES, lambda folder: any(folder.glob("k40c_*.json")))
    if found is not None:
        return found
    raise SnsimError(f"optimality-gap reads the shipped K40c traces ({TRACES}/k40c_*.json), "
                     "not found here or in the source checkout")


def check_optimality_gap() -> None:
    trace_dir()


def run_optimality_gap(opts: Options) -> Outcome:
    folder = trace_dir()
    paths = sorted(p for p in folder.glob("k40c_*.json") if "2500" not in p.stem)
    if opts.quick:
        paths = [p for p in paths if p.stem in QUICK_TRACES]
    factors = QUICK_FACTORS if opts.quick else FACTORS
    limit = QUICK_TIME_LIMIT_S if opts.quick else TIME_LIMIT_S
    specs = [TraceSpec("file", path=str(p)) for p in paths]
    pols = ("optimal",) + HEURISTICS
    points = [p for pol in pols for p in grid(
        specs, (pol,), budget_factor=factors,
        options=[optimal_options(opts, limit) if pol == "optimal" else ()])]
    from snsim.experiments.memory import sweep

    table = sweep(points, opts)
    table.insert(0, "network", [Path(p.trace.path).stem.removeprefix("k40c_") for p in points])
    table = over_optimal(table)
    return Outcome(table, _draw, {"traces": [p.stem for p in paths],
                                  "budget_factors": list(factors),
                                  "policies": list(pols), "time_limit_s": limit,
                                  "serial": serial(opts)},
                   summary(table))


def serial(opts: Options) -> bool:
    """``optimal`` without its child beside the heuristics (its plan option
    ``serial``) where the sweep runs several points at once: its workers
    then keep the cores busy, one process each."""
    return opts.workers > 1 or opts.scheduler is not None


def optimal_options(opts: Options, limit: float) -> tuple:
    """``optimal``'s plan options, as sorted (name, value) pairs."""
    return ((("serial", True),) if serial(opts) else ()) + (("time_limit", limit),)


def over_optimal(table):
    """Columns ``time_over_compute`` and ``over_optimal`` (the row's iteration time
    over the optimum's at the same trace and budget; empty where either is
    infeasible)."""
    table = table.copy()
    table["time_over_compute"] = (table.iteration_ms / table.compute_ms).where(table.feasible)
    opt = table[(table.policy == "optimal") & table.feasible]
    ref = opt.set_index(["network", "budget_factor"]).iteration_ms
    at = ref.reindex(list(zip(table.network, table.budget_factor))).to_numpy()
    table["over_optimal"] = (table.iteration_ms / at).where(table.feasible)
    return table


def summary(t) -> str:
    opt = t[t.policy == "optimal"]
    if opt.empty or "optimality_gap" not in t:
        return ""
    met = opt[opt.feasible & (opt.optimality_gap <= 0.01)]
    every = opt[opt.feasible & (opt.schedule_gap <= 0.01)]
    sn = t[(t.policy == "superneurons") & t.feasible]
    lines = [f"optimality-gap: {len(met)} of {len(opt)} budgets within 1% of the bound over "
             f"the MILP's class, {len(every)} within 1% of the bound for every schedule; "
             f"solved in {opt.solve_s.sum():.0f} s, at most {opt.solve_s.max():.1f} s each"]
    if len(sn):
        worst = sn.loc[sn.over_optimal.idxmax()]
        lines.append(f"  superneurons over the optimum: at most {worst.over_optimal:.4f} "
                     f"({worst.network}, {worst.budget_factor:g}x)")
    return "\n".join(lines)


def _draw(t, plt):
    from snsim.plots.panels import budget_axes, finish, panels
    from snsim.plots.style import color, marker

    traces = list(dict.fromkeys(t.network))
    fig, axes = panels(plt, len(traces), legend_in=LEGEND_IN)
    for ax, name in zip(axes, traces):
        sub = t[t.network == name]
        # budgets equally spaced (1.05 and 1.1 apart), labelled with their factors
        at = {f: i for i, f in enumerate(sorted(set(sub.budget_factor)))}
        opt = sub[(sub.policy == "optimal") & sub.feasible].sort_values("budget_factor")
        x = opt.budget_factor.map(at)
        every = opt.schedule_bound_ms / opt.compute_ms
        ax.fill_between(x, every, opt.time_over_compute, color="#dddddd",
                        label="optimal's gap to the bound")
        ax.plot(x, opt.bound_ms / opt.compute_ms, color="#555555", lw=0.8,
                ls="--", label="bound: no plan of the MILP's class is faster")
        ax.plot(x, every, color="#555555", lw=0.8, ls=":",
                label="bound: no schedule is faster")
        ax.plot(x, opt.time_over_compute, color="black", lw=1.6,
                label="optimal (its plan, or the best heuristic's)")
        for p, s in sub[sub.policy != "optimal"].groupby("policy", sort=False):
            ok = s[s.feasible]
            ax.plot(ok.budget_factor.map(at), ok.time_over_compute, color=color(p),
                    marker=marker(p), ms=4, lw=1, label=p)
        ax.set_xticks(list(at.values()), [f"{f:g}" for f in at], fontsize=7)
        budget_axes(ax, name)
    return finish(fig, axes, len(traces),
                  "Each heuristic against the optimum (MILP, HiGHS) and its proven bound",
                  LEGEND_IN)
