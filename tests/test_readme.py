"""The README's "Use" commands that need no study, no server and no long wait run exactly as
written, so a new user can copy-paste them.

The README's set-up activates the virtual environment, so its "Use" lines call a bare
``perflab``: each command here runs through bash with this interpreter's ``bin`` first on
``PATH`` (what ``. .venv/bin/activate`` does), unchanged. Commands that need a study made by
an earlier line (``run``, ``report``, ``compare``, ``kill``), an endpoint (``bench``, ``eval``)
or minutes (``realengine``) are left to the tests of those commands.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BIN = Path(sys.executable).parent

#: The commands a new user tries first; the README must keep at least one of each.
QUICK_KINDS = ("engines list", "engines command", "hardware", "launch --check", "audit", "plugin new")


@dataclass(frozen=True)
class UseCommand:
    line: str  # as written, continuation lines joined
    argv: tuple[str, ...]  # shlex's reading of it, comment dropped
    expected_exit: int  # 0, or what a trailing "# exit N" comment says

    @property
    def kind(self) -> str | None:
        """Which quick command this is, or None for one that needs a study, a server or minutes."""
        if self.argv[:1] != ("perflab",):
            return None
        sub = self.argv[1:3]
        if sub in (("engines", "list"), ("engines", "command"), ("plugin", "new")):
            return " ".join(sub)
        if sub[:1] == ("hardware",):
            return "hardware"
        if sub[:1] == ("launch",) and "--check" in self.argv:
            return "launch --check"
        # an audit of a study is run after that study's `perflab run`; one of files in the repository now
        if sub[:1] == ("audit",) and not any(a.startswith("studies/") for a in self.operands):
            return "audit"
        return None

    @property
    def operands(self) -> list[str]:
        return [a for a in self.argv[2:] if not a.startswith("-")]


def use_commands() -> list[UseCommand]:
    text = README.read_text(encoding="utf-8")
    section = re.search(r"^## Use\n(.*?)^## ", text, re.S | re.M)
    assert section, "README.md has no '## Use' section"
    blocks = re.findall(r"^```bash\n(.*?)^```", section.group(1), re.S | re.M)
    assert blocks, "README.md's '## Use' section has no bash block"
    joined = re.sub(r"\\\n\s*", "", "\n".join(blocks))
    commands = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        argv = shlex.split(line, comments=True)
        # leading VAR=value assignments are environment, not the program
        while argv and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[0]):
            argv.pop(0)
        exit_note = re.search(r"#\s*exit (\d+)", line)
        commands.append(UseCommand(line, tuple(argv), int(exit_note.group(1)) if exit_note else 0))
    return commands


QUICK = [c for c in use_commands() if c.kind]


def test_the_readme_keeps_a_command_of_each_first_kind() -> None:
    assert sorted({c.kind for c in QUICK if c.kind}) == sorted(QUICK_KINDS), [c.line for c in QUICK]


def test_readme_paths_stay_inside_the_repository() -> None:
    """Every file a "Use" line reads is in the clone (or made by an earlier line, as studies/ is)."""
    for cmd in use_commands():
        for arg in cmd.operands:
            if "/" in arg and not arg.startswith(("http://", "https://", "sim:")) and re.fullmatch(r"[\w./*-]+", arg):
                assert (REPO / arg).resolve().is_relative_to(REPO), f"{cmd.line!r}: {arg} is outside the repository"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFLAB_")}
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(BIN.parent)
    # a terminal's width, so the tables' names print unbroken (captured output would get rich's 80)
    env["COLUMNS"] = "120"
    return env


def _shell_line(cmd: UseCommand) -> str:
    if shutil.which("perflab", path=str(BIN)):
        return cmd.line
    # an interpreter outside a virtual environment (no perflab script beside it): the module
    return re.sub(r"^perflab\b", f"{shlex.quote(sys.executable)} -m perflab", cmd.line)


@pytest.mark.parametrize("cmd", QUICK, ids=[c.line[:70] for c in QUICK])
def test_readme_use_command_works_as_written(cmd: UseCommand, tmp_path: Path) -> None:
    # an audit reads files of the repository by their relative paths, as from the clone's root;
    # the others write (run directories, a plugin package) into a scratch directory
    cwd = REPO if cmd.kind == "audit" else tmp_path
    out = subprocess.run(["bash", "-c", _shell_line(cmd)], cwd=cwd, env=_env(), capture_output=True,
                         text=True, timeout=300)
    said = f"{cmd.line}\nexit {out.returncode}\nstdout:\n{out.stdout[-3000:]}\nstderr:\n{out.stderr[-3000:]}"
    assert out.returncode == cmd.expected_exit, said
    as_json = json.loads(out.stdout) if "--json" in cmd.argv else None
    if cmd.kind == "engines list":
        for engine in ("vllm", "vllm-ascend", "sglang", "trtllm", "mindie"):
            assert engine in out.stdout, said
    elif cmd.kind == "hardware":
        assert "Accelerators" in out.stdout, said
        if "--hardware" in cmd.argv:
            machine = cmd.argv[cmd.argv.index("--hardware") + 1].removeprefix("sim:")
            assert f"simulated: {machine}" in out.stdout, said
    elif cmd.kind == "engines command":
        engine, model = cmd.argv[3], cmd.argv[cmd.argv.index("--model") + 1]
        if as_json is not None:
            assert as_json["engine"] == engine and as_json["argv"], said
        else:
            assert f"# {engine}" in out.stdout and model in out.stdout, said
    elif cmd.kind == "launch --check":
        assert as_json is not None, said
        assert as_json["state"] == "done" and as_json["engine"] == cmd.argv[2], said
    elif cmd.kind == "audit":
        if as_json is not None:
            assert as_json["clean"] is (cmd.expected_exit == 0), said
        else:
            assert ("inconsistenc" in out.stdout) is (cmd.expected_exit != 0), said
        # a count the README's comment gives is the count found
        count = re.search(r"#.*?(\d+) findings", cmd.line)
        if count:
            found = len(as_json["findings"]) if as_json is not None else int(out.stdout.split()[0])
            assert found == int(count.group(1)), said
    elif cmd.kind == "plugin new":
        package = tmp_path / f"perflab-plugin-{cmd.argv[3]}"
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            assert (package / name).is_file(), said


def test_the_setup_puts_perflab_on_path_for_the_use_lines() -> None:
    """Exactly two set-up commands (the demo, the tests); the demo's activates the environment,
    since the "Use" lines call a bare ``perflab``."""
    text = README.read_text(encoding="utf-8")
    section = re.search(r"^## Set up\n(.*?)^## ", text, re.S | re.M)
    assert section, "README.md has no '## Set up' section"
    commands = [c.strip() for c in re.findall(r"^```bash\n(.*?)^```", section.group(1), re.S | re.M)]
    assert len(commands) == 2, commands
    demo, tests = commands
    assert demo.endswith("perflab demo") and "python -m pytest" in tests, commands
    steps = [s.strip() for s in demo.split("&&")]
    assert ". .venv/bin/activate" in steps or "source .venv/bin/activate" in steps, demo
    assert any(c.argv[:1] == ("perflab",) for c in use_commands())
