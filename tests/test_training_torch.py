"""Training state against real PyTorch: torch.optim's state, the profiled step,
and a whole step (forward, backward, optimizer step) predicted vs measured."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from snsim.cli import main  # noqa: E402
from snsim.execute import optim  # noqa: E402
from snsim.training import Training, state_bytes  # noqa: E402
from snsim.validation.run import Case, Session, validate_case  # noqa: E402

SESSION = Session()


def _toy():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))


@pytest.mark.parametrize("name, amsgrad", [("sgd", False), ("momentum", False),
                                           ("adam", False), ("adamw", True)])
def test_state_bytes_rule_is_torch_optims(name, amsgrad):
    model = _toy()
    params = list(model.parameters())
    opt = optim.make(Training(optimizer=name, amsgrad=amsgrad), params)
    before = [p.detach().clone() for p in params]
    optim.initialize(opt)
    param_bytes = sum(p.numel() * 4 for p in params)   # 30 + 5 + 15 + 3 = 53 floats
    assert param_bytes == 212
    assert optim.state_bytes(opt) == state_bytes(name, param_bytes, amsgrad, len(params))
    # initializing leaves parameters and gradients as they were
    assert all(torch.equal(a, b) for a, b in zip(before, params))
    assert all(p.grad is None for p in params)


def test_optimizer_none_has_no_optimizer():
    assert optim.make(Training(optimizer="none"), _toy().parameters()) is None
    assert optim.make(None, _toy().parameters()) is None


@pytest.mark.parametrize("optimizer, grads", [("adam", "resident"), ("momentum", "set-to-none"),
                                              ("adamw", "set-to-none")])
def test_whole_step_predicted_within_one_percent(optimizer, grads):
    out = validate_case(Case("toymodels:residual", 4, "liveness", repeats=1, warmup=0,
                             optimizer=optimizer, grads=grads), SESSION)
    assert out.max_grad_abs_diff <= 1e-5
    assert out.optimizer_state_bytes > 0
    assert abs(out.plain_peak_error) <= 0.01, out.to_dict()
    assert abs(out.peak_error) <= 0.01, out.to_dict()


def test_profile_records_the_measured_step(tmp_path, capsys):
    path = tmp_path / "t.json"
    assert main(["profile", "--model", "toymodels:concat", "--batch", "2", "--optimizer",
                 "adam", "--amsgrad", "--repeats", "1", "--warmup", "0", "--out",
                 str(path)]) == 0
    rec = json.loads(path.read_text())["training"]
    model, _ = __import__("toymodels").concat()
    params = [p for p in model.parameters() if p.requires_grad]
    pbytes = sum(p.numel() * p.element_size() for p in params)
    assert rec["optimizer"] == "adam" and rec["amsgrad"] is True
    assert rec["param_tensors"] == len(params)
    assert rec["state_bytes"] == 3 * pbytes + 4 * len(params)
    assert rec["step_ms"] > 0 and rec["step_transient_bytes"] >= 0
    capsys.readouterr()
    assert main(["simulate", str(path), "--policy", "liveness", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["optimizer_state_bytes"] == rec["state_bytes"]
    assert got["optimizer_ms"] == rec["step_ms"]
    assert got["static_bytes"] == 2 * pbytes + rec["state_bytes"]


def test_amsgrad_needs_adam(capsys):
    assert main(["profile", "--model", "toymodels:concat", "--batch", "2", "--amsgrad",
                 "--out", "/tmp/never-written.json"]) == 2
    err = capsys.readouterr().err
    assert "--amsgrad needs --optimizer adam or adamw" in err and err.count("\n") == 1


def test_bf16_autocast_activation_sizes_and_whole_step(tmp_path, capsys):
    """Under autocast a convolution's output is bf16 (half the fp32 bytes); the
    whole step's predicted peak is within 1% of plain PyTorch under autocast."""
    paths = {}
    for amp in ("off", "bf16"):
        paths[amp] = tmp_path / f"{amp}.json"
        assert main(["profile", "--model", "toymodels:concat", "--batch", "2", "--amp", amp,
                     "--repeats", "1", "--warmup", "0", "--out", str(paths[amp])]) == 0
    off, bf = (json.loads(paths[a].read_text()) for a in ("off", "bf16"))
    assert bf["training"]["amp"] == "bf16" and off["training"]["amp"] == "off"
    convs = [(a, b) for a, b in zip(off["layers"], bf["layers"]) if a["kind"] == "conv"]
    assert convs
    for a, b in convs:
        assert b["out_dtype"] == "bfloat16" and "out_dtype" not in a
        assert 2 * b["output_bytes"] == a["output_bytes"]
    # (concat under bf16: tests/test_gradviews.py)
    out = validate_case(Case("toymodels:residual", 4, "liveness", repeats=1, warmup=0,
                             optimizer="adam", amp="bf16"), SESSION)
    assert abs(out.plain_peak_error) <= 0.01, out.to_dict()
    assert abs(out.peak_error) <= 0.01, out.to_dict()


def test_modeled_trace_records_the_optimizer_and_models_its_step(tmp_path, capsys):
    path = tmp_path / "m.json"
    assert main(["profile", "--model", "toymodels:concat", "--batch", "2", "--device-model",
                 "a100", "--optimizer", "momentum", "--out", str(path)]) == 0
    rec = json.loads(path.read_text())["training"]
    assert set(rec) == {"optimizer", "amsgrad", "grads", "amp", "param_tensors"}
    model, _ = __import__("toymodels").concat()
    pbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    capsys.readouterr()
    assert main(["simulate", str(path), "--policy", "liveness", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["optimizer_state_bytes"] == pbytes          # one momentum buffer
    # 5 bytes moved per parameter byte over the A100's 2,039 GB/s
    assert got["optimizer_ms"] == pytest.approx(5 * pbytes / 2039e9 * 1e3)


def test_fp16_steps_through_a_grad_scaler():
    """--amp fp16: torch.amp.GradScaler's semantics (the fp32 parameters are the
    master weights): the loss is scaled, the step unscales in place and steps,
    and the scaler's 0-d scale and growth tracker count as state."""
    model = _toy()
    params = list(model.parameters())
    opt = optim.make(Training(optimizer="sgd", amp="fp16"), params)
    assert isinstance(opt, optim.Scaled)
    assert optim.state_bytes(opt) == 4 + 4            # SGD has none: the scaler's two
    assert optim.loss_scale(opt) == optim.INIT_SCALE
    optim.initialize(opt)
    before = [p.detach().clone() for p in params]
    loss = model(torch.ones(2, 6)).sum()
    optim.scaled(opt, loss).backward()
    scaled = [p.grad.clone() for p in params]
    opt.step()
    for p, g, b in zip(params, scaled, before):
        assert torch.equal(p.grad, g / optim.INIT_SCALE)            # unscaled in place
        assert torch.allclose(p.detach(), b - optim.LR * p.grad)   # an SGD step on them
    plain = optim.make(Training(optimizer="sgd", amp="bf16"), params)
    assert not isinstance(plain, optim.Scaled) and optim.loss_scale(plain) == 1.0


@pytest.mark.parametrize("model, batch", [("toymodels:concat", 2), ("toymodels:residual", 4)])
def test_fp16_whole_step_with_loss_scaling(model, batch):
    out = validate_case(Case(model, batch, "liveness", repeats=1, warmup=0,
                             optimizer="adam", amp="fp16"), SESSION)
    assert out.max_grad_abs_diff <= 1e-5, out.to_dict()
    assert abs(out.plain_peak_error) <= 0.01, out.to_dict()
    assert abs(out.peak_error) <= 0.01, out.to_dict()
