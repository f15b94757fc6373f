"""A module called twice, against plain PyTorch (capture note [11], executor
note [10]): the profile lists the shared parameters, and liveness predicts
plain autograd's peak with autograd's gradient-summing buffer counted, with
resident gradients and with set-to-none ones."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from snsim.graph import Graph  # noqa: E402
from snsim.profile import profiler  # noqa: E402
from snsim.trace import from_dict  # noqa: E402
from snsim.validation.run import GRAD_TOLERANCE, Case, Session, validate_case  # noqa: E402

MODEL = "tests.families:shared_twice"


def test_the_second_call_lists_the_first_calls_parameters():
    doc = profiler.profile(MODEL, None, repeats=1, warmup=0)
    by_name = {la["name"]: la for la in doc["layers"]}
    first, second = by_name["shared"], by_name["shared@shared_1"]
    assert second["param_bytes"] == 0
    assert second["param_shares"] == [[first["id"], first["param_bytes"]]]
    g = Graph(from_dict(doc, "shared_twice"))
    assert g.param_buffers == {first["id"]: (first["param_bytes"],
                                             (second["id"], first["id"]))}


@pytest.mark.parametrize("grads", [None, "set-to-none"])
def test_shared_module_matches_plain_pytorch(grads):
    case = Case(model=MODEL, batch=None, policy="liveness", repeats=1, warmup=0,
                optimizer="sgd" if grads else None, grads=grads)
    out = validate_case(case, Session())
    assert out.max_grad_abs_diff <= GRAD_TOLERANCE, out.worst_grad_param
    assert abs(out.peak_error) < 0.001, out.peak_error            # vs snsim's executor
    assert abs(out.plain_peak_error) < 0.01, out.plain_peak_error  # vs plain autograd
