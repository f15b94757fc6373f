"""The real executor: gradients equal autograd's under every policy; memory is real."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from snsim.execute.executor import Executor  # noqa: E402
from snsim.execute.memory import measure_peak  # noqa: E402
from snsim.torchgraph.program import tensor_bytes  # noqa: E402
from snsim.torchgraph.program import Program  # noqa: E402
from snsim.graph import Graph  # noqa: E402
from snsim.policies import names, plan  # noqa: E402
from snsim.policies.base import PlanContext  # noqa: E402
from snsim.profile import profiler  # noqa: E402
from snsim.schedule import verify  # noqa: E402
from snsim.trace import from_dict  # noqa: E402

MODELS = ["toymodels:residual", "toymodels:concat", "toymodels:dropout_bn"]
_cache: dict = {}


def setup(spec):
    if spec not in _cache:
        torch.set_num_threads(1)
        doc = profiler.profile(spec, 4, None, device="cpu", repeats=1, warmup=0)
        g = Graph(from_dict(doc))
        torch.manual_seed(0)
        ms = profiler.resolve(spec, None, torch.device("cpu"))
        ms.model.train()
        x = profiler.example_input(ms, 4, torch.device("cpu"))
        ref_model = copy.deepcopy(ms.model)
        prog = Program(ms.model, x)
        torch.manual_seed(7)
        prog.loss(ref_model(x)).backward()
        ref = [p.grad.clone() for p in ref_model.parameters()]
        _cache[spec] = (g, prog, x, ref, ms.model)
    return _cache[spec]


def run_policy(spec, policy, budget=None):
    g, prog, x, ref, model = setup(spec)
    s = plan(policy, PlanContext(g, budget))
    verify(g, s)
    ex = Executor(prog, g, s, torch.device("cpu"))
    try:
        ex.prepare(fresh=True)
        torch.manual_seed(7)
        ex.step(x.numpy().copy())
    finally:
        ex.close()
    return max((p.grad - r).abs().max().item() for p, r in zip(prog.param_list, ref)), s


@pytest.mark.parametrize("spec", MODELS)
@pytest.mark.parametrize("policy", names())
def test_gradients_equal_autograd(spec, policy):
    diff, _ = run_policy(spec, policy)
    assert diff <= 1e-5


@pytest.mark.parametrize("spec", MODELS)
@pytest.mark.parametrize("policy", ["utp", "vdnn-all", "cost-aware", "dtr", "superneurons",
                                    "sqrt-n"])
def test_gradients_under_tight_budget(spec, policy):
    """A tight budget makes policies offload, evict and recompute; gradients still match."""
    g = setup(spec)[0]
    diff, s = run_policy(spec, policy, int(1.1 * g.lower_bound_bytes))
    assert diff <= 1e-5


def test_recompute_replays_dropout_and_keeps_bn_stats():
    g, prog, x, ref, model = setup("toymodels:dropout_bn")
    bn = model.net[2]
    diff, s = run_policy("toymodels:dropout_bn", "recompute-memory")
    recomputed = {op.layer for op in s.ops if str(op).startswith("compute R")}
    assert {2, 4} <= recomputed                                # bn and dropout re-run
    assert diff <= 1e-5                                        # same dropout masks
    # one step updates the running mean once, recomputed or not
    start = bn.running_mean.clone()
    run_policy("toymodels:dropout_bn", "none")
    once = bn.running_mean.clone()
    bn.running_mean.copy_(start)
    run_policy("toymodels:dropout_bn", "recompute-memory")
    assert not torch.equal(once, start)
    assert torch.allclose(bn.running_mean, once)


def measured_peak(spec, policy, budget=None):
    g, prog, x, ref, model = setup(spec)
    s = plan(policy, PlanContext(g, budget))
    ex = Executor(prog, g, s, torch.device("cpu"))
    batch = x.numpy().copy()
    existing = tensor_bytes(list(model.parameters()) + list(model.buffers()))

    def once():
        ex.prepare(fresh=True)
        ex.step(batch)
    try:
        return measure_peak(once, torch.device("cpu"), existing, release=ex.release).peak_bytes
    finally:
        ex.close()


def test_memory_saving_policies_measure_lower_than_none():
    spec = "toymodels:residual"
    g = setup(spec)[0]
    none = measured_peak(spec, "none")
    assert measured_peak(spec, "cost-aware") < none
    assert measured_peak(spec, "utp", int(1.2 * g.lower_bound_bytes)) < none
    assert measured_peak(spec, "liveness") < none
