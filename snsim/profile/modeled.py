"""Modeled mode: layer times from FLOPs and bytes through a roofline.

The model is built and run on the ``meta`` device, so no activation or weight
memory exists (ResNet-2500 at batch 32 profiles on a laptop); shapes, and so
every byte field, are exact and identical to a measured run (same capture).

Each layer's forward, and then its backward (``torch.autograd.grad`` with
respect to its inputs and parameters), run under a dispatch mode that sees
every ATen kernel.  Each kernel ``k`` costs

    t_k = max(flops_k / (EFF_COMPUTE * P), bytes_k / (EFF_MEMORY * B)) + T_LAUNCH

where ``flops_k`` comes from ``torch.utils.flop_counter``'s formula registry
(convolutions, matmuls, attention; 0 for kernels it has no formula for),
``bytes_k`` is the bytes of the kernel's tensor arguments plus its outputs
(each read or written once; views and allocations move nothing), ``P`` the
preset's peak FLOP/s in the kernel's precision: FP32, or, for a kernel with
FLOPs whose first floating argument is bfloat16/float16 (a mixed-precision
profile, ``--amp``: the layers run under ``torch.autocast`` on fake tensors,
snsim.torchgraph.amp), the preset's BF16/FP16 rate
(``DevicePreset.peak_flops``); such a kernel is recorded as ``[flops, bytes,
"bf16"]``.  ``B`` is its memory bandwidth.  Layer time =
sum over its kernels.  Constants (assumptions, not measurements):
``EFF_COMPUTE = 0.6`` (sustained fraction of peak for cuDNN/cuBLAS-class
kernels), ``EFF_MEMORY = 0.8`` (STREAM-like fraction of peak bandwidth),
``T_LAUNCH = 5 us`` (kernel launch and framework overhead per kernel).

A step that launches no kernel (an ``add``'s backward passes the gradient
through) still costs one ``T_LAUNCH``: the framework's dispatch is not free.

Convolutions get one workspace entry ``modeled-default`` with 0 bytes and
the layer's times: the model has no algorithm choices (``source.workspace``
says so).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from snsim.torchgraph import amp as amp_mod
from snsim.torchgraph.amp import PRECISION
from snsim.torchgraph.capture import LayerOp, capture
from snsim.devices import EFF_COMPUTE, EFF_MEMORY, T_LAUNCH_S, DevicePreset, kernel_seconds

__all__ = ["EFF_COMPUTE", "EFF_MEMORY", "T_LAUNCH_S", "Cost", "CostMode", "layer_cost"]

FORMULA = ("t_kernel = max(flops / (0.6 * peak), bytes_moved / (0.8 * mem_Bps)) + 5 us, "
           "peak = the preset's FP32 rate, or its BF16/FP16 rate for a half-precision kernel; "
           "layer time = sum over its ATen kernels (forward; backward via autograd.grad); "
           "flops from torch.utils.flop_counter, bytes = tensor args + outputs")

_aten = torch.ops.aten
_FREE = {_aten.empty.memory_format, _aten.empty_like.default, _aten.empty_strided.default,
         _aten.detach.default, _aten.alias.default, _aten.lift_fresh.default,
         _aten.new_empty.default, _aten.new_empty_strided.default}


@dataclass
class Cost:
    flops: float = 0.0
    bytes: int = 0
    kernels: int = 0
    seconds: float = 0.0
    # each kernel's (flops, bytes moved[, precision]), in dispatch order: what
    # re-prices the step on another preset (snsim.devices.step_ms, ``simulate --device``)
    each: list = field(default_factory=list)


class CostMode(TorchDispatchMode):
    """Accumulate roofline cost of every kernel dispatched while active."""

    def __init__(self, preset: DevicePreset):
        super().__init__()
        self.preset = preset
        self.cost = Cost()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in _FREE or func.is_view:
            return out
        packet = func._overloadpacket
        flops = 0.0
        if packet in flop_registry:
            flops = float(flop_registry[packet](*args, **kwargs, out_val=out))
        moved = sum(t.numel() * t.element_size()
                    for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor))
        precision = _precision(args) if flops else None
        c = self.cost
        c.flops += flops
        c.bytes += moved
        c.kernels += 1
        c.seconds += kernel_seconds(flops, moved, self.preset, precision)
        c.each.append((flops, moved) if precision is None else (flops, moved, precision))
        return out


def _precision(args) -> str | None:
    """``bf16``/``fp16`` when the kernel's first floating argument is half, else None."""
    for t in tree_flatten(args)[0]:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            return PRECISION.get(t.dtype)
    return None


def layer_cost(op: LayerOp, preset: DevicePreset,
               cache: dict | None = None) -> tuple[Cost, Cost]:
    """(forward, backward) roofline cost of one layer on meta tensors.

    ``cache`` maps :attr:`LayerOp.key` to results: equal keys cost the same.
    """
    if cache is not None and op.key is not None:
        if op.key not in cache:
            cache[op.key] = layer_cost(op, preset)
        return cache[op.key]
    leaves = op.leaves()
    with CostMode(preset) as fwd_mode:
        out = op.fn(*leaves)
    outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    wrt = [x for x in leaves if x.requires_grad] + list(op.params)
    bwd = Cost()
    if outs and wrt:
        grads = [torch.empty_like(t) for t in outs]
        with CostMode(preset) as bwd_mode:
            torch.autograd.grad(outs, wrt, grads, allow_unused=True)
        bwd = bwd_mode.cost
        bwd.seconds = max(bwd.seconds, T_LAUNCH_S)
    fwd = fwd_mode.cost
    fwd.seconds = max(fwd.seconds, T_LAUNCH_S)
    return fwd, bwd


def profile_layers(ms, example: torch.Tensor, amp: str, preset: DevicePreset, on_node, bar):
    """Capture ``ms.model`` on ``example`` and price every layer: on ``meta``;
    under ``--amp`` on fake tensors of :func:`snsim.torchgraph.amp.rules_device`,
    inside its autocast (``ms.model`` is then the fake model).  Returns the
    capture and each layer's times and kernels."""
    region = amp_mod.fake_region() if amp != "off" else contextlib.nullcontext(None)
    with region as fake_dev:
        model = ms.model
        if fake_dev is not None:
            model, example = amp_mod.to_fake(model, example, fake_dev)
        with amp_mod.autocast(amp, example.device):
            captured = capture(model, example, on_node)
            bar.phase("model", len(captured.layers))
            cache: dict = {}
            times = [_layer_times(layer, preset, bar, cache) for layer in captured.layers]
    ms.model = model
    return captured, times


def _layer_times(layer, preset: DevicePreset, bar, cache) -> dict[str, Any]:
    bar.step()
    if layer.op is None:
        return {"fwd_ms": 0.0, "bwd_ms": 0.0}
    fwd, bwd = layer_cost(layer.op, preset, cache)
    t = {"fwd_ms": fwd.seconds * 1e3, "bwd_ms": bwd.seconds * 1e3,
         "fwd_flops": fwd.flops, "bwd_flops": bwd.flops,
         # each kernel's [flops, bytes(, precision)]: lets simulate --device re-price it
         "fwd_kernels": [list(k) for k in fwd.each],
         "bwd_kernels": [list(k) for k in bwd.each]}
    if layer.kind == "conv":
        t["workspace"] = [{"algo": "modeled-default", "bytes": 0, "fwd_ms": t["fwd_ms"],
                           "bwd_ms": t["bwd_ms"]}]
    return t


def source(preset: DevicePreset, amp: str) -> dict[str, Any]:
    """The trace's ``source`` block of a modeled profile."""
    src = {"kind": "modeled", "device": "meta", "device_name": preset.name,
           "device_model": preset.key, "preset_source": preset.source,
           "roofline": FORMULA,
           "workspace": "modeled: one 'modeled-default' entry (0 bytes) per convolution; "
                        "the model has no algorithm choices"}
    if amp != "off":
        rules = amp_mod.rules_device().type
        src["autocast"] = (f"{amp}: layers captured and priced under torch.autocast("
                           f"{rules!r}) on fake tensors ({rules} autocast's per-op rules and "
                           "weight-cast cache; half-precision kernels at the preset's "
                           f"{amp} rate)")
    return src


def device_block(preset: DevicePreset) -> dict[str, Any]:
    """The trace's ``device`` block of a modeled profile: the preset's memory and links."""
    return {"name": f"{preset.name} (preset {preset.key})", "memory_bytes": preset.memory_bytes,
            "h2d_bytes_per_s": preset.h2d_Bps, "d2h_bytes_per_s": preset.d2h_Bps}
