"""Where a search's probe traces come from: ResNets by shape arithmetic, other
zoo models from two modeled profiles (torch, once per model) extrapolated in the
batch.  Graphs are built once per (model, batch) in a process."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Family:
    """A searched family of probe traces: size -> graph, size -> the trace's identity
    (what its document is a pure function of, for the probe cache), size -> what is
    reported (third-stage blocks -> depth)."""

    what: str                                  # "depth" or "batch"
    graph: Callable[[int], Graph]
    identity: Callable[[int], dict[str, Any]]
    label: Callable[[int], int] = int


# Graphs are shared by every search of a process (a worker runs several policies'
# searches, which probe many of the same sizes); a few of 10^4 layers fit easily.
@functools.lru_cache(maxsize=6)
def _resnet_graph(stages: tuple[int, ...], batch: int, device_model: str,
                  model: str | None) -> Graph:
    import gc

    depth = 3 * sum(stages) + 2
    was = gc.isenabled()
    gc.disable()   # ~10^5 acyclic objects: no cyclic collection while they are made
    try:
        doc = resnet_doc(stages, batch, device_model, model=model)
    finally:
        if was:
            gc.enable()
    return graph_of(doc, f"{model or f'resnet-{depth}'} (b{batch}, {device_model}, no torch)")


def _resnet_identity(stages, batch: int, device_model: str, model: str | None) -> dict:
    import dataclasses

    from snsim import devices

    # with the package source in every key (search.cache), these are all the
    # generator's inputs
    return {"family": "resnet", "stages": list(stages), "batch": batch, "model": model,
            "device_model": device_model,
            "preset": dataclasses.asdict(devices.get(device_model))}


def depth_family(batch: int, device_model: str) -> Family:
    """third-stage blocks -> the probe graph of ResNet-(3 n + 134) at ``batch``."""
    return Family("depth",
                  lambda n: _resnet_graph(stage_config(depth_of(n)), batch, device_model, None),
                  lambda n: _resnet_identity(stage_config(depth_of(n)), batch, device_model,
                                             None),
                  depth_of)


def depth_graph(batch: int, device_model: str) -> Callable[[int], Graph]:
    return depth_family(batch, device_model).graph


# (model, batch, device model) -> a file holding that profile (use_profile_files)
_PROFILE_FILES: dict[tuple[str, int, str], str] = {}


def profile_files(model: str, device_model: str, folder) -> dict[tuple[str, int, str], str]:
    """Write ``model``'s two base profiles into ``folder`` (named by their content,
    written whole, once) and return where: a parent profiles once, and its worker
    processes read these (:func:`use_profile_files`) instead of profiling again."""
    import hashlib
    import json
    from pathlib import Path

    from snsim.fileio import write_json

    out = {}
    for b in (1, 2):
        doc = _profiled(model, b, device_model)
        sha = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]
        path = Path(folder) / f"{model}_b{b}_{device_model}-{sha}.json"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json(path, doc)
        out[(model, b, device_model)] = str(path)
    return out


def use_profile_files(files: dict[tuple[str, int, str], str]) -> None:
    _PROFILE_FILES.update(files)


@functools.lru_cache(maxsize=16)
def _profiled(model: str, batch: int, device_model: str) -> dict[str, Any]:
    path = _PROFILE_FILES.get((model, batch, device_model))
    if path is not None:
        import json
        from pathlib import Path

        return json.loads(Path(path).read_text(encoding="utf-8"))
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


@functools.lru_cache(maxsize=16)
def _profiles_sha256(model: str, device_model: str) -> str:
    import hashlib
    import json

    blob = json.dumps([_profiled(model, 1, device_model), _profiled(model, 2, device_model)],
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


@functools.lru_cache(maxsize=6)
def _zoo_graph(model: str, batch: int, device_model: str) -> Graph:
    return graph_of(batch_doc(model, batch, device_model), f"{model} (b{batch}, {device_model})")


def batch_family(model: str, device_model: str) -> Family:
    """batch -> the probe graph of zoo ``model`` (ResNets by shape arithmetic, other
    models extrapolated from two modeled profiles, whose content is their identity)."""
    stages = _resnet_stages(model)

    def identity(batch: int) -> dict[str, Any]:
        if stages is not None:
            return _resnet_identity(stages, batch, device_model, model)
        return {"family": "zoo", "model": model, "batch": batch, "device_model": device_model,
                "profiles_sha256": _profiles_sha256(model, device_model)}

    def graph(batch: int) -> Graph:
        if stages is not None:
            return _resnet_graph(tuple(stages), batch, device_model, model)
        return _zoo_graph(model, batch, device_model)
    return Family("batch", graph, identity)


def batch_graph(model: str, device_model: str) -> Callable[[int], Graph]:
    return batch_family(model, device_model).graph
