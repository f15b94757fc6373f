"""Where a search's probe traces come from: ResNets by shape arithmetic, other
zoo models from two modeled profiles (torch, once per model) extrapolated in the
batch.  Graphs are built once per (model, batch) in a process."""

from __future__ import annotations

import functools
import re
from typing import Any, Callable

from snsim.errors import SnsimError
from snsim.graph import Graph
from snsim.search.batch import at_batch
from snsim.search.resnet import depth_of, resnet_doc, stage_config

# The zoo's bottleneck ResNets by name (the release's stage configurations).
ZOO_RESNETS = {"resnet50": (3, 4, 6, 3), "resnet101": (3, 4, 23, 3),
               "resnet152": (3, 8, 36, 3), "resnet-254": (3, 16, 62, 3),
               "resnet-506": (6, 32, 124, 6), "resnet-1010": (12, 64, 248, 12),
               "resnet-2500": (6, 32, 788, 6)}


def graph_of(doc: dict[str, Any], label: str) -> Graph:
    from snsim.trace.io import from_dict

    return Graph(from_dict(doc, label))


def depth_graph(batch: int, device_model: str) -> Callable[[int], Graph]:
    """third-stage blocks -> the probe graph of ResNet-(3 n + 134) at ``batch``."""
    @functools.lru_cache(maxsize=4)  # the search asks for a few sizes twice
    def make(third: int) -> Graph:
        depth = depth_of(third)
        return graph_of(resnet_doc(stage_config(depth), batch, device_model),
                        f"resnet-{depth} (b{batch}, {device_model}, no torch)")
    return make


@functools.lru_cache(maxsize=16)
def _profiled(model: str, batch: int, device_model: str) -> dict[str, Any]:
    from snsim.errors import require_torch

    require_torch(f"a batch search on {model}")
    from snsim.profile import profiler

    return profiler.profile(model, batch, device_model=device_model)


def _resnet_stages(model: str):
    stages = ZOO_RESNETS.get(model)
    m = re.fullmatch(r"resnet-(\d+)", model)
    if stages is None and m:
        try:
            stages = stage_config(int(m.group(1)))
        except ValueError:
            stages = None
    return stages


def needs_profile(model: str) -> bool:
    """Whether ``model``'s traces come from torch (not from shape arithmetic)."""
    return _resnet_stages(model) is None


def batch_doc(model: str, batch: int, device_model: str) -> dict[str, Any]:
    """The modeled trace document of zoo ``model`` at ``batch`` on ``device_model``."""
    stages = _resnet_stages(model)
    if stages is not None:
        return resnet_doc(stages, batch, device_model, model=model)
    return at_batch(_profiled(model, 1, device_model), _profiled(model, 2, device_model), batch)


def check_model(model: str) -> None:
    """Refuse an unknown model name in one line, before any work."""
    if model in ZOO_RESNETS or re.fullmatch(r"resnet-\d+", model):
        return
    from snsim.errors import require_torch

    require_torch(f"a batch search on {model}")
    from snsim.profile.zoo import lookup

    lookup(model)
    if ":" in model:
        raise SnsimError(f"max-batch takes a zoo model name, not {model!r}")


def batch_graph(model: str, device_model: str) -> Callable[[int], Graph]:
    @functools.lru_cache(maxsize=4)
    def make(batch: int) -> Graph:
        return graph_of(batch_doc(model, batch, device_model),
                        f"{model} (b{batch}, {device_model})")
    return make
