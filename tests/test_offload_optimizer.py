"""``--offload-optimizer`` run by the real executor (docs/DESIGN.md 3a): the
optimizer's state and step on the host, gradients copied down and parameters
copied back at the schedule's optimizer step, against the prediction."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from snsim.cli import main  # noqa: E402
from snsim.execute import optim  # noqa: E402
from snsim.execute.executor import Executor  # noqa: E402
from snsim.graph import Graph  # noqa: E402
from snsim.training import override  # noqa: E402
from snsim.validation.run import Case, Session, build_program, predict, validate_case  # noqa: E402

SESSION = Session()


def _executor(case, offload):
    trace = SESSION.trace(case)
    graph = Graph(trace.with_training(override(trace.training, offload=True))) if offload \
        else Graph(trace)
    schedule, _ = predict(graph, case.policy, None)
    _, example, program = build_program(case)
    return Executor(program, graph, schedule, torch.device("cpu")), example, program, trace


def test_offloaded_step_is_the_on_device_step():
    """Same parameters after a step; the state lives on the host, none on the device."""
    case = Case("toymodels:residual", 4, "superneurons", repeats=1, warmup=0, optimizer="adam")
    after = {}
    for offload in (False, True):
        ex, example, program, trace = _executor(case, offload)
        try:
            ex.prepare(fresh=True)
            torch.manual_seed(1)
            ex.step(example.numpy().copy())
            after[offload] = [p.detach().clone() for p in program.param_list]
            if offload:
                assert isinstance(ex.optimizer, optim.Offloaded)
                assert ex.state_bytes() == 0
                assert optim.state_bytes(ex.optimizer) == trace.optimizer_state_bytes
                states = [v for s in ex.optimizer.state.values() for v in s.values()]
                assert states and not any(v.requires_grad for v in states)
        finally:
            ex.close()
    assert all(torch.equal(a, b) for a, b in zip(after[False], after[True]))
    assert any(not torch.equal(a, p) for a, p in
               zip(after[True], build_program(case)[2].param_list))   # the step moved them


@pytest.mark.parametrize("model, batch, policy, optimizer, grads, amp", [
    ("toymodels:residual", 4, "superneurons", "adam", None, None),
    ("toymodels:residual", 4, "vdnn-all", "adamw", "set-to-none", None),
    ("toymodels:concat", 2, "utp", "momentum", None, "fp16"),
])
def test_offloaded_whole_step_predicted_vs_executor(model, batch, policy, optimizer, grads, amp):
    kw = dict(repeats=1, warmup=0, optimizer=optimizer, grads=grads, amp=amp)
    on = validate_case(Case(model, batch, policy, **kw), SESSION)
    off = validate_case(Case(model, batch, policy, offload_optimizer=True, **kw), SESSION)
    assert off.offload_optimizer and abs(off.peak_error) <= 0.01, off.to_dict()
    assert off.max_grad_abs_diff <= 1e-5, off.to_dict()
    # the device no longer holds the state: the measured peak drops by it
    # (the policies plan the same route with or without it here)
    assert on.predicted_peak_bytes - off.predicted_peak_bytes == off.optimizer_state_bytes
    assert on.measured_peak_bytes - off.measured_peak_bytes == pytest.approx(
        off.optimizer_state_bytes, rel=0.01)


def test_validate_refuses_offload_for_a_policy_without_it(capsys):
    assert main(["validate", "--model", "toymodels:residual", "--batch", "4", "--policy",
                 "liveness", "--optimizer", "adam", "--offload-optimizer"]) == 2
    err = capsys.readouterr().err
    assert "--offload-optimizer is an option of the swapping policies" in err
    assert err.count("\n") == 1
    assert main(["validate", "--model", "toymodels:residual", "--batch", "4", "--policy",
                 "superneurons", "--offload-optimizer"]) == 2
    assert "needs an optimizer with a step" in capsys.readouterr().err
