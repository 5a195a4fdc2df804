#!/usr/bin/env python3
"""Move the core's modules into the layout that shows the architecture (issue 26, item 4).

    python tools/relayout.py [--dry-run] [--root REPO]

Re-runnable and idempotent: it moves (``git mv``) every module of :data:`MOVES` still at its
old place, then rewrites every reference to an old module path across the repository's text
files — imports (``import a.b``, ``from a.b import c``, ``from a import b``), dotted strings
(monkeypatch and mock targets, ``python -m`` lines, ``:mod:`` roles, entry points) and file
paths (``core/perflab/lab/runner.py``). A second run finds nothing at an old place and no old
path to rewrite: it changes nothing. It prints what it moved and each file it rewrote.

There are no re-export modules at the old paths (one declaration per concept): every importer,
plugins included, is rewritten. After it, reinstall the plugins (``pip install ./plugins/NAME``,
they are installed non-editable).

The layout (``perflab.`` omitted):

* ``contract/``: what a plugin programs against — hookspecs, the engine base, types, status,
  errors, crash causes.
* the plan stays ``lab/plan.py`` and the serving options ``lab/options.py``: a package
  ``lab/plan/`` whose ``__init__`` is the plan cannot hold the options, since the plan imports
  the accuracy gate, which imports the options (``Configuration``) — importing
  ``lab.plan.options`` would run the plan first, a cycle (tests/test_architecture.py counts a
  package's ``__init__`` as imported with its submodules). When the plan gains modules of its
  own (its schema), add ``"perflab.lab.plan": "perflab.lab.plan"`` and them here.
* ``lab/run/``: the runner above the executor, preflight, early stop and, below the runner,
  ``backends/local.py`` and ``backends/ray.py`` with the shipping of files between them.
* ``lab/store/``: the store (the package's ``__init__``), its integrity checks and study log.
  ``lab/measured.py`` stays beside ``lab/study.py``: a result's measured extras are the
  study's data, which the store imports (in ``lab/store/`` the study would import the store).
* ``lab/report/``: report.md/report.json (the package's ``__init__``), html, charts, compare,
  the writer of the report files, the stored-study reader they decide from, and the audit
  (``perflab.audit`` moves in whole): report and audit together.

A module that becomes its package's ``__init__`` keeps its dotted name, so the many importers
of the store and the report need no rewrite and no old path turns ambiguous (an old
``perflab.lab.store`` next to a new ``perflab.lab.store.store`` could not be rewritten twice
safely). Modules not listed stay where they are; a listed module that a later change removed
is skipped.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

#: old dotted module -> new dotted module; a package moves whole (its submodules follow).
MOVES: dict[str, str] = {
    # the contract plugins program against
    "perflab.hookspecs": "perflab.contract.hookspecs",
    "perflab.markers": "perflab.contract.markers",
    "perflab.plugin_base": "perflab.contract.plugin_base",
    "perflab.types": "perflab.contract.types",
    "perflab.status": "perflab.contract.status",
    "perflab.errors": "perflab.contract.errors",
    "perflab.crashes": "perflab.contract.crashes",
    # running a study: the runner above its backends
    "perflab.lab.runner": "perflab.lab.run.runner",
    "perflab.lab.executor": "perflab.lab.run.executor",
    "perflab.lab.preflight": "perflab.lab.run.preflight",
    "perflab.lab.earlystop": "perflab.lab.run.earlystop",
    "perflab.lab.backend": "perflab.lab.run.backends.local",
    "perflab.lab.raybackend": "perflab.lab.run.backends.ray",
    "perflab.lab.shipping": "perflab.lab.run.backends.shipping",
    # the store
    "perflab.lab.store": "perflab.lab.store",  # -> lab/store/__init__.py
    "perflab.lab.integrity": "perflab.lab.store.integrity",
    "perflab.lab.studylog": "perflab.lab.store.studylog",
    # the report, and the audit with it
    "perflab.lab.report": "perflab.lab.report",  # -> lab/report/__init__.py
    "perflab.lab.html": "perflab.lab.report.html",
    "perflab.lab.chart": "perflab.lab.report.chart",
    "perflab.lab.compare": "perflab.lab.report.compare",
    "perflab.lab.publish": "perflab.lab.report.publish",
    "perflab.lab.stored": "perflab.lab.report.stored",
    "perflab.audit": "perflab.lab.report.audit",
}

#: the new packages' docstrings (their __init__.py, created when missing)
PACKAGES: dict[str, str] = {
    "perflab.contract": "The contract a plugin programs against: hookspecs, the engine base, types, status, errors.",
    "perflab.lab.run": "Running a study: the runner, the executor of one configuration, and the backends below them.",
    "perflab.lab.run.backends": "Where a study's runs execute: here (local) or on a Ray cluster (ray).",
}

CORE = Path("core")
#: where references are rewritten (relative to the repository root)
SCAN = ("core", "plugins", "tests", "docs", "examples", "benchmarks", ".ci", "README.md", "pyproject.toml",
        "requirements.txt", "tools")
TEXT_SUFFIXES = {".py", ".pyi", ".md", ".rst", ".txt", ".toml", ".cfg", ".ini", ".yaml", ".yml", ".sh", ".html",
                 ".j2", ".tmpl", ".in", ""}
#: recorded data (studies, captured servers, seeds): what was, not code to rewrite
SKIP_PARTS = {".git", ".venv", "node_modules", "__pycache__", "fixtures", "build", "dist"}
SKIP_SUFFIX_DIRS = (".egg-info",)

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
DOTTED = re.compile(rf"(?<![\w.]){'perflab'}(?:\.{IDENT})+")
PATHLIKE = re.compile(rf"(?<![\w.-])perflab(?:/{IDENT})+(?:\.py|/)?")
FROM_IMPORT = re.compile(
    rf"^(?P<indent>[ \t]*)from[ \t]+(?P<mod>perflab(?:\.{IDENT})*)[ \t]+import[ \t]+"
    rf"(?P<names>\((?:[^()]*)\)|[^\n#]*?)(?P<tail>[ \t]*(?:#[^\n]*)?)$",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Layout:
    root: Path

    def file_of(self, dotted: str) -> tuple[Path, bool] | None:
        """The file of module ``dotted`` (and whether it is a package's __init__), if present."""
        base = self.root / CORE / Path(*dotted.split("."))
        if (base / "__init__.py").is_file():
            return base / "__init__.py", True
        if base.with_suffix(".py").is_file():
            return base.with_suffix(".py"), False
        return None

    def target_file(self, new: str, is_pkg: bool, old: str) -> Path:
        base = self.root / CORE / Path(*new.split("."))
        if is_pkg:
            return base  # a package moves whole
        return base / "__init__.py" if new == old else base.with_suffix(".py")


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True)


def move(layout: Layout, dry_run: bool) -> list[str]:
    """``git mv`` every listed module still at its old place; return what moved."""
    done: list[str] = []
    root = layout.root
    for old, new in MOVES.items():
        found = layout.file_of(old)
        if found is None:
            continue  # gone (removed by a later change)
        path, is_pkg = found
        if old == new and path.name == "__init__.py":
            continue  # already its package's __init__
        src = path.parent if is_pkg else path
        dst = layout.target_file(new, is_pkg, old)
        if dst.exists():
            raise SystemExit(f"relayout: cannot move {src.relative_to(root)}: {dst.relative_to(root)} exists")
        done.append(f"{src.relative_to(root)} -> {dst.relative_to(root)}")
        if dry_run:
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        git(root, "mv", str(src.relative_to(root)), str(dst.relative_to(root)))
        if is_pkg and src.is_dir():
            # git moved the tracked files; a __pycache__ left behind would make the old name an
            # importable namespace package that hides a missed rewrite
            leftovers = [q for q in src.rglob("*") if q.is_file() and "__pycache__" not in q.parts]
            if not leftovers:
                shutil.rmtree(src)
    for pkg, doc in PACKAGES.items():
        init = root / CORE / Path(*pkg.split(".")) / "__init__.py"
        if init.parent.is_dir() and not init.exists():
            done.append(f"new package {init.relative_to(root)}")
            if not dry_run:
                init.write_text(f'"""{doc}"""\n', encoding="utf-8")
                git(root, "add", str(init.relative_to(root)))
    return done


def rename_module(dotted: str) -> str:
    """``dotted`` (a module, or a name in one) at its new place; unchanged when not moved."""
    parts = dotted.split(".")
    for i in range(len(parts), 1, -1):
        head = ".".join(parts[:i])
        if head in MOVES and MOVES[head] != head:
            return ".".join([MOVES[head], *parts[i:]])
    return dotted


def rename_path(text: str) -> str:
    """A file path's ``perflab/...`` part at its new place (``perflab/lab/runner.py``)."""
    trail = "/" if text.endswith("/") else ""
    body = text.rstrip("/")
    py = body.endswith(".py")
    body = body.removesuffix(".py")
    parts = body.split("/")
    for i in range(len(parts), 1, -1):
        head = ".".join(parts[:i])
        if head not in MOVES:
            continue
        new = MOVES[head]
        rest = parts[i:]
        if new == head:
            if py and not rest:  # perflab/lab/plan.py -> perflab/lab/plan/__init__.py
                return "/".join(parts) + "/__init__.py" + trail
            return text
        return "/".join([*new.split("."), *rest]) + (".py" if py else "") + trail
    return text


def split_names(names: str) -> list[tuple[str, str | None]]:
    inner = names.strip()
    if inner.startswith("("):
        inner = inner[1:-1]
    out: list[tuple[str, str | None]] = []
    for item in re.split(r"[,\n]", re.sub(r"#[^\n]*", "", inner)):
        item = item.strip()
        if not item:
            continue
        name, _, alias = item.partition(" as ")
        out.append((name.strip(), alias.strip() or None))
    return out


def rewrite_from_import(m: re.Match[str]) -> str:
    """``from a import b`` where ``a.b`` is a moved module: import it from its new package."""
    mod, names = m["mod"], m["names"]
    items = split_names(names)
    moved = [(n, a) for n, a in items if f"{mod}.{n}" in MOVES and MOVES[f"{mod}.{n}"] != f"{mod}.{n}"]
    if not moved:
        return m[0]
    lines: list[str] = []
    rest = [(n, a) for n, a in items if (n, a) not in moved]
    if rest:
        lines.append(f"{m['indent']}from {mod} import " + ", ".join(n + (f" as {a}" if a else "") for n, a in rest))
    for n, a in moved:
        parent, _, leaf = MOVES[f"{mod}.{n}"].rpartition(".")
        local = a or n
        lines.append(f"{m['indent']}from {parent} import {leaf}" + (f" as {local}" if local != leaf else ""))
    lines[-1] += m["tail"]
    return "\n".join(lines)


def rewrite_text(text: str) -> str:
    text = FROM_IMPORT.sub(rewrite_from_import, text)
    text = DOTTED.sub(lambda m: rename_module(m[0]), text)
    return PATHLIKE.sub(lambda m: rename_path(m[0]), text)


#: the README's map of core/perflab (its "Layout" block), as it reads in the new layout
README_CORE = """\
core/perflab/        contract/ (hookspecs, plugin_base, types, status, errors, crashes: what a
                     plugin programs against), plugin manager, supervisor, hardware, observe,
                     bench client, accuracy, CLI, and the lab:
core/perflab/lab/    plan.py, options.py, study.py (the decisions); run/ (runner, executor,
                     preflight, early stop, and below them backends/local.py and ray.py);
                     store/ (the store, its integrity); report/ (report.md and .json, html,
                     charts, compare, and the audit)
"""
README_BLOCK = re.compile(r"^core/perflab/ .*?(?=^\S)", re.MULTILINE | re.DOTALL)


def rewrite_readme(root: Path, dry_run: bool) -> list[str]:
    """The README's Layout block names files by their place; say where they are now."""
    readme = root / "README.md"
    if not readme.is_file():
        return []
    text = readme.read_text(encoding="utf-8")
    m = README_BLOCK.search(text)
    if m is None or "contract/" in m[0]:
        return []
    if not dry_run:
        readme.write_text(text[: m.start()] + README_CORE + text[m.end():], encoding="utf-8")
    return ["README.md (its Layout block)"]


def text_files(root: Path) -> list[Path]:
    out: list[Path] = []
    me = Path(__file__).resolve()
    for entry in SCAN:
        base = root / entry
        candidates = [base] if base.is_file() else sorted(base.rglob("*")) if base.is_dir() else []
        for path in candidates:
            rel = path.relative_to(root)
            if (not path.is_file() or path.resolve() == me or SKIP_PARTS & set(rel.parts)
                    or any(p.endswith(SKIP_SUFFIX_DIRS) for p in rel.parts) or path.suffix not in TEXT_SUFFIXES):
                continue
            out.append(path)
    return out


def rewrite(root: Path, dry_run: bool) -> list[str]:
    changed: list[str] = []
    for path in text_files(root):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary or unreadable: not code
        new = rewrite_text(text)
        if new != text:
            changed.append(str(path.relative_to(root)))
            if not dry_run:
                path.write_text(new, encoding="utf-8")
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help="the repository")
    ap.add_argument("--dry-run", action="store_true", help="print what would move and change; touch nothing")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    if not (root / CORE / "perflab" / "__init__.py").is_file():
        print(f"relayout: {root} has no core/perflab package", file=sys.stderr)
        return 2
    moved = move(Layout(root), args.dry_run)
    for line in moved:
        print(f"moved    {line}")
    changed = rewrite(root, args.dry_run) + rewrite_readme(root, args.dry_run)
    for line in changed:
        print(f"rewrote  {line}")
    if not moved and not changed:
        print("relayout: the tree is already in the new layout; nothing to do")
        return 0
    sort_imports(root, [c for c in changed if c.endswith(".py")], args.dry_run)
    return 0


def sort_imports(root: Path, files: list[str], dry_run: bool) -> None:
    """A rewritten import may now sort elsewhere in its block: ruff's isort rule (with the
    project's own ruff settings) puts it back in order, in the rewritten files only."""
    if dry_run or not files:
        return
    if "[tool.ruff" not in (root / "pyproject.toml").read_text(encoding="utf-8"):
        # without the project's settings ruff would rewrap every block at its default width
        print("relayout: no [tool.ruff] in pyproject.toml: sort the rewritten imports by hand")
        return
    ruff = shutil.which("ruff")
    argv = [ruff] if ruff else [sys.executable, "-m", "ruff"]
    if subprocess.run([*argv, "--version"], capture_output=True).returncode != 0:
        print("relayout: ruff is not installed here: sort the rewritten imports with `ruff check --select I --fix`")
        return
    done = subprocess.run([*argv, "check", "--select", "I", "--fix", "--quiet", *files], cwd=root,
                          capture_output=True, text=True)
    print(f"sorted   the imports of the {len(files)} rewritten Python files (ruff check --select I --fix: exit "
          f"{done.returncode})")


if __name__ == "__main__":
    sys.exit(main())
