"""The layers of app/, read from the source's imports (those under TYPE_CHECKING and inside
functions included): the transports are adapters over a core that imports none of them, no
module imports itself back through others, and no file grows past what a reader takes in."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"
LONGEST = 600  # lines a module may hold

TRANSPORTS = ("app.api", "app.web", "app.bus", "app.mqtt", "app.cli", "app.main")
"""What carries requests in and out: none of it may be imported by the service core."""
ADAPTERS_WITHOUT_HTTP = ("app.bus", "app.mqtt")
"""Transports that must not reach into the HTTP layer: they call the core, as HTTP does."""


def _module(path: Path) -> str:
    parts = path.relative_to(APP.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module(path): path for path in sorted(APP.rglob("*.py"))}


def _imports(path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """The app modules `path` imports (`from app.x import y` names module app.x.y when there
    is one, else app.x)."""
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    yield f"{base}.{alias.name}"
                elif base in modules:
                    yield base


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: set(_imports(path, modules)) - {name} for name, path in modules.items()}


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == package or name.startswith(package + ".") for package in packages)


def test_the_service_core_imports_no_transport() -> None:
    graph = _graph()
    reaching = {
        name: sorted(target for target in targets if _within(target, TRANSPORTS))
        for name, targets in graph.items()
        if _within(name, ("app.service",))
    }
    assert {name: found for name, found in reaching.items() if found} == {}


def test_the_bus_and_mqtt_import_nothing_of_the_http_layer() -> None:
    graph = _graph()
    reaching = {
        name: sorted(t for t in targets if _within(t, ("app.api", "app.web", "app.main")))
        for name, targets in graph.items()
        if _within(name, ADAPTERS_WITHOUT_HTTP)
    }
    assert {name: found for name, found in reaching.items() if found} == {}


def test_no_module_imports_itself_back() -> None:
    """Tarjan's strongly connected components of the import graph: each must be one module."""
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        on_stack.add(name)
        for target in sorted(graph.get(name, ())):
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in on_stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == name:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    assert cycles == []


def test_no_module_is_longer_than_a_reader_takes_in() -> None:
    lengths = {name: path.read_text().count("\n") for name, path in _modules().items()}
    assert {name: n for name, n in lengths.items() if n > LONGEST} == {}
