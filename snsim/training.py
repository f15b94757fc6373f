"""Training state of a trace: optimizer, its state and step, gradient lifetime, precision.

The trace's optional top-level ``training`` object (docs/DESIGN.md section 3a):

    {"optimizer": "adam", "amsgrad": false, "grads": "resident", "amp": "off",
     "state_bytes": 123, "step_ms": 1.5, "step_transient_bytes": 456,
     "param_tensors": 62}

Only ``optimizer`` is required.  A trace without the object means what it
always meant: no optimizer step, no state, gradients resident (static =
2 x parameters).  Absent ``state_bytes`` follows :func:`state_bytes`; absent
``step_ms`` / ``step_transient_bytes`` are modeled (:func:`modeled_step_ms`,
:func:`modeled_transient_bytes`).  Torch-free: the simulator reads it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from snsim.errors import TraceError

OPTIMIZERS = ("none", "sgd", "momentum", "adam", "adamw")
GRADS = ("resident", "set-to-none")
AMPS = ("off", "bf16", "fp16")
# state buffers per parameter, as torch.optim keeps them (SGD momentum_buffer;
# Adam/AdamW exp_avg and exp_avg_sq, plus max_exp_avg_sq with amsgrad)
BUFFERS = {"none": 0, "sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}
# Adam/AdamW keep a per-parameter ``step`` count: a 0-d float32 tensor
STEP_COUNT_BYTES = 4
# bytes moved by one step per parameter byte (read param and grad, read and
# write each state buffer, write the param; Adam's foreach step also writes and
# reads one temporary, sqrt(v)): the modeled step time is these bytes / bandwidth
MOVED = {"none": 0, "sgd": 3, "momentum": 5, "adam": 9, "adamw": 9}
# memory bandwidth of the modeled step when the trace names no device preset: a
# round figure for one CPU core's streaming bandwidth (the step is not measured)
DEFAULT_STEP_Bps = 10e9
KEYS = {"optimizer", "amsgrad", "grads", "amp", "state_bytes", "step_ms",
        "step_transient_bytes", "param_tensors", "offload"}


@dataclass(frozen=True, slots=True)
class Training:
    optimizer: str = "none"
    amsgrad: bool = False
    grads: str = "resident"
    amp: str = "off"
    state_bytes: int | None = None
    step_ms: float | None = None
    step_transient_bytes: int | None = None
    param_tensors: int | None = None
    offload: bool = False     # state and step on the host (ZeRO-Offload)

    @property
    def has_step(self) -> bool:
        """Does the iteration end with an optimizer step?"""
        return self.optimizer != "none"

    @property
    def set_to_none(self) -> bool:
        return self.grads == "set-to-none"

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        if not self.offload:
            del d["offload"]
        return d


def state_bytes(optimizer: str, param_bytes: int, amsgrad: bool = False,
                param_tensors: int = 0) -> int:
    """Optimizer state bytes as ``torch.optim`` keeps them: ``BUFFERS`` buffers of
    every parameter's size (one more with ``amsgrad``), plus Adam's 4-byte step
    count per parameter tensor."""
    buffers = BUFFERS[optimizer] + (1 if amsgrad and optimizer in ("adam", "adamw") else 0)
    steps = STEP_COUNT_BYTES * param_tensors if optimizer in ("adam", "adamw") else 0
    return buffers * param_bytes + steps


def modeled_transient_bytes(optimizer: str, param_bytes: int) -> int:
    """The step's temporaries under ``foreach`` (CUDA's default): Adam/AdamW hold
    ``sqrt(exp_avg_sq)`` of every parameter at once; SGD (with or without
    momentum) updates in place."""
    return param_bytes if optimizer in ("adam", "adamw") else 0


def modeled_step_ms(optimizer: str, param_bytes: int, mem_Bps: float,
                    amsgrad: bool = False) -> float:
    """Bytes the step moves over ``mem_Bps`` (a memory-bound elementwise update)."""
    moved = (MOVED[optimizer] + (2 if amsgrad else 0)) * param_bytes
    return 1e3 * moved / mem_Bps


def parse(raw: Any, label: str = "<trace>") -> Training | None:
    """The :class:`Training` of a trace's ``training`` object (None when absent)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise TraceError(f"{label}: field training: must be an object")
    if "optimizer" not in raw:
        raise TraceError(f"{label}: field training.optimizer: missing required field")
    unknown = set(raw) - KEYS
    if unknown:
        raise TraceError(f"{label}: field training: unknown keys {sorted(unknown)}")
    try:
        t = Training(**raw)
    except TypeError as exc:
        raise TraceError(f"{label}: field training: {exc}") from None
    for name, allowed in (("optimizer", OPTIMIZERS), ("grads", GRADS), ("amp", AMPS)):
        if getattr(t, name) not in allowed:
            raise TraceError(f"{label}: field training.{name}: {getattr(t, name)!r} is not "
                             f"one of {', '.join(allowed)}")
    for name in ("state_bytes", "step_transient_bytes", "param_tensors"):
        v = getattr(t, name)
        if v is not None and (type(v) is not int or v < 0):
            raise TraceError(f"{label}: field training.{name}: must be a non-negative integer")
    ms = t.step_ms
    if ms is not None and (type(ms) not in (int, float) or not 0 <= ms < float("inf")):
        raise TraceError(f"{label}: field training.step_ms: must be a finite number >= 0")
    for name in ("amsgrad", "offload"):
        if type(getattr(t, name)) is not bool:
            raise TraceError(f"{label}: field training.{name}: must be true or false")
    return t


def override(current: Training | None, optimizer: str | None = None,
             grads: str | None = None, offload: bool = False) -> Training | None:
    """``current`` with the optimizer and/or gradient lifetime replaced (simulate's
    ``--optimizer``/``--grads``), and with ``offload`` its state and step moved
    to the host.  Measured figures of another optimizer are dropped, so they
    are modeled again."""
    if optimizer is None and grads is None and not offload:
        return current
    t = current or Training()
    if optimizer is not None and optimizer != t.optimizer:
        t = dataclasses.replace(t, optimizer=optimizer, state_bytes=None, step_ms=None,
                                step_transient_bytes=None)
    if grads is not None:
        t = dataclasses.replace(t, grads=grads)
    if offload:
        t = dataclasses.replace(t, offload=True)
    return t
