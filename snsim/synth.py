"""Shaped traces built from layer shapes and an analytic time model.

Used before real profiles exist, for benchmarks at sizes no machine here can
run (10^4-layer chains, ResNet-2500) and for random DAGs in property tests.
Bytes are exact for the shapes given (float32 activations, 8-byte pooling
indices, 1-byte dropout masks); times come from a roofline on a nominal
device, ``time = max(flops / flops_per_s, bytes_moved / mem_Bps)``, with
backward twice the forward for layers with weights.  ``source`` says so.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from snsim import devices
from snsim.trace.model import Device, Layer, Trace, Workspace

_K40C = devices.get("k40c")
K40C = Device(name=_K40C.name, memory_bytes=_K40C.memory_bytes,
              h2d_Bps=_K40C.h2d_Bps, d2h_Bps=_K40C.d2h_Bps)
# A rough roofline on the k40c preset (snsim.devices): a sustained 60% of peak
# FP32 compute for convolutions, 80% of memory bandwidth.  The profiler's
# modeled mode (snsim.profile.modeled) is the accurate one; these shapes are
# for benchmarks and property tests.
_FLOPS_PER_S = _K40C.fp32_flops * 0.6
_MEM_BPS = _K40C.mem_Bps * 0.8

_BWD_READS = {
    "data": (), "conv": ("inputs",), "fc": ("inputs",), "matmul": ("inputs",),
    "bn": ("inputs",), "norm": ("inputs",), "act": ("output",), "pool": ("inputs", "output"),
    "lrn": ("inputs", "output"), "dropout": (), "add": (), "concat": (),
    "softmax": ("output",), "loss": ("inputs",), "attention": ("inputs",),
    "embedding": ("inputs",), "other": ("inputs",),
}


@dataclass
class _Node:
    name: str
    kind: str
    inputs: tuple[int, ...]
    shape: tuple[int, ...]   # per-sample output shape
    params: int = 0          # parameter count
    flops: float = 0.0       # forward FLOPs per sample
    saved_extra: int = 0     # bytes per sample
    conv: bool = False


class ShapeBuilder:
    """Accumulate layers by shape; :meth:`build` turns them into a :class:`Trace`."""

    def __init__(self, model: str, batch: int, input_shape: tuple[int, ...],
                 device: Device = K40C):
        self.model, self.batch, self.device = model, batch, device
        self.input_shape = tuple(input_shape)
        self.nodes: list[_Node] = [_Node("data", "data", (), self.input_shape)]

    def shape(self, i: int) -> tuple[int, ...]:
        return self.nodes[i].shape

    def add(self, name: str, kind: str, inputs, shape, params: int = 0, flops: float = 0.0,
            saved_extra: int = 0) -> int:
        self.nodes.append(_Node(name, kind, tuple(inputs), tuple(shape), params, flops,
                                saved_extra, kind == "conv"))
        return len(self.nodes) - 1

    # ---- common layers (CHW activations) ----
    def conv(self, x: int, out_c: int, k: int, stride: int = 1, pad: int | None = None,
             name: str | None = None) -> int:
        c, h, w = self.shape(x)
        pad = k // 2 if pad is None else pad
        oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        params = out_c * c * k * k + out_c
        return self.add(name or f"conv{len(self.nodes)}", "conv", [x], (out_c, oh, ow),
                        params, 2.0 * c * k * k * out_c * oh * ow)

    def bn(self, x: int) -> int:
        c = self.shape(x)[0]
        return self.add(f"bn{len(self.nodes)}", "bn", [x], self.shape(x), 2 * c,
                        8.0 * math.prod(self.shape(x)), saved_extra=0)

    def relu(self, x: int) -> int:
        return self.add(f"relu{len(self.nodes)}", "act", [x], self.shape(x), 0,
                        float(math.prod(self.shape(x))))

    def pool(self, x: int, k: int, stride: int, pad: int = 0) -> int:
        c, h, w = self.shape(x)
        oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        n = c * oh * ow
        return self.add(f"pool{len(self.nodes)}", "pool", [x], (c, oh, ow), 0,
                        float(n * k * k), saved_extra=8 * n)

    def gap(self, x: int) -> int:
        c = self.shape(x)[0]
        return self.add(f"avgpool{len(self.nodes)}", "pool", [x], (c,), 0,
                        float(math.prod(self.shape(x))))

    def fc(self, x: int, out: int) -> int:
        n_in = math.prod(self.shape(x))
        return self.add(f"fc{len(self.nodes)}", "fc", [x], (out,), n_in * out + out,
                        2.0 * n_in * out)

    def dropout(self, x: int) -> int:
        n = math.prod(self.shape(x))
        return self.add(f"dropout{len(self.nodes)}", "dropout", [x], self.shape(x), 0,
                        float(n), saved_extra=n)

    def join(self, kind: str, xs, shape) -> int:
        return self.add(f"{kind}{len(self.nodes)}", kind, xs, shape, 0,
                        float(math.prod(shape)))

    def loss(self, x: int) -> int:
        return self.add("loss", "loss", [x], (), 0, 3.0 * math.prod(self.shape(x)))

    # ---- trace ----
    def build(self, note: str = "") -> Trace:
        b = self.batch
        layers = []
        for i, nd in enumerate(self.nodes):
            out = 4 * b * math.prod(nd.shape) if nd.shape else 4
            moved = out + sum(4 * b * math.prod(self.nodes[j].shape) for j in nd.inputs)
            fwd = 0.0 if nd.kind == "data" else 1e3 * max(
                b * nd.flops / _FLOPS_PER_S, (moved + 4 * nd.params) / _MEM_BPS)
            bwd = 0.0 if nd.kind == "data" else fwd * (2.0 if nd.params else 1.0)
            ws: tuple[Workspace, ...] = ()
            if nd.conv:
                ws = (Workspace("implicit_gemm", 0, round(fwd, 6), round(bwd, 6)),
                      Workspace("gemm", out, round(0.8 * fwd, 6), round(0.85 * bwd, 6)),
                      Workspace("fft", 4 * out, round(0.6 * fwd, 6), round(0.7 * bwd, 6)))
            layers.append(Layer(
                id=i, name=nd.name, kind=nd.kind, inputs=nd.inputs, output_bytes=out,
                param_bytes=4 * nd.params, fwd_ms=round(fwd, 6), bwd_ms=round(bwd, 6),
                bwd_reads=frozenset(_BWD_READS[nd.kind]),
                saved_extra_bytes=b * nd.saved_extra, workspace=ws))
        source = {"kind": "modeled", "device": "none",
                  "device_model": "snsim.synth roofline (k40c preset: "
                                  f"{_K40C.fp32_flops / 1e12:.2f} TFLOP/s x 0.6, "
                                  f"{_K40C.mem_Bps / 1e9:.0f} GB/s x 0.8); shapes only, "
                                  "no profiling",
                  "generator": "snsim.synth", "note": note}
        return Trace(model=self.model, batch=b, layers=tuple(layers), device=self.device,
                     input_shape=self.input_shape, source=source)


# ----------------------------------------------------------------- networks
def cnn_chain(batch: int = 32, image: int = 64) -> Trace:
    """A small plain CNN: conv-relu-pool x3, then two fc layers with dropout."""
    sb = ShapeBuilder("cnn_chain", batch, (3, image, image))
    x = 0
    for c in (32, 64, 128):
        x = sb.pool(sb.relu(sb.conv(x, c, 3)), 2, 2)
    x = sb.dropout(sb.relu(sb.fc(x, 256)))
    sb.loss(sb.fc(x, 10))
    return sb.build("plain chain")


def resnet(blocks=(3, 4, 6, 3), batch: int = 32, image: int = 227,
           model: str | None = None) -> Trace:
    """Bottleneck ResNet with the SuperNeurons stage configuration ``blocks``."""
    sb = ShapeBuilder(model or f"resnet{3 * sum(blocks) + 2}", batch, (3, image, image))
    x = sb.pool(sb.relu(sb.bn(sb.conv(0, 64, 7, 2, 3))), 3, 2, 1)
    for stage, n in enumerate(blocks):
        width = 64 * 2**stage
        for blk in range(n):
            stride = 2 if stage > 0 and blk == 0 else 1
            y = sb.relu(sb.bn(sb.conv(x, width, 1, 1, 0)))
            y = sb.relu(sb.bn(sb.conv(y, width, 3, stride, 1)))
            y = sb.bn(sb.conv(y, 4 * width, 1, 1, 0))
            short = x if blk > 0 else sb.bn(sb.conv(x, 4 * width, 1, stride, 0))
            x = sb.relu(sb.join("add", [y, short], sb.shape(y)))
    sb.loss(sb.fc(sb.gap(x), 1000))
    return sb.build(f"bottleneck stages {list(blocks)}")


def inception_net(batch: int = 32, image: int = 64, modules: int = 3) -> Trace:
    """A stem and ``modules`` Inception-style blocks joined by channel concat."""
    sb = ShapeBuilder("inception_small", batch, (3, image, image))
    x = sb.pool(sb.relu(sb.conv(0, 64, 3, 2, 1)), 2, 2)
    for _ in range(modules):
        b1 = sb.relu(sb.conv(x, 32, 1, 1, 0))
        b2 = sb.relu(sb.conv(sb.relu(sb.conv(x, 24, 1, 1, 0)), 48, 3))
        b3 = sb.relu(sb.conv(sb.relu(sb.conv(x, 8, 1, 1, 0)), 16, 5))
        b4 = sb.relu(sb.conv(sb.pool(x, 3, 1, 1), 16, 1, 1, 0))
        c, h, w = sb.shape(b1)
        x = sb.join("concat", [b1, b2, b3, b4], (32 + 48 + 16 + 16, h, w))
    sb.loss(sb.fc(sb.gap(x), 10))
    return sb.build("inception-style concat blocks")


def chain(n: int, batch: int = 16, width: int = 64, image: int = 32) -> Trace:
    """``n`` layers: data, then conv/bn/relu repeated, then the loss."""
    sb = ShapeBuilder(f"chain{n}", batch, (width, image, image))
    x, k = 0, 0
    while len(sb.nodes) < n - 1:
        x = sb.conv(x, width, 3) if k % 3 == 0 else (sb.bn(x) if k % 3 == 1 else sb.relu(x))
        k += 1
    sb.loss(x)
    return sb.build(f"{n}-layer conv/bn/relu chain")


def random_dag(seed: int, n: int = 12) -> Trace:
    """A random valid trace: chains, forks, joins, dead ends, workspaces, extras."""
    rng = random.Random(seed)
    kinds = ["conv", "fc", "act", "bn", "pool", "dropout", "add", "concat", "other"]
    layers = [Layer(0, "data", "data", (), rng.randint(1, 64) * 1024, 0, 0.0, 0.0,
                    frozenset())]
    for i in range(1, n):
        kind = "loss" if i == n - 1 else rng.choice(kinds)
        if kind in ("add", "concat") and i >= 2:
            inputs = tuple(sorted(rng.sample(range(i), 2)))
        else:
            inputs = (i - 1 if rng.random() < 0.7 else rng.randrange(i),)
        fwd = round(rng.uniform(0.1, 5.0), 3)
        ws: tuple[Workspace, ...] = ()
        if kind == "conv" and rng.random() < 0.6:
            ws = (Workspace("a", 0, fwd, 2 * fwd),
                  Workspace("b", rng.randint(1, 128) * 1024, round(fwd / 2, 3), fwd))
        reads = _BWD_READS[kind if kind != "other" else rng.choice(list(_BWD_READS))]
        layers.append(Layer(
            id=i, name=f"{kind}{i}", kind=kind, inputs=inputs,
            output_bytes=rng.randint(1, 64) * 1024,
            param_bytes=rng.choice([0, 0, 4096]) if kind in ("conv", "fc", "other") else 0,
            fwd_ms=fwd, bwd_ms=round(2 * fwd, 3), bwd_reads=frozenset(reads),
            saved_extra_bytes=rng.choice([0, 0, 512]), workspace=ws))
    if not any(layer.param_bytes for layer in layers):
        layers[1] = Layer(**{**{f: getattr(layers[1], f) for f in Layer.__slots__
                                if f != "__weakref__"}, "param_bytes": 4096})
    src = {"kind": "modeled", "device_model": f"snsim.synth.random_dag(seed={seed})"}
    return Trace(model=f"random{seed}", batch=1, layers=tuple(layers), source=src,
                 device=Device("test", 2**30, 1e9, 1e9))
