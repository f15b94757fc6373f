"""Mixed precision: the ``torch.autocast`` region of a trace's ``training.amp``.

Forward computation (the profiler's capture and layer passes, the executor's
forward and recomputed steps, the plain-PyTorch baseline's forward and loss)
runs inside it; backward runs outside, as ``loss.backward()`` after a
``with torch.autocast(...)`` forward does.  ``off`` is no region at all.

Modeled traces (no real device) cannot use ``meta`` tensors under autocast:
autocast casts only tensors of its own device type (a CPU autocast leaves a
``meta`` tensor in float32).  :func:`fake_region` gives them *fake* tensors
instead (``torch._subclasses.FakeTensorMode``): tensors that report a real
device, so autocast applies its per-op rules and its weight-cast cache as it
does on that device, while every kernel only computes shapes and dtypes, as
on ``meta``.  The device whose rules apply is :func:`rules_device`: ``cuda``
when this torch build has a GPU to run on, else ``cpu`` (a CPU-only build
cannot make fake CUDA tensors: autograd aborts the process looking for a
CUDA device guard).  One correction: PyTorch's batch-norm decomposition,
which fake tensors run, returns the saved mean and inverse std in the
input's dtype on CPU, while the real CPU and CUDA kernels keep them in the
weight's dtype (float32) when the input is half and the weight is not;
:class:`MixedBatchNormStats` gives them the weight's dtype.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
PRECISION = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def autocast(amp: str | None, device: torch.device):
    """The autocast context for ``amp`` on ``device`` (a null context for off/None)."""
    if amp in (None, "off"):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[amp])


def of(training) -> str:
    """The amp mode of a training record (``off`` without one)."""
    return "off" if training is None else training.amp


def rules_device() -> torch.device:
    """The device whose autocast rules a modeled mixed-precision profile applies."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


_aten = torch.ops.aten
_BATCH_NORMS = (_aten.native_batch_norm.default, _aten._native_batch_norm_legit.default,
                _aten._native_batch_norm_legit_functional.default)


class MixedBatchNormStats(TorchDispatchMode):
    """Batch norm on a half input with float32 weights saves float32 statistics,
    as the real CPU and CUDA kernels do (module docstring)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _BATCH_NORMS:
            x, w = args[0], args[1]
            if w is not None and w.dtype != x.dtype and out[1].dtype != w.dtype:
                out = (out[0], out[1].to(w.dtype), out[2].to(w.dtype)) + tuple(out[3:])
        return out


@contextlib.contextmanager
def fake_region(device: torch.device | None = None):
    """Fake tensors on ``device`` (default :func:`rules_device`) while active;
    yields the device.  Real tensors met inside become fake (the loss's targets)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    device = device or rules_device()
    with FakeTensorMode(allow_non_fake_inputs=True), MixedBatchNormStats():
        yield device


def is_fake(t: torch.Tensor) -> bool:
    """Is ``t`` a fake tensor (no storage: shapes and dtypes only)?"""
    from torch._subclasses.fake_tensor import is_fake as fake

    return fake(t)


def to_fake(model: torch.nn.Module, example: torch.Tensor, device: torch.device):
    """``model`` and an ``example`` batch of the same shape and dtype as fake
    tensors on ``device``; call inside :func:`fake_region`.  Parameter values
    are not kept (a modeled profile needs none)."""
    model = model.to_empty(device=device)
    return model, torch.empty(example.shape, dtype=example.dtype, device=device)
