"""Training state (docs/DESIGN.md section 3a), worked out by hand.

fc1: data X0 100 B -> fc (1000 B of parameters, reads inputs) X1 10 B -> loss
X2 4 B (reads inputs).  Route F0 F1 F2 B2 B1 [O3]; B2 needs X1 and makes G2
(4) and G1 (10); B1 needs G1 and X0 and makes no activation gradient.
Under liveness (frees right after the last use), above static:
F0 100, F1 110, F2 114 (X2 freed), B2 124 (G2, X1 freed), B1 110, then 0.
"""

from __future__ import annotations

import json

import pytest

from conftest import L, make
from snsim.errors import ScheduleError, TraceError
from snsim.graph import Graph
from snsim.policies import PlanContext, plan
from snsim.schedule import ledger, verify
from snsim.schedule.ops import Compute, Schedule
from snsim.sim import simulate
from snsim.training import Training, override, parse, state_bytes
from snsim.trace.io import from_dict, to_dict


def fc1(**training):
    t = make([L(0, "data", [], 100),
              L(1, "fc", [0], 10, params=1000, fwd=1.0, bwd=2.0, reads=["inputs"]),
              L(2, "loss", [1], 4, fwd=0.5, bwd=0.5, reads=["inputs"])], "fc1")
    return t.with_training(Training(**training)) if training else t


def live(trace):
    g = Graph(trace)
    s = plan("liveness", PlanContext(g))
    verify(g, s)
    return g, s, simulate(g, s)


def test_state_bytes_follow_torch_optim():
    assert state_bytes("sgd", 1000) == 0
    assert state_bytes("none", 1000) == 0
    assert state_bytes("momentum", 1000) == 1000          # momentum_buffer
    assert state_bytes("adam", 1000) == 2000              # exp_avg, exp_avg_sq
    assert state_bytes("adamw", 1000, amsgrad=True) == 3000   # + max_exp_avg_sq
    assert state_bytes("adam", 1000, param_tensors=3) == 2012  # + a 4-byte step per tensor
    assert state_bytes("momentum", 1000, amsgrad=True, param_tensors=3) == 1000


def test_no_training_record_is_todays_semantics():
    g, s, r = live(fc1())
    assert g.optimizer_step is None and r.optimizer_state_bytes == 0
    assert r.static_bytes == 2000 and r.peak_bytes == 2124
    assert not any(op.phase == "O" for op in s.ops if type(op) is Compute)


def test_adam_resident_state_is_static_and_step_ends_the_route():
    g, s, r = live(fc1(optimizer="adam", step_ms=2.0))
    assert s.ops[-1] == Compute("O", 3)
    assert r.static_bytes == 1000 + 1000 + 2000 and r.optimizer_state_bytes == 2000
    # the step's modeled foreach temporaries: sqrt(exp_avg_sq), 1000 B, over 4000 static
    assert ledger.walk(g, s.ops)[-1] == (0, 1000, 0)
    assert r.peak_bytes == 5000            # at O: B2's 4124 is lower
    assert r.lower_bound_bytes == 5000
    assert r.optimizer_ms == 2.0
    assert r.iteration_ms == pytest.approx(1.0 + 0.5 + 0.5 + 2.0 + 2.0)  # F1 F2 B2 B1 O


def test_set_to_none_gradients_are_born_in_backward():
    g, s, r = live(fc1(optimizer="sgd", grads="set-to-none", step_ms=0.0))
    assert r.static_bytes == 1000         # weights only: no state, gradients not static
    eff = ledger.walk(g, s.ops)
    b1 = [k for k, op in enumerate(s.ops) if op == Compute("B", 1)][0]
    assert eff[b1][0] == 1000             # B1 makes its layer's weight gradient
    # B2 1124; B1 1000 + G1 10 + X0 100 + W1 1000 = 2110; O 1000 + 1000 = 2000
    assert r.peak_bytes == 2110
    assert r.lower_bound_bytes == 2110
    resident = live(fc1(optimizer="sgd", step_ms=0.0))[2]
    assert resident.peak_bytes == 2124    # resident: 2000 static + B2's 124


def test_set_to_none_with_adam_peaks_at_the_step():
    g, s, r = live(fc1(optimizer="adam", grads="set-to-none"))
    # O: 1000 weights + 2000 state + 1000 born gradient + 1000 temporaries
    assert r.peak_bytes == 5000 and r.static_bytes == 3000
    # none frees nothing: at O, 3000 + X0 100 + X1 10 + X2 4 + G2 4 + G1 10 + 1000 + 1000
    gn = Graph(fc1(optimizer="adam", grads="set-to-none"))
    sn = plan("none", PlanContext(gn))
    assert simulate(gn, sn).peak_bytes == 5128


def test_optimizer_none_keeps_no_step_but_set_to_none_still_applies():
    g, s, r = live(fc1(optimizer="none", grads="set-to-none"))
    assert g.optimizer_step is None and r.optimizer_ms == 0.0
    assert r.static_bytes == 1000 and r.peak_bytes == 2110


def test_modeled_step_time_from_bytes_moved():
    g = Graph(fc1(optimizer="adam"))   # no preset named: 10 GB/s; Adam moves 9 x 1000 B
    assert g.optimizer_ms == pytest.approx(9000 / 10e9 * 1e3)
    g = Graph(fc1(optimizer="momentum"))
    assert g.optimizer_ms == pytest.approx(5000 / 10e9 * 1e3)


def test_verifier_rules_for_the_optimizer_step():
    g = Graph(fc1(optimizer="adam"))
    route = [Compute(p, i) for p, i in g.route]
    with pytest.raises(ScheduleError, match="ends without the optimizer step O3"):
        verify(g, Schedule("hand", list(route)))
    with pytest.raises(ScheduleError, match="optimizer step before route step B1"):
        verify(g, Schedule("hand", route[:-1] + [Compute("O", 3), route[-1]]))
    with pytest.raises(ScheduleError, match="computes after the optimizer step"):
        verify(g, Schedule("hand", route + [Compute("O", 3), Compute("R", 1)]))
    with pytest.raises(ScheduleError, match="no optimizer step in this trace"):
        verify(Graph(fc1()), Schedule("hand", route + [Compute("O", 3)]))
    verify(g, Schedule("hand", route + [Compute("O", 3)]))


def test_training_record_round_trips_and_bad_values_are_one_line():
    t = fc1(optimizer="adamw", amsgrad=True, grads="set-to-none", state_bytes=3012,
            step_ms=1.5, step_transient_bytes=77, param_tensors=3)
    doc = json.loads(json.dumps(to_dict(t)))
    back = from_dict(doc)
    assert back.training == t.training and back.optimizer_state_bytes == 3012
    assert Graph(back).optimizer_transient_bytes == 77
    for bad, msg in [({"optimizer": "lamb"}, "training.optimizer"),
                     ({"optimizer": "adam", "grads": "zero"}, "training.grads"),
                     ({"optimizer": "adam", "state_bytes": -1}, "training.state_bytes"),
                     ({"optimizer": "adam", "colour": 1}, "unknown keys"),
                     ({"grads": "resident"}, "training")]:
        with pytest.raises(TraceError, match=msg) as err:
            from_dict({**doc, "training": bad})
        assert "\n" not in str(err.value)


def test_override_drops_the_other_optimizers_measurements():
    t = Training(optimizer="adam", state_bytes=2012, step_ms=3.0, step_transient_bytes=5)
    assert override(t, "momentum") == Training(optimizer="momentum")
    assert override(t, None, "set-to-none") == Training(
        optimizer="adam", grads="set-to-none", state_bytes=2012, step_ms=3.0,
        step_transient_bytes=5)
    assert override(None, None, None) is None
    assert parse(None) is None


def test_simulate_and_info_take_the_training_overrides(capsys, tmp_path):
    from snsim.cli import main
    from snsim.trace.io import save

    path = tmp_path / "fc1.json"
    save(fc1(), path)
    assert main(["simulate", str(path), "--policy", "liveness", "--optimizer", "adam",
                 "--grads", "set-to-none", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["peak_bytes"], got["static_bytes"], got["optimizer_state_bytes"]) == \
        (5000, 3000, 2000)
    assert got["lower_bound_bytes"] == 5000 and got["optimizer_ms"] > 0
    assert main(["info", str(path), "--optimizer", "momentum"]) == 0
    out = capsys.readouterr().out
    # momentum resident: static 1000 + 1000 + 1000; liveness peaks at B2 (124 B of tensors)
    assert "peak (liveness) 3.05 KiB at B2" in out
    for line in ("weights", "gradients", "optimizer state"):
        assert f"{line}" in out and "(1000 B)" in out
    assert "activations" in out and "(124 B)" in out


def test_offloaded_optimizer_state_and_step_are_on_the_host():
    g, s, r = live(fc1(optimizer="adam", offload=True))
    # static on the device: weights + gradients; the 2000 B of state are on the host
    assert r.static_bytes == 2000 and r.optimizer_state_bytes == 2000
    assert ledger.walk(g, s.ops)[-1] == (0, 0, 0)   # no temporaries on the device
    assert r.peak_bytes == 2124                     # B2, as without an optimizer
    # the step: 1000 B of gradients down and 1000 B of parameters up at 1e5 B/s
    # (10 ms each), Adam on the host moving 9000 B at 10 GB/s
    assert r.optimizer_ms == pytest.approx(20.0 + 9000 / 10e9 * 1e3)
    assert (r.h2d_bytes, r.d2h_bytes) == (1000, 1000)
    assert r.lower_bound_bytes == 2000 + 110    # B1: G1 + X0 (X0 is not B2's need)


def test_offload_optimizer_is_a_swapping_policys_option(capsys, tmp_path):
    from snsim.cli import main
    from snsim.trace.io import save

    path = tmp_path / "fc1.json"
    save(fc1(), path)
    assert main(["simulate", str(path), "--policy", "liveness", "--optimizer", "adam",
                 "--offload-optimizer"]) == 2
    err = capsys.readouterr().err
    assert "option of the swapping policies (vdnn-all, vdnn-conv, utp, superneurons)" in err
    assert err.count("\n") == 1
    assert main(["simulate", str(path), "--policy", "utp", "--offload-optimizer"]) == 2
    assert "records no optimizer with a step; add --optimizer" in capsys.readouterr().err
    assert main(["simulate", str(path), "--policy", "utp", "--optimizer", "adam",
                 "--offload-optimizer", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["static_bytes"], got["optimizer_state_bytes"], got["h2d_bytes"]) == \
        (2000, 2000, 1000)


def test_measured_hand_over_peak_holds_the_born_gradient_once():
    """B1 hands its dying read X0 to autograd; its measured peak above the level
    before it (bwd_released, 1050 B) was measured with set-to-none, so it holds
    W1's 1000 B: the ledger counts W1 as B1's allocation and only 50 B on top."""
    from snsim.trace.model import Workspace

    # without the hand-over, B1 would need 5000 B of workspace
    ws = (Workspace("measured", 0, 2.0, 2.0, bwd_bytes=5000, bwd_released=1050),)
    t = make([L(0, "data", [], 100),
              L(1, "fc", [0], 10, params=1000, fwd=1.0, bwd=2.0, reads=["inputs"], ws=ws),
              L(2, "loss", [1], 4, fwd=0.5, bwd=0.5, reads=["inputs"])], "fc1m")
    g, s, r = live(t.with_training(Training(optimizer="sgd", grads="set-to-none",
                                            step_ms=0.0)))
    b1 = s.ops.index(Compute("B", 1))
    assert ledger.hands_over(g, s.ops, b1)
    assert ledger.walk(g, s.ops)[b1] == (1000, 50, 0)
    # before B1: 1000 weights + G1 10 + X0 100 = 1110; B1 peaks at 1110 + 1050
    assert r.peak_bytes == 2160
    # B1's least need: reads 110 + 1050 - its born 1000 = 160 (not 110 + 5000),
    # plus the 1000 born: the born gradient is counted once
    assert g.least_step_bytes(("B", 1)) == 160
    assert r.lower_bound_bytes == 1000 + 1000 + 160


def fc2_born():
    """data X0 100 -> fc1 X1 100 (10 B params) -> fc2 X2 100 (400 B params) -> loss X3 4,
    SGD with set-to-none gradients: static 410 (weights).  Liveness, above static:
    F0 100, F1 200, F2 300, F3 304, B3 404 (G3 4, G2 100), then X0 X1 G2 = 300;
    B2 makes G1 100 and fc2's weight gradient 400: 800 -> 1210 in all; B1 610 + 10.
    The lower bound is B2's own G2 + X1 + G1 (300) + the 400 B born: 410 + 700 = 1110,
    reached by offloading X0 (read again only by B1) across B2.  A planner that
    forgets the born 400 B sees B2 at 410 + 400 = 810 and plans nothing."""
    t = make([L(0, "data", [], 100),
              L(1, "fc", [0], 100, params=10, fwd=1.0, bwd=1.0, reads=["inputs"]),
              L(2, "fc", [1], 100, params=400, fwd=1.0, bwd=1.0, reads=["inputs"]),
              L(3, "loss", [2], 4, fwd=1.0, bwd=1.0, reads=["inputs"])], "fc2")
    return t.with_training(Training(optimizer="sgd", grads="set-to-none", step_ms=0.0))


@pytest.mark.parametrize("policy", ["utp", "superneurons"])
def test_planners_count_gradients_born_in_backward(policy):
    g = Graph(fc2_born())
    assert g.lower_bound_bytes == 1110
    assert live(fc2_born())[2].peak_bytes == 1210
    budget = 1150          # between the lower bound and liveness
    s = plan(policy, PlanContext(g, budget))
    verify(g, s)
    r = simulate(g, s, budget)
    assert s.infeasible_reason is None and r.feasible, (s.lines(), r.reason)
    assert r.peak_bytes == 1110
    assert "offload X0" in s.lines() and "prefetch X0" in s.lines()


def test_planners_count_the_optimizer_steps_temporaries():
    # fc1 with Adam: static 4000 (weights, gradients, two moments); the step's modeled
    # foreach temporaries 1000 B make the lower bound 5000; at 4500 every planner
    # that plans under a budget says the step does not fit (the simulator agrees)
    g = Graph(fc1(optimizer="adam", step_ms=2.0))
    for policy in ("utp", "superneurons", "vdnn-all", "sqrt-n", "cost-aware", "dtr"):
        s = plan(policy, PlanContext(g, 4500))
        assert s.infeasible_reason is not None and "step O3 (adam step)" in \
            s.infeasible_reason, (policy, s.infeasible_reason)
        assert "500 bytes" in s.infeasible_reason
        assert not simulate(g, s, 4500).feasible
        s = plan(policy, PlanContext(g, 5000))
        assert s.infeasible_reason is None and simulate(g, s, 5000).feasible


def test_schedule_command_keys_and_lists_the_optimizer_step(tmp_path, capsys):
    from snsim.cli import main

    path = tmp_path / "fc1.json"
    path.write_text(json.dumps(to_dict(fc1(optimizer="adam", step_ms=2.0))))
    assert main(["schedule", str(path), "--policy", "liveness"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("# key: compute Fi / Bi / Ri")   # v1's prefix unchanged
    assert "compute On = the optimizer step" in lines[0]
    ops = [ln.split(None, 1)[1] for ln in lines[1:] if not ln.startswith("#")]
    assert ops[-1] == "compute O3" and ops[-2] == "free G1"


def test_optimal_counts_born_gradients_and_the_steps_fixed_time():
    pytest.importorskip("highspy")
    from snsim.policies.finishing import finish
    from snsim.policies.optimal.decode import decode
    from snsim.policies.optimal.formulation import build
    from snsim.policies.optimal.solve import solve
    from snsim.policies.replay import with_optimizer_step

    g = Graph(fc2_born())
    # the MILP itself (the policy skips it when a heuristic sits at the moment bound):
    # its count holds fc2's 400 B weight gradient from B2 on: it offloads X0 (1 ms out,
    # 1 ms back, overlapped but for B1's wait) and predicts the real peak
    form = build(g, 1150)
    sol = solve(form.milp, 30.0)
    assert sol.values is not None
    ops, peak = decode(form, sol.values)
    assert peak == 1110
    r = simulate(g, finish("optimal", g, with_optimizer_step(g, ops), 1150, {}), 1150)
    assert r.feasible and r.peak_bytes == 1110
    assert sol.objective + g.optimizer_ms == pytest.approx(r.iteration_ms)
    # the policy's plan is no slower than the MILP's, and its bound holds it
    s = plan("optimal", PlanContext(g, 1150))
    assert s.infeasible_reason is None
    r2 = simulate(g, s, 1150)
    assert r2.feasible and r2.iteration_ms <= r.iteration_ms + 1e-9
    assert s.stats["bound_ms"] <= r2.iteration_ms + 1e-9
    # Adam's 2 ms step is in the compute bound and in the reported bound
    g = Graph(fc1(optimizer="adam", step_ms=2.0))
    s = plan("optimal", PlanContext(g, 5000))
    assert s.stats["compute_bound_ms"] == pytest.approx(1.0 + 0.5 + 0.5 + 2.0 + 2.0)
    assert s.stats["bound_ms"] == pytest.approx(6.0) and s.stats["optimality_gap"] == 0.0
