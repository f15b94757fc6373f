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
from typing import Any

import torch

from snsim.graph import Graph
from snsim.torchgraph.clock import quantiles
from snsim.policies.base import PlanContext
from snsim.policies.none import plan_none
from snsim.schedule.ops import Compute

from snsim.execute.executor import Executor
from snsim.torchgraph.program import Program


def time_steps(program: Program, graph: Graph, batch: Any, device: torch.device,
               warmup: int, repeats: int, tick=None
               ) -> dict[tuple[str, int], tuple[float, float, float]]:
    """(phase, layer) -> (median, p10, p90) milliseconds of each compute step;
    ``tick()``, if given, is called after each training step (for progress)."""
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
    return {schedule.ops[k].step: quantiles(v) for k, v in samples.items()}


def set_step_times(doc: dict, times: dict, warmup: int, repeats: int, device: torch.device) -> None:
    """Make ``times`` the layers' ``fwd_ms``/``bwd_ms`` (the earlier ones kept as ``*_pass``).

    Workspace entries keep their ratios to the layer's default (entry 0), whose
    times are the layer's (DESIGN section 2).
    """
    for layer in doc["layers"]:
        i = layer["id"]
        for phase, key in (("F", "fwd_ms"), ("B", "bwd_ms")):
            if (phase, i) not in times:
                continue
            med, lo, hi = (round(x, 6) for x in times[(phase, i)])
            old = layer[key]
            if f"{key}_p10" in layer:
                layer[f"{key}_pass"] = old
                layer[f"{key}_pass_p10"] = layer[f"{key}_p10"]
                layer[f"{key}_pass_p90"] = layer[f"{key}_p90"]
            layer[key], layer[f"{key}_p10"], layer[f"{key}_p90"] = med, lo, hi
            for k, w in enumerate(layer.get("workspace", [])):
                w[key] = med if k == 0 or old <= 0 else round(w[key] * med / old, 6)
    src = doc.setdefault("source", {})
    src["step_times"] = (
        f"fwd_ms/bwd_ms: per-step times of snsim's executor running policy none on "
        f"{device.type} ({warmup} warm-up steps, median of {repeats}; *_p10/_p90 the spread); "
        "the profiler's per-layer pass timings are kept in *_pass fields")
    src["executor_layers_total_ms"] = round(sum(v[0] for v in times.values()), 6)
