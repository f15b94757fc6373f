"""Tables for people: trace summaries and policy comparisons (pandas).

pandas is imported by the functions that draw a table, not by the module:
``snsim simulate --json`` only ranks results and never pays for it.
"""

from __future__ import annotations

from typing import Sequence

from snsim.graph import Graph
from snsim.sim.result import SimResult
from snsim.units import fmt_bytes, fmt_ms


def rank(results: Sequence[SimResult]) -> list[SimResult]:
    """Feasible first, then by samples per second (descending), then by peak."""
    return sorted(results, key=lambda r: (not r.feasible, -r.samples_per_s, r.peak_bytes))


def comparison_table(results: Sequence[SimResult]) -> str:
    import pandas as pd

    rows = []
    for r in rank(results):
        rows.append({
            "policy": r.policy,
            "feasible": "yes" if r.feasible else "NO",
            # an infeasible run has no peak (the JSON's peak_bytes is null), only
            # what it reached before it stopped (single_table says so)
            "peak": fmt_bytes(r.peak_bytes) if r.feasible else "-",
            "peak/LB": f"{r.peak_bytes / r.lower_bound_bytes:.3f}" if r.feasible else "-",
            "iteration": fmt_ms(r.iteration_ms) if r.feasible else "-",
            "time/compute": f"{r.iteration_ms / r.compute_ms:.3f}"
            if r.feasible and r.compute_ms else "-",
            # a plan its planner gave up on was not replayed: no traffic to show
            "recompute": fmt_ms(r.recompute_ms) if r.replayed else "-",
            "stall": fmt_ms(r.stall_ms) if r.replayed else "-",
            "offloaded": fmt_bytes(r.d2h_bytes) if r.replayed else "-",
            "samples/s": f"{r.samples_per_s:.1f}" if r.feasible else "-",
        })
    table = pd.DataFrame(rows).to_string(index=False)
    first = results[0]
    head = (f"{first.trace}: {first.model}, batch {first.batch}; budget "
            f"{fmt_bytes(first.capacity_bytes)}"
            f"{'' if first.budget_bytes is not None else ' (device memory)'}; "
            f"lower bound {fmt_bytes(first.lower_bound_bytes)}; "
            f"pure compute {fmt_ms(first.compute_ms)}")
    notes = [f"  {r.policy}: {r.reason}" for r in rank(results) if not r.feasible]
    return "\n".join([head, table] + (["infeasible:"] + notes if notes else []))


def single_table(r: SimResult) -> str:
    lines = [
        ("policy", r.policy), ("trace", f"{r.trace} ({r.model}, batch {r.batch})"),
        ("budget", fmt_bytes(r.capacity_bytes) + ("" if r.budget_bytes is not None
                                                  else " (device memory)")),
        ("feasible", "yes" if r.feasible else f"NO: {r.reason}"),
    ]
    if not r.replayed:   # its planner gave up: the trace's figures and its counters only
        lines.append(("replayed",
                      "no: the planner gave up, so no peak, time or traffic was simulated"))
    else:
        # a run that stopped has no peak, only what it reached (as the JSON's
        # partial_peak_bytes): not a fraction of the lower bound to read as a result
        lines.append(("peak memory", f"{fmt_bytes(r.peak_bytes)}  ({r.peak_bytes} B, "
                                     f"{r.peak_bytes / r.lower_bound_bytes:.3f} x lower bound)"
                      if r.feasible
                      else f"- (reached {fmt_bytes(r.peak_bytes)} before it stopped)"))
    lines.append(("static (weights+grads)" if not r.optimizer_state_bytes and not r.optimizer_ms
                  else "static (+optimizer)", fmt_bytes(r.static_bytes)))
    if r.optimizer_state_bytes or r.optimizer_ms:   # a trace with a training record
        lines += [("optimizer state", fmt_bytes(r.optimizer_state_bytes)),
                  ("optimizer step", fmt_ms(r.optimizer_ms))]
    lines.append(("lower bound", fmt_bytes(r.lower_bound_bytes)))
    if r.replayed:
        lines.append(("iteration", (fmt_ms(r.iteration_ms)
                                    + (f"  ({r.iteration_ms / r.compute_ms:.3f} x compute)"
                                       if r.compute_ms else "")) if r.feasible
                      else f"- (stopped at {fmt_ms(r.iteration_ms)})"))
    lines.append(("compute", fmt_ms(r.compute_ms)))
    if r.replayed:
        lines += [("recompute", fmt_ms(r.recompute_ms)), ("stall", fmt_ms(r.stall_ms)),
                  ("host->device", fmt_bytes(r.h2d_bytes)),
                  ("device->host", fmt_bytes(r.d2h_bytes)),
                  ("samples/s", f"{r.samples_per_s:.2f}")]
    lines += [(k, str(v)) for k, v in r.policy_stats.items()]
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in lines)


def trace_summary(graph: Graph) -> str:
    import pandas as pd

    t = graph.trace
    df = pd.DataFrame([{"kind": layer.kind, "output_bytes": layer.output_bytes,
                        "param_bytes": layer.param_bytes, "fwd_ms": layer.fwd_ms,
                        "bwd_ms": layer.bwd_ms if graph.requires_grad[layer.id] else 0.0,
                        "saved_extra_bytes": layer.saved_extra_bytes}
                       for layer in t.layers])
    by = df.groupby("kind").agg(layers=("kind", "size"), activations=("output_bytes", "sum"),
                                params=("param_bytes", "sum"), fwd_ms=("fwd_ms", "sum"),
                                bwd_ms=("bwd_ms", "sum")).sort_values("layers",
                                                                      ascending=False)
    by["activations"] = by["activations"].map(fmt_bytes)
    by["params"] = by["params"].map(fmt_bytes)
    by["fwd_ms"] = by["fwd_ms"].map(lambda v: f"{v:.3f}")
    by["bwd_ms"] = by["bwd_ms"].map(lambda v: f"{v:.3f}")
    src = t.source
    dev = t.device
    head = [
        f"trace      {t.label}",
        f"model      {t.model}, batch {t.batch}, {t.dtype}, input {list(t.input_shape)}",
        f"source     {src.get('kind', '?')}"
        + (f" on {src['device_name']}" if src.get("device_name") else "")
        + (f" ({src['device_model']})" if src.get("device_model") else ""),
        f"device     {dev.name}: {fmt_bytes(dev.memory_bytes)}, "
        f"h2d {dev.h2d_Bps / 1e9:.2f} GB/s, d2h {dev.d2h_Bps / 1e9:.2f} GB/s",
        f"layers     {len(t.layers)} ({sum(graph.requires_grad)} with backward)",
        f"activations {fmt_bytes(df.output_bytes.sum())} outputs + "
        f"{fmt_bytes(df.saved_extra_bytes.sum())} saved extras",
        f"parameters {fmt_bytes(t.param_bytes)} (static {fmt_bytes(t.static_bytes)} "
        "with gradients)",
        f"compute    forward {fmt_ms(df.fwd_ms.sum())}, backward {fmt_ms(df.bwd_ms.sum())}, "
        f"route {fmt_ms(graph.compute_ms)}",
        f"lower bound {fmt_bytes(graph.lower_bound_bytes)} "
        f"({graph.lower_bound_bytes} B: static + largest step)",
        "",
        by.to_string(),
    ]
    return "\n".join(head)

