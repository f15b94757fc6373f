"""The import graph of ``snsim``: no cycles, no forbidden edges, no private names across modules.

Every ``import`` in every module counts, also those inside functions (a lazy
import still makes a dependency).  A *unit* is a subpackage of ``snsim``
(``snsim.policies``) or a top-level module (``snsim.graph``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "snsim"


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(imported module, names imported from it, line) for every import in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    me = _module_name(path)
    base = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((a.name, [], node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                mod = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((mod, [a.name for a in node.names], node.lineno))
    return out


MODULES = {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _resolve(mod: str, names: list[str]) -> list[str]:
    """The snsim modules an import statement loads (``from pkg import mod`` loads pkg.mod)."""
    if not mod.startswith("snsim"):
        return []
    out = [mod] if mod in MODULES else []
    out += [f"{mod}.{n}" for n in names if f"{mod}.{n}" in MODULES]
    return out


def _unit(mod: str) -> str:
    parts = mod.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else mod


def _edges():
    for mod, path in MODULES.items():
        for target, names, line in _imports(path):
            for dst in _resolve(target, names):
                if dst != mod:
                    yield mod, dst, names, f"{path.relative_to(ROOT)}:{line}"


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    color: dict[str, int] = {}
    stack: list[str] = []

    def visit(u):
        color[u] = 1
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if color.get(v) == 1:
                return stack[stack.index(v):] + [v]
            if not color.get(v):
                found = visit(v)
                if found:
                    return found
        stack.pop()
        color[u] = 2
        return None

    for u in sorted(graph):
        if not color.get(u):
            found = visit(u)
            if found:
                return found
    return None


def _is_package_init(mod: str) -> bool:
    return MODULES[mod].name == "__init__.py"


def test_no_module_cycle():
    graph: dict[str, set[str]] = {}
    for src, dst, _, _ in _edges():
        # a package's __init__ re-exporting its own submodules is not a cycle of the design
        if _is_package_init(dst) and src.startswith(dst + "."):
            continue
        graph.setdefault(src, set()).add(dst)
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_no_package_cycle():
    graph: dict[str, set[str]] = {}
    for src, dst, _, _ in _edges():
        a, b = _unit(src), _unit(dst)
        if a != b:
            graph.setdefault(a, set()).add(b)
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


TORCH_FREE = ("snsim.trace", "snsim.graph", "snsim.schedule", "snsim.policies", "snsim.sim",
              "snsim.units", "snsim.errors", "snsim.fileio", "snsim.synth", "snsim.report",
              "snsim.plots", "snsim.devices", "snsim.whatif", "snsim.evaluate", "snsim.search",
              "snsim.sweep",
              "snsim")

FORBIDDEN = [
    # (importer unit prefix, imported unit prefix, why)
    ("snsim.policies", "snsim.sim", "policies plan; they never run the simulator"),
    ("snsim.policies", "snsim.plots", "policies never draw"),
    ("snsim.execute", "snsim.profile", "the executor stands below the profiler"),
    ("snsim.torchgraph", "snsim.profile", "torchgraph is the bottom torch layer"),
    ("snsim.torchgraph", "snsim.execute", "torchgraph is the bottom torch layer"),
    ("snsim.sim", "snsim.policies", "the simulator replays any schedule"),
    ("snsim.trace", "snsim.graph", "the trace layer knows nothing above it"),
]


def test_torch_free_core():
    """The simulator half never imports torch, not even lazily."""
    bad = []
    for mod, path in MODULES.items():
        if _unit(mod) not in TORCH_FREE:
            continue
        for target, _, line in _imports(path):
            if target == "torch" or target.startswith("torch."):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not bad, bad


@pytest.mark.parametrize("src,dst,why", FORBIDDEN)
def test_forbidden_edge(src, dst, why):
    bad = [f"{where}: {a} imports {b}" for a, b, _, where in _edges()
           if (a == src or a.startswith(src + ".")) and (b == dst or b.startswith(dst + "."))]
    assert not bad, f"{why}: {bad}"


def test_library_never_imports_scripts():
    bad = []
    for mod, path in MODULES.items():
        for target, _, line in _imports(path):
            if target.split(".")[0] in ("experiments", "validate", "benchmarks", "scripts", "tests"):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not bad, bad


def test_no_private_name_across_modules():
    """``from snsim.x import _name`` (or ``mod._name``) from another module is a leak."""
    bad = []
    for src, dst, names, where in _edges():
        bad += [f"{where}: {src} uses {dst}.{n}" for n in names
                if n.startswith("_") and not n.startswith("__") and f"{dst}.{n}" not in MODULES]
    # attribute access on an imported module: ``cap._op_callable``
    for mod, path in MODULES.items():
        tree = ast.parse(path.read_text())
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("snsim"):
                for a in node.names:
                    if f"{node.module}.{a.name}" in MODULES:
                        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("snsim") and a.asname:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {mod} uses "
                           f"{aliases[node.value.id]}.{node.attr}")
    assert not bad, bad


def test_the_walk_sees_the_tree():
    """Guard against a walk that finds nothing (and so can never fail)."""
    edges = list(_edges())
    assert len(MODULES) > 40 and len(edges) > 100
    assert ("snsim.profile.transients", "snsim.execute.executor") in {(a, b) for a, b, _, _ in edges}
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]


# The interpreters of a schedule dispatch on ``op.action`` (snsim/schedule/ops.py), so a
# new op kind with an existing action is the ops module's and the ledger's alone.
INTERPRETERS = ("snsim.sim.engine", "snsim.execute.executor", "snsim.policies.replay")
OP_KINDS = {"Free", "Offload", "Prefetch", "Wait"}


@pytest.mark.parametrize("mod", INTERPRETERS)
def test_interpreters_never_name_an_op_kind(mod):
    named = [(line, sorted(OP_KINDS & set(names))) for src, names, line in _imports(MODULES[mod])
             if src == "snsim.schedule.ops" and OP_KINDS & set(names)]
    assert named == [], f"{mod} imports op classes {named}; dispatch on op.action"


def test_every_op_kind_has_an_action():
    from snsim.schedule import ops

    for name in OP_KINDS | {"Compute"}:
        assert getattr(ops, name).action in ops.ACTIONS, name
