"""Mixed precision on modeled traces (docs/DESIGN.md 3a): the layers run under
``torch.autocast`` on fake tensors, so a modeled bf16 profile has the bytes and
dtypes of a measured one, and half-precision kernels are priced at the preset's
BF16/FP16 rate."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from snsim import devices  # noqa: E402
from snsim.cli import main  # noqa: E402
from snsim.profile import profiler  # noqa: E402
from snsim.torchgraph import amp  # noqa: E402
from snsim.training import Training  # noqa: E402

# every byte-, dtype- and structure-field of a layer
FIELDS = ("name", "kind", "inputs", "output_bytes", "param_bytes", "saved_extra_bytes",
          "bwd_reads", "grad_shares", "grad_bytes", "out_dtype", "inplace_of", "shape")


@pytest.fixture
def cpu_rules(monkeypatch):
    """The measured side is a CPU: compare with CPU autocast's rules even where a
    GPU would make the modeled profile follow CUDA's."""
    monkeypatch.setattr(amp, "rules_device", lambda: torch.device("cpu"))


@pytest.mark.parametrize("spec, batch, precision", [
    ("toymodels:residual", 4, "bf16"),        # conv, batch norm, max pool, linear
    ("families:mha_classifier", None, "bf16"),  # embedding, attention, layer norm
    ("toymodels:concat", 2, "fp16"),
])
def test_modeled_amp_bytes_equal_measured_cpu(cpu_rules, spec, batch, precision):
    tr = Training(optimizer="adam", amp=precision)
    modeled = profiler.profile(spec, batch, device_model="h100", training=tr)
    measured = profiler.profile(spec, batch, device="cpu", repeats=1, warmup=0, training=tr)
    fp32 = profiler.profile(spec, batch, device_model="h100",
                            training=Training(optimizer="adam"))
    assert len(modeled["layers"]) == len(measured["layers"])
    for m, r in zip(modeled["layers"], measured["layers"]):
        assert {k: m.get(k) for k in FIELDS} == {k: r.get(k) for k in FIELDS}, m["name"]
    half = {"bf16": "bfloat16", "fp16": "float16"}[precision]
    assert any(la.get("out_dtype") == half for la in modeled["layers"])
    # autocast really applied: activations shrink, weight casts are saved extras
    assert sum(la["output_bytes"] for la in modeled["layers"]) < \
        sum(la["output_bytes"] for la in fp32["layers"])
    cast = [(a, b) for a, b in zip(modeled["layers"], fp32["layers"])
            if a["param_bytes"] and a["kind"] in ("conv", "fc")]
    assert cast and all(a.get("saved_extra_bytes", 0) >= b.get("saved_extra_bytes", 0)
                        + b["param_bytes"] // 2
                        - 4 * 64 for a, b in cast)   # the half copy of the weight (bias aside)
    assert "autocast" in modeled["source"]


def test_batch_norm_saves_float32_statistics_under_autocast(cpu_rules):
    """The one correction to the fake kernels: half input, float32 weight ->
    float32 mean/invstd (8 channels x 2 x 4 B), as the CPU kernel measures."""
    tr = Training(optimizer="sgd", amp="bf16")
    doc = profiler.profile("toymodels:residual", 4, device_model="a100", training=tr)
    bn = next(la for la in doc["layers"] if la["name"] == "stem.1")
    assert bn["saved_extra_bytes"] == 8 * 2 * 4


def test_roofline_uses_the_half_precision_peak(cpu_rules):
    tr = Training(optimizer="sgd", amp="bf16")
    doc = profiler.profile("toymodels:residual", 4, device_model="a100", training=tr)
    a100 = devices.get("a100")
    fc = next(la for la in doc["layers"] if la["name"] == "fc")
    half = [k for k in fc["fwd_kernels"] if len(k) == 3]
    assert half and all(k[2] == "bf16" and k[0] > 0 for k in half)
    f, b, _ = half[0]
    by_hand = max(f / (0.6 * 312e12), b / (0.8 * 2039e9)) + 5e-6
    assert devices.kernel_seconds(f, b, a100, "bf16") == pytest.approx(by_hand)
    assert fc["fwd_ms"] == pytest.approx(devices.step_ms(fc["fwd_kernels"], a100), abs=1e-6)
    # the same kernels priced at FP32 take longer (a compute-bound one does)
    assert devices.kernel_seconds(1e12, 1, a100, "bf16") < devices.kernel_seconds(1e12, 1, a100)
    # chips without BF16 arithmetic fall back to FP32; fp16 uses the FP16 rate
    v100 = devices.get("v100")
    assert v100.peak_flops("bf16") == v100.fp32_flops and v100.peak_flops("fp16") == 125e12
    assert devices.get("h100").peak_flops("bf16") == 989e12


def test_simulate_device_reprices_half_kernels(cpu_rules, tmp_path, capsys):
    path = tmp_path / "t.json"
    assert main(["profile", "--model", "toymodels:residual", "--batch", "4", "--device-model",
                 "v100", "--amp", "bf16", "--out", str(path)]) == 0
    doc = json.loads(path.read_text())
    h100 = devices.get("h100")
    compute = sum(devices.step_ms(la.get("fwd_kernels", ()), h100)
                  + (devices.step_ms(la["bwd_kernels"], h100) if la.get("bwd_kernels") else 0)
                  for la in doc["layers"] if "fwd_kernels" in la)
    capsys.readouterr()
    assert main(["simulate", str(path), "--policy", "liveness", "--device", "h100",
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["compute_ms"] == pytest.approx(compute, rel=1e-4)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (device suite)")


@CUDA
@pytest.mark.parametrize("spec, batch, precision", [
    ("toymodels:residual", 4, "fp16"),
    ("toymodels:residual", 4, "bf16"),
    ("families:mha_classifier", None, "fp16"),
    ("toymodels:concat", 2, "off"),
])
def test_modeled_amp_bytes_equal_measured_cuda(spec, batch, precision):
    """Where a GPU exists a modeled profile follows CUDA autocast's rules: its
    bytes, dtypes and structure equal a profile measured on that GPU."""
    assert amp.rules_device().type == "cuda"
    tr = Training(optimizer="adam", amp=precision)
    modeled = profiler.profile(spec, batch, device_model="h100", training=tr)
    measured = profiler.profile(spec, batch, device="cuda", repeats=1, warmup=0, training=tr)
    assert len(modeled["layers"]) == len(measured["layers"])
    diff = [(m["name"], {k: (m.get(k), r.get(k)) for k in FIELDS if m.get(k) != r.get(k)})
            for m, r in zip(modeled["layers"], measured["layers"])
            if any(m.get(k) != r.get(k) for k in FIELDS)]
    assert not diff, diff
