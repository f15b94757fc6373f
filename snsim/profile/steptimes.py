"""Time each step as snsim's executor runs it, for the trace's ``fwd_ms``/``bwd_ms``.

The executor runs layer by layer (a backward step is one
``torch.autograd.grad`` per layer, saved tensors go through hooks), so a
layer costs it more than the same kernels cost inside one fused autograd
graph; on small layers the difference is most of the time (DenseNet-121 at
4x3x32x32 on one CPU thread: per-layer sums 94 ms, executor 123 ms).  The
simulator predicts the executor's step, so the trace records the
executor's per-step times: policy ``none``, warm-ups, then the median of
``repeats`` steps per operation (CUDA events on a GPU, ``perf_counter_ns``
on a CPU).  This happens while profiling, never in a validation run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from snsim.graph import Graph
from snsim.torchgraph.clock import quantiles
from snsim.policies.base import PlanContext
from snsim.policies.none import plan_none
from snsim.schedule.ops import Compute

from snsim.execute.executor import Executor
from snsim.torchgraph.program import Program


@dataclass(frozen=True, slots=True)
class StepTime:
    """Milliseconds the executor takes for step ``(phase, layer)``: median and spread."""

    phase: str
    layer: int
    median_ms: float
    p10_ms: float
    p90_ms: float


def time_steps(program: Program, graph: Graph, batch: Any, device: torch.device,
               warmup: int, repeats: int, tick=None) -> tuple[StepTime, ...]:
    """Each compute step's time, in schedule order; ``tick()``, if given, is
    called after each training step (for progress)."""
    tick = tick or (lambda: None)
    schedule = plan_none(PlanContext(graph))
    ex = Executor(program, graph, schedule, device)
    samples: dict[int, list[float]] = {}
    try:
        ex.prepare()
        for _ in range(warmup):
            ex.step(batch)
            tick()
        if device.type == "cuda":
            events: dict[int, tuple[Any, Any]] = {}

            def hook(k, when):
                if type(schedule.ops[k]) is not Compute:
                    return
                if when == "before":
                    start = torch.cuda.Event(enable_timing=True)
                    start.record()
                    events[k] = (start, None)
                else:
                    end = torch.cuda.Event(enable_timing=True)
                    end.record()
                    events[k] = (events[k][0], end)

            for _ in range(repeats):
                events.clear()
                ex.step(batch, hook=hook)
                torch.cuda.synchronize(device)
                tick()
                for k, (s, e) in events.items():
                    samples.setdefault(k, []).append(s.elapsed_time(e))
        else:
            started = [0]

            def hook(k, when):
                if when == "before":
                    started[0] = time.perf_counter_ns()
                elif type(schedule.ops[k]) is Compute:
                    samples.setdefault(k, []).append((time.perf_counter_ns() - started[0]) / 1e6)

            for _ in range(repeats):
                ex.step(batch, hook=hook)
                tick()
    finally:
        ex.close()
    return tuple(StepTime(schedule.ops[k].phase, schedule.ops[k].layer, *quantiles(v))
                 for k, v in sorted(samples.items()))
