"""The model families users train (tests/families.py) profile, simulate and validate.

Each pattern that used to crash, be refused or give wrong gradients
(integer token ids, tuple outputs, whole nn.Modules, parameters used
through a function, several outputs, scaled_dot_product_attention,
in-place activations, chunk views) is profiled on the CPU, then executed
under a policy that keeps everything and under one that swaps and
recomputes at a tight budget, and its gradients are compared with plain
autograd's.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from snsim.errors import SnsimError  # noqa: E402
from snsim.profile import profiler  # noqa: E402
from snsim.trace import from_dict  # noqa: E402
from snsim.validation.run import GRAD_TOLERANCE, Case, Session, validate_case  # noqa: E402

from tests import families  # noqa: E402

# liveness's prediction within 2% of plain autograd's measured peak: all of them
FAITHFUL = set(families.FAMILIES)

_SESSION = Session()
_DOCS: dict = {}


def _doc(name: str) -> dict:
    if name not in _DOCS:
        _DOCS[name] = profiler.profile(f"tests.families:{name}", None, repeats=1, warmup=0)
    return _DOCS[name]


def _layers(name: str, kind: str | None = None) -> list[dict]:
    return [la for la in _doc(name)["layers"] if kind is None or la["kind"] == kind]


@pytest.mark.parametrize("name", families.FAMILIES)
@pytest.mark.parametrize("policy,budget", [("liveness", None), ("superneurons", "1.05xlb"),
                                           ("dtr", "1.2xlb")])
def test_family_validates_with_autograd_gradients(name, policy, budget):
    trace = from_dict(_doc(name), name)
    case = Case(model=f"tests.families:{name}", batch=None, policy=policy, budget=budget,
                repeats=1, warmup=0)
    _SESSION.traces[(case.model, None, None, "cpu", case.training)] = trace
    out = validate_case(case, _SESSION)
    assert out.batch == trace.batch
    assert out.max_grad_abs_diff <= GRAD_TOLERANCE, (name, policy, out.worst_grad_param)
    if policy == "liveness":  # the executor holds what the simulator counts
        assert abs(out.peak_error) < 0.03, (name, out.peak_error)
        # and plain PyTorch holds what liveness predicts
        assert abs(out.plain_peak_error) < 0.02, (name, out.plain_peak_error)


def test_token_ids_from_the_example():
    doc = _doc("lstm_lm")
    assert doc["input_dtype"] == "int64"
    assert doc["batch"] == families.BATCH and doc["input_shape"] == [families.SEQ]
    assert doc["layers"][0]["output_bytes"] == 8 * families.BATCH * families.SEQ


def test_tuple_output_counts_every_tensor():
    # nn.LSTM returns (out, (h, c)): all three are its output
    (lstm,) = [la for la in _layers("lstm_lm") if la["name"] == "rnn"]
    b, t, w = families.BATCH, families.SEQ, families.WIDTH
    assert lstm["output_bytes"] == 4 * (b * t * w + 2 * b * w)
    (mha,) = [la for la in _layers("mha_classifier") if la["name"] == "attn"]
    # attention output plus the head-averaged weights
    assert mha["output_bytes"] == 4 * (b * t * w + b * t * t)


def test_parameters_through_functions_count_and_get_gradients():
    tied = families.TiedLM()
    n_params = sum(p.numel() for p in tied.parameters())
    assert sum(la["param_bytes"] for la in _layers("tied_lm")) == 4 * n_params
    vit = families.TinyViT()
    assert sum(la["param_bytes"] for la in _layers("tiny_vit")) == \
        4 * sum(p.numel() for p in vit.parameters())


def test_several_outputs_one_cross_entropy_each():
    layers = _layers("two_heads")
    loss = layers[-1]
    heads = [la["id"] for la in layers if la["name"] in ("a", "b")]
    assert loss["kind"] == "loss" and sorted(loss["inputs"]) == sorted(heads)
    # two log-softmaxes (batch x 10 and batch x 3) and the scalar sums are kept
    assert loss["bwd_reads"] == []
    assert loss["saved_extra_bytes"] >= 4 * 16 * (10 + 3)


def test_attention_backward_reads_its_output():
    (att,) = _layers("sdpa_model", "attention")
    assert att["bwd_reads"] == ["inputs", "output"]


def test_example_disagreeing_with_arguments_is_refused():
    with pytest.raises(SnsimError, match="--batch 3 disagrees"):
        profiler.profile("tests.families:gru_classifier", 3, repeats=1, warmup=0)
    with pytest.raises(SnsimError, match="--input-shape 5 disagrees"):
        profiler.profile("tests.families:gru_classifier", None, (5,), repeats=1, warmup=0)
    with pytest.raises(SnsimError, match="--input-dtype float32 disagrees"):
        profiler.profile("tests.families:lstm_lm", None, input_dtype="float32",
                         repeats=1, warmup=0)


def test_input_dtype_int64_without_example_bounded_by_embedding(tmp_path, monkeypatch):
    (tmp_path / "mymodels.py").write_text(
        "import torch.nn as nn\n"
        "class M(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.e = nn.Embedding(7, 4)\n"
        "        self.h = nn.Linear(4, 7)\n"
        "    def forward(self, x):\n"
        "        return self.h(self.e(x))\n"
        "def lm():\n"
        "    return M(), (5,)\n")
    monkeypatch.chdir(tmp_path)  # the current directory is importable
    doc = profiler.profile("mymodels:lm", 2, input_dtype="int64", repeats=1, warmup=0)
    assert doc["input_dtype"] == "int64" and doc["layers"][0]["output_bytes"] == 8 * 2 * 5


def test_module_layers_measure_their_hand_over():
    # nn.GRU and nn.MultiheadAttention are one layer each: autograd frees their
    # internal saved tensors node by node, which the hand-over measurement records
    for name, layer in (("gru_classifier", "rnn"), ("mha_classifier", "attn")):
        (la,) = [x for x in _layers(name) if x["name"] == layer]
        entry = la["workspace"][0]
        assert entry["bwd_released"] < la["saved_extra_bytes"] + entry["bwd_bytes"]
