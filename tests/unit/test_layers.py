"""The layers of docs/design.md, kept by a test: every runtime import (at module level or inside
a function; imports under ``if TYPE_CHECKING:`` are not run and do not count) points down the
layers or stays in its own layer, and no set of modules imports itself round in a cycle.

A module's layer is that of the longest prefix listed in ``LAYERS``; a module no prefix covers
is an error, so a new package has to be placed here (and in docs/design.md) on purpose.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("protocol", "purgatory", "broker")

# Lowest first. A module may import its own layer and the layers before it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("protocol", "purgatory"),
    # Leaves of the broker: no broker import at all (the assignors' names are checked when the
    # configuration is read, so the pure assignor algorithms sit here).
    ("broker.gc_policy", "broker.healthcheck", "broker.kafka_keys", "broker.startup_error",
     "broker.metrics.instruments", "broker.group.assignors", "broker.config_error"),
    ("broker.log",),
    ("broker.config", "broker.logging"),
    ("broker.replica",),
    ("broker.cluster", "broker.metadata"),
    ("broker.security", "broker.coordinator", "broker.client_telemetry", "broker.interbroker"),
    ("broker.group", "broker.txn"),
    ("broker.apis",),
    ("broker.network",),
    ("broker.metrics",),
    ("broker", "broker.wiring", "broker.server", "broker.cli", "broker.testing",
     "broker.__main__"),
)
# Packages whose name covers only their own __init__, not every module under them.
EXACT = {"broker"}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def layer_of(module: str) -> int:
    best, best_len = -1, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            covers = module == prefix or (prefix not in EXACT and module.startswith(prefix + "."))
            if covers and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best < 0:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS and docs/design.md")
    return best


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                skipped.update(id(n) for n in ast.walk(inner))
    return skipped


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The project modules an import statement loads (the most precise one known)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".")
            if MODULES[module].name != "__init__.py":
                package = package[:-1]
            package = package[: len(package) - node.level + 1]
            base = ".".join(package + ([base] if base else []))
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                 for alias in node.names]
    out = []
    for name in names:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name:
            out.append(name)
    return out


def runtime_imports(module: str) -> set[str]:
    tree = ast.parse(MODULES[module].read_text())
    skipped = _type_checking_nodes(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in skipped:
            found.update(t for t in _targets(module, node) if t != module)
    return found


GRAPH = {module: runtime_imports(module) for module in MODULES}


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        layer_of(module)


def test_no_runtime_import_goes_up_the_layers() -> None:
    upward = sorted(
        f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})"
        for module, targets in GRAPH.items() for target in targets
        if layer_of(target) > layer_of(module) and not module.startswith(target + "."))
    assert not upward, "imports up the layers:\n" + "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _package_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """A package's ``__init__`` importing its own modules is how packages are built, not a
    cycle; only imports between modules count."""
    return {module: {t for t in targets if not t.startswith(module + ".")}
            for module, targets in graph.items()}


def test_no_runtime_import_cycle() -> None:
    cycles = _cycles(_package_edges(GRAPH))
    assert not cycles, "runtime import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_checks_can_fail() -> None:
    """The detectors themselves: an upward import and a cycle are found."""
    assert layer_of("broker.log.log") < layer_of("broker.server")
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
