"""The import rules of docs/architecture.md, read from the source (imports inside functions
and under TYPE_CHECKING count):

- the floor (`runtime/base/`) imports nothing of the project outside itself;
- `policy`, `learner` and `sites` take only the floor from `runtime`;
- `learner` is imported only by the composition root (the daemon and the training run it
  wires, the API, the first-run bootstrap, the CLI) and by itself;
- no two files import each other, directly or through others.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("runtime", "policy", "learner", "sites")
FLOOR = "runtime.base"
COMPOSITION_ROOT = (
    "runtime.daemon",
    "runtime.training",
    "runtime.api",
    "runtime.bootstrap",
    "runtime.cli",
)

Graph = dict[str, set[str]]


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def module_graph(root: Path, packages: Iterable[str]) -> Graph:
    """{module: the project's modules it imports}. `from a import b` counts as importing
    the module `a.b` when there is one (not the package `a`)."""
    files: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path

    def known(name: str) -> str | None:
        parts = name.split(".")
        while parts and ".".join(parts) not in files:
            parts.pop()
        return ".".join(parts) or None

    graph: Graph = {}
    for module, path in files.items():
        named: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
            if isinstance(node, ast.Import):
                named.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                assert node.level == 0, f"{path}: relative import"
                subs = [f"{node.module}.{a.name}" for a in node.names]
                found = [s for s in subs if s in files]
                named.update(found)
                if len(found) < len(subs):
                    named.add(node.module)
        graph[module] = {m for m in map(known, named) if m is not None and m != module}
    return graph


def violations(graph: Graph) -> list[str]:
    """Every import that breaks a rule of the module docstring, as 'A imports B: why'."""
    found = []
    for module, imported in sorted(graph.items()):
        for other in sorted(imported):
            if _within(module, FLOOR) and not _within(other, FLOOR):
                found.append(f"{module} imports {other}: the floor imports only the floor")
            if (
                module.split(".")[0] in ("policy", "learner", "sites")
                and _within(other, "runtime")
                and not _within(other, FLOOR)
            ):
                found.append(f"{module} imports {other}: only {FLOOR} may be taken from runtime")
            if (
                _within(other, "learner")
                and not _within(module, "learner")
                and not any(_within(module, root) for root in COMPOSITION_ROOT)
            ):
                found.append(f"{module} imports {other}: learner is the composition root's")
    return found


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def graph() -> Graph:
    return module_graph(ROOT, PACKAGES)


def test_the_floor_exists_and_every_package_keeps_to_its_floor(graph: Graph) -> None:
    assert {f"{FLOOR}.messages", f"{FLOOR}.config", f"{FLOOR}.http", f"{FLOOR}.files"} <= set(graph)
    assert violations(graph) == []


def test_no_file_level_import_cycle(graph: Graph) -> None:
    assert cycles(graph) == []


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_rules_see_imports_inside_functions_and_cycles(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "runtime/__init__.py": "",
            "runtime/base/__init__.py": "",
            "runtime/base/config.py": "def f():\n    from runtime.episode import X\n",
            "runtime/episode.py": "from runtime.base import config\n",
            "runtime/daemon.py": "import learner.trainer\n",
            "runtime/scheduler.py": "from learner import trainer\n",
            "policy/__init__.py": "",
            "policy/client.py": "from runtime.base.config import C\nfrom runtime import episode\n",
            "learner/__init__.py": "",
            "learner/trainer.py": "from runtime.base.config import C\n",
            "sites/__init__.py": "",
        },
    )
    graph = module_graph(tmp_path, PACKAGES)
    assert graph["runtime.base.config"] == {"runtime.episode"}
    assert violations(graph) == [
        "policy.client imports runtime.episode: only runtime.base may be taken from runtime",
        "runtime.base.config imports runtime.episode: the floor imports only the floor",
        "runtime.scheduler imports learner.trainer: learner is the composition root's",
    ]
    assert cycles(graph) == [["runtime.base.config", "runtime.episode"]]
