"""Tensors the model's own code holds in a variable (capture note [14]).

Eager PyTorch frees a tensor when nothing refers to it: ``o = self.side(x)``
read only by ``h + o`` stays until ``forward`` returns, not until the add.
The profiler writes where the code lets go (``released_after``) when that
is after the layer's last forward reader, and the plain-PyTorch comparison
keeps the tensor that long; snsim's own executor, which runs the layers
itself, frees it as the schedule says.
"""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from snsim.profile import profiler  # noqa: E402
from snsim.validation.run import GRAD_TOLERANCE, Case, Session, validate_case  # noqa: E402


class _SideHeld(nn.Module):
    """``o`` is read by the add only, then held by its variable to the end."""

    def __init__(self, named: bool):
        super().__init__()
        self.named = named
        self.side = nn.Linear(16, 256)
        self.up = nn.Linear(16, 256)
        self.head = nn.Linear(256, 10)

    def forward(self, x):
        if not self.named:   # the same layers, no variables
            return self.head(torch.tanh(self.up(x) + self.side(x))).mean(1)
        o = self.side(x)
        h = self.up(x)
        return self.head(torch.tanh(h + o)).mean(1)


def side_held():
    return _SideHeld(True), torch.randn(8, 64, 16)


def side_inline():
    return _SideHeld(False), torch.randn(8, 64, 16)


class _ReadElsewhere(nn.Module):
    """``a + f(x)`` where ``a`` is also read by another layer (saved for its
    backward), and ``f(x)`` is held past the add."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 256)
        self.f = nn.Linear(16, 256)
        self.head = nn.Linear(256, 10)
        self.head2 = nn.Linear(256, 10)

    def forward(self, x):
        a = self.up(x)
        f = self.f(x)
        r = a + f
        return (self.head(r) + self.head2(torch.tanh(a))).mean(1)


def read_elsewhere():
    return _ReadElsewhere(), torch.randn(8, 64, 16)


class _Halves(nn.Module):
    """``a, b = h.chunk(2)``: the halves (views) hold ``h`` to the end."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 512)
        self.mix = nn.Linear(256, 256)
        self.head = nn.Linear(256, 10)

    def forward(self, x):
        h = self.up(x)
        a, b = h.chunk(2, -1)
        m = self.mix(torch.tanh(a + b))
        return self.head(torch.relu(m)).mean(1)


def halves():
    return _Halves(), torch.randn(8, 64, 16)


class _Inner(nn.Module):
    """A submodule whose local ``o`` dies when it returns; it unpacks a shape."""

    def __init__(self):
        super().__init__()
        self.side = nn.Linear(16, 256)
        self.up = nn.Linear(16, 256)

    def forward(self, x):
        b, t, _ = x.shape
        o = self.side(x)
        return torch.tanh(self.up(x) + o).reshape(b, t, 256)


class _Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Inner()
        self.mid = nn.Linear(256, 256)
        self.head = nn.Linear(256, 10)

    def forward(self, x):
        y = self.inner(x)
        shape = y.shape   # eager keeps a torch.Size, not y
        y = self.mid(y)
        y = torch.tanh(y)
        return self.head(y).mean(1).reshape(shape[0], -1)


def outer():
    return _Outer(), torch.randn(8, 64, 16)


def _layers(name):
    doc = profiler.profile(f"tests.test_held_locals_torch:{name}", None, device_model="k40c")
    return {la["name"]: la for la in doc["layers"]}


def test_a_variable_held_past_its_last_reader_is_released_where_the_code_lets_go():
    held = _layers("side_held")
    assert held["side"]["released_after"] == held["mean"]["id"]
    assert "released_after" not in held["add"]          # its variable dies at the tanh
    assert not any("released_after" in la for la in _layers("side_inline").values())


def test_a_submodule_s_locals_go_when_it_returns_and_a_shape_holds_nothing():
    # b, t, _ = x.shape once held every local of _Inner.forward to the end of the
    # trace (fx's unpacking keeps its frame in a reference cycle), and
    # shape = y.shape held y (fx's Attribute keeps its root proxy)
    gc.disable()   # a cycle would hold them until the collector runs: make it never
    try:
        by_name = _layers("outer")
    finally:
        gc.enable()
    assert by_name["inner.side"]["released_after"] == by_name["tanh"]["id"]
    assert not any("released_after" in by_name[n] for n in ("inner.up", "add", "tanh"))
    assert by_name["tanh_1"]["released_after"] == by_name["mean"]["id"]   # y, to the end


def _plain(name):
    out = validate_case(Case(model=f"tests.test_held_locals_torch:{name}", batch=None,
                             policy="liveness", repeats=1, warmup=0), Session())
    assert out.max_grad_abs_diff <= GRAD_TOLERANCE, out.worst_grad_param
    assert out.peak_error == 0.0, out.peak_error      # the executor frees it as planned
    return out


# liveness vs plain PyTorch before the field (CPU, torch 2.13): +23.6% (o's
# 524,288 B), +0.0005%, +1.8% (40,960 B: the forward peak, with f's 524,288 B,
# over the backward's), +16.6% (545,100 B: the forward peak, with h's 1,048,576 B,
# over the backward's); now 0.0%, +0.0005%, 0.0%, +0.0004%
@pytest.mark.parametrize("name", ["side_held", "side_inline", "read_elsewhere", "halves"])
def test_liveness_predicts_plain_pytorch_with_the_model_s_variables(name):
    out = _plain(name)
    assert abs(out.plain_peak_error) < 0.0001, out.plain_peak_error
