"""Build the wheels ``benchmarks/gpu_check.py`` needs on an NVIDIA machine without internet.

That machine has Python 3.12 (x86-64) with PyTorch, transformers and nvidia-ml-py
preinstalled, but no FastAPI or Uvicorn, and takes other packages as wheels in a folder of at
most 64 MiB. This script puts there:

* perflab's own wheels: the core and the transformers plugin (built from this checkout);
* everything else they and ``transformers serve`` (transformers' ``serving`` extra: FastAPI,
  Uvicorn, accelerate, openai, ...) need, for CPython 3.12 on manylinux x86-64, less what the
  machine already has: the dependencies of :data:`PREINSTALLED` (torch, transformers,
  nvidia-ml-py), followed through their metadata.

pip resolves the set (``pip install --dry-run --report``, which reads metadata only) and
downloads the selection (``pip download --no-deps --only-binary=:all:``); the folder's total is
checked against :data:`LIMIT_BYTES` and printed, with the one-line install for the machine::

    python benchmarks/gpu_wheels.py            # -> gpu-wheels/ (git-ignored)
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
LIMIT_BYTES = 64 * 1024 * 1024
#: perflab's distributions the check runs: the core (the repository's root) and the engine's plugin
PERFLAB_DISTS: tuple[str, ...] = (".", "plugins/transformers")
#: the machine's own packages, at its versions (issue 28): they and their dependencies are not carried
TRANSFORMERS_VERSION = "5.17.*"
TORCH_VERSION = "2.11.*"
PREINSTALLED: tuple[str, ...] = ("torch", "transformers", "nvidia-ml-py")
#: what `transformers serve` needs beyond transformers itself: its own extra
SERVING = "transformers[serving]"
#: torch, and what of the serving extra requires it: pip cannot resolve torch for the target
#: from here, so these are read without their dependencies (:func:`resolve`)
TORCH_BOUND: tuple[str, ...] = ("torch", "accelerate")
#: CPython 3.12 on x86-64 Linux. PyTorch 2.11's wheels are manylinux_2_28, so a machine that runs
#: it has glibc >= 2.28: wheels of either tag install there
PYTHON_VERSION = "3.12"
PLATFORMS: tuple[str, ...] = ("manylinux2014_x86_64", "manylinux_2_28_x86_64")
#: the environment markers are evaluated in: that machine's
TARGET_ENV: Mapping[str, str] = {
    "python_version": PYTHON_VERSION, "python_full_version": f"{PYTHON_VERSION}.0", "sys_platform": "linux",
    "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
    "implementation_name": "cpython", "platform_python_implementation": "CPython",
}


@dataclass(frozen=True)
class Pin:
    """One third-party wheel to download: ``name==version``."""

    name: str
    version: str

    def spec(self) -> str:
        return f"{self.name}=={self.version}"


def canonical(name: str) -> str:
    """A project name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements_of(item: Mapping[str, Any], extras: Sequence[str] = ()) -> list[Requirement]:
    """An install report item's dependencies that apply on the target, with ``extras``."""
    out = []
    for text in item.get("metadata", {}).get("requires_dist") or []:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({**TARGET_ENV, "extra": e}) for e in ("", *extras)):
            out.append(req)
    return out


def bare(req: Requirement) -> str:
    """A requirement without its marker (already evaluated for the target: an ``extra ==``
    marker would make pip skip it)."""
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    return f"{req.name}{extras}{req.specifier}"


def closure(items: Sequence[Mapping[str, Any]], roots: Iterable[str]) -> set[str]:
    """The canonical names of ``roots`` and everything they depend on (without extras), as far
    as the install report ``items`` (pip's ``--report`` "install" list) resolved them."""
    by_name = {canonical(i["metadata"]["name"]): i for i in items}
    seen: set[str] = set()
    todo = [canonical(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)  # a name pip did not resolve (torch's own dependencies) still counts, unexpanded
        if name in by_name:
            todo.extend(canonical(r.name) for r in requirements_of(by_name[name]))
    return seen


def select(items: Sequence[Mapping[str, Any]], preinstalled: Iterable[str] = PREINSTALLED,
           own: Iterable[str] = ()) -> list[Pin]:
    """The third-party wheels to carry: every resolved item but the preinstalled closure and
    perflab's own distributions (``own``, built here), sorted by name."""
    skip = closure(items, preinstalled) | {canonical(o) for o in own}
    return sorted((Pin(canonical(i["metadata"]["name"]), str(i["metadata"]["version"]))
                   for i in items if canonical(i["metadata"]["name"]) not in skip), key=lambda p: p.name)


def total_size(wheels: Iterable[Path]) -> int:
    return sum(p.stat().st_size for p in wheels)


def size_problem(total: int, limit: int = LIMIT_BYTES) -> str | None:
    """Why the folder cannot go to the machine (None: it fits)."""
    if total > limit:
        return f"{mib(total)} of wheels, over the {mib(limit)} the machine takes"
    return None


def mib(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"


def install_command(folder: Path | str) -> str:
    """The one line that installs the folder on the machine (no index: it has no internet)."""
    return f"python -m pip install --no-index --find-links {folder} {folder}/*.whl"


def target_args() -> list[str]:
    args = ["--only-binary=:all:", "--python-version", PYTHON_VERSION, "--implementation", "cp",
            "--abi", f"cp{PYTHON_VERSION.replace('.', '')}"]
    for p in PLATFORMS:
        args += ["--platform", p]
    return args


def pip(*args: str) -> list[str]:
    # --isolated: the target's set must not depend on this machine's pip configuration (its
    # find-links and constraints are for this machine's own Python)
    return [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", *args]


def build_own(out: Path, dists: Sequence[str] = PERFLAB_DISTS) -> list[Path]:
    """perflab's wheels, built from this checkout into ``out``."""
    missing = [d for d in dists if not (ROOT / d / "pyproject.toml").is_file()]
    if missing:
        raise SystemExit(f"gpu_wheels: no {', '.join(missing)} in {ROOT} (the transformers plugin is issue 28 item 1)")
    before = set(out.glob("*.whl"))
    subprocess.run(pip("wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir", str(out),
                       *(str(ROOT / d) for d in dists)), check=True)
    return sorted(set(out.glob("*.whl")) - before) or sorted(out.glob("*.whl"))


def dry_run(specs: Sequence[str], *, deps: bool) -> list[dict[str, Any]]:
    """The items pip would install for the machine (``--report``'s "install" list). Metadata only."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run(pip("install", "--quiet", "--dry-run", "--ignore-installed", "--report", str(report),
                           "--target", str(Path(tmp) / "target"), *target_args(),
                           *([] if deps else ["--no-deps"]), *specs), check=True)
        return list(json.loads(report.read_text())["install"])


def resolve(own: Sequence[Path]) -> list[dict[str, Any]]:
    """pip's resolution for the machine: perflab's wheels, transformers serve, and the
    preinstalled packages (so their dependencies are known and left out).

    torch is not resolved for the target (its CUDA libraries' wheels carry tags pip cannot
    match from here, and the machine has it): it and :data:`TORCH_BOUND` are read alone
    (``--no-deps``) and their other dependencies join the resolution."""
    alone = dry_run([f"torch=={TORCH_VERSION}", f"{SERVING}=={TRANSFORMERS_VERSION}", *TORCH_BOUND[1:]], deps=False)
    roots = [str(w) for w in own] + [f"transformers=={TRANSFORMERS_VERSION}", "nvidia-ml-py"]
    for item in alone:
        if canonical(item["metadata"]["name"]) == "torch":
            continue
        extras = ("serving",) if canonical(item["metadata"]["name"]) == "transformers" else ()
        roots += [bare(r) for r in requirements_of(item, extras) if canonical(r.name) not in TORCH_BOUND]
    resolved = dry_run(roots, deps=True)
    names = {canonical(i["metadata"]["name"]) for i in resolved}
    return resolved + [i for i in alone if canonical(i["metadata"]["name"]) not in names]


def download(pins: Sequence[Pin], out: Path) -> None:
    subprocess.run(pip("download", "--quiet", "--no-deps", "--dest", str(out), *target_args(),
                       *(p.spec() for p in pins)), check=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the wheels benchmarks/gpu_check.py needs on an NVIDIA machine.")
    parser.add_argument("--out", type=Path, default=ROOT / "gpu-wheels", help="wheel folder (default %(default)s)")
    parser.add_argument("--dist", action="append", dest="dists", metavar="PATH",
                        help=f"a perflab distribution to build, relative to the checkout (repeatable; default {' '.join(PERFLAB_DISTS)})")
    args = parser.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.whl"):  # a fresh set: no stale version rides along
        old.unlink()
    own = build_own(out, tuple(args.dists or PERFLAB_DISTS))
    items = resolve(own)
    pins = select(items, PREINSTALLED, [w.name.split("-")[0] for w in own])  # a wheel's name starts with its project
    download(pins, out)
    wheels = sorted(out.glob("*.whl"))
    total = total_size(wheels)
    for w in wheels:
        print(f"{mib(w.stat().st_size):>10}  {w.name}")
    print(f"{mib(total):>10}  in all ({len(wheels)} wheels; limit {mib(LIMIT_BYTES)})")
    problem = size_problem(total)
    if problem:
        print(f"gpu_wheels: {problem}", file=sys.stderr)
        return 1
    print(f"on the machine: {install_command(out.name)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
