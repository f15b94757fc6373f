"""The schedule: an explicit list of operations a policy returns.

Both the simulator and the real executor run the same list, in order, as
issued by one host thread:

* :class:`Compute` runs a step on the compute stream: ``F``/``B`` are the
  route's forward and backward steps, ``R`` re-runs a forward step
  (recomputation).  It allocates the step's outputs and, for its duration,
  the workspace of algorithm ``algo``.
* :class:`Free` releases a tensor's device memory.  If an :class:`Offload` of
  it is still copying, the memory is released when that copy ends (a free
  *under way*).
* :class:`Offload` copies a resident tensor to host on the device-to-host
  engine; the device copy stays until freed.
* :class:`Prefetch` allocates device memory and copies a host copy back on the
  host-to-device engine; it is not usable before a :class:`Wait`.
* :class:`Wait` makes the compute stream wait until a prefetch (or offload)
  of the tensor has finished.

See ``verify.py`` for the rules a schedule must follow.

Every op class names its ``action``, the one thing an interpreter that keeps
time or moves tensors needs to know: ``compute`` (a step on the compute
stream), ``release`` (device memory goes, or goes when a copy of it ends),
``to_host`` / ``to_device`` (a copy on the device-to-host / host-to-device
engine; ``to_device`` allocates), ``sync`` (the compute stream waits for a
copy).  What an op does to memory (which tensors, how many bytes, which rules)
is the ledger's (:mod:`snsim.schedule.ledger`).  The simulator, the
planners' estimate and the executor dispatch on ``action`` and never name an
op class other than :class:`Compute`, so a new op kind with one of these
actions is written here and in the ledger only (``tests/test_layering.py``
checks it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

from snsim.graph import Step, Tensor, step_name, tensor_name


COMPUTE, RELEASE, TO_HOST, TO_DEVICE, SYNC = "compute", "release", "to_host", "to_device", "sync"
ACTIONS = (COMPUTE, RELEASE, TO_HOST, TO_DEVICE, SYNC)


@dataclass(frozen=True, slots=True)
class Compute:
    phase: str  # "F", "B" or "R"
    layer: int
    algo: int = 0
    action: ClassVar[str] = COMPUTE

    @property
    def step(self) -> Step:
        return (self.phase, self.layer)

    def __str__(self) -> str:
        return f"compute {step_name(self.step)}" + (f" algo={self.algo}" if self.algo else "")


@dataclass(frozen=True, slots=True)
class _TensorOp:
    """An operation on one tensor; the subclass names the verb."""

    tensor: Tensor
    verb: ClassVar[str] = ""
    action: ClassVar[str] = ""

    def __str__(self) -> str:
        return f"{self.verb} {tensor_name(self.tensor)}"


@dataclass(frozen=True, slots=True)
class Free(_TensorOp):
    verb: ClassVar[str] = "free"
    action: ClassVar[str] = RELEASE


@dataclass(frozen=True, slots=True)
class Offload(_TensorOp):
    verb: ClassVar[str] = "offload"
    action: ClassVar[str] = TO_HOST


@dataclass(frozen=True, slots=True)
class Prefetch(_TensorOp):
    verb: ClassVar[str] = "prefetch"
    action: ClassVar[str] = TO_DEVICE


@dataclass(frozen=True, slots=True)
class Wait(_TensorOp):
    verb: ClassVar[str] = "wait"
    action: ClassVar[str] = SYNC


Op = Union[Compute, Free, Offload, Prefetch, Wait]


@dataclass
class Schedule:
    """A policy's plan: the ops, plus what the policy decided and why.

    ``stats`` holds the planner's own counters (cache hits and misses,
    recomputed layers, evictions); they are reported beside the simulator's.
    """

    policy: str
    ops: list[Op]
    budget_bytes: int | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    infeasible_reason: str | None = None
    # (graph, number of ops, effects) once the ledger has walked it (ledger.effects)
    checked: tuple | None = field(default=None, compare=False, repr=False)

    def __len__(self) -> int:
        return len(self.ops)

    def lines(self) -> list[str]:
        return [str(op) for op in self.ops]
