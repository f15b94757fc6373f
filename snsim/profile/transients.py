"""Measure each step's transient memory: what a step allocates and frees itself.

A step's level in the simulator is what it needs and allocates plus its
workspace.  Real kernels also use memory they free before returning: oneDNN
reorders convolution weights into a blocked layout on CPU, cuDNN takes a
workspace on GPU, autograd materializes a parameter's gradient before it
replaces (or is added to) the ``.grad`` buffer, a second contribution to an
activation gradient exists beside the sum it is added to.  This module runs
one annotated step of the executor (policy ``none``, nothing freed) and, per
step, takes

    workspace = measured peak inside the step - level before it - bytes the
                step allocates (its outputs, saved extras and gradients)

so that the trace can carry it as the layer's ``workspace`` entry and the
simulator counts it (DESIGN section 2: transient, only during the step).
"""

from __future__ import annotations

from typing import Any

import torch

from snsim.graph import Graph
from snsim.policies.none import plan_none
from snsim.policies.base import PlanContext
from snsim.schedule.ops import Compute

from snsim.execute.executor import Executor
from snsim.execute.memory import per_op_levels
from snsim.torchgraph.program import Program

# Below this a measured transient is allocator noise (alignment, small tensors).
_NOISE_BYTES = 4096


def measure_transients(program: Program, graph: Graph, batch: Any,
                       device: torch.device) -> dict[int, tuple[int, int]]:
    """Layer id -> (forward, backward) transient bytes, for layers that have any."""
    schedule = plan_none(PlanContext(graph))
    ex = Executor(program, graph, schedule, device)
    try:  # close it: on CPU its two copy-engine threads outlive it otherwise
        ex.prepare()
        ex.step(batch)  # warm-up: lazy initializations are not transients
        peaks: dict[int, tuple[int, int]] = {}   # op index -> (peak, end), relative
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            base = torch.cuda.memory_allocated(device)

            def hook(k, when):
                torch.cuda.synchronize(device)
                if when == "before":
                    torch.cuda.reset_peak_memory_stats(device)
                else:
                    peaks[k] = (torch.cuda.max_memory_allocated(device) - base,
                                torch.cuda.memory_allocated(device) - base)

            ex.prepare()
            ex.step(batch, hook=hook)
        else:
            from torch.profiler import ProfilerActivity, profile

            from snsim.execute.memory import mark_window, quiet_stderr

            with quiet_stderr(), profile(activities=[ProfilerActivity.CPU],
                                         profile_memory=True) as prof:
                ex.release()
                mark_window()
                with torch.profiler.record_function("snsim#-1"):  # the level ops start from
                    ex.prepare(fresh=True)
                ex.step(batch, annotate=True)
            peaks = per_op_levels(prof)
    finally:
        ex.close()
    out: dict[int, list[int]] = {}
    level = peaks.get(-1, (0, 0))[1]  # after the gradient buffers are allocated
    allocated: set = set()
    for k, op in enumerate(schedule.ops):
        if k not in peaks:
            continue
        peak, end = peaks[k]
        if type(op) is Compute:
            new = [t for t in graph.allocs(op.step) if t not in allocated]
            allocated.update(new)
            own = sum(graph.size(t) for t in new)
            ws = peak - level - own
            if ws > _NOISE_BYTES:
                slot = 1 if op.phase == "B" else 0
                out.setdefault(op.layer, [0, 0])[slot] = ws
        level = end
    return {i: (v[0], v[1]) for i, v in out.items()}


def add_transients(doc: dict, model, example, device: torch.device,
                   warmup: int = 0, repeats: int = 0, progress: bool | None = None) -> dict:
    """Give each layer of a measured trace document its transient memory.

    With ``repeats``, the layers' times become the executor's own per-step
    times (:mod:`snsim.profile.steptimes`).  A layer with a measured transient
    and no workspace list gets one entry ``{"algo": "measured", "bytes":
    forward, "bwd_bytes": backward}`` with its times; a layer whose default
    entry (the first) has no measured size yet (CPU's ``cpu-default``) gets
    the sizes written into it; a default entry that already carries sizes
    measured for its algorithm (CUDA's cuDNN entries) keeps them.
    ``source.workspace`` says how it was measured.  A progress bar on stderr
    counts the executor's training steps (``progress=None``: only when stderr
    is a terminal); on a large model they take minutes.
    """
    import sys

    from tqdm import tqdm

    from snsim.trace import from_dict

    graph = Graph(from_dict(doc, "<trace being profiled>"))
    program = Program(model, example)
    batch = example.detach().cpu().numpy().copy() if device.type == "cpu" \
        else example.detach().cpu().pin_memory()
    show = sys.stderr.isatty() if progress is None else progress
    bar = tqdm(total=3 + (warmup + repeats if repeats > 0 else 0), desc="executor steps",
               unit="step", leave=False, file=sys.stderr, disable=not show)
    try:
        found = measure_transients(program, graph, batch, device)
        bar.update(3)  # its warm-up step, the annotated step and the analysis
        if repeats > 0:
            from snsim.profile.steptimes import set_step_times, time_steps

            set_step_times(doc, time_steps(program, graph, batch, device, warmup, repeats,
                                           tick=lambda: bar.update(1)),
                           warmup, repeats, device)
    finally:
        bar.close()
    for i, (fwd, bwd) in found.items():
        layer = doc["layers"][i]
        if layer.get("workspace"):
            # candidates from the library: the measured one describes the default
            first = layer["workspace"][0]
            if first.get("bytes", 0) == 0 and "bwd_bytes" not in first:
                first.update(bytes=int(fwd), bwd_bytes=int(bwd))
        else:
            layer["workspace"] = [{"algo": "measured", "bytes": int(fwd), "bwd_bytes": int(bwd),
                                   "fwd_ms": layer["fwd_ms"], "bwd_ms": layer["bwd_ms"]}]
    src = doc.setdefault("source", {})
    note = ("transient memory per step measured by snsim.profile.transients (peak inside "
            "the step minus its level before and its own allocations, one annotated step "
            f"of policy none on {device.type}); a layer's default workspace entry carries it")
    src["workspace"] = f"{src['workspace']}; {note}" if src.get("workspace") else note
    return doc
