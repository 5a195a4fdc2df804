"""``perflab run``, ``perflab report`` and ``perflab demo``: the lab's commands."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import click

from perflab import redact
from perflab.cli import get_pm


def _run(ctx: click.Context, plan: Any, out: Path | None, hardware: str | None, retry_failed: bool,
         as_json: bool, live: bool | None, early_stop: bool = True, parallel: int | str = 1,
         executor: str = "local", ray_address: str | None = None, replace: bool = False) -> None:
    import dataclasses

    import anyio

    from perflab.contract.errors import PerflabError
    from perflab.lab import exits
    from perflab.lab.progress import StudyProgress
    from perflab.lab.run.runner import default_out, print_summary, run_study

    if hardware:  # --hardware: the plan's hardware, from here on (the study stores it as hardware_spec)
        plan = dataclasses.replace(plan, hardware=hardware)
    if not early_stop:  # --no-early-stop: every measurement runs to its end (plan key early_stop: false)
        plan = dataclasses.replace(plan, decision=dataclasses.replace(plan.decision, early_stop=False))
    out = out or default_out(plan)
    header = f"{plan.name} · {plan.display_model} · {plan.hardware}"
    progress = StudyProgress(header, live=False if as_json else live)
    try:
        summary = anyio.run(
            lambda: run_study(get_pm(ctx), plan, out, retry_failed=retry_failed, progress=progress, argv=sys.argv[1:],
                              parallel=parallel, executor=executor, ray_address=ray_address, replace=replace)
        )
    except PerflabError as exc:
        if as_json:  # --json says how it ended too; the error line follows on stderr (perflab.cli.main)
            click.echo(json.dumps(redact.redact_obj({"study_dir": str(out), "error": str(exc),
                                                     **exits.as_json(exc.exit_code)}), indent=2))
        raise
    if as_json:
        o = summary.outcome
        click.echo(json.dumps(redact.redact_obj({  # secrets as *** (perflab.redact)
            "study_dir": str(summary.study_dir),
            **exits.as_json(summary.exit_code),
            "interrupted": summary.interrupted,
            "runs_launched": summary.measured,
            "measurements_reused": summary.reused,
            "complete": o.complete if o else False,
            "optimized": o.optimized.label if o and o.optimized else None,
            "report": {k: str(v) for k, v in summary.report.items()},
            "engine_hours": summary.engine_hours,
            "replaced_study_moved_to": str(summary.archived) if summary.archived else None,
        }), indent=2))
        if summary.interrupted:
            click.echo("perflab: interrupted; re-run the same command to resume", err=True)
        elif summary.exit_code:
            click.echo(f"perflab: {exits.describe(summary.exit_code)[1]} (exit {int(summary.exit_code)})", err=True)
    else:
        print_summary(summary)
    # No thread outlives the study: Ctrl-C cancels the running benchmark and waits for it
    # (perflab.lab.run.executor), so the exit is a plain one.
    if summary.exit_code:
        raise click.exceptions.Exit(int(summary.exit_code))


_live_option = click.option("--live/--no-live", default=None,
                            help="Live progress display (default: when stderr is a terminal).")
_early_stop_option = click.option(
    "--early-stop/--no-early-stop", default=True, show_default=True,
    help="Stop a measurement early once it has clearly lost — even its best case can no longer beat the "
         "current best, or the forecast of its open requests (first come, first served, each to its "
         "max_tokens) is more than 1% below it — or the engine is over-saturated; it is recorded as "
         "stopped-early with the figures that decided (--no-early-stop: every measurement runs to its "
         "end, as the plan key early_stop: false).")


_replace_option = click.option(
    "--replace", is_flag=True,
    help="Start afresh in --out: the study there (of this plan or another) is moved aside, whole, to "
         "<out>.replaced-<time>. Without it, --out holding another plan's study (another name, model or "
         "hardware) is refused (exit 2); the same plan resumes.")


def _run_epilog() -> str:
    from perflab.lab.exits import epilog

    return epilog()


@click.command("run", epilog=_run_epilog())
@click.argument("plan_file", metavar="PLAN", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--out", "-o", type=click.Path(path_type=Path, file_okay=False),
              help="Study directory (default: perflab-studies/<plan name>). Re-running with the same --out resumes; "
                   "a directory holding another plan's study is refused (see --replace).")
@_replace_option
@click.option("--hardware", metavar="auto|sim:NAME", default=None,
              help="Override the plan's hardware, e.g. sim:a100-80g-x8 to run the plan on the simulator.")
@click.option("--retry-failed", is_flag=True, help="Re-run configurations that crashed or timed out before (when resuming).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary instead of text.")
@_live_option
@_early_stop_option
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="Where runs execute: local = this machine (perflab.lab.run.backends.local.LocalBackend); ray = the nodes "
                   "of a Ray cluster of the plan's machine, as many runs at once as they fit (needs perflab[ray]; "
                   "docs/user-guide.md, 'Running on Ray').")
@click.option("--ray-address", metavar="ADDR", default=None,
              help="With --executor ray: the cluster to join (HOST:PORT, auto, ray://HOST:PORT); "
                   "default: a local Ray started for the study and stopped with it.")
@click.option("--parallel", metavar="N|auto", default="1", show_default=True,
              help="How many configurations of one study step run at once, each on its own devices "
                   "(auto: as many as fit the machine's accelerators). Decisions are those of a sequential run.")
@click.pass_context
def run(ctx: click.Context, plan_file: Path, out: Path | None, replace: bool, hardware: str | None,
        retry_failed: bool, as_json: bool, live: bool | None, early_stop: bool, executor: str, parallel: str,
        ray_address: str | None) -> None:
    """Run a whole study from a plan file (YAML or TOML; see docs/plan-reference.md).

    Engine selection, one optimization at a time, combinations, then baseline and optimized
    on every profile; report.md, report.json, chart.png and report.html land in the study directory.
    Ctrl-C stops cleanly; the same command resumes. A study directory belongs to one plan
    (name, model, hardware): editing the plan otherwise (adding a candidate) resumes, reusing
    every measurement still valid. With --parallel, the configurations of a
    step run side by side on disjoint device sets (docs/user-guide.md, "Parallel runs"). With
    --executor ray, they run on the nodes of a Ray cluster (docs/user-guide.md, "Running on Ray").
    """
    from perflab.lab.plan import load_plan
    from perflab.lab.run.backends.local import parse_parallel

    n = parse_parallel(parallel)  # a mistake is one line, before anything is loaded
    if ray_address is not None and executor != "ray":
        from perflab.contract.errors import UsageError

        raise UsageError("--ray-address needs --executor ray")
    if executor == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            from perflab.contract.errors import UsageError

            raise UsageError("--executor ray needs Ray: pip install 'perflab[ray]'")
    pm = get_pm(ctx)
    plan = load_plan(plan_file, known_engines=pm.engine_names())
    _run(ctx, plan, out, hardware, retry_failed, as_json, live, early_stop and plan.decision.early_stop, n,
         executor, ray_address, replace=replace)


@click.command("report")
@click.argument("study_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print report.json instead of the paths written.")
@click.option("--html", "as_html", is_flag=True,
              help="Print only the path of report.html (the self-contained page: open it in a browser, print it).")
@click.option("--rebuild", is_flag=True,
              help="Recreate a missing or corrupt study.db from the run directories first (the old one is kept "
                   "as study.db.corrupt-<time>).")
def report(study_dir: Path, as_json: bool, as_html: bool, rebuild: bool) -> None:
    """Write report.md, report.json, chart.png (pareto.png with load curves) and report.html of a
    study directory (also done at the end of `run`).

    report.html is one self-contained page: report.md's sections with every chart embedded, the
    load curves, and the engine metrics and accelerator telemetry sampled while each configuration
    ran; it needs no network and prints without cutting a chart.

    Reads without the study lock: it works while `perflab run` is still going."""
    from perflab.lab.run.runner import write_study_report

    if as_json and as_html:
        from perflab.contract.errors import UsageError

        raise UsageError("--json and --html: choose one (--json prints report.json, --html report.html's path)")

    if rebuild:
        import sqlite3

        from perflab.lab.store import rebuild as rebuild_db
        from perflab.lab.store.integrity import StudyLock, write_fault

        if not study_dir.is_dir():
            from perflab.contract.errors import UsageError

            raise UsageError(f"{study_dir}: no such study directory")
        try:
            with StudyLock(study_dir):  # rebuilding writes: not while a run writes it
                counts = rebuild_db(study_dir)
        except (OSError, sqlite3.Error) as exc:  # a read-only study directory: one line, not a traceback
            fault = write_fault(exc, study_dir)
            if fault is None:
                raise
            raise fault from None
        click.echo(f"Rebuilt   {study_dir / 'study.db'} from {counts['runs']} run(s), "
                   f"{counts['measurements']} measurement(s)", err=as_json)
    outcome, paths = write_study_report(study_dir)
    if as_json:
        click.echo(paths["json"].read_text(encoding="utf-8"))
        return
    if as_html:
        click.echo(paths["html"])
        return
    if not outcome.complete:
        click.echo("note: the study is incomplete; re-run `perflab run` with the same --out to finish it", err=True)
    for kind, path in paths.items():
        click.echo(f"{kind.capitalize():9s} {path}")


@click.command("demo", epilog=_run_epilog())
@click.option("--out", "-o", type=click.Path(path_type=Path, file_okay=False), default=Path("perflab-studies/demo"),
              show_default=True, help="Study directory; an existing demo study is resumed, another plan's refused.")
@click.option("--fresh", is_flag=True, help="Delete the demo's study directory first and measure everything again "
                                            "(only a demo study: another plan's is refused).")
@_replace_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary instead of text.")
@_live_option
@_early_stop_option
@click.pass_context
def demo(ctx: click.Context, out: Path, fresh: bool, replace: bool, as_json: bool, live: bool | None,
         early_stop: bool) -> None:
    """Reproduce seed 002 (Qwen3-32B on 8×A100: vLLM vs SGLang vs TensorRT-LLM, FP8/AWQ,
    max batched tokens, five workloads), scaled down, on simulated engines."""
    from perflab.lab.demo import demo_plan, harness_missing

    pm = get_pm(ctx)
    plan = demo_plan(known_engines=pm.engine_names())
    if (missing := harness_missing()) is not None:
        click.echo(f"perflab demo: {missing}; the accuracy gate keeps its agreement check only", err=True)
    if fresh and out.exists():
        from perflab.contract.errors import UsageError
        from perflab.lab.store.integrity import check_plan

        if not (out / "study.db").exists():
            raise UsageError(f"--fresh: {out} is not a study directory; refusing to delete it")
        if not replace:  # deleting is for the demo's own study; --replace moves any study aside instead
            check_plan(out, plan, remedy="--fresh deletes only a demo study: choose another --out, or "
                                         "--replace to move that study aside")
            shutil.rmtree(out)
    _run(ctx, plan, out, None, False, as_json, live, early_stop, replace=replace)
    if not as_json:
        chart = f"chart: {out / 'chart.png'}; " if (out / "chart.png").is_file() else ""  # none without matplotlib
        click.echo(f"\nThe demo's report is in {out / 'report.md'} ({chart}as one page: {out / 'report.html'}).")
