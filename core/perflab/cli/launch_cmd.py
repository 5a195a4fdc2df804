"""``perflab launch ENGINE``: start one engine, wait until it really serves, tear it down.

Without ``--check`` it serves until Ctrl-C (or until the engine dies); with ``--check`` it
sends one generation once ready, tears down and exits. Progress goes to stderr (with the
supervisor's log lines under ``perflab -v launch``), the result (human summary or ``--json``)
to stdout.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import click
import httpx

from perflab import redact
from perflab.cli.options import engine_version_option, hardware_option, json_option, pop_serve_config, serve_options
from perflab.contract.status import Status
from perflab.contract.versions import ORIGIN_WORDS, VersionChoice
from perflab.plugins import PluginManager

# Exit statuses (also in --help and docs/lifecycle.md).
EXIT_OK = 0
EXIT_ERROR = 1  # perflab error (bad plugin, unreadable hardware, ...)
EXIT_USAGE = 2
EXIT_UNSUPPORTED = 3
EXIT_CRASHED = 4
EXIT_TIMEOUT = 5
EXIT_CHECK_FAILED = 6  # ready, but the --check generation failed
EXIT_LEFTOVERS = 7  # served fine, but teardown left a process, a port or memory behind
EXIT_BY_STATE = {Status.UNSUPPORTED: EXIT_UNSUPPORTED, Status.CRASHED: EXIT_CRASHED, Status.TIMEOUT: EXIT_TIMEOUT}

EPILOG = """\b
Exit status:
  0    it became ready (with --check: the generation worked) and was torn down cleanly
  1    perflab error (a broken plugin, ...)
  2    usage error (bad option, unknown engine)
  3    unsupported: preflight refused the configuration (--force launches anyway)
  4    crashed: the engine exited (or its port was taken) before or while serving
  5    timeout: not serving within --startup-timeout
  6    --check: ready, but the check generation failed
  7    served, but teardown left something behind (process, port, accelerator memory)
  130  interrupted (Ctrl-C) before the engine was ready; 143 for SIGTERM
"""


def _default_workdir(engine: str) -> Path:
    base = Path("perflab-runs")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        path = base / (f"launch-{engine}-{stamp}" + ("" if n == 1 else f"-{n}"))
        try:
            path.mkdir(parents=True, exist_ok=False)
            return path
        except FileExistsError:
            continue
    raise click.ClickException(f"could not create a fresh run directory under {base}")


def _err(text: str) -> None:
    click.echo(text, err=True)


@click.command(epilog=EPILOG)
@click.argument("engine")
@serve_options
@hardware_option
@engine_version_option
@click.option("--check", is_flag=True, help="Once ready, send one generation, tear down and exit (no serving).")
@click.option("--force", is_flag=True, help="Launch even if preflight says the configuration cannot work.")
@json_option
@click.option("--startup-timeout", type=click.FloatRange(min=0, min_open=True), metavar="S",
              help="Seconds to become ready (default: the engine plugin's, 1800 s for most).")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path),
              help="Run directory for engine.log, launch.json and config files (default: ./perflab-runs/launch-ENGINE-TIME/).")
@click.option("--grace", type=click.FloatRange(min=0), default=10.0, show_default=True, metavar="S",
              help="Seconds between SIGTERM and SIGKILL at teardown.")
@click.pass_context
def launch(ctx: click.Context, engine: str, hardware: str, engine_version: str | None, check: bool, force: bool,
           as_json: bool, startup_timeout: float | None, workdir: Path | None, grace: float, **kwargs: Any) -> None:
    """Launch ENGINE, wait until it really serves (a generated token), tear it down on Ctrl-C.

    Readiness means every health probe answers and a one-token generation comes back; a
    crash is noticed the moment the process exits and named from its log. Teardown kills
    the whole process group and every process it spawned, then checks that the ports are
    free and accelerator memory is back to where it was.
    """
    from perflab.cli import get_pm
    from perflab.hardware import resolve

    config = pop_serve_config(kwargs)
    redact.register_config(config)  # before anything is printed or written
    pm = get_pm(ctx)
    rec = pm.engine(engine)  # unknown engine: one-line usage error before anything else
    snapshot, env = resolve(pm, hardware)
    for problem in snapshot.errors:
        _err(f"perflab: warning: hardware probe: {problem}")
    choice = rec.choose_version(env, engine_version)
    for note in choice.notes:
        _err(f"perflab: warning: {note}")
    _err(f"perflab: {engine} command built for {choice.label}")
    if workdir is None:
        workdir = _default_workdir(engine)
    redact.private_dir(workdir)  # 0700 when the launch has secrets
    _err(f"perflab: run directory {workdir}")
    code = anyio.run(_launch, pm, engine, config, snapshot, env, workdir, force, startup_timeout, grace, check, as_json,
                     choice)
    sys.exit(code)  # not ctx.exit(): perflab.cli.main runs click in non-standalone mode


async def _launch(pm: PluginManager, engine: str, config: Any, snapshot: Any, env: dict[str, str], workdir: Path, force: bool,
                  startup_timeout: float | None, grace: float, check: bool, as_json: bool, choice: VersionChoice) -> int:
    from perflab.supervisor import EngineInstance, signal_guard
    from perflab.supervisor_group import EngineGroup

    check_result: dict[str, Any] | None = None
    # --nodes N: one process per node rank on this machine, supervised as one engine
    kind = EngineGroup if config.node_count > 1 else EngineInstance
    inst = kind(pm, engine, config, hardware=snapshot, env=env, workdir=workdir, force=force,
                startup_timeout=startup_timeout, grace=grace, version=choice.version)
    async with signal_guard() as guard, inst:
        o = inst.outcome
        if o.state is Status.READY:
            if check:
                check_result = await _check(inst)
            else:
                if not as_json:
                    click.echo(f"{inst.base_url}  (model {inst.launch.served_model_name}; "  # type: ignore[union-attr]
                               f"log {o.log}) — Ctrl-C to stop")
                _err(f"perflab: {engine} ready in {o.ready_s:.1f} s at {inst.base_url}; Ctrl-C to stop")
                await inst.died.wait()
    o = inst.outcome
    result = o.to_json()
    result["engine_version"] = choice.to_json()
    if check_result is not None:
        result["check"] = check_result
    if as_json:
        click.echo(json.dumps(redact.redact_obj(result), indent=2))
    else:
        _print_summary(result, o)
    return _exit_code(o, check_result, guard.exit_code if guard.interrupted else 0, check)


async def _check(inst: Any) -> dict[str, Any]:
    from perflab.lifecycle.ports import connect_host
    from perflab.lifecycle.readiness_probe import generate_once

    spec = inst.launch
    path = (inst.readiness.generation_path if inst.readiness else None) or "/v1/completions"
    async with httpx.AsyncClient(trust_env=False, headers=redact.auth_headers(spec.argv, {**inst.env, **spec.env})) as client:
        gen = await generate_once(client, connect_host(spec.host), spec.port, path, spec.served_model_name,
                                  prompt="Say hello.", max_tokens=8)
    return {"ok": gen.ok, "path": path, "text": gen.text, "error": gen.error,
            "latency_s": None if gen.latency_s is None else round(gen.latency_s, 3)}


def _exit_code(o: Any, check_result: dict[str, Any] | None, signal_code: int, checking: bool) -> int:
    if o.state in EXIT_BY_STATE:
        return EXIT_BY_STATE[o.state]
    if o.ready_s is None:
        return signal_code or EXIT_CRASHED  # interrupted before it was ready
    if check_result is None and checking:
        return signal_code or EXIT_CHECK_FAILED  # interrupted between ready and the check
    if check_result is not None and not check_result["ok"]:
        return EXIT_CHECK_FAILED
    if o.leftovers:
        return EXIT_LEFTOVERS
    return EXIT_OK


def _print_summary(result: dict[str, Any], o: Any) -> None:
    click.echo(f"state:      {result['state']}" + (" (interrupted)" if result["interrupted"] else ""))
    version = result["engine_version"]
    if version["version"]:
        click.echo(f"version:    {version['version']} ({ORIGIN_WORDS[version['from']]})")
    if result["cause"]:
        click.echo(f"cause:      {result['cause']}")
    if result["reason"]:
        click.echo(f"reason:     {result['reason']}")
    if o.cause is not None and o.cause.hint:
        click.echo(f"hint:       {o.cause.hint}")
    for w in o.warnings:
        click.echo(f"warning:    {w.what}: {w.why}")
    if result["ready_s"] is not None:
        click.echo(f"ready in:   {result['ready_s']:.2f} s")
    check = result.get("check")
    if check is not None:
        click.echo(f"check:      {'ok' if check['ok'] else 'FAILED'} " + (repr(check['text']) if check["ok"] else check["error"]))
    if result["teardown_s"] is not None:
        click.echo(f"teardown:   {result['teardown_s']:.2f} s, " + ("clean" if not o.leftovers else f"{len(o.leftovers)} problem(s)"))
    for left in o.leftovers:
        click.echo(f"leftover:   {left}")
    if result["log"]:
        click.echo(f"log:        {result['log']}")
