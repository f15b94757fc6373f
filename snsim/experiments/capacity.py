"""max-depth and max-batch: the capacity searches (:mod:`snsim.search`) per policy,
one search per worker task."""

from __future__ import annotations

import time

from snsim.experiments.base import GiB, PAPER_POLICIES, Options, Outcome, networks
from snsim.sweep import map_tasks


def search_task(args: tuple) -> dict:
    """One capacity search as a table row (module level: it runs in workers)."""
    from snsim.search import models
    from snsim.search.cache import ProbeCache
    from snsim.search.capacity import search

    what, policy, subject, device_model, budget, cache, profiles = args
    models.use_profile_files(profiles)
    t0 = time.perf_counter()
    family = (models.depth_family(subject, device_model) if what == "depth"
              else models.batch_family(subject, device_model))
    res = search(policy, family, budget, cache=ProbeCache(cache) if cache else None)
    d = res.to_dict()
    fail = d.pop("first_failing")
    d[f"first_failing_{what}"], d["first_failing_reason"] = fail[what], fail["reason"]
    d["search_s"] = round(time.perf_counter() - t0, 3)
    d["device_model"], d["budget_bytes"] = device_model, budget
    return d


# a search's relative cost (measured, ResNet family at 12 GB): which go first
_COST = {"dtr": 9, "vdnn-all": 8, "sqrt-n": 7, "superneurons": 4, "utp": 4}


def _run(opts: Options, what: str, subjects: dict, pols, budget) -> list[dict]:
    from snsim.search import models

    profiles: dict = {}
    if what == "batch":  # profiled here once, read by every worker
        for arg in subjects.values():
            if models.needs_profile(arg):
                profiles.update(models.profile_files(arg, opts.device_model,
                                                     opts.cache / "profiles"))
    items = [((s, p), (what, p, arg, opts.device_model, budget, str(opts.cache), profiles))
             for s, arg in subjects.items() for p in pols]
    order = [tag for tag, _ in items]
    # the longest searches first, so the last worker is not left with one alone
    items.sort(key=lambda it: -_COST.get(it[1][1], 1))
    rows: dict = {}
    bar = None
    if opts.progress:
        import sys

        from tqdm import tqdm

        tqdm.monitor_interval = 0   # no monitor thread: the search forks its workers
        bar = tqdm(total=len(items), desc=f"max-{what}", unit="search", file=sys.stderr,
                   leave=False)

    def done(tag, row):
        rows[tag] = {"subject": tag[0], **row}
        if bar is not None:
            bar.update()
    try:
        map_tasks(search_task, items, done, opts.workers, opts.scheduler)
    finally:
        if bar is not None:
            bar.close()
    return [rows[tag] for tag in order]


def run_max_depth(opts: Options) -> Outcome:
    import pandas as pd

    from snsim import policies

    batch = 16
    pols = ["none", "liveness", "superneurons"] if opts.quick else policies.names()
    budget = 6 * GiB if opts.quick else None  # quick: smaller networks, seconds
    table = pd.DataFrame(_run(opts, "depth", {f"b{batch}": batch}, pols, budget))
    table.insert(1, "batch", batch)
    for col in ("depth", "first_failing_depth"):
        table[col] = table[col].astype("Int64")
    live = table.set_index("policy").depth.get("liveness")
    ok = live is not None and live is not pd.NA
    table["x_liveness"] = (table.depth.astype(float) / float(live)).round(3) if ok else None
    mem = f"{budget / GiB:g} GiB" if budget else "12 GB"
    lines = [f"Deepest ResNet per policy (batch {batch}, modeled {opts.device_model}, "
             f"{mem}; family [6, 32, n, 6]):", "",
             "| policy | deepest | x liveness | ms/iteration | first failing | probes (planned) "
             "| s |",
             "|---|---|---|---|---|---|---|"]
    for r in table.itertuples():
        ok = r.depth is not pd.NA
        ms = f"{r.iteration_ms:.0f}" if ok else "-"
        lines.append(f"| {r.policy} | {r.depth if ok else '-'} | {r.x_liveness} | {ms} | "
                     f"{r.first_failing_depth} | {r.probes} ({r.planned}) | {r.search_s:.1f} |")
    return Outcome(table, _draw_depth, {"batch": batch, "policies": pols,
                                        "budget_bytes": budget,
                                        "family": "[6, 32, n, 6], depth 3n + 134"},
                   "\n".join(lines))


def _draw_depth(t, plt):
    from snsim.plots.style import color

    t = t.sort_values("depth", na_position="first").reset_index(drop=True)
    t["depth"] = t.depth.astype("float")
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    ys = range(len(t))
    a1.barh(ys, t.depth.fillna(0), color=[color(p) for p in t.policy])
    for y, r in zip(ys, t.itertuples()):
        ok = r.depth == r.depth  # not NaN
        txt = f"{int(r.depth)}" if ok else "fits none"
        if ok and r.x_liveness == r.x_liveness and r.x_liveness is not None:
            txt += f"  ({r.x_liveness:.2f}x liveness)"
        a1.text((r.depth if ok else 0) + 20, y, txt, va="center", fontsize=7)
    a1.set_yticks(list(ys), t.policy)
    a1.set_xlabel("deepest trainable ResNet (layers)")
    a1.set_xlim(0, (t.depth.max() or 1) * 1.35)
    mem = t.budget_bytes.iloc[0]
    mem = "12 GB" if mem != mem or mem is None else f"{mem / GiB:g} GiB"
    a1.set_title(f"Deepest ResNet in {mem}, batch {t.batch.iloc[0]} (modeled K40c)",
                 fontsize=10)
    a2.barh(ys, (t.iteration_ms / 1e3).fillna(0), color=[color(p) for p in t.policy])
    a2.set_yticks(list(ys), t.policy)
    a2.set_xlabel("seconds per iteration at that policy's deepest network")
    a2.set_title("Time per iteration at the deepest network", fontsize=10)
    fig.tight_layout()
    return fig


def run_max_batch(opts: Options) -> Outcome:
    import pandas as pd

    nets = {"resnet50": "resnet50"} if opts.quick else {n: n for n in networks(opts)}
    pols = ["liveness", "superneurons"] if opts.quick else list(PAPER_POLICIES)
    table = pd.DataFrame(_run(opts, "batch", nets, pols, None)).rename(
        columns={"subject": "network"})
    return Outcome(table, _draw_batch, {"networks": list(nets), "policies": pols})


def _draw_batch(t, plt):
    from snsim.plots.style import color

    nets = list(dict.fromkeys(t.network))
    pols = list(dict.fromkeys(t.policy))
    fig, ax = plt.subplots(figsize=(11, 4.5))
    w = 0.8 / len(pols)
    for k, p in enumerate(pols):
        sub = t[t.policy == p].set_index("network").reindex(nets)
        xs = [i + (k - (len(pols) - 1) / 2) * w for i in range(len(nets))]
        ax.bar(xs, sub.batch.fillna(0), w, color=color(p), label=p)
    ax.set_yscale("log", base=2)
    ax.set_xticks(range(len(nets)), nets)
    ax.set_ylabel("largest batch that fits")
    ax.set_title("Largest batch per network and policy in 12 GB (modeled K40c)")
    ax.legend(fontsize=8, ncol=5)
    fig.tight_layout()
    return fig
