"""Measured mode: per-layer times, a plain training step and the host link.

Layers are timed the way a training step runs them (:func:`time_layers`):
each pass runs every layer once in execution order, each on leaf copies of
its recorded inputs (:class:`snsim.torchgraph.capture.LayerOp`), then every
backward in reverse order (``torch.autograd.grad`` of the layer's output
with a fixed random ``grad_output`` with respect to its floating inputs and
parameters), freeing each layer's graph as it goes.  ``warmup`` passes are
untimed, ``repeats`` are timed; the layer's ``fwd_ms``/``bwd_ms`` are the
medians, ``*_ms_p10``/``*_ms_p90`` the spread.  A plain training step of the
whole model runs after each pass, so both see the same machine load.

Why passes, not one layer repeated: a layer repeated back to back runs with
its tensors hot in cache; on resnet18 (batch 8, 64x64, one CPU thread) such
isolated medians summed to 5-22% below the plain step, passes to about 7-8%
below it.  The rest is autograd work between layers (gradient accumulation
at forks) that belongs to no layer.

Clocks: CPU uses ``time.perf_counter_ns`` around each call (with
``torch.set_num_threads(1)`` set by the caller); CUDA uses a pair of CUDA
events around each call, synchronized before reading.

Side effects: the model stays in training mode and its batch-norm running
statistics are updated by every timed forward (as by training steps).

Host link: on CUDA, pinned host->device and device->host copies over sizes
from 1 MiB to 256 MiB (curve and the largest transfer's rate recorded); on a
CPU there is no PCIe link, so the figure recorded is a copy into a
preallocated host buffer, and ``source.link`` says exactly that.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable

import torch

from snsim.errors import SnsimError
from snsim.torchgraph.capture import LayerOp, tensors_of
from snsim.torchgraph.clock import Clock, quantiles


def _spread(prefix: str, xs: list[float]) -> dict[str, float]:
    m, lo, hi = quantiles(xs) if xs else (0.0, 0.0, 0.0)
    return {prefix: m, f"{prefix}_p10": lo, f"{prefix}_p90": hi}


def _grad_targets(out: Any, leaves: list[torch.Tensor], op: LayerOp):
    outs = [t for t in tensors_of(out)
            if isinstance(t, torch.Tensor) and t.requires_grad]
    wrt = [x for x in leaves if x.requires_grad] + list(op.params)
    return outs, wrt


def time_layers(ops: list[LayerOp | None], clock: Clock, warmup: int, repeats: int,
                step: Callable[[], Any], progress: Callable[[], None] | None = None
                ) -> tuple[list[dict[str, float]], dict[str, float]]:
    """Per-layer times from passes over the whole network, and the plain step's times.

    ``ops[i] is None`` (the data layer) gets zeros.  ``step`` runs one plain
    training step; a ``RuntimeError`` from it becomes :class:`SnsimError`.
    """
    try:
        return _time_layers(ops, clock, warmup, repeats, step, progress)
    except torch.OutOfMemoryError:
        raise SnsimError("out of device memory while timing layers (measured mode keeps "
                         "the recorded inputs of every layer beside a pass, about twice a "
                         "training step's activations); use a smaller --batch or "
                         "--device-model for a modeled trace") from None


def _time_layers(ops, clock, warmup, repeats, step, progress):
    n = len(ops)
    leaves = [op.leaves() if op is not None else [] for op in ops]
    grads: list[list[torch.Tensor] | None] = [None] * n
    fwd: list[list[float]] = [[] for _ in ops]
    bwd: list[list[float]] = [[] for _ in ops]
    steps: list[float] = []
    gen = torch.Generator(device="cpu").manual_seed(1)
    for rep in range(warmup + repeats):
        keep = rep >= warmup
        outs: list[Any] = [None] * n
        for i, op in enumerate(ops):
            if op is None:
                continue
            ms, outs[i] = clock.once(op.fn, *leaves[i])
            if keep:
                fwd[i].append(ms)
            if progress is not None:
                progress()
        for i in range(n - 1, -1, -1):
            if outs[i] is None:
                continue
            targets, wrt = _grad_targets(outs[i], leaves[i], ops[i])
            outs[i] = None
            if targets and wrt:
                if grads[i] is None:
                    grads[i] = [torch.randn(t.shape, generator=gen, dtype=t.dtype).to(t.device)
                                for t in targets]
                ms, _ = clock.once(torch.autograd.grad, targets, wrt, grads[i],
                                   allow_unused=True)
                if keep:
                    bwd[i].append(ms)
            del targets, wrt
        try:
            ms, _ = clock.once(step)
        except RuntimeError as exc:  # e.g. an in-place op overwrote a tensor backward needs
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise SnsimError(f"the model's own training step fails: {msg}") from None
        if keep:
            steps.append(ms)
    times = [{**_spread("fwd_ms", f), **_spread("bwd_ms", b)} for f, b in zip(fwd, bwd)]
    return times, _spread("step_ms", steps)


def training_step(model: torch.nn.Module, example: torch.Tensor, loss_fn) -> Callable[[], Any]:
    """A plain forward + loss + backward of the whole model (parameter gradients)."""
    params = [p for p in model.parameters() if p.requires_grad]

    def step():
        return torch.autograd.grad(loss_fn(*tensors_of(model(example))), params)
    return step


def time_layer(op: LayerOp, clock: Clock, warmup: int, repeats: int) -> dict[str, float]:
    """Median and p10/p90 times of one layer run alone, back to back (CUDA conv candidates)."""
    leaves = op.leaves()
    fwd = clock.time_ms(lambda: op.fn(*leaves), warmup, repeats)
    out = op.fn(*leaves)
    outs = [t for t in tensors_of(out)
            if isinstance(t, torch.Tensor) and t.requires_grad]
    wrt = [x for x in leaves if x.requires_grad] + list(op.params)
    res: dict[str, float] = {}
    m, lo, hi = quantiles(fwd)
    res.update(fwd_ms=m, fwd_ms_p10=lo, fwd_ms_p90=hi)
    if outs and wrt:
        gen = torch.Generator(device="cpu").manual_seed(1)
        grads = [torch.randn(t.shape, generator=gen, dtype=t.dtype).to(t.device) for t in outs]
        bwd = clock.time_ms(lambda: torch.autograd.grad(outs, wrt, grads, retain_graph=True,
                                                        allow_unused=True), warmup, repeats)
        m, lo, hi = quantiles(bwd)
    else:
        m = lo = hi = 0.0
    res.update(bwd_ms=m, bwd_ms_p10=lo, bwd_ms_p90=hi)
    return res


def conv_workspaces(op: LayerOp, clock: Clock, warmup: int,
                    repeats: int) -> tuple[list[dict], dict[str, float]]:
    """CUDA: one entry per cuDNN selection mode, with measured workspace and times.

    PyTorch exposes no per-algorithm cuDNN API, but it exposes the choice
    between the heuristic algorithm (``cudnn.benchmark = False``, PyTorch's
    default, listed first) and the fastest found by ``cudnnFind``
    (``benchmark = True``).  Workspace = the caching allocator's peak during
    the call above what is allocated after it (forward: ``bytes``; backward:
    ``bwd_bytes``).  Returns the entries and the full timing of the first.
    """
    entries, first = [], {}
    saved = torch.backends.cudnn.benchmark
    try:
        for algo, bench in (("cudnn-heuristic", False), ("cudnn-benchmark", True)):
            torch.backends.cudnn.benchmark = bench
            leaves = op.leaves()
            op.fn(*leaves)  # let benchmark mode search before measuring
            fwd_ws, out = _peak_above(op.fn, *leaves)
            outs = [t for t in tensors_of(out)
                    if isinstance(t, torch.Tensor) and t.requires_grad]
            wrt = [x for x in leaves if x.requires_grad] + list(op.params)
            bwd_ws = 0
            if outs and wrt:
                grads = [torch.ones_like(t) for t in outs]
                bwd_ws, _ = _peak_above(torch.autograd.grad, outs, wrt, grads,
                                        retain_graph=True, allow_unused=True)
            out = outs = None  # free before timing
            t = time_layer(op, clock, warmup, repeats)
            first = first or t
            entries.append({"algo": algo, "bytes": fwd_ws, "bwd_bytes": bwd_ws,
                            "fwd_ms": t["fwd_ms"], "bwd_ms": t["bwd_ms"]})
    finally:
        torch.backends.cudnn.benchmark = saved
    return entries, first


def _peak_above(fn, *args, **kwargs) -> tuple[int, object]:
    """(allocator peak during ``fn(...)`` minus what is allocated after it, its result)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    result = fn(*args, **kwargs)
    torch.cuda.synchronize()
    return max(0, torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()), result


_SIZES = [2**20, 2**22, 2**24, 2**26, 2**28]


def link_bandwidth(device: torch.device, repeats: int = 5) -> dict:
    """Host<->device copy rates over several sizes (see module docstring)."""
    clock = Clock(device)
    if device.type == "cuda":
        curve = {"h2d": [], "d2h": []}
        for size in _SIZES:
            host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            dev = torch.empty(size, dtype=torch.uint8, device=device)
            h2d = statistics.median(clock.time_ms(lambda: dev.copy_(host, non_blocking=True),
                                                  2, repeats))
            d2h = statistics.median(clock.time_ms(lambda: host.copy_(dev, non_blocking=True),
                                                  2, repeats))
            curve["h2d"].append([size, size / (h2d / 1e3)])
            curve["d2h"].append([size, size / (d2h / 1e3)])
            del host, dev
        return {"kind": "cuda pinned host<->device copies (CUDA events)",
                "h2d_bytes_per_s": curve["h2d"][-1][1], "d2h_bytes_per_s": curve["d2h"][-1][1],
                "curve_bytes_Bps": curve}
    curve = []
    for size in _SIZES[:4]:
        src = torch.empty(size, dtype=torch.uint8).fill_(1)
        dst = torch.empty(size, dtype=torch.uint8)
        ms = statistics.median(clock.time_ms(lambda: dst.copy_(src), 2, repeats))
        curve.append([size, size / (ms / 1e3)])
    return {"kind": "cpu: no PCIe link on a CPU; figure is a host memcpy into a preallocated "
                    "buffer (torch copy_, one thread), used for both directions",
            "h2d_bytes_per_s": curve[-1][1], "d2h_bytes_per_s": curve[-1][1],
            "curve_bytes_Bps": curve}
