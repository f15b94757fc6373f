"""A measured trace document, completed with what snsim's executor measures.

The profiler (:mod:`snsim.profile.profiler`) builds the document from the
capture and the per-layer timings; this module runs the executor on it once
(:mod:`~snsim.profile.transients`, :mod:`~snsim.profile.steptimes`), gets back
typed records, and returns a *new* document with them written in.  Nothing
else writes into a trace document.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from snsim.graph import Graph
from snsim.profile.steptimes import StepTime, time_steps
from snsim.profile.transients import StepTransient, measure_transients
from snsim.torchgraph.program import Program


def measure(doc: dict, model, example, device: torch.device, warmup: int = 0,
            repeats: int = 0, progress: bool = False
            ) -> tuple[tuple[StepTransient, ...], tuple[StepTime, ...]]:
    """Run the executor on ``doc``'s model: transients, and (with ``repeats``) step times.

    With ``progress``, a bar on stderr counts the executor's training steps; on a
    large model they take minutes after the profiler's own bars have ended.
    """
    import sys

    from tqdm import tqdm

    from snsim.trace import from_dict

    graph = Graph(from_dict(doc, "<trace being profiled>"))
    program = Program(model, example)
    batch = example.detach().cpu().numpy().copy() if device.type == "cpu" \
        else example.detach().cpu().pin_memory()
    bar = tqdm(total=3 + (warmup + repeats if repeats > 0 else 0), desc="executor steps",
               unit="step", leave=False, file=sys.stderr, disable=not progress)
    try:
        found = measure_transients(program, graph, batch, device)
        bar.update(3)  # its warm-up step, the annotated step and the analysis
        times = time_steps(program, graph, batch, device, warmup, repeats,
                           tick=lambda: bar.update(1)) if repeats > 0 else ()
    finally:
        bar.close()
    return found, times


def with_measurements(doc: dict, transients, times, device: torch.device, warmup: int,
                      repeats: int) -> dict[str, Any]:
    """``doc`` with the executor's step times and transients written in (a new document).

    Step times become the layers' ``fwd_ms``/``bwd_ms`` (the profiler's per-layer
    pass timings kept as ``*_pass``); workspace entries keep their ratios to the
    layer's default entry (DESIGN section 2).  A layer with a measured transient
    and no workspace list gets one entry ``{"algo": "measured", "bytes": forward,
    "bwd_bytes": backward}`` with its times; a default entry with no measured
    size yet (CPU's ``cpu-default``) gets the sizes written into it; one that
    already carries sizes measured for its algorithm (cuDNN's) keeps them.
    """
    out = copy.deepcopy(doc)
    src = out.setdefault("source", {})
    if times:
        _set_step_times(out, times)
        src["step_times"] = (
            f"fwd_ms/bwd_ms: per-step times of snsim's executor running policy none on "
            f"{device.type} ({warmup} warm-up steps, median of {repeats}; *_p10/_p90 the "
            "spread); the profiler's per-layer pass timings are kept in *_pass fields")
        src["executor_layers_total_ms"] = round(sum(t.median_ms for t in times), 6)
    for t in transients:
        layer = out["layers"][t.layer]
        if layer.get("workspace"):
            first = layer["workspace"][0]
            if first.get("bytes", 0) == 0 and "bwd_bytes" not in first:
                first.update(bytes=t.fwd_bytes, bwd_bytes=t.bwd_bytes)
        else:
            layer["workspace"] = [{"algo": "measured", "bytes": t.fwd_bytes,
                                   "bwd_bytes": t.bwd_bytes, "fwd_ms": layer["fwd_ms"],
                                   "bwd_ms": layer["bwd_ms"]}]
        if t.bwd_released is not None:
            layer["workspace"][0]["bwd_released"] = int(t.bwd_released)
    note = ("transient memory per step measured by snsim.profile.transients (peak inside "
            "the step minus its level before and its own allocations, one annotated step "
            f"of policy none on {device.type}); a layer's default workspace entry carries it")
    src["workspace"] = f"{src['workspace']}; {note}" if src.get("workspace") else note
    return out


def _set_step_times(doc: dict, times) -> None:
    by_step = {(t.phase, t.layer): t for t in times}
    for layer in doc["layers"]:
        i = layer["id"]
        for phase, key in (("F", "fwd_ms"), ("B", "bwd_ms")):
            t = by_step.get((phase, i))
            if t is None:
                continue
            med, lo, hi = (round(x, 6) for x in (t.median_ms, t.p10_ms, t.p90_ms))
            old = layer[key]
            if f"{key}_p10" in layer:
                layer[f"{key}_pass"] = old
                layer[f"{key}_pass_p10"] = layer[f"{key}_p10"]
                layer[f"{key}_pass_p90"] = layer[f"{key}_p90"]
            layer[key], layer[f"{key}_p10"], layer[f"{key}_p90"] = med, lo, hi
            for k, w in enumerate(layer.get("workspace", [])):
                w[key] = med if k == 0 or old <= 0 else round(w[key] * med / old, 6)
