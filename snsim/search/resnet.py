"""Modeled ResNet traces by shape arithmetic, without torch.

``snsim profile resnet-N --device-model P`` captures the zoo's bottleneck
ResNet on the meta device and prices every ATen kernel through the roofline
(``snsim/profile/modeled.py``).  A depth search needs hundreds of such traces
of 10^3-10^4 layers; profiling each takes minutes.  This module writes the
same document from the shapes alone: the same layers, names, kinds, bytes,
saved extras, kernel lists ``[flops, bytes]`` and times (summed in the same
order by :func:`snsim.devices.step_ms`, rounded as the profiler rounds).
``tests/test_search.py`` holds it equal, layer for layer, to a fresh profile
where torch is installed, and to the shipped profiled K40c traces except in
two ``bwd_reads`` (those traces predate the capture's reading of autograd's
saved tensors: max pooling reads its input and indices, not its output; cross
entropy keeps its log-softmax, not its input).  Only ``source`` differs (it
says this generator made the trace), and the profile's ``released_after``
(where the zoo's Python code lets go of a tensor, which only ``snsim
validate``'s plain-PyTorch comparison reads; policies free at last use) is
not generated.

What each kernel moves (bytes of its tensor arguments and outputs, as the
profiler counts them; X = the layer's output, I = its input, C = channels):

- conv: forward ``I + W + X``; backward one ``convolution_backward``:
  ``G_X + I + W + G_W`` plus ``G_I`` when the input requires grad (not for the
  stem, whose input is the data), FLOPs 1x (stem) or 2x the forward.
- batch norm: ``num_batches_tracked += 1`` (16 bytes), then
  ``I + X + 6 C`` floats (weight, bias, running mean/var, saved mean/invstd);
  backward ``3 X + 7 C`` floats; saved extras ``2 C`` floats.
- ReLU (in place, profiled out of place): ``2 X``; backward ``3 X``.
- max pool: ``I + X + idx`` (int64 indices, the saved extra); backward
  ``G_X + I + idx + G_I``.
- add: ``3 X``; backward no kernel (one launch).
- global average pool: ``I + X``; backward ``2 I`` (the expanded gradient).
- fc (addmm): ``b + I + W + X``; backward two mm and a sum.
- loss (cross entropy): log_softmax ``2 X_in``, nll_loss ``X_in + targets +
  8``; backward ``X_in + targets + 8 + X_in`` and ``3 X_in``.
"""

from __future__ import annotations

import math
from typing import Any

from snsim import devices
from snsim.devices import DevicePreset, step_ms
from snsim.trace.model import SCHEMA

F32 = 4
CLASSES = 1000
IMAGE = (3, 227, 227)  # the zoo's ResNet input


def stage_config(depth: int) -> tuple[int, int, int, int]:
    """The bottleneck stages of ResNet-``depth`` in the searched family.

    The family is the SuperNeurons release's [6, 32, n, 6] line (ResNet-506 is
    [6, 32, 124, 6], ResNet-2498 "2500" is [6, 32, 788, 6]), grown in its third
    stage: depth = 3 (6 + 32 + n + 6) + 2 = 3 n + 134, n >= 1.
    """
    n, rem = divmod(depth - 134, 3)
    if n < 1 or rem:
        raise ValueError(f"depth {depth} is not 3 n + 134 with n >= 1")
    return (6, 32, n, 6)


def depth_of(third: int) -> int:
    return 3 * third + 134


def _r(x: float) -> float:
    return round(float(x), 6)


class _Builder:
    def __init__(self, batch: int, preset: DevicePreset):
        self.b, self.preset = batch, preset
        self.layers: list[dict[str, Any]] = []
        self.shapes: list[tuple[int, ...]] = []

    def bytes_of(self, i: int) -> int:
        return F32 * math.prod(self.shapes[i])

    def add(self, name, kind, op, inputs, shape, fwd_k, bwd_k, reads, param_bytes=0,
            extra=0, inplace_of=None, shares=()) -> int:
        i = len(self.layers)
        fwd, bwd = step_ms(fwd_k, self.preset), step_ms(bwd_k, self.preset)
        d: dict[str, Any] = {
            "id": i, "name": name, "kind": kind, "inputs": list(inputs),
            "output_bytes": F32 * math.prod(shape) if shape else F32,
            "param_bytes": param_bytes, "fwd_ms": _r(fwd), "bwd_ms": _r(bwd),
            "bwd_reads": list(reads)}
        if extra:
            d["saved_extra_bytes"] = extra
        if shares:   # autograd hands these inputs this layer's own gradient (capture [10])
            d["grad_shares"] = list(shares)
        d["fwd_flops"] = int(sum(f for f, _ in fwd_k))
        d["bwd_flops"] = int(sum(f for f, _ in bwd_k))
        d["fwd_kernels"] = [[int(f), int(b)] for f, b in fwd_k]
        d["bwd_kernels"] = [[int(f), int(b)] for f, b in bwd_k]
        if kind == "conv":
            d["workspace"] = [{"algo": "modeled-default", "bytes": 0, "fwd_ms": _r(fwd),
                               "bwd_ms": _r(bwd)}]
        d["op"] = op
        d["shape"] = list(shape)
        if inplace_of is not None:
            d["inplace"] = True
            d["inplace_of"] = inplace_of
            d["inplace_alias"] = True   # it writes into its input's storage (capture [2])
        self.layers.append(d)
        self.shapes.append(tuple(shape))
        return i

    def conv(self, name, x, cout, k, s, p, grad_input=True) -> int:
        b, cin, h, w = self.shapes[x]
        oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        shape = (b, cout, oh, ow)
        wb = F32 * cout * cin * k * k
        xi, xo = self.bytes_of(x), F32 * math.prod(shape)
        flops = 2 * math.prod(shape) * cin * k * k
        bwd_bytes = xo + xi + wb + wb + (xi if grad_input else 0)
        return self.add(name, "conv", "Conv2d", [x], shape, [(flops, xi + wb + xo)],
                        [((2 if grad_input else 1) * flops, bwd_bytes)], ["inputs"], wb)

    def bn(self, name, x) -> int:
        shape, xb = self.shapes[x], self.bytes_of(x)
        c = F32 * shape[1]
        return self.add(name, "bn", "BatchNorm2d", [x], shape,
                        [(0, 16), (0, 2 * xb + 6 * c)], [(0, 3 * xb + 7 * c)], ["inputs"],
                        2 * c, extra=2 * c)

    def relu(self, name, x) -> int:
        xb = self.bytes_of(x)
        return self.add(name, "act", "ReLU", [x], self.shapes[x], [(0, 2 * xb)],
                        [(0, 3 * xb)], ["output"], inplace_of=x)


def resnet_doc(stages, batch: int, device_model: str = "k40c",
               model: str | None = None) -> dict[str, Any]:
    """The ``snsim.trace/1`` document ``snsim profile`` writes for the zoo's
    bottleneck ResNet with ``stages`` on preset ``device_model`` (modeled)."""
    preset = devices.get(device_model)
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    sb = _Builder(batch, preset)
    sb.add("data", "data", "input", [], (batch, *IMAGE), [], [], [])
    sb.layers[0] = {k: v for k, v in sb.layers[0].items()
                    if not k.endswith(("_flops", "_kernels"))}
    sb.layers[0]["fwd_ms"] = sb.layers[0]["bwd_ms"] = 0.0
    x = sb.conv("stem.0", 0, 64, 7, 2, 3, grad_input=False)
    x = sb.relu("stem.2", sb.bn("stem.1", x))
    _, c, h, w = sb.shapes[x]
    oh, ow = (h + 2 - 3) // 2 + 1, (w + 2 - 3) // 2 + 1
    xi, xo = sb.bytes_of(x), F32 * batch * c * oh * ow
    idx = 2 * xo
    x = sb.add("stem.3", "pool", "MaxPool2d", [x], (batch, c, oh, ow),
               [(0, xi + xo + idx)], [(0, xo + xi + idx + xi)], ["inputs"], extra=idx)
    k, cin = 0, 64
    for stage, n in enumerate(stages):
        width = 64 * 2**stage
        for j in range(n):
            stride = 2 if stage > 0 and j == 0 else 1
            x, k, cin = _block(sb, k, x, cin, width, stride), k + 1, 4 * width
    b, c, h, w = sb.shapes[x]
    xi = sb.bytes_of(x)
    x = sb.add("pool", "pool", "AdaptiveAvgPool2d", [x], (b, c, 1, 1),
               [(0, xi + F32 * b * c)], [(0, 2 * xi)], [])
    xi, wb, bias, out = sb.bytes_of(x), F32 * c * CLASSES, F32 * CLASSES, F32 * b * CLASSES
    flops = 2 * b * c * CLASSES
    x = sb.add("fc", "fc", "Linear", [x], (b, CLASSES), [(flops, bias + xi + wb + out)],
               [(flops, out + wb + xi), (flops, out + xi + wb), (0, out + bias)],
               ["inputs"], wb + bias)
    targets = 8 * b
    sb.add("loss", "loss", "cross_entropy", [x], (),
           [(0, 2 * out), (0, out + targets + 8)],
           [(0, 4 + out + targets + 4 + out), (0, 3 * out)], [], extra=out + 4)
    depth = 3 * sum(stages) + 2
    # batch norm's running mean and variance (float32) and its int64 batch count:
    # buffers the model holds, static beside the weights (capture note [12])
    buffers = sum(2 * F32 * sb.shapes[la["id"]][1] + 8 for la in sb.layers if la["kind"] == "bn")
    return {"schema": SCHEMA, "constant_bytes": buffers, "model": model or f"resnet-{depth}", "batch": batch,
            "dtype": "float32", "input_shape": list(IMAGE),
            "source": {"kind": "modeled", "device": "none", "device_name": preset.name,
                       "device_model": preset.key, "preset_source": preset.source,
                       "generator": "snsim.search.resnet (shape arithmetic, no torch)",
                       "stages": list(stages),
                       "roofline": "as snsim profile --device-model: t_kernel = max(flops / "
                                   "(0.6 peak_fp32), bytes / (0.8 mem_Bps)) + 5 us"},
            "device": {"name": f"{preset.name} (preset {preset.key})",
                       "memory_bytes": preset.memory_bytes,
                       "h2d_bytes_per_s": preset.h2d_Bps, "d2h_bytes_per_s": preset.d2h_Bps},
            "layers": sb.layers}


def _block(sb: _Builder, k: int, x: int, cin: int, width: int, stride: int) -> int:
    p = f"blocks.{k}"
    y = sb.relu(f"{p}.relu", sb.bn(f"{p}.conv1.1", sb.conv(f"{p}.conv1.0", x, width, 1, 1, 0)))
    y = sb.bn(f"{p}.conv2.1", sb.conv(f"{p}.conv2.0", y, width, 3, stride, 1))
    y = sb.relu(f"{p}.relu@blocks_{k}_relu_1", y)
    y = sb.bn(f"{p}.conv3.1", sb.conv(f"{p}.conv3.0", y, 4 * width, 1, 1, 0))
    short = x
    if stride != 1 or cin != 4 * width:
        short = sb.bn(f"{p}.down.1", sb.conv(f"{p}.down.0", x, 4 * width, 1, stride, 0))
    xb = sb.bytes_of(y)
    s = sb.add("add" if k == 0 else f"add_{k}", "add", "add", [y, short], sb.shapes[y],
               [(0, 3 * xb)], [], [], shares=[y, short])
    return sb.relu(f"{p}.relu@blocks_{k}_relu_2", s)
