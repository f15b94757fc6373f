"""Gradient pieces in the shapes capture note [13] once left to the plain rule,
against plain PyTorch autograd (DESIGN 3, "Gradient storage"; DESIGN 7).

Each model but ``gate_twice_residual`` stacks three blocks
``x -> x + down(shape(up(x)))`` so that a tight budget has activations to swap
and recompute.  The numbers quoted were measured on CPU with torch 2.13."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from snsim.validation.run import GRAD_TOLERANCE, Case, Session, validate_case  # noqa: E402


class _PiecesAndWholeInOneLayer(torch.nn.Module):
    """(a) ``u.T @ h`` reads piece ``u`` and ``h`` whole in one layer; ``norm``
    reads ``v``, before it (the matmul's backward runs first: its piece waits,
    its gradient of ``h`` whole makes ``G_h``) or after it (the matmul joins)."""

    def __init__(self, norm_first: bool = True):
        super().__init__()
        self.norm_first = norm_first
        self.norm = torch.nn.LayerNorm(64)

    def forward(self, h):
        u, v = h.chunk(2, -1)
        if self.norm_first:
            return self.norm(v) @ (u.transpose(1, 2) @ h)
        s = u.transpose(1, 2) @ h
        return self.norm(v) @ s


class _PieceReadTwice(torch.nn.Module):
    """(b) piece ``u`` is read by the gating ``mul`` and by ``tanh``."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(64)

    def forward(self, h):
        u, v = h.chunk(2, -1)
        return u * self.norm(v) + torch.tanh(u)


class _LastReadsAPieceReadBefore(torch.nn.Module):
    """``norm(u) * v + tanh(u)``: ``norm``, the last reader in backward, reads
    ``u``, whose gradient ``tanh``'s backward made first."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(64)

    def forward(self, h):
        u, v = h.chunk(2, -1)
        return self.norm(u) * v + torch.tanh(u)


class _TwoViewsWithPieces(torch.nn.Module):
    """(c) ``h``'s halves by features gate each other, and its halves by tokens."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(64)

    def forward(self, h):
        u, v = h.chunk(2, -1)
        p, q = h.chunk(2, 1)
        return (u * self.norm(v)).repeat(1, 1, 2) + (p * torch.tanh(q)).repeat(1, 2, 1)


class _PassThroughPiece(torch.nn.Module):
    """(d) ``u + relu(v)``: the add's backward hands ``u`` its own gradient's storage."""

    def forward(self, h):
        u, v = h.chunk(2, -1)
        return u + torch.relu(v)


class _GateTwice(torch.nn.Module):
    """``x * silu(gate) + gate``: the add hands ``gate`` its own gradient's
    storage, and ``silu``, the last reader, reads ``gate`` too: autograd adds
    its gradient of ``gate`` into that storage (in place where nothing else
    holds it)."""

    def forward(self, h):
        x, gate = h.chunk(2, -1)
        return x * torch.nn.functional.silu(gate) + gate


class _Stack(torch.nn.Module):
    def __init__(self, block, out_dim: int, depth: int = 3):
        super().__init__()
        self.ups = torch.nn.ModuleList(torch.nn.Linear(32, 128) for _ in range(depth))
        self.blocks = torch.nn.ModuleList(block() for _ in range(depth))
        self.downs = torch.nn.ModuleList(torch.nn.Linear(out_dim, 32) for _ in range(depth))
        self.head = torch.nn.Linear(32, 10)

    def forward(self, x):
        for up, block, down in zip(self.ups, self.blocks, self.downs):
            x = x + down(block(up(x)))
        return self.head(x).mean(1)


def pieces_and_whole_in_one_layer():
    return _Stack(_PiecesAndWholeInOneLayer, 128), torch.randn(8, 64, 32)


def pieces_and_whole_joined():
    return _Stack(lambda: _PiecesAndWholeInOneLayer(False), 128), torch.randn(8, 64, 32)


def piece_read_twice():
    return _Stack(_PieceReadTwice, 64), torch.randn(8, 64, 32)


def last_reads_a_piece_read_before():
    return _Stack(_LastReadsAPieceReadBefore, 64), torch.randn(8, 64, 32)


def gate_twice():
    return _Stack(_GateTwice, 64), torch.randn(8, 64, 32)


class _ResidualGateTwice(torch.nn.Module):
    """``x + (a * silu(gate) + gate)`` without a projection: the add's gradient
    storage is the residual stream's, which ``x``'s gradient still shares when
    ``silu``'s backward adds into it, so autograd sums out of place."""

    def __init__(self, depth: int = 3):
        super().__init__()
        self.inp = torch.nn.Linear(32, 64)
        self.ups = torch.nn.ModuleList(torch.nn.Linear(64, 128) for _ in range(depth))
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = self.inp(x)
        for up in self.ups:
            a, gate = up(x).chunk(2, -1)
            x = x + (a * torch.nn.functional.silu(gate) + gate)
        return self.head(x).mean(1)


def gate_twice_residual():
    return _ResidualGateTwice(), torch.randn(8, 64, 32)


def two_views_with_pieces():
    return _Stack(_TwoViewsWithPieces, 128), torch.randn(8, 64, 32)


def pass_through_piece():
    return _Stack(_PassThroughPiece, 64), torch.randn(8, 64, 32)


def _exact(name: str, policy: str = "liveness", budget=None):
    """Validate ``name`` under ``policy``: snsim's executor reproduces autograd's
    gradients and the peak snsim predicts for it."""
    case = Case(model=f"tests.test_pieces2_torch:{name}", batch=None, policy=policy,
                budget=budget, repeats=1, warmup=0)
    out = validate_case(case, Session())
    assert out.max_grad_abs_diff <= GRAD_TOLERANCE, out.worst_grad_param
    assert abs(out.peak_error) < 0.001, out.peak_error            # vs snsim's executor
    return out


def _pieces(name: str) -> dict[str, list]:
    from snsim.profile import profiler

    doc = profiler.profile(f"tests.test_pieces2_torch:{name}", None, device_model="k40c")
    return {la["name"]: la["grad_pieces"] for la in doc["layers"] if "grad_pieces" in la}


# liveness vs plain PyTorch under the old rule (the first contributor made the
# whole G_j; CPU, torch 2.13): (b) -9.86%, (c) -9.93%, and -9.81% where the last
# reader reads a piece a reader before it read
@pytest.mark.parametrize("name, was", [("piece_read_twice", -0.0986),
                                       ("two_views_with_pieces", -0.0993),
                                       ("last_reads_a_piece_read_before", -0.0981)])
def test_pieces_read_twice_or_of_two_views_match_plain_pytorch(name, was):
    out = _exact(name)
    assert abs(out.plain_peak_error) < 0.001, (out.plain_peak_error, was)


@pytest.mark.parametrize("name", ["piece_read_twice", "two_views_with_pieces",
                                  "last_reads_a_piece_read_before"])
@pytest.mark.parametrize("policy", ["superneurons", "utp"])
def test_pieces_read_twice_or_of_two_views_run_as_predicted_under_a_budget(name, policy):
    out = _exact(name, policy, "1.2xlb")
    assert out.feasible
    assert out.measured_peak_bytes < out.liveness_predicted_peak_bytes


def test_capture_names_the_view_and_the_pieces_where_a_piece_is_read_twice():
    got = _pieces("piece_read_twice")
    half = 8 * 64 * 64 * 4
    # [input, bytes, view, piece, bytes]: tanh and mul both read u (piece 0)
    assert got["blocks.0.norm"] == [[1, half, 0, 1, half]]
    assert got["mul"] == [[1, half, 0, 0, half]]
    assert got["tanh"] == [[1, half, 0, 0, half]]


def test_capture_numbers_the_views_of_one_input():
    got = _pieces("two_views_with_pieces")
    half = 8 * 64 * 64 * 4
    assert got["blocks.0.norm"] == [[1, half, 0, 1, half]]
    assert got["mul"] == [[1, half, 0, 0, half]]
    assert got["tanh"] == [[1, half, 1, 1, half]] and got["mul_1"] == [[1, half, 1, 0, half]]


def test_a_piece_passed_through_matches_plain_pytorch():
    # -17.9% under the old rule (the add's backward made the whole G_h), and
    # superneurons and utp found no schedule at 1.2x the lower bound
    out = _exact("pass_through_piece")
    assert abs(out.plain_peak_error) < 0.001, out.plain_peak_error


@pytest.mark.parametrize("policy", ["superneurons", "utp"])
def test_a_piece_passed_through_runs_as_predicted_under_a_budget(policy):
    out = _exact("pass_through_piece", policy, "1.2xlb")
    assert out.feasible
    assert out.measured_peak_bytes < out.liveness_predicted_peak_bytes


def test_a_reader_of_pieces_and_the_whole_input_matches_plain_pytorch():
    # -3.61% under the old rule: capture left the pieces to it where one layer
    # (u.T @ h) reads a piece and h whole
    from snsim.profile import profiler

    doc = profiler.profile("tests.test_pieces2_torch:pieces_and_whole_in_one_layer", None,
                           device_model="k40c")
    assert [la["name"] for la in doc["layers"] if "grad_whole" in la] == \
        ["matmul", "matmul_2", "matmul_4"]
    got = _pieces("pieces_and_whole_in_one_layer")
    half = 8 * 64 * 64 * 4
    assert got["matmul"] == [[1, half]] and got["blocks.0.norm"] == [[1, half]]
    out = _exact("pieces_and_whole_in_one_layer")
    assert abs(out.plain_peak_error) < 0.001, out.plain_peak_error


@pytest.mark.parametrize("name, policy, budget", [
    ("pieces_and_whole_in_one_layer", "superneurons", "1.2xlb"),
    ("pieces_and_whole_in_one_layer", "utp", "1.2xlb"),
    # the reader of both joins the pieces (superneurons finds no plan at 1.2x or 1.3x)
    ("pieces_and_whole_joined", "liveness", None),
    ("pieces_and_whole_joined", "superneurons", "1.5xlb")])
def test_a_reader_of_pieces_and_the_whole_input_runs_as_predicted(name, policy, budget):
    out = _exact(name, policy, budget)
    assert out.feasible
    assert abs(out.plain_peak_error) < 0.001, out.plain_peak_error


# -17.5% and -23.3% under the old rule
@pytest.mark.parametrize("name, policy, budget", [
    ("gate_twice", "liveness", None), ("gate_twice", "superneurons", "1.2xlb"),
    ("gate_twice", "utp", "1.2xlb"), ("gate_twice_residual", "liveness", None),
    # (superneurons and utp find no plan at 1.2x here)
    ("gate_twice_residual", "superneurons", "1.5xlb")])
def test_a_last_reader_adds_into_a_passed_through_piece_as_autograd(name, policy, budget):
    out = _exact(name, policy, budget)
    assert out.feasible
    assert abs(out.plain_peak_error) < 0.001, out.plain_peak_error
