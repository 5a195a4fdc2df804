"""How much `pip install perflab` adds to a fresh environment, core alone and with its extras.

Builds the wheels of this repository once (the core, the five engine plugins and the
simulator; non-editable, as a user installs them), then for each configuration creates a fresh
venv in a temporary directory, installs it there with its dependencies from the package index
(pip's cache makes repeats fast), and prints how much site-packages grew: the sum of the file
sizes (MB = 10^6 bytes; byte-compiled files included, as pip writes them), and its five largest
distributions. The configurations:

* ``core``                the core alone (`pip install perflab`)
* ``core+plugins+sim``    plus the five engine plugins and the simulator: what `perflab demo` needs
* ``core[charts]``        the core with the charts extra (matplotlib)
* ``core[charts,aiohttp]`` what the core depended on before both were extras

In the ``core+plugins+sim`` environment it also imports the modules `perflab demo`, `run` and
`report` load, so a module-level import of something only an extra provides is caught, and
with ``--demo`` runs `perflab demo` there: its report is written, and says in one line what
the charts extra adds.
The target: the core alone adds at most 60 MB (exit status 1 if not).

    .venv/bin/python benchmarks/bench_install_size.py [--only core ...] [--demo] [--target 60]

Run it with the project's own environment (`requirements.txt` installs the `wheel` and
`setuptools` the wheels are built with, without build isolation).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ("vllm", "vllm_ascend", "sglang", "trtllm", "mindie", "sim")
MB = 1e6
#: what `perflab demo`, `run` and `report` import (the CLI, the study runner on the local backend,
#: the report writers, the simulator): none of it may need an extra at import time
DEMO_MODULES = ("perflab.cli", "perflab.cli.lab_cmd", "perflab.lab.demo", "perflab.lab.run.runner",
                "perflab.lab.run.executor", "perflab.lab.run.backends.local", "perflab.lab.report.publish",
                "perflab.lab.report.html", "perflab.lab.report.chart", "perflab.bench.runner", "perflab_sim")
#: what the demo must not need: none of it is installed in that environment
EXTRAS_ONLY = ("matplotlib", "numpy", "aiohttp", "ray", "playwright", "pytest")


def build_wheels(dest: Path) -> dict[str, Path]:
    """The core's and every plugin's wheel, built once: name -> wheel file."""
    sources = [ROOT, *(ROOT / "plugins" / p for p in PLUGINS)]
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                           str(dest), *map(str, sources)], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"building the wheels failed:\n{done.stdout}{done.stderr}")
    wheels = {w.name.split("-")[0]: w for w in dest.glob("*.whl")}
    if "perflab" not in wheels or len(wheels) != 1 + len(PLUGINS):
        sys.exit(f"expected {1 + len(PLUGINS)} wheels, built: {sorted(wheels)}")
    return wheels


def site_packages(env: Path) -> Path:
    found = list((env / "lib").glob("python3*/site-packages"))
    if len(found) != 1:
        sys.exit(f"no single site-packages under {env}")
    return found[0]


def sizes(directory: Path) -> dict[str, int]:
    """Bytes per top-level entry of ``directory`` (a package, a module, a dist-info)."""
    out: dict[str, int] = {}
    for entry in directory.iterdir():
        if entry.is_symlink():
            continue
        if entry.is_dir():
            total = sum(f.stat().st_size for f in entry.rglob("*") if f.is_file() and not f.is_symlink())
        else:
            total = entry.stat().st_size
        out[entry.name] = total
    return out


def by_distribution(added: dict[str, int], directory: Path) -> dict[str, int]:
    """Group the added top-level entries by the distribution that installed them (its RECORD)."""
    owner: dict[str, str] = {}
    for info in directory.glob("*.dist-info"):
        dist = info.name.split("-")[0]
        record = info / "RECORD"
        if not record.exists():
            continue
        for line in record.read_text(encoding="utf-8").splitlines():
            top = line.split(",")[0].split("/")[0]
            owner.setdefault(top, dist)
        owner[info.name] = dist
    out: dict[str, int] = {}
    for name, size in added.items():
        dist = owner.get(name, name)
        out[dist] = out.get(dist, 0) + size
    return out


def run_demo(env: Path, workdir: Path, clean: dict[str, str]) -> None:
    """`perflab demo` in ``env`` (no charts extra): the report is written and one line of it says
    what perflab[charts] adds."""
    out = workdir / "demo-study"
    done = subprocess.run([str(env / "bin" / "perflab"), "demo", "--out", str(out)], env=clean, cwd=workdir,
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        sys.exit(f"perflab demo failed without the extras:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    report = (out / "report.md").read_text(encoding="utf-8")
    said = [line for line in [*report.splitlines(), *done.stderr.splitlines()] if "perflab[charts]" in line]
    if not said:
        sys.exit("perflab demo wrote its report without saying what perflab[charts] adds")
    print(f"{'':24s} perflab demo wrote its report; it says: {said[0].strip()}", flush=True)


def measure(name: str, requirements: list[str], workdir: Path, check_imports: bool, demo: bool = False) -> float:
    env = workdir / name.replace("[", "-").replace("]", "").replace(",", "-").replace("+", "-")
    venv.EnvBuilder(with_pip=True, clear=True).create(env)
    python = env / "bin" / "python"
    sp = site_packages(env)
    before = sizes(sp)  # the venv's own pip and setuptools: not perflab's
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *requirements],
                          env=clean, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{name}: pip install failed:\n{done.stdout}{done.stderr}")
    after = sizes(sp)
    added = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    total = sum(added.values()) / MB
    top = sorted(by_distribution(added, sp).items(), key=lambda kv: -kv[1])[:5]
    print(f"{name:24s} {total:7.1f} MB   largest: " + ", ".join(f"{d} {s / MB:.1f}" for d, s in top), flush=True)
    if check_imports:
        code = (f"import importlib, importlib.util\n"
                f"present = [m for m in {EXTRAS_ONLY!r} if importlib.util.find_spec(m) is not None]\n"
                f"assert not present, f'installed without being asked for: {{present}}'\n"
                f"for m in {DEMO_MODULES!r}:\n    importlib.import_module(m)\n")
        done = subprocess.run([str(python), "-c", code], env=clean, capture_output=True, text=True, cwd=workdir)
        if done.returncode != 0:
            sys.exit(f"{name}: the demo's modules do not import without the extras:\n{done.stderr}")
        print(f"{'':24s} the demo's modules import; not installed: {', '.join(EXTRAS_ONLY)}", flush=True)
        if demo:
            run_demo(env, workdir, clean)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=["core", "core+plugins+sim", "core[charts]", "core[charts,aiohttp]"],
                        help="measure only these configurations")
    parser.add_argument("--demo", action="store_true",
                        help="also run `perflab demo` in the core+plugins+sim environment (a few minutes)")
    parser.add_argument("--target", type=float, default=60.0, help="the core alone adds at most this many MB (default 60)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="perflab-install-size-") as tmp:
        workdir = Path(tmp)
        wheels = build_wheels(workdir / "wheels")
        core = str(wheels["perflab"])
        plugins = [str(w) for n, w in wheels.items() if n != "perflab"]
        configurations = {
            "core": ([core], False),
            "core+plugins+sim": ([core, *plugins], True),
            "core[charts]": ([f"{core}[charts]"], False),
            "core[charts,aiohttp]": ([f"{core}[charts,aiohttp]"], False),
        }
        print(f"site-packages growth of a fresh venv (python {sys.version.split()[0]}), MB = 10^6 bytes", flush=True)
        results = {name: measure(name, reqs, workdir, check, args.demo) for name, (reqs, check) in configurations.items()
                   if not args.only or name in args.only}
    if "core" in results and results["core"] > args.target:
        sys.exit(f"the core alone adds {results['core']:.1f} MB, above the target of {args.target:g} MB")


if __name__ == "__main__":
    main()
