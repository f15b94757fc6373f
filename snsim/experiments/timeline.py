"""memory-timeline and overlap: one iteration in detail (recorded simulations)."""

from __future__ import annotations

from snsim.experiments.base import GiB, PAPER_POLICIES, Options, Outcome, network


def _graph(opts: Options, name: str, batch: int):
    from snsim.graph import Graph
    from snsim.trace.io import from_dict

    spec = network(name, batch, opts.device_model)
    return Graph(from_dict(spec.document(), spec.label()))


def run_memory_timeline(opts: Options) -> Outcome:
    import pandas as pd

    from snsim.evaluate import evaluate_many

    name, batch, factor = "resnet50", 16 if not opts.quick else 8, 1.25
    g = _graph(opts, name, batch)
    budget = int(factor * g.lower_bound_bytes)
    rows = []
    for e in evaluate_many(g, PAPER_POLICIES, budget, record=True):
        r = e.result
        for pt in r.timeline:
            rows.append({"network": name, "batch": batch, "policy": e.policy,
                         "budget_bytes": budget, "budget_factor": factor,
                         "feasible": r.feasible, "reason": r.reason,
                         "iteration_ms": r.iteration_ms if r.feasible else None,
                         "forward_end_ms": r.forward_end_ms,
                         "lower_bound_bytes": r.lower_bound_bytes,
                         "time_ms": pt.time_ms, "level_bytes": pt.level_bytes,
                         "what": pt.what, "kind": str(pt.kind.value)})
    return Outcome(pd.DataFrame(rows), _draw_timeline,
                   {"network": name, "batch": batch, "budget_factor": factor,
                    "policies": list(PAPER_POLICIES)})


def _draw_timeline(t, plt):
    from snsim.plots.style import color

    fig, ax = plt.subplots(figsize=(11, 4.5))
    for p, s in t.groupby("policy", sort=False):
        ok = bool(s.feasible.iloc[0])
        ax.step(s.time_ms, s.level_bytes / GiB, where="post", color=color(p), lw=1,
                ls="-" if ok else "--", label=p if ok else f"{p} (stops: over budget)")
    ax.axhline(t.budget_bytes.iloc[0] / GiB, color="k", ls=":", lw=1,
               label=f"budget ({t.budget_factor.iloc[0]:g} x lower bound)")
    ax.axhline(t.lower_bound_bytes.iloc[0] / GiB, color="k", ls="-.", lw=0.8,
               label="lower bound")
    ax.set_xlabel("time in the iteration (ms)")
    ax.set_ylabel("device memory (GiB)")
    ax.set_title(f"Memory over one iteration: {t.network.iloc[0]}, batch {t.batch.iloc[0]}, "
                 "modeled K40c")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    return fig


def run_overlap(opts: Options) -> Outcome:
    import pandas as pd

    from snsim.evaluate import evaluate

    name, batch, factor = "resnet50", 16 if not opts.quick else 8, 1.1
    g = _graph(opts, name, batch)
    budget = int(factor * g.lower_bound_bytes)
    e = evaluate(g, "utp", budget, record=True)
    r = e.result
    rows = [{"network": name, "batch": batch, "policy": "utp", "budget_bytes": budget,
             "budget_factor": factor, "feasible": r.feasible, "iteration_ms": r.iteration_ms,
             "stall_ms": r.stall_ms, "stream": str(iv.stream.value), "kind": str(iv.kind.value),
             "name": iv.name, "start_ms": iv.start_ms, "end_ms": iv.end_ms}
            for iv in r.intervals]
    return Outcome(pd.DataFrame(rows), _draw_gantt,
                   {"network": name, "batch": batch, "policy": "utp", "budget_factor": factor},
                   f"utp on {name} b{batch} at {factor} x lower bound: iteration "
                   f"{r.iteration_ms:.1f} ms, stalls {r.stall_ms:.1f} ms")


_KIND_COLOR = {"step": "#1f77b4", "recompute": "#9467bd", "copy": "#2ca02c",
               "stall": "#d62728"}


def _draw_gantt(t, plt):
    from matplotlib.patches import Patch

    streams = ["compute", "h2d", "d2h"]
    fig, ax = plt.subplots(figsize=(12, 3.2))
    for y, stream in enumerate(streams):
        s = t[t.stream == stream]
        for kind, k in s.groupby("kind"):
            ax.broken_barh(list(zip(k.start_ms, k.end_ms - k.start_ms)), (y - 0.4, 0.8),
                           color=_KIND_COLOR.get(kind, "#7f7f7f"), lw=0)
    ax.set_yticks(range(len(streams)), ["compute", "H2D (prefetch)", "D2H (offload)"])
    ax.invert_yaxis()
    ax.set_xlabel("time in the iteration (ms)")
    r = t.iloc[0]
    ax.set_title(f"utp on {r.network}, batch {r.batch}, budget {r.budget_factor:g} x lower "
                 f"bound: iteration {r.iteration_ms:.0f} ms, stalls {r.stall_ms:.0f} ms")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in _KIND_COLOR.items()],
              fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    return fig
