"""throughput and link-whatif: samples per second as the batch, the recomputation
rule and the host link change."""

from __future__ import annotations

from snsim.experiments.base import GiB, PAPER_POLICIES, Options, Outcome, network
from snsim.experiments.memory import sweep
from snsim.sweep import grid

RECOMPUTE = ("recompute-speed", "recompute-memory", "cost-aware")
# Host links, bytes/s per direction: PCIe x16 nominal rates, and a 450 GB/s
# coherent CPU-GPU link (NVLink-C2C class).
LINKS = {"PCIe 3": 15.75e9, "PCIe 4": 31.5e9, "PCIe 5": 63e9, "coherent 450 GB/s": 450e9}


def run_throughput(opts: Options) -> Outcome:
    name = "resnet50"
    batches = (8, 32) if opts.quick else (8, 16, 32, 64, 128, 256)
    pols = ("liveness", "superneurons") if opts.quick else PAPER_POLICIES
    specs = [network(name, b, opts.device_model) for b in batches]
    t1 = sweep(grid(specs, pols), opts)
    t1.insert(0, "panel", "batch")
    rb = 16 if opts.quick else 64
    t2 = sweep(grid([network(name, rb, opts.device_model)], RECOMPUTE), opts)
    t2.insert(0, "panel", "recompute")
    import pandas as pd

    table = pd.concat([t1, t2], ignore_index=True)
    table.insert(1, "network", name)
    return Outcome(table, _draw_throughput, {"network": name, "batches": list(batches),
                                             "policies": list(pols),
                                             "recompute_batch": rb})


def _draw_throughput(t, plt):
    from snsim.plots.style import color, marker

    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(14, 4.2),
                                     gridspec_kw={"width_ratios": [2, 1, 1]})
    b = t[t.panel == "batch"]
    for p, s in b.groupby("policy", sort=False):
        ok = s[s.feasible]
        a1.plot(ok.batch, ok.samples_per_s, color=color(p), marker=marker(p), label=p)
    a1.set_xscale("log", base=2)
    a1.set_xlabel("batch")
    a1.set_ylabel("samples / s")
    a1.set_title(f"{t.network.iloc[0]}: throughput against batch, 12 GB", fontsize=10)
    a1.legend(fontsize=7)
    r = t[t.panel == "recompute"]
    cols = [color(p) for p in r.policy]
    a2.bar(range(len(r)), r.recompute_ms, color=cols)
    a2.set_xticks(range(len(r)), [p.replace("recompute-", "") for p in r.policy])
    a2.set_ylabel("recomputation per iteration (ms)")
    a2.set_title(f"extra compute, batch {r.batch.iloc[0]}", fontsize=10)
    a3.bar(range(len(r)), r.peak_bytes / GiB, color=cols)
    a3.set_xticks(range(len(r)), [p.replace("recompute-", "") for p in r.policy])
    a3.set_ylabel("peak (GiB)")
    a3.set_title("peak memory", fontsize=10)
    fig.tight_layout()
    return fig


def run_link_whatif(opts: Options) -> Outcome:
    name, batch, factor = "resnet50", 16 if opts.quick else 32, 1.1
    links = dict(list(LINKS.items())[::3]) if opts.quick else LINKS
    spec = network(name, batch, opts.device_model)
    table = sweep(grid([spec], ("utp", "superneurons"), budget_factor=[factor],
                       link_Bps=list(links.values())), opts)
    names = {v: k for k, v in links.items()}
    table.insert(0, "link", [names[v] for v in table.link_Bps])
    table.insert(1, "network", name)
    return Outcome(table, _draw_link, {"network": name, "batch": batch,
                                       "budget_factor": factor, "links_Bps": links})


def _draw_link(t, plt):
    from snsim.plots.style import color, marker

    fig, ax = plt.subplots(figsize=(8, 4.2))
    for p, s in t.groupby("policy", sort=False):
        ok = s[s.feasible]
        ax.plot(ok.link_Bps / 1e9, ok.samples_per_s, color=color(p), marker=marker(p),
                label=p)
    ax.set_xscale("log")
    ticks = t.drop_duplicates("link")
    ax.set_xticks(ticks.link_Bps / 1e9, [f"{n}\n{v / 1e9:g} GB/s" for n, v in
                                         zip(ticks.link, ticks.link_Bps)], fontsize=7)
    ax.minorticks_off()
    ax.set_ylabel("samples / s")
    r = t.iloc[0]
    ax.set_title(f"{r.network}, batch {r.batch}, budget {r.budget_factor:g} x lower bound: "
                 "throughput against host link", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
