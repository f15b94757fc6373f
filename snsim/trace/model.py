"""Typed, frozen records of a trace (DESIGN.md section 1).

Units are fixed at load: bytes are ``int``, times are milliseconds, bandwidth
is bytes per second.  Optional fields the loader does not know are kept in
``extra`` so that a trace survives a load/save round trip.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from typing import Any

from snsim import training as training_state

SCHEMA = "snsim.trace/1"

KINDS = frozenset({
    "data", "conv", "fc", "pool", "act", "bn", "lrn", "dropout", "add", "concat",
    "loss", "softmax", "matmul", "attention", "norm", "embedding", "other",
})


@dataclass(frozen=True, slots=True)
class Workspace:
    """One convolution algorithm choice with its workspace and times."""

    algo: str
    bytes: int
    fwd_ms: float
    bwd_ms: float
    bwd_bytes: int | None = None
    # the backward step's peak above the level before it when the tensors it reads for
    # the last time are handed to autograd (docs/DESIGN.md, "Dying reads")
    bwd_released: int | None = None

    @property
    def fwd_bytes(self) -> int:
        return self.bytes

    @property
    def backward_bytes(self) -> int:
        return self.bytes if self.bwd_bytes is None else self.bwd_bytes


@dataclass(frozen=True, slots=True)
class Layer:
    id: int
    name: str
    kind: str
    inputs: tuple[int, ...]
    output_bytes: int
    param_bytes: int
    fwd_ms: float
    bwd_ms: float
    bwd_reads: frozenset[str]
    saved_extra_bytes: int = 0
    workspace: tuple[Workspace, ...] = ()
    # bytes of G_i when less than the output's: a tuple whose elements do not all
    # receive a gradient (nn.MultiheadAttention's unused weights); None = output_bytes
    grad_bytes: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def gradient_bytes(self) -> int:
        """Bytes of ``G_i``: the output's, or ``grad_bytes`` where the trace gives it."""
        return self.output_bytes if self.grad_bytes is None else self.grad_bytes

    @property
    def reads_inputs(self) -> bool:
        return "inputs" in self.bwd_reads

    @property
    def reads_output(self) -> bool:
        return "output" in self.bwd_reads


_PARAM_BYTES = attrgetter("param_bytes")


def make_records(cls, *columns) -> list:
    """``[cls(*row) for row in zip(*columns)]`` for a frozen, slotted dataclass
    ``cls`` with one column per field: the objects made and their fields set
    through the slot descriptors, all in C (no Python ``__init__`` frame per
    object: a deep trace has ~10^4 layers, its plans ~10^5 ops).  The same
    objects, as the generated ``__init__`` only sets the fields; a class with a
    ``__post_init__`` is made the plain way."""
    names = [f.name for f in dataclasses.fields(cls)]
    if len(names) != len(columns):
        raise ValueError(f"{cls.__name__} has fields {names}, got {len(columns)} columns")
    if hasattr(cls, "__post_init__"):
        return [cls(*row) for row in zip(*columns)]
    columns = [col if isinstance(col, (list, tuple)) else list(col) for col in columns]
    out = list(map(object.__new__, repeat(cls, len(columns[0]))))
    for name, col in zip(names, columns):
        deque(map(getattr(cls, name).__set__, out, col), maxlen=0)
    return out


@dataclass(frozen=True, slots=True)
class Device:
    name: str
    memory_bytes: int
    h2d_Bps: float
    d2h_Bps: float


# A device for traces that carry none: 12 GiB and 12 GB/s each way (a round
# figure for pinned copies over PCIe 3.0 x16).  It is not one of the presets
# (snsim.devices); a trace that names its device always uses that.
DEFAULT_DEVICE = Device(name="default (12 GiB, 12 GB/s links)",
                        memory_bytes=12 * 2**30, h2d_Bps=12e9, d2h_Bps=12e9)


@dataclass(frozen=True, slots=True)
class Trace:
    model: str
    batch: int
    layers: tuple[Layer, ...]
    device: Device = DEFAULT_DEVICE
    dtype: str = "float32"
    input_shape: tuple[int, ...] = ()
    source: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    path: str | None = field(default=None, compare=False)

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def param_bytes(self) -> int:
        # summed in C: read by static_bytes, which planners and the ledger ask often
        return sum(map(_PARAM_BYTES, self.layers))

    @property
    def training(self) -> training_state.Training | None:
        """The optional ``training`` object (None: no optimizer, gradients resident)."""
        raw = self.extra.get("training")
        return None if raw is None else training_state.parse(raw, self.label)

    @property
    def optimizer_state_bytes(self) -> int:
        """The optimizer's state (0 without a ``training`` object)."""
        t = self.training
        if t is None:
            return 0
        if t.state_bytes is not None:
            return t.state_bytes
        return training_state.state_bytes(t.optimizer, self.param_bytes, t.amsgrad,
                                          t.param_tensors or 0)

    @property
    def constant_bytes(self) -> int:
        """Static memory beyond parameters: a model's buffers and constant tensors,
        an op log's constants (top-level ``constant_bytes``; 0 without it)."""
        return int(self.extra.get("constant_bytes", 0))

    @property
    def static_bytes(self) -> int:
        """Weights, weight gradients (unless born in backward: ``set-to-none``),
        the optimizer's state (unless offloaded to the host), and the model's
        buffers and constants or an op log's constants (``constant_bytes``,
        docs/DESIGN.md sections 3 and "Op-log traces"), resident for the whole
        iteration."""
        constants = self.constant_bytes
        t = self.training
        if t is None:
            return 2 * self.param_bytes + constants
        grads = 0 if t.set_to_none else self.param_bytes
        state = 0 if t.offload else self.optimizer_state_bytes   # offloaded: on the host
        return self.param_bytes + grads + state + constants

    def with_training(self, t: training_state.Training | None) -> "Trace":
        """This trace with ``training`` replaced (None removes it)."""
        extra = {k: v for k, v in self.extra.items() if k != "training"}
        if t is not None:
            extra["training"] = t.to_dict()
        return dataclasses.replace(self, extra=extra)

    @property
    def label(self) -> str:
        return self.path or self.model
