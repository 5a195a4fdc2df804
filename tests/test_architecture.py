"""The core's architecture, checked from its source: no import cycles among its modules, and no
private name (``_x``) imported from another module.

The graph is built by parsing every module with :mod:`ast` (nothing is imported), so a
module that fails to import still shows its edges. **Every** import statement counts: at
module level, inside functions, and under ``if TYPE_CHECKING:``. A deferred or type-only
import hides a cycle from the interpreter, not from a reader: the two modules still cannot be
understood, tested or moved one without the other. Breaking a cycle means moving the shared
thing below both modules, never deferring the import.

The scanned packages: ``perflab`` (core/perflab), and the simulator's own distribution
``perflab_sim`` when it is present (plugins/sim or sim/ at the repository root, or installed),
in one graph, so an import of the simulator back from the core is a cycle too.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Edge:
    source: str  # the importing module
    target: str  # the imported module
    where: str  # path:line of the import statement


@dataclass(frozen=True)
class PrivateUse:
    module: str
    target: str
    name: str
    where: str


def package_dirs() -> dict[str, Path]:
    """The packages whose modules form the graph: name -> directory."""
    out = {"perflab": ROOT / "core" / "perflab"}
    for candidate in (ROOT / "plugins" / "sim" / "perflab_sim", ROOT / "sim" / "perflab_sim"):
        if candidate.is_dir():
            out["perflab_sim"] = candidate
            break
    else:
        spec = importlib.util.find_spec("perflab_sim")
        if spec is not None and spec.submodule_search_locations:
            out["perflab_sim"] = Path(next(iter(spec.submodule_search_locations)))
    return out


def modules_of(name: str, directory: Path) -> dict[str, tuple[Path, bool]]:
    """Every module of the package: dotted name -> (file, is a package's __init__)."""
    out: dict[str, tuple[Path, bool]] = {}
    for path in sorted(directory.rglob("*.py")):
        parts = [name, *path.relative_to(directory).with_suffix("").parts]
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


class Graph:
    def __init__(self, packages: dict[str, Path]) -> None:
        self.modules: dict[str, tuple[Path, bool]] = {}
        for name, directory in packages.items():
            self.modules.update(modules_of(name, directory))
        self.edges: dict[str, list[Edge]] = {m: [] for m in self.modules}
        self.private: list[PrivateUse] = []
        for module, (path, is_pkg) in self.modules.items():
            self._scan(module, path, is_pkg)

    def owner(self, dotted: str) -> str | None:
        """The scanned module that ``dotted`` (a module, or a name in one) lives in."""
        while dotted and dotted not in self.modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    def _absolute(self, module: str, is_pkg: bool, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = module.split(".") if is_pkg else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        return ".".join([*base, *([node.module] if node.module else [])])

    def _scan(self, module: str, path: Path, is_pkg: bool) -> None:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        aliases: dict[str, str] = {}  # a local name bound to a scanned module -> that module
        for node in ast.walk(tree):  # every import, wherever it is (see the module's docstring)
            where = f"{rel}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                for a in node.names:
                    target = self.owner(a.name)
                    if target is not None:
                        self._edge(module, target, where)
                        if a.asname and target == a.name:
                            aliases[a.asname] = target
            elif isinstance(node, ast.ImportFrom):
                base = self._absolute(module, is_pkg, node)
                for a in node.names:
                    if f"{base}.{a.name}" in self.modules:  # a submodule: `from perflab import redact`
                        self._edge(module, f"{base}.{a.name}", where)
                        aliases[a.asname or a.name] = f"{base}.{a.name}"
                        continue
                    target = self.owner(base)
                    if target is None:
                        continue
                    self._edge(module, target, where)
                    if _private(a.name) and target != module:
                        self.private.append(PrivateUse(module, target, a.name, where))
        for node in ast.walk(tree):  # `mod._name` through a module imported whole
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and _private(node.attr) and aliases[node.value.id] != module):
                self.private.append(PrivateUse(module, aliases[node.value.id], node.attr, f"{rel}:{node.lineno}"))

    def _edge(self, source: str, target: str, where: str) -> None:
        """``source`` imports ``target``, and with it every package above ``target`` that is not
        above ``source`` too (those were initialised before ``source`` ran): importing
        ``a.b.c`` runs ``a/b/__init__.py``, so a package's ``__init__`` that imports back is a cycle."""
        own = {source.rsplit(".", i)[0] for i in range(1, source.count(".") + 1)}
        parts = target.split(".")
        for i in range(len(parts), 0, -1):
            t = ".".join(parts[:i])
            if t in own:
                break
            if t != source and t in self.modules:
                self.edges[source].append(Edge(source, t, where))

    def cycles(self) -> list[list[str]]:
        """The strongly connected components of more than one module (Tarjan, iterative)."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set[str] = set()
        out: list[list[str]] = []
        counter = 0
        for root in self.modules:
            if root in index:
                continue
            work: list[tuple[str, Iterator[Edge]]] = [(root, iter(self.edges[root]))]
            index[root] = low[root] = counter
            counter += 1
            stack.append(root)
            on_stack.add(root)
            while work:
                v, it = work[-1]
                for e in it:
                    w = e.target
                    if w not in index:
                        index[w] = low[w] = counter
                        counter += 1
                        stack.append(w)
                        on_stack.add(w)
                        work.append((w, iter(self.edges[w])))
                        break
                    if w in on_stack:
                        low[v] = min(low[v], index[w])
                else:
                    work.pop()
                    if work:
                        low[work[-1][0]] = min(low[work[-1][0]], low[v])
                    if low[v] == index[v]:
                        scc = []
                        while True:
                            w = stack.pop()
                            on_stack.discard(w)
                            scc.append(w)
                            if w == v:
                                break
                        if len(scc) > 1:
                            out.append(sorted(scc))
        return out

    def describe(self, scc: Iterable[str]) -> str:
        """A cycle's modules and the imports between them, each with its file and line."""
        members = set(scc)
        lines = [" <-> ".join(sorted(members))]
        for m in sorted(members):
            lines += [f"    {m} -> {t}  ({w})" for t, w in sorted({(e.target, e.where) for e in self.edges[m]})
                      if t in members]
        return "\n".join(lines)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@pytest.fixture(scope="module")
def graph() -> Graph:
    return Graph(package_dirs())


def test_the_core_has_no_import_cycles(graph: Graph) -> None:
    cycles = graph.cycles()
    assert not cycles, "import cycles (every import counts, deferred and TYPE_CHECKING ones too):\n" + "\n".join(
        graph.describe(c) for c in cycles)


def test_no_private_name_is_imported_across_modules(graph: Graph) -> None:
    found = [f"{p.module} uses {p.target}.{p.name}  ({p.where})" for p in graph.private]
    assert not found, "private names used across modules (make the name public, or move it):\n" + "\n".join(found)


def test_the_graph_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The checker itself: a cycle closed only by a function-level import, one closed only by a
    TYPE_CHECKING import, a relative import, and a private name reached through a module alias
    are all found; a package importing its own submodule alone is no cycle, and a package whose
    ``__init__`` imports a module that imports one of the package's submodules is one."""
    pkg = tmp_path / "demo"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "pkg").mkdir()
    files = {
        "__init__.py": "from demo import a\n",
        "a.py": "import demo.b\n",
        "b.py": "def f():\n    from demo.a import thing\n",
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub.d import D\n",
        "sub/__init__.py": "",
        "pkg/__init__.py": "from demo import e\n",
        "pkg/leaf.py": "",
        "e.py": "from demo.pkg.leaf import *\n",
        "sub/d.py": "from ..c import _hidden\nfrom demo import a as alias\nx = alias._secret\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    g = Graph({"demo": pkg})
    assert sorted(g.cycles()) == [["demo.a", "demo.b"], ["demo.c", "demo.sub.d"], ["demo.e", "demo.pkg"]]
    assert sorted((p.module, p.target, p.name) for p in g.private) == [
        ("demo.sub.d", "demo.a", "_secret"), ("demo.sub.d", "demo.c", "_hidden")]
