"""Model zoo: hand-counted layers of each network (built on ``meta``: no memory)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from snsim.errors import SnsimError  # noqa: E402
from snsim.profile import profiler, zoo  # noqa: E402


def _count(name, shape=None):
    entry, params = zoo.lookup(name)
    with torch.device("meta"):
        model = entry.build(shape or entry.input_shape, **params)
    mods = list(model.modules())
    return (sum(isinstance(m, nn.Conv2d) for m in mods),
            sum(isinstance(m, nn.Linear) for m in mods),
            sum(isinstance(m, nn.LocalResponseNorm) for m in mods),
            sum(isinstance(m, nn.Dropout) for m in mods))


@pytest.mark.parametrize("name, convs, fcs", [
    ("alexnet", 5, 3), ("vgg16", 13, 3),
    ("resnet18", 17 + 3, 1),             # stem + 8 blocks x 2, 3 projection shortcuts
    ("resnet50", 1 + 3 * 16 + 4, 1),     # stem + 16 bottlenecks x 3 + 4 projections
    ("resnet101", 1 + 3 * 33 + 4, 1), ("resnet152", 1 + 3 * 50 + 4, 1),
    ("resnet-2500", 1 + 3 * 832 + 4, 1),  # [6, 32, 788, 6]: 2498 weighted layers + projections
    # stem 11, 4 x A (7), reduction A 4, 7 x B (10), reduction B 6, 3 x C (10)
    ("inception_v4", 11 + 28 + 4 + 70 + 6 + 30, 1),
    ("densenet121", 1 + 2 * (6 + 12 + 24 + 16) + 3, 1),  # stem, 2 per dense layer, transitions
])
def test_weighted_layer_counts(name, convs, fcs):
    got = _count(name)
    assert got[:2] == (convs, fcs)


def test_alexnet_has_lrn_and_dropout_and_gpt_params():
    assert _count("alexnet")[2:] == (2, 2)
    entry, params = zoo.lookup("gpt:layers=3,heads=2,width=8,vocab=10")
    model = entry.build((5,), **params)
    assert sum(isinstance(m, nn.Linear) for m in model.modules()) == 4 * 3 + 1
    assert tuple(model.pos.shape) == (5, 8) and model.tok.num_embeddings == 10


def test_modeled_resnet50_layer_count_and_kinds():
    doc = profiler.profile("resnet50", 2, (3, 64, 64), device_model="k40c")
    kinds = [la["kind"] for la in doc["layers"]]
    # data, 53 conv + 53 bn, 49 relu (3 per block + stem), 16 adds, 2 pools, fc, loss
    assert len(kinds) == 1 + 53 + 53 + 49 + 16 + 2 + 1 + 1
    assert kinds.count("add") == 16 and kinds[0] == "data" and kinds[-1] == "loss"


@pytest.mark.parametrize("name, msg", [
    ("resnet-77", "unknown ResNet depth"), ("gpt:layers=x", "use key=integer"),
    ("vgg19", "unknown model 'vgg19'"),
])
def test_lookup_errors(name, msg):
    with pytest.raises(SnsimError, match=msg):
        zoo.lookup(name)


def test_too_small_input_is_an_error():
    with pytest.raises(SnsimError, match="too small for alexnet"):
        zoo.lookup("alexnet")[0].build((3, 32, 32))


def test_documented_parameters_are_accepted():
    """Every ``name:key=value`` example in the zoo's docstring and help is one
    that lookup accepts (the docstring offered gpt ``seq=``, which it rejects)."""
    import re

    docs = zoo.__doc__ + " ".join(a.help or "" for a in _profile_parser()._actions)
    examples = re.findall(r"\b([a-z_0-9-]+:(?:[a-z_]+=\d+,?)+)", docs)
    assert examples, "no examples found"
    for ex in examples:
        zoo.lookup(ex.rstrip(","))


def _profile_parser():
    import argparse

    from snsim.profile.command import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    return p
