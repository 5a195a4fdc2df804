"""``perflab plugin new``: write a ready-to-install engine plugin package.

The generated package serves an OpenAI-compatible server binary, implements every engine
hook, and ships tests that run perflab's conformance suite (including a full
launch/ready/teardown cycle against a bundled stand-in server), so it passes its own tests
out of the box. Templates are plain text with ``__NAME__``-style placeholders.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from perflab import __version__
from perflab.contract.errors import UsageError

TEMPLATE_PACKAGE = "perflab.scaffold.templates"
# template file -> path in the generated package (module dir renamed per plugin)
FILES = {
    "pyproject.toml.tmpl": "pyproject.toml",
    "README.md.tmpl": "README.md",
    "LICENSE": "LICENSE",
    "MANIFEST.in.tmpl": "MANIFEST.in",
    "plugin.py.tmpl": "{module}/__init__.py",
    "test_conformance.py.tmpl": "tests/test_conformance.py",
    "stand_in_server.py.tmpl": "tests/stand_in_server.py",
}


@dataclass(frozen=True)
class PluginNames:
    engine: str  # demo-engine
    distribution: str  # perflab-plugin-demo-engine
    module: str  # perflab_demo_engine
    executable: str  # demo-engine
    display_name: str  # Demo Engine


def names_for(name: str, executable: str | None = None) -> PluginNames:
    if not re.fullmatch(r"[a-z][a-z0-9-]*[a-z0-9]|[a-z]", name):
        raise UsageError(
            f"plugin name {name!r}: expected lowercase letters, digits and dashes, starting with a letter (e.g. llama-cpp)"
        )
    module = "perflab_" + name.replace("-", "_")
    if keyword.iskeyword(module):
        raise UsageError(f"plugin name {name!r} gives an invalid module name {module!r}")
    exe = executable or name
    if not re.fullmatch(r"[A-Za-z0-9._+-]+", exe):
        raise UsageError(f"--executable {exe!r}: expected a program name without path or spaces")
    display = " ".join(part.capitalize() for part in name.split("-"))
    return PluginNames(name, f"perflab-plugin-{name}", module, exe, display)


def check_free(names: PluginNames, engines: Mapping[str, str]) -> None:
    """UsageError (one line) when the new plugin's engine name is taken: by an installed engine
    (``engines``: engine name -> the distribution that provides it), by one of perflab's own
    engines, or when a distribution of the package's name is already installed: of two plugins
    registering one engine name, perflab uses only one."""
    from importlib import metadata

    from perflab.hardware.engine_versions import ALIASES, KNOWN_ENGINES

    taken = {**{e: "perflab's own engine" for e in KNOWN_ENGINES},
             **{alias: f"perflab's own engine {engine!r}" for alias, engine in ALIASES.items()},
             **{e: f"the engine of {dist}" for e, dist in engines.items()}}
    who = taken.get(names.engine) or taken.get(names.engine.replace("-", "_"))
    if who is None:
        try:
            metadata.distribution(names.distribution)
        except metadata.PackageNotFoundError:
            return
        who = f"the engine of the installed {names.distribution}"
    raise UsageError(f"plugin name {names.engine!r} is taken: it is {who}; choose another (e.g. {names.engine}-custom)")


#: What the generated plugin maps itself (its FLAGS and the fixed entries of the template);
#: every other serving option starts as a refusal the author replaces with a Maps.
TEMPLATE_MAPS = frozenset({"model", "host", "port", "devices", "extra_args", "extra_env", "options",
                           "served_model_name", "tp", "max_model_len", "max_num_seqs"})


def refused_options() -> str:
    """The template's ``serve_options`` lines for the options it does not map, one per
    ServeConfig field (:func:`perflab.contract.types.serve_options`), so a new plugin starts complete."""
    from perflab.contract.types import serve_options

    return "\n".join(f'        "{o.name}": Refuses(NO_FLAG, DOCS),' for o in serve_options() if o.name not in TEMPLATE_MAPS)


def render(text: str, names: PluginNames) -> str:
    major_minor = ".".join(__version__.split(".")[:2])
    nxt = major_minor.split(".")
    upper = f"{nxt[0]}.{int(nxt[1]) + 1}"
    return (
        text.replace("__ENGINE__", names.engine)
        .replace("__DISTRIBUTION__", names.distribution)
        .replace("__MODULE__", names.module)
        .replace("__EXECUTABLE__", names.executable)
        .replace("__DISPLAY__", names.display_name)
        .replace("__PERFLAB_SPEC__", f"perflab>={major_minor},<{upper}")
        .replace("__REFUSED_OPTIONS__", refused_options())
    )


def create(name: str, directory: Path, executable: str | None = None, force: bool = False) -> Path:
    """Write the package into ``directory/perflab-plugin-NAME`` and return that path."""
    names = names_for(name, executable)
    root = directory / names.distribution
    if root.exists() and any(root.iterdir()) and not force:
        raise UsageError(f"{root} already exists and is not empty (use --force to overwrite)")
    templates = resources.files(TEMPLATE_PACKAGE)
    for tmpl, dest in FILES.items():
        target = root / dest.format(module=names.module)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(render(templates.joinpath(tmpl).read_text(encoding="utf-8"), names), encoding="utf-8")
    return root
