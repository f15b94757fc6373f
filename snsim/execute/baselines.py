"""What a user would run instead of snsim's executor, measured the same way.

* ``autograd``: the model's forward, the loss, ``loss.backward()``.
* ``checkpoint``: ``torch.utils.checkpoint.checkpoint`` (``use_reentrant=False``)
  over sqrt(n) segments of the layer sequence (each segment returns the
  tensors later layers read, so any DAG works).
* ``save_on_cpu``: ``torch.autograd.graph.save_on_cpu(pin_memory=True)``,
  only where a GPU exists (on a CPU it moves nothing).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch.utils.checkpoint import checkpoint

from snsim.torchgraph.program import Program


def autograd_step(program: Program, batch: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        x = batch.to(next(iter(program.model.parameters())).device, copy=True)
        program.reference_loss(x).backward()
    return step


def checkpoint_step(program: Program, batch: torch.Tensor) -> Callable[[], None]:
    n = program.n
    k = max(1, int(math.isqrt(n - 1)))
    bounds = list(range(1, n, k)) + [n]
    consumers_after: dict[int, int] = {}
    for layer in program.layers:
        for j in layer.inputs:
            consumers_after[j] = max(consumers_after.get(j, 0), layer.id)

    def make_segment(a: int, b: int, ins: list[int], outs: list[int]):
        def seg(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            values: dict[int, Any] = dict(zip(ins, xs))
            for i in range(a, b):
                values[i] = program.run(i, values)
            return tuple(values[i] for i in outs)
        return seg

    segments = []
    for a, b in zip(bounds, bounds[1:]):
        ins = sorted({j for i in range(a, b) for j in program.layers[i].inputs if j < a})
        outs = [i for i in range(a, b) if consumers_after.get(i, 0) >= b or i == n - 1]
        segments.append((make_segment(a, b, ins, outs), ins, outs))

    def step() -> None:
        dev = next(iter(program.model.parameters())).device
        values: dict[int, Any] = {0: batch.to(dev, copy=True)}
        for seg, ins, outs in segments:
            res = checkpoint(seg, *[values[j] for j in ins], use_reentrant=False)
            values.update(zip(outs, res))  # checkpoint saves its inputs anyway
        values[n - 1].backward()
    return step


def save_on_cpu_step(program: Program, batch: torch.Tensor) -> Callable[[], None] | None:
    if not torch.cuda.is_available():
        return None
    plain = autograd_step(program, batch)

    def step() -> None:
        with torch.autograd.graph.save_on_cpu(pin_memory=True):
            plain()
    return step


BASELINES = {"autograd": autograd_step, "checkpoint-sqrt-n": checkpoint_step,
             "save_on_cpu": save_on_cpu_step}
