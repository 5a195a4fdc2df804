"""The distributions people install and publish: the core, the six engine plugins, the
simulator, and a package `perflab plugin new` writes.

Each is built (sdist, then the wheel from it: ``python -m build --no-isolation``, offline, with
the test environment's setuptools) from a copy of its source, and checked as PyPI would:
``twine check --strict`` (its README renders), the Apache-2.0 LICENSE inside every wheel and
sdist, classifiers from PyPI's list, keywords, Project-URLs; the core's sdist ships no tests
(they need the whole repository's fixtures, plugins and examples).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LICENSE = (REPO / "LICENSE").read_bytes()
PLUGIN_DIRS = ("vllm", "vllm_ascend", "sglang", "trtllm", "mindie", "transformers", "sim")
CORE_FILES = ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in")
_BUILD_JUNK = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist", "*.pyc", ".pytest_cache")


def _project(pyproject: Path) -> dict:
    return tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]


def _homepage() -> str:
    return str(_project(REPO / "pyproject.toml")["urls"]["Homepage"])


def test_every_license_copy_is_the_root_license() -> None:
    """Each distribution's directory holds its own copy (setuptools takes license files from
    inside the project only); they are one text, Apache-2.0 as the metadata says."""
    assert b"Apache License" in LICENSE and b"Version 2.0, January 2004" in LICENSE
    copies = [REPO / "plugins" / d / "LICENSE" for d in PLUGIN_DIRS]
    copies.append(REPO / "core" / "perflab" / "scaffold" / "templates" / "LICENSE")
    for copy in copies:
        assert copy.read_bytes() == LICENSE, f"{copy} differs from the repository's LICENSE"


def test_perflab_links_are_the_urls_the_core_declares() -> None:
    """The plugins and the scaffold link perflab only under the home the core's metadata declares."""
    home = _homepage()
    declared = set(_project(REPO / "pyproject.toml")["urls"].values())
    assert all(url.startswith(home) for url in declared)
    texts = [REPO / "plugins" / d / name for d in PLUGIN_DIRS for name in ("README.md", "pyproject.toml")]
    texts += sorted((REPO / "core" / "perflab" / "scaffold" / "templates").glob("*.tmpl"))
    for path in texts:
        for url in re.findall(r"https?://[^\s)\"'>]*perflab[^\s)\"'>]*", path.read_text(encoding="utf-8")):
            url = url.rstrip(".,;:")  # the sentence's punctuation
            assert url.startswith(home + "/") or url == home, f"{path}: {url} is not under {home}"


def _build(src: Path, out: Path) -> tuple[Path, Path]:
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    name = _project(src / "pyproject.toml")["name"].replace("-", "_")
    (sdist,) = out.glob(f"{name}-*.tar.gz")
    (wheel,) = out.glob(f"{name}-*.whl")
    return sdist, wheel


def _sources(tmp: Path) -> list[Path]:
    """Copies of the seven distributions' sources (the work tree gets no build/ or egg-info churn),
    and the package the scaffold writes."""
    core = tmp / "src" / "perflab"
    shutil.copytree(REPO / "core", core / "core", ignore=_BUILD_JUNK)
    # the tests go along so that their absence from the sdist is the manifest's doing
    shutil.copytree(REPO / "tests", core / "tests", ignore=_BUILD_JUNK)
    for name in CORE_FILES:
        shutil.copy2(REPO / name, core / name)
    sources = [core]
    for d in PLUGIN_DIRS:
        sources.append(tmp / "src" / d)
        shutil.copytree(REPO / "plugins" / d, sources[-1], ignore=_BUILD_JUNK)
    made = subprocess.run([sys.executable, "-m", "perflab", "plugin", "new", "llama-cpp", "--executable",
                           "llama-server", "--dir", str(tmp / "src")], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    sources.append(tmp / "src" / "perflab-plugin-llama-cpp")
    return sources


@pytest.mark.slow
def test_every_distribution_builds_passes_twine_check_and_carries_the_license(tmp_path: Path) -> None:
    from trove_classifiers import classifiers as known_classifiers

    dist = tmp_path / "dist"
    built = {src.name: _build(src, dist) for src in _sources(tmp_path)}
    assert len(built) == 8

    check = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *sorted(map(str, dist.iterdir()))],
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count("PASSED") == 16, check.stdout

    for src_name, (sdist, wheel) in built.items():
        with zipfile.ZipFile(wheel) as whl:
            names = whl.namelist()
            (license_file,) = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/licenses/LICENSE", n)]
            assert whl.read(license_file) == LICENSE, wheel.name
            (metadata_file,) = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
            meta = Parser().parsestr(whl.read(metadata_file).decode())
        with tarfile.open(sdist) as tar:
            members = tar.getnames()
            top = members[0].split("/")[0]
            license_member = tar.extractfile(f"{top}/LICENSE")
            assert license_member is not None and license_member.read() == LICENSE, sdist.name
        assert meta["License-Expression"] == "Apache-2.0", wheel.name
        assert meta["Description-Content-Type"] == "text/markdown" and meta.get_payload().strip(), wheel.name
        classifiers = meta.get_all("Classifier") or []
        assert classifiers and set(classifiers) <= known_classifiers, (wheel.name, set(classifiers) - known_classifiers)
        assert meta["Keywords"], wheel.name
        # tests ship whole (with what they import beside them) or not at all
        shipped = {m.removeprefix(f"{top}/") for m in members if m.startswith(f"{top}/tests/") and m.endswith(".py")}
        src_tests = {p.relative_to(tmp_path / "src" / src_name).as_posix()
                     for p in (tmp_path / "src" / src_name / "tests").rglob("*.py")}
        assert not shipped or shipped == src_tests, (sdist.name, sorted(src_tests - shipped))
        if src_name == "perflab-plugin-llama-cpp":
            assert shipped == src_tests and "tests/stand_in_server.py" in shipped, sdist.name
            continue  # an author's own package: its home is theirs to declare
        urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
        assert urls.get("Homepage") == _homepage() and urls.get("Repository"), (wheel.name, urls)
        if src_name == "perflab":
            assert not shipped, "the core's sdist ships tests without the repository's fixtures"
        else:
            # an engine's README says which engine versions it was written against and links its notes
            assert "## Engine versions" in meta.get_payload() and urls.get("Documentation", "").endswith(".md")
