"""Policy registry: a policy is one module in this package, registered by name.

Each module decorates a planner with :func:`register`; the registry finds
modules by listing this package, so adding a policy touches nothing else.
A planner takes a :class:`~snsim.policies.base.PlanContext` and returns a
:class:`~snsim.schedule.Schedule`.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Callable

from snsim.errors import PolicyError
from snsim.schedule.ops import Compute
from snsim.policies.base import (FEATURES, OPTIONS, PlanContext, Planner, PolicyInfo,
                                 no_cyclic_gc, trace_features)

_REGISTRY: dict[str, PolicyInfo] = {}
_loaded = False
_INTERNAL = {"base", "cache", "dtr_pool", "finishing", "layers", "polish", "replay", "retime",
             "sequences"}  # helpers


def register(name: str, summary: str, order: int = 100, needs: tuple[str, ...] = (),
             reference: bool = False, options: tuple[str, ...] = ()
             ) -> Callable[[Planner], Planner]:
    """Class or function decorator: make ``planner`` available as policy ``name``.

    ``needs`` names the trace features (:data:`base.FEATURES`) it cannot plan
    without; :func:`plan` refuses a trace that lacks one, in one line.
    ``reference``: an expensive reference planner, planned only by name
    (not listed by :func:`names`, so not in ``--policy all`` or sweeps).
    ``options``: the plan options (:data:`base.OPTIONS`) the policy accepts
    beyond the common ones; the CLI refuses one for a policy without it.
    """
    unknown = set(needs) - set(FEATURES)
    if unknown:
        raise ValueError(f"policy {name!r} needs unknown features {sorted(unknown)}")
    if set(options) - set(OPTIONS):
        raise ValueError(f"policy {name!r} accepts unknown options {sorted(options)}")

    def deco(planner: Planner) -> Planner:
        if name in _REGISTRY and _REGISTRY[name].planner is not planner:
            raise ValueError(f"policy {name!r} registered twice")
        _REGISTRY[name] = PolicyInfo(name=name, summary=summary, planner=planner, order=order,
                                     needs=frozenset(needs), reference=reference,
                                     options=frozenset(options))
        return planner

    return deco


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    for mod in pkgutil.iter_modules(__path__):
        if mod.name not in _INTERNAL and not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")
    _loaded = True


def _load_one(name: str) -> None:
    """Import only the module that registers ``name`` (found by its ``register("name"``
    in the sources: a command that plans one policy does not import the others,
    numpy with ``dtr`` among them); every module when none says so."""
    import re
    from pathlib import Path

    pattern = re.compile(r'@register\(\s*["\']' + re.escape(name) + r'["\']')
    for mod in pkgutil.iter_modules(__path__):
        if mod.name in _INTERNAL or mod.name.startswith("_"):
            continue
        path = Path(__path__[0]) / mod.name
        path = path / "__init__.py" if mod.ispkg else path.with_suffix(".py")
        try:
            source = path.read_text(encoding="utf-8")
        except OSError:
            continue
        if pattern.search(source):
            importlib.import_module(f"{__name__}.{mod.name}")
            if name in _REGISTRY:
                return
    _load_all()


def names(reference: bool = False) -> list[str]:
    """Registered policy names, in presentation order; with ``reference``, the
    reference planners too."""
    _load_all()
    return [p.name for p in sorted(_REGISTRY.values(), key=lambda p: (p.order, p.name))
            if reference or not p.reference]


def get(name: str) -> PolicyInfo:
    if name not in _REGISTRY and not _loaded:
        _load_one(name)
    try:
        return _REGISTRY[name]
    except KeyError:
        raise PolicyError(f"unknown policy {name!r}; choose from: "
                          + ", ".join(names(reference=True)) + ", all") from None


def plan(name: str, ctx: PlanContext):
    """Plan ``ctx`` with policy ``name`` and return its schedule.

    :class:`PolicyError` (one line) if the trace lacks a feature the policy needs.
    Where the trace has an optimizer step, it is appended to the planner's ops:
    planners plan the route (forward and backward) and never place it.
    """
    info = get(name)
    missing = info.needs - trace_features(ctx.graph)
    if "backward" in missing:
        raise PolicyError(f"policy {name} needs a trace with a backward pass, and "
                          f"{ctx.graph.trace.label} is forward-only (its source says so)")
    with no_cyclic_gc():
        schedule = info.planner(ctx)
    step = ctx.graph.optimizer_step
    ops = schedule.ops
    # the optimizer step ends every plan (DESIGN 3a); a planner that returns another
    # planner's plan (optimal's heuristics) already has it
    if step is not None and not (ops and ops[-1] == Compute(step[0], step[1])):
        ops.append(Compute(step[0], step[1]))
    return schedule


__all__ = ["register", "names", "get", "plan", "PlanContext", "PolicyInfo"]
