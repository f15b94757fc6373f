"""A host copy of a gradient that a later backward step adds into in place is
stale after that step (``Graph.written``): the ledger refuses to bring it back
from that copy, and the tensor cache copies it out again before evicting it.

Found on a model written for the check (attention from one ``qkv`` projection,
a split MLP, residual adds whose gradients share one storage): ``utp`` and
``superneurons`` at 1.1x the lower bound offloaded the residual stream's
gradient once, then evicted and prefetched it across five adds into it, and
snsim's executor lost those contributions (``embed.bias`` off by 0.079 from
plain autograd)."""

from __future__ import annotations

import pytest

from snsim.errors import ScheduleError
from snsim.graph import Graph, G
from snsim.policies.liveness import liveness_ops
from snsim.schedule import verify
from snsim.schedule.ops import Compute, Free, Offload, Prefetch, Schedule, Wait


def _swapped_across_the_add(forkjoin, again: bool):
    g = Graph(forkjoin)
    (writer, (ga,)), = g.written.items()   # B2 adds its part into G1, which B3 made
    assert ga == G(1) and writer == ("B", 2)
    ops = liveness_ops(g)
    made = ops.index(Compute("B", 3))
    ops.insert(made + 1, Offload(ga))
    k = ops.index(Compute(*writer)) + 1
    ops[k:k] = ([Offload(ga)] if again else []) + [Free(ga), Prefetch(ga), Wait(ga)]
    return g, Schedule("hand", ops)


def test_a_copy_older_than_an_add_into_it_is_not_brought_back(forkjoin):
    g, s = _swapped_across_the_add(forkjoin, again=False)
    with pytest.raises(ScheduleError, match="G1, whose host copy is older than B2's write"):
        verify(g, s)


def test_copied_out_again_after_the_add_it_may_come_back(forkjoin):
    g, s = _swapped_across_the_add(forkjoin, again=True)
    verify(g, s)


def attention_and_split_mlp():
    torch = pytest.importorskip("torch")
    from torch import nn

    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.n1, self.qkv, self.o = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.n2, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(2 * d, d)

        def forward(self, x):
            q, k, v = self.qkv(self.n1(x)).chunk(3, dim=-1)
            a = torch.softmax(q @ k.transpose(1, 2) / q.shape[-1] ** 0.5, dim=-1)
            x = x + self.o(a @ v)
            d = x.shape[-1]
            g, u, w = self.up(self.n2(x)).split([d, 2 * d, d], -1)
            return x + self.down(torch.cat([torch.sigmoid(g) * w, torch.tanh(u[..., :d])], -1))

    class Net(nn.Module):
        def __init__(self, d=48, depth=3):
            super().__init__()
            self.embed = nn.Conv2d(3, d, 4, stride=4)
            self.blocks = nn.Sequential(*[Block(d) for _ in range(depth)])
            self.head = nn.Linear(d, 10)

        def forward(self, x):
            return self.head(self.blocks(self.embed(x).flatten(2).transpose(1, 2)).mean(1))

    torch.manual_seed(0)
    return Net(), torch.randn(8, 3, 32, 32)


@pytest.mark.parametrize("policy", ["utp", "superneurons"])
def test_the_residual_gradient_swapped_at_a_tight_budget_is_exact(policy):
    pytest.importorskip("torch")
    from snsim.validation.run import GRAD_TOLERANCE, Case, Session, validate_case

    case = Case(model="tests.test_stale_copy:attention_and_split_mlp", batch=None,
                policy=policy, budget="1.1xlb", repeats=1, warmup=0)
    out = validate_case(case, Session())
    assert out.feasible
    assert out.max_grad_abs_diff <= GRAD_TOLERANCE, out.worst_grad_param
    assert abs(out.peak_error) < 0.001, out.peak_error
    assert abs(out.plain_peak_error) < 0.001, out.plain_peak_error
