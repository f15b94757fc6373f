"""What the peak is made of: weights, gradients, optimizer state, buffers and
constants, activations.

``snsim info`` shows it for the trace under ``liveness`` (the plain PyTorch
step's prediction): the ledger's walk of that schedule, frees immediate, and
at the op with the highest level the bytes split into weights, parameter
gradients (all of them when resident; those born so far with
``set-to-none``), optimizer state, activations (every resident forward
output, gradient of an output and saved extra) and the op's transient
(workspace, or the optimizer step's temporaries).
"""

from __future__ import annotations

from dataclasses import dataclass

from snsim.graph import Graph, step_name
from snsim.schedule import ledger
from snsim.schedule.ops import Compute
from snsim.units import fmt_bytes


@dataclass(frozen=True)
class Breakdown:
    at: str                 # the op at the peak ("B3", "O12", ...)
    peak_bytes: int
    weight_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    activation_bytes: int
    constant_bytes: int     # buffers (batch-norm statistics) and constants
    transient_bytes: int


def peak_breakdown(graph: Graph) -> Breakdown:
    """The split of ``liveness``'s planned peak (see the module docstring)."""
    from snsim import policies
    from snsim.policies.base import PlanContext

    trace = graph.trace
    schedule = policies.plan("liveness", PlanContext(graph))
    static = trace.static_bytes
    weights, state, consts = trace.param_bytes, trace.optimizer_state_bytes, trace.constant_bytes
    resident_grads = static - weights - state - consts
    level = static
    born = 0
    best = Breakdown("static", static, weights, resident_grads, state, 0, consts, 0)
    for op, (nbytes, ws, freed) in zip(schedule.ops, ledger.effects(graph, schedule)):
        grads = graph.param_grad_bytes(op.step) if type(op) is Compute else 0
        born += grads
        level += nbytes - freed
        if level + ws > best.peak_bytes:
            best = Breakdown(step_name(op.step) if type(op) is Compute else str(op),
                             level + ws, weights, resident_grads + born, state,
                             level - static - born, consts, ws)
    return best


def breakdown_lines(graph: Graph) -> str:
    b = peak_breakdown(graph)
    t = graph.training
    head = "training   " + ("none recorded (no optimizer step; gradients resident)"
                            if t is None else
                            f"optimizer {t.optimizer}{' (amsgrad)' if t.amsgrad else ''}, "
                            f"gradients {t.grads}, amp {t.amp}, step "
                            f"{graph.optimizer_ms:.3f} ms")
    rows = [("weights", b.weight_bytes), ("gradients", b.gradient_bytes),
            ("optimizer state", b.optimizer_state_bytes),
            ("buffers, consts", b.constant_bytes), ("activations", b.activation_bytes),
            ("transient", b.transient_bytes)]
    lines = [head, f"peak (liveness) {fmt_bytes(b.peak_bytes)} at {b.at}:"]
    lines += [f"  {name:16} {fmt_bytes(v):>12}  ({v} B)" for name, v in rows]
    return "\n".join(lines)
