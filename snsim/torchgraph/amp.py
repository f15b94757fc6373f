"""Mixed precision: the ``torch.autocast`` region of a trace's ``training.amp``.

Forward computation (the profiler's capture and layer passes, the executor's
forward and recomputed steps, the plain-PyTorch baseline's forward and loss)
runs inside it; backward runs outside, as ``loss.backward()`` after a
``with torch.autocast(...)`` forward does.  ``off`` is no region at all.
"""

from __future__ import annotations

import contextlib

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(amp: str | None, device: torch.device):
    """The autocast context for ``amp`` on ``device`` (a null context for off/None)."""
    if amp in (None, "off"):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[amp])


def of(training) -> str:
    """The amp mode of a training record (``off`` without one)."""
    return "off" if training is None else training.amp
