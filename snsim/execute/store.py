"""What the executor keeps per tensor: saved-tensor records, gradient edges and
tuple-valued layer values (notes [2], [6] and [7] of :mod:`snsim.execute.executor`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from snsim.errors import ScheduleError
from snsim.graph import tensor_name


class Saved:
    """One tensor autograd saved: held directly, or a handle to the store [2]."""

    __slots__ = ("t", "key", "elem", "size", "stride", "rel", "once")

    def __init__(self, t: torch.Tensor):
        self.t: torch.Tensor | None = t
        self.key = None
        self.elem = None
        self.once = False

    def own(self, base: Any) -> None:
        """Hold the tensor itself, read from ``base`` (the store's value it was bound
        to), and give it up when autograd unpacks it [7]."""
        if self.key is not None:
            if self.elem is not None:
                base = flat(base)[self.elem]
            self.t = base.as_strided(self.size, self.stride, base.storage_offset() + self.rel)
            self.key = None
        self.once = True

    def bind(self, key, base: torch.Tensor, elem: int | None = None) -> None:
        """Re-read from the store's ``key`` (element ``elem`` of a tuple-valued layer)."""
        t = self.t
        self.key, self.elem, self.size, self.stride = key, elem, t.size(), t.stride()
        self.rel = t.storage_offset() - base.storage_offset()
        self.t = None

    def get(self, store: dict) -> torch.Tensor:
        if self.key is None:
            t = self.t
            if t is None:
                raise ScheduleError("a saved extra tensor was freed before the backward "
                                    "step that needs it")
            if self.once:  # autograd's node holds it now and drops it when it is done [7]
                self.t = None
            return t
        base = store.get(self.key)
        if base is None:
            raise ScheduleError(f"backward needs {tensor_name(self.key)}, not resident")
        if self.elem is not None:
            base = flat(base)[self.elem]
        return base.as_strided(self.size, self.stride, base.storage_offset() + self.rel)


@dataclass
class Edge:
    out: list                   # GradientEdge per tensor of the layer's output (None: no grad)
    inputs: dict[int, list]     # input layer -> GradientEdge per tensor of its leaf alias
    shapes: list
    records: list[Saved]       # keep the handles alive with the graph
    # input layer -> GradientEdge per piece of the multi-output view it is read
    # through, where the graph's plan makes or joins piece gradients (executor [11])
    pieces: dict[int, list] = field(default_factory=dict)


def storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class Slot:
    """Where a tensor of a tuple-valued layer sits while the tuple is off the device."""


SLOT = Slot()


@dataclass(frozen=True)
class Elem:
    """Tensor ``k`` (in :func:`flat` order) of the tuple-valued store entry ``key``."""

    key: tuple
    k: int


def flat(value: Any) -> list:
    """The tensors of a layer's value, in order: itself, or those of a (nested) tuple [6]."""
    if isinstance(value, (torch.Tensor, Slot)):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in flat(v)]
    return []


def rebuild(value: Any, tensors) -> Any:
    """``value``'s structure with its tensors replaced, in :func:`flat` order."""
    if isinstance(value, (torch.Tensor, Slot)):
        return next(tensors)
    if isinstance(value, (tuple, list)):
        return type(value)(rebuild(v, tensors) for v in value)
    return value


def remap(value: Any, fn) -> Any:
    """Apply ``fn`` to every tensor of ``value``, keeping its structure."""
    return rebuild(value, iter([fn(t) for t in flat(value)]))
