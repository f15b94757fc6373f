"""Small hand-built traces shared by the tests (their numbers are worked out in the tests)."""

from __future__ import annotations

import pytest

from snsim.trace.model import Device, Layer, Trace, Workspace

DEV = Device("test device", 10**6, 1e5, 1e5)  # 100 bytes take 1 ms on either engine


def L(i, kind, inputs, out, params=0, fwd=0.0, bwd=0.0, reads=(), extra=0, ws=()):
    return Layer(id=i, name=f"{kind}{i}", kind=kind, inputs=tuple(inputs), output_bytes=out,
                 param_bytes=params, fwd_ms=fwd, bwd_ms=bwd, bwd_reads=frozenset(reads),
                 saved_extra_bytes=extra, workspace=tuple(ws))


def make(layers, model="t") -> Trace:
    return Trace(model=model, batch=4, layers=tuple(layers), device=DEV,
                 source={"kind": "modeled", "device_model": "hand-written test"})


@pytest.fixture
def chain4() -> Trace:
    """data -> conv -> relu (reads output) -> loss."""
    return make_chain4()


def make_chain4() -> Trace:
    """data X0 100 -> conv X1 200 (reads inputs) -> act X2 200 (reads output) -> loss X3 4."""
    return make([
        L(0, "data", [], 100),
        L(1, "conv", [0], 200, params=10, fwd=2.0, bwd=4.0, reads=["inputs"]),
        L(2, "act", [1], 200, fwd=1.0, bwd=1.0, reads=["output"]),
        L(3, "loss", [2], 4, fwd=0.5, bwd=0.5, reads=["inputs"]),
    ], "chain4")


@pytest.fixture
def forkjoin() -> Trace:
    """data -> conv a -> {conv b, relu c} -> add -> loss; G_a accumulates two gradients."""
    return make([
        L(0, "data", [], 100),
        L(1, "conv", [0], 100, params=8, fwd=1.0, bwd=2.0, reads=["inputs"]),
        L(2, "conv", [1], 100, params=8, fwd=1.0, bwd=2.0, reads=["inputs"]),
        L(3, "act", [1], 100, fwd=0.5, bwd=0.5, reads=["output"]),
        L(4, "add", [2, 3], 100, fwd=0.25, bwd=0.25),
        L(5, "loss", [4], 4, fwd=0.25, bwd=0.25, reads=["inputs"]),
    ], "forkjoin")


@pytest.fixture
def extras() -> Trace:
    """data -> bn (saves 10 B of statistics) -> dropout (saves a 50 B mask) -> loss."""
    return make([
        L(0, "data", [], 100),
        L(1, "bn", [0], 100, params=4, fwd=1.0, bwd=1.0, reads=["inputs"], extra=10),
        L(2, "dropout", [1], 100, fwd=1.0, bwd=1.0, extra=50),
        L(3, "loss", [2], 4, fwd=1.0, bwd=1.0, reads=["inputs"]),
    ], "extras")


@pytest.fixture
def with_workspace() -> Trace:
    """data -> conv with two algorithms (0 B slow, 60 B fast) -> loss."""
    return make([
        L(0, "data", [], 100),
        L(1, "conv", [0], 100, params=5, fwd=3.0, bwd=6.0, reads=["inputs"],
          ws=[Workspace("slow", 0, 3.0, 6.0), Workspace("fast", 60, 1.0, 2.0, bwd_bytes=80)]),
        L(2, "loss", [1], 4, fwd=0.5, bwd=0.5, reads=["inputs"]),
    ], "ws")


def liveness_peak(trace: Trace) -> int:
    """The simulated peak of ``trace`` under liveness with no budget."""
    from snsim.graph import Graph
    from snsim.policies.liveness import liveness_ops
    from snsim.schedule.ops import Schedule
    from snsim.sim import simulate

    g = Graph(trace)
    return simulate(g, Schedule("liveness", liveness_ops(g), 1 << 40), 1 << 40,
                    record=False).peak_bytes
