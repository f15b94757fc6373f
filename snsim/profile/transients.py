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

from dataclasses import dataclass
from typing import Any

import torch

from snsim.graph import Graph
from snsim.policies.none import plan_none
from snsim.policies.base import PlanContext
from snsim.schedule.ops import Compute

from snsim.execute.executor import Executor
from snsim.execute.memory import step_levels
from snsim.torchgraph.program import Program

# Below this a measured transient is allocator noise (alignment, small tensors).
_NOISE_BYTES = 4096


@dataclass(frozen=True, slots=True)
class StepTransient:
    """Memory layer ``layer``'s forward and backward steps allocate and free themselves."""

    layer: int
    fwd_bytes: int
    bwd_bytes: int
    # the backward's peak above the level before it when its dying reads are handed
    # to autograd (the executor's note [7]), measured under liveness
    bwd_released: int | None = None


def measure_transients(program: Program, graph: Graph, batch: Any,
                       device: torch.device) -> tuple[StepTransient, ...]:
    """The transient bytes of every layer that has any, in layer order."""
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
            peaks = step_levels(ex, batch)
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
            # its gradients born in backward (set-to-none) are its own allocations too
            own = sum(graph.size(t) for t in new) + graph.param_grad_bytes(op.step)
            ws = peak - level - own
            if ws > _NOISE_BYTES:
                slot = 1 if op.phase == "B" else 0
                out.setdefault(op.layer, [0, 0])[slot] = ws
        level = end
    released = measure_released(program, graph, batch, device)
    return tuple(StepTransient(i, *out.get(i, (0, 0)), released.get(i))
                 for i in sorted(set(out) | set(released)))


def measure_released(program: Program, graph: Graph, batch: Any,
                     device: torch.device) -> dict[int, int]:
    """Layer id -> peak of its backward step above the level before it, under
    ``liveness`` with the step's dying reads handed to autograd, for the backward
    steps that have dying reads (CPU; on CUDA the hand-over is not measured yet)."""
    if device.type != "cpu" or not any(graph.dying.values()):
        return {}
    from snsim.policies.liveness import plan_liveness

    schedule = plan_liveness(PlanContext(graph))
    ex = Executor(program, graph, schedule, device)
    try:
        ex.prepare()
        ex.step(batch, hand_over=True)
        levels = step_levels(ex, batch, hand_over=True)
    finally:
        ex.close()
    out: dict[int, int] = {}
    level = levels.get(-1, (0, 0))[1]
    for k, op in enumerate(schedule.ops):
        if k not in levels:
            continue
        peak, end = levels[k]
        if type(op) is Compute and op.phase == "B" and graph.dying.get(op.step):
            out[op.layer] = max(peak - level, 0)
        level = end
    return out
