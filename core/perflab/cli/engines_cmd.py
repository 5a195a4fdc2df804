"""``perflab engines``: which engine plugins are installed, and what perflab would run.

``engines list`` must start fast (it is what users run first, and CI runs it with
``--strict``): it reads plugin records and package metadata, never imports an engine, and
imports rich only when it prints a table.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from perflab import redact
from perflab.cli.options import engine_version_option, hardware_option, json_option, pop_serve_config, serve_options
from perflab.contract.errors import PerflabError
from perflab.plugins import FINE

if TYPE_CHECKING:
    from perflab.contract.types import GroupNode, HardwareSnapshot, LaunchSpec, NodeGroup, ServeConfig, Unsupported
    from perflab.contract.versions import VersionChoice
    from perflab.plugins import PluginManager

NO_ENGINE = "-"


class PreflightFailed(PerflabError):
    """``engines command --check`` found an error-severity objection."""

    exit_code = 2


# --------------------------------------------------------------------------- engines list


def _engine_install(
    pm: PluginManager, name: str, executable: str | None, env: Mapping[str, str], distributions: tuple[str, ...] = ()
) -> tuple[bool, str | None, str | None]:
    """(installed, version, problem) for one engine, from its plugin's version hook.

    An engine that names Python ``distributions`` is installed only when its version hook
    found one: an executable on PATH is not enough (``vllm`` on PATH is not vLLM-Ascend).
    """
    try:
        version = pm.engine(name).engine.version(env)
    except Exception as exc:  # a plugin bug must not hide the rest of the listing
        return False, None, f"version check failed: {type(exc).__name__}: {exc}"
    if version is not None:
        return True, str(version), None
    if distributions:
        return False, None, None
    # Not a Python distribution (MindIE is a C++ server): being on PATH is what counts.
    if executable and shutil.which(executable, path=env.get("PATH", os.defpath)):
        return True, None, None
    return False, None, None


def collect(pm: PluginManager, env: Mapping[str, str]) -> dict[str, Any]:
    """Everything ``engines list`` shows, as JSON-ready data."""
    engines: list[dict[str, Any]] = []
    for name in pm.engine_names():
        rec = pm.engines[name]
        info = rec.info
        plugin = next((r for r in pm.records if r.name == rec.plugin and r.status == "ok"), None)
        installed, version, problem = _engine_install(pm, name, info.executable, env, info.distributions)
        mapped = rec.engine.engine_versions
        engines.append(
            {
                "engine": name,
                "display_name": info.display_name,
                "plugin": rec.plugin,
                "distribution": rec.distribution,
                "plugin_version": rec.version,
                "accelerators": list(info.accelerators),
                "hooks": ["perflab_register_engines", *rec.engine.implemented()] if plugin else [],
                "status": "ok",
                "error": problem,
                "installed": installed,
                "engine_version": version,
                # the versions the plugin builds commands for (None: it declares none)
                "mapped_versions": {"oldest": mapped.oldest, "newest": mapped.newest} if mapped else None,
                "executable": info.executable,
                "default_port": info.default_port,
            }
        )
    plugins = [
        {
            "name": r.name,
            "module": r.module,
            "distribution": r.distribution,
            "version": r.version,
            "status": r.status,
            "error": r.error,
            "hooks": list(r.hooks),
            "engines": list(r.engines),
            "builtin": r.builtin,
            "warnings": list(getattr(r, "warnings", ())),
        }
        for r in pm.records
    ]
    return {"engines": engines, "plugins": plugins, "errors": list(pm.errors)}


# The lifecycle stage each hook or engine method serves (design.md's table), short enough for a table cell.
_STAGES = {
    "perflab_register_engines": "register",
    "perflab_probe_hardware": "hardware",
    "version": "version",
    "check_support": "preflight",
    "build_launch": "launch",
    "build_group_launch": "multi-node",
    "readiness": "readiness",
    "classify_crash": "crashes",
    "teardown": "teardown",
    "describe_file": "script",
    "cache_reset": "cache",
    "metrics": "metrics",
    "perflab_register_bench_backends": "bench",
}


def _short_hooks(hooks: list[str]) -> str:
    order = list(_STAGES)
    known = sorted((h for h in hooks if h in _STAGES), key=order.index)
    return ", ".join([_STAGES[h] for h in known] + [h for h in hooks if h not in _STAGES]) or "-"


def _plugin_label(name: str, version: str | None) -> str:
    return f"{name} {version}" if version else name


#: the plugin column's width at most, when the table must fit a narrow terminal (longer names fold)
PLUGIN_WIDTH = 30


def render_list(data: dict[str, Any]) -> None:
    from rich import box
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table
    from rich.text import Text

    console = Console()
    table = Table(title="perflab engine plugins", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("engine", no_wrap=True)
    table.add_column("plugin · hooks", overflow="fold")
    table.add_column("runs on")
    table.add_column("status", overflow="fold")
    table.add_column("installed")

    def plugin_cell(name: str, version: str | None, hooks: list[str]) -> Text:
        cell = Text(_plugin_label(name, version))
        cell.append("\n" + _short_hooks(hooks), style="dim")
        return cell

    for e in data["engines"]:
        if e["installed"]:
            installed = Text(e["engine_version"] or "yes (version unknown)", style="green")
        else:
            installed = Text("not installed", style="dim")
        status = Text("ok", style="green") if not e["error"] else Text(f"ok ({e['error']})", style="yellow")
        table.add_row(
            e["engine"],
            plugin_cell(e["distribution"] or e["plugin"], e["plugin_version"], e["hooks"]),
            ", ".join(e["accelerators"]) or "-",
            status,
            installed,
        )
    for p in data["plugins"]:
        if p["builtin"] and p["status"] == "ok":
            continue  # the built-in hardware probes are part of the core
        if p["status"] == "ok" and p["engines"]:
            continue  # shown as engine rows
        if p["status"] == "ok":
            status = Text("ok (no engine)", style="green")
        elif p["status"] == "disabled":  # not loaded, so which engines it registers is unknown
            status = Text("disabled (PERFLAB_DISABLE_PLUGINS)", style="dim")
        else:
            status = Text(f"{p['status']}: {p['error']}", style="red")
        table.add_row(NO_ENGINE, plugin_cell(p["distribution"] or p["module"], p["version"], p["hooks"]), "-", status, "")
    if Measurement.get(console, console.options.update_width(10_000), table).maximum > console.width:
        # too wide for the terminal (80 columns): left to rich, the plugin column would shrink until it
        # cut its package names ("perflab-plugin-vllm-ascend"); as wide as the longest one instead, the
        # version and the hooks wrapped below it, and the other columns wrap their words
        names = [e["distribution"] or e["plugin"] for e in data["engines"]] + [
            p["distribution"] or p["module"] for p in data["plugins"]]
        table.columns[1].width = min(max(map(len, names), default=PLUGIN_WIDTH), PLUGIN_WIDTH)
    console.print(table)
    broken = [p for p in data["plugins"] if p["status"] not in FINE]
    for p in broken:
        console.print(
            Text(f"plugin {p['distribution'] or p['name']} ({p['module']}): {p['status']}: {p['error']}", style="red"),
            soft_wrap=True,
        )
    for err in data["errors"]:
        console.print(Text(f"error: {err}", style="red"), soft_wrap=True)
    for p in data["plugins"]:
        for w in p["warnings"]:
            console.print(Text(f"warning: plugin {p['distribution'] or p['name']}: {w}", style="yellow"), soft_wrap=True)
    if broken or data["errors"]:
        console.print("Run with `perflab --strict engines list` to make these problems fatal.", style="dim")
    if not data["engines"]:
        console.print("No engine plugin is installed. Install one, e.g. `pip install perflab-plugin-vllm`.")


@click.group("engines")
def engines() -> None:
    """List engine plugins and show the command perflab would run."""


@engines.command("list")
@json_option
@click.pass_context
def list_engines(ctx: click.Context, as_json: bool) -> None:
    """One row per engine: its plugin, accelerators, hooks, status, and whether the engine
    itself is installed here. Plugin problems are shown; `perflab --strict engines list`
    exits non-zero on any."""
    from perflab.cli import get_pm

    data = collect(get_pm(ctx), os.environ)
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        render_list(data)


# --------------------------------------------------------------------------- engines command


def dry_run_workdir(engine: str) -> Path:
    """Where a real launch would put its files; the dry run writes nothing there."""
    import tempfile

    return Path(tempfile.gettempdir()) / f"perflab-dry-run-{engine}"


def _file_path(workdir: Path, path: str) -> str:
    p = Path(path)
    return str(p if p.is_absolute() else workdir / p)


def launch_json(launch: LaunchSpec, workdir: Path) -> dict[str, Any]:
    return {
        "engine": launch.engine,
        "argv": redact.redact_argv(launch.argv),
        "env": redact.redact_env(launch.env),
        "files": [{"path": _file_path(workdir, f.path), "content": redact.scrub(f.content)} for f in launch.files],
        "host": launch.host,
        "port": launch.port,
    }


def _preflight_json(problems: list[Unsupported]) -> list[dict[str, str]]:
    return [{"what": u.what, "why": u.why, "source": u.source, "severity": u.severity} for u in problems]


def describe_devices(hardware: HardwareSnapshot) -> str:
    """``2 accelerator(s)``, or for the host CPU ``CPU AMD EPYC: 2 cores in 1 NUMA node(s)``."""
    accs = hardware.accelerators
    if not accs:
        return "no accelerator found"
    if all(a.kind == "cpu" for a in accs):
        cores = sum(a.cores or 0 for a in accs)
        return f"CPU {accs[0].name}: {cores} cores in {len(accs)} NUMA node(s)"
    return f"{len(accs)} accelerator(s)"


def render_command(
    engine: str,
    launch: LaunchSpec,
    workdir: Path,
    problems: list[Unsupported],
    version: VersionChoice,
    hardware: HardwareSnapshot,
    joins: str | None = None,
) -> None:
    """``joins``: for a node rank that serves no API, where it joins its group (said instead
    of what it serves)."""
    import shlex

    echo = click.echo
    where = describe_devices(hardware)
    if hardware.simulated:
        where += f", simulated {hardware.name}"
    echo(f"# {engine} {version.label if version.version else '(not installed here)'} — {where}")
    if launch.env:
        echo("# environment:")
        for k, v in redact.redact_env(launch.env).items():
            echo(f"{k}={shlex.quote(v)}")
    if launch.files:
        echo("# files written before start:")
        for f in launch.files:
            echo(f"# --- {_file_path(workdir, f.path)}")
            echo(redact.scrub(f.content).rstrip("\n"))
            echo("# ---")
    if launch.cwd:
        echo(f"# working directory: {launch.cwd}")
    echo("# command:")
    echo(shlex.join(redact.redact_argv(launch.argv)))
    if joins is None:
        echo(f"# serves {launch.served_model_name!r} on {launch.base_url}")
    else:
        echo(f"# serves no API: {joins}")
    for w in launch.warnings:
        click.secho(f"warning: {w}", fg="yellow", err=True)
    for u in problems:
        src = f" [{u.source}]" if u.source else ""
        color = "red" if u.severity == "error" else "yellow"
        click.secho(f"{u.severity}: {u.what}: {u.why}{src}", fg=color, err=True)


def _group_launches(pm: PluginManager, engine: str, config: ServeConfig, snapshot: HardwareSnapshot, workdir: Path,
                    version: str | None) -> tuple[NodeGroup, list[LaunchSpec]]:
    """The group and the launches of a ``nodes`` > 1 configuration (one per node, in rank order) as
    ``perflab launch``/``run`` would start them on this machine (rank addresses 127.0.0.1, a free
    rendezvous port; perflab.supervisor_group)."""
    from perflab.contract.types import NodeGroup
    from perflab.lifecycle.ports import pick_free_port
    from perflab.supervisor_group import local_nodes

    rec = pm.engine(engine)
    config = config if config.port is not None else config.replace(port=rec.info.default_port)
    nodes = local_nodes(config, snapshot, rec.info.accelerators)
    group = NodeGroup(nodes, pick_free_port(nodes[0].address))
    return group, rec.build_group_launch(config, snapshot, group, workdir, version)


def _rendezvous(group: NodeGroup) -> str:
    return f"{group.serving.address}:{group.rendezvous_port}"


def _joins(group: NodeGroup, node: GroupNode) -> str | None:
    """Where ``node`` joins ``group`` when it is not the node that serves the API (None: it serves)."""
    if node == group.serving:
        return None
    return f"joins node rank {group.serving.rank}'s rendezvous at {_rendezvous(group)}"


@engines.command("command")
@click.argument("engine")
@serve_options
@hardware_option
@engine_version_option
@json_option
@click.option("--check", is_flag=True, help="Exit with status 2 if the preflight finds an error.")
@click.pass_context
def engine_command(ctx: click.Context, engine: str, hardware: str, engine_version: str | None, as_json: bool,
                   check: bool, **kwargs: Any) -> None:
    """Print what perflab would run for ENGINE: argv, environment, files (MindIE's
    config.json), host and port, with the preflight's objections. Nothing is started or
    written. The command is built for --engine-version, else the version installed here,
    else the newest the plugin maps; the first line says which."""
    from perflab.cli import get_pm
    from perflab.hardware import resolve

    pm = get_pm(ctx)
    rec = pm.engine(engine)  # unknown engine: one-line error before probing anything
    config = pop_serve_config(kwargs)
    snapshot, env = resolve(pm, hardware)
    choice = rec.choose_version(env, engine_version)
    if choice.warning:  # not the installed-version mismatch: printing a command for another machine is the point
        click.secho(f"warning: {choice.warning}", fg="yellow", err=True)
    version = choice.version
    problems = rec.check_support(config, snapshot, version)
    workdir = dry_run_workdir(engine)
    group, ranks = _group_launches(pm, engine, config, snapshot, workdir, version) if config.node_count > 1 else (None, [])
    launch = ranks[group.serving.rank] if group is not None else rec.build_launch(config, snapshot, workdir, version)
    redact.register_config(config)  # printed as ***
    for spec in ranks or [launch]:
        redact.register_launch(spec)
    if as_json:
        out = launch_json(launch, workdir)
        if group is not None:  # every node rank's launch (the serving rank's is also the top level)
            out["rendezvous"] = _rendezvous(group)
            out["nodes"] = [{"rank": node.rank, "address": node.address, "serves": _joins(group, node) is None,
                             **launch_json(spec, workdir)} for node, spec in zip(group.nodes, ranks, strict=True)]
        out["engine_version"] = choice.to_json()
        out["preflight"] = _preflight_json(problems)
        click.echo(json.dumps(redact.redact_obj(out), indent=2))
        for w in launch.warnings:  # stdout stays pure JSON
            click.secho(f"warning: {w}", fg="yellow", err=True)
    else:
        for err in snapshot.errors:
            click.secho(f"warning: hardware probe failed: {err}", fg="yellow", err=True)
        if group is None:
            render_command(engine, launch, workdir, problems, choice, snapshot)
        else:
            for node, spec in zip(group.nodes, ranks, strict=True):
                joins = _joins(group, node)
                click.echo(f"# ===== node rank {node.rank} of {group.size}" + (" (serves the API)" if joins is None else ""))
                render_command(engine, spec, workdir, problems if spec is ranks[-1] else [], choice, snapshot, joins)
    errors = [u for u in problems if u.severity == "error"]
    if check and errors:
        raise PreflightFailed(
            f"preflight: {engine} cannot serve this configuration ({'; '.join(f'{u.what}: {u.why}' for u in errors)})"
        )
