"""perflab's command line.

Sub-commands live in their own modules and are imported only when invoked, so that
``perflab engines list`` starts fast. User mistakes (:class:`perflab.contract.errors.PerflabError`)
print one line on stderr, never a traceback.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

import click

from perflab import __version__
from perflab.cli.logs import DEFAULT_LEVEL, LEVELS, level_for, logging_at

if TYPE_CHECKING:  # loaded on first use (get_pm): the CLI starts without pluggy's plugins
    from perflab.plugins import PluginManager

# name -> "module:attribute", imported on first use
COMMANDS: dict[str, tuple[str, str]] = {
    "engines": ("perflab.cli.engines_cmd:engines", "List engine plugins and show the command perflab would run."),
    "hardware": ("perflab.cli.hardware_cmd:hardware", "Show the accelerators on this machine (NVML, npu-smi), else the CPU."),
    "launch": ("perflab.cli.launch_cmd:launch", "Launch one engine, wait until it really serves, tear it down on Ctrl-C."),
    "bench": ("perflab.cli.bench_cmd:bench", "Benchmark an OpenAI-compatible endpoint (vllm bench serve metrics)."),
    "eval": ("perflab.cli.eval_cmd:eval_", "Score an OpenAI-compatible endpoint on an accuracy task (lm-evaluation-harness)."),
    "run": ("perflab.cli.lab_cmd:run", "Run a whole study from a plan file, resumable."),
    "report": ("perflab.cli.lab_cmd:report", "Write the Markdown report, chart, report.json and report.html of a study."),
    "audit": ("perflab.cli.audit_cmd:audit", "Check benchmark results, studies and study pages for internal consistency."),
    "demo": ("perflab.cli.lab_cmd:demo", "Reproduce a scaled-down seed study on the simulator."),
    "compare": ("perflab.cli.compare_cmd:compare", "Compare two studies of one plan: changed metrics, regressions, decisions."),
    "export": ("perflab.cli.export_cmd:export", "Export a study's measurements: csv, jsonl, parquet, or vLLM's sweep layout."),
    "plan": ("perflab.cli.plan_cmd:plan", "Plan files: their JSON Schema, for editors that complete and check them."),
    "plugin": ("perflab.cli.plugin_cmd:plugin", "Create a new engine plugin package."),
    "ps": ("perflab.cli.ps_cmd:ps", "List the engines perflab started that are still running."),
    "kill": ("perflab.cli.ps_cmd:kill", "Stop the engines of a study directory, or every orphaned engine."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        target, _ = COMMANDS[name]
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Help text comes from the table, so --help does not import every sub-command.
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


#: sub-commands that print through click alone and log nothing: unless asked (-v, --log-level),
#: structlog is not configured for them, so `engines list --json` starts without loading it (and rich)
UNLOGGED = frozenset({"engines"})


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="perflab")
@click.option("--strict", is_flag=True, envvar="PERFLAB_STRICT_PLUGINS", help="Fail if any plugin fails to load (for CI).")
@click.option("--log-level", type=click.Choice(list(LEVELS), case_sensitive=False), envvar="PERFLAB_LOG_LEVEL",
              help=f"Log lines shown on stderr (default: {DEFAULT_LEVEL}; a study's study.log keeps every event).")
@click.option("-v", "--verbose", count=True, help="Show the log: -v for info, -vv for debug (--log-level wins).")
@click.pass_context
def cli(ctx: click.Context, strict: bool, log_level: str | None, verbose: int) -> None:
    """perflab: a performance lab for LLM inference engines.

    It probes the accelerators, launches each candidate engine (vLLM, vLLM-Ascend, SGLang,
    TensorRT-LLM, MindIE) with the right flags, waits until it really serves, benchmarks it,
    tears it down completely and writes the study. `perflab demo` runs a whole study on
    simulated engines, no GPU needed.
    """
    ctx.ensure_object(dict)
    ctx.obj["strict"] = strict
    if ctx.invoked_subcommand not in UNLOGGED or log_level or verbose:
        ctx.with_resource(logging_at(level_for(log_level and log_level.lower(), verbose)))


def get_pm(ctx: click.Context | None = None) -> PluginManager:
    """The plugin manager for this invocation (loaded once, honouring --strict)."""
    from perflab.plugins import load

    ctx = ctx or click.get_current_context()
    root = ctx.find_root()
    root.ensure_object(dict)
    if "pm" not in root.obj:
        root.obj["pm"] = load(strict=root.obj.get("strict", False))
    return root.obj["pm"]


def main(argv: list[str] | None = None) -> None:
    from perflab.contract.errors import PerflabError

    try:
        rv = cli.main(args=argv, prog_name="perflab", standalone_mode=False)
    except PerflabError as exc:
        from perflab.redact import scrub

        click.echo(f"perflab: error: {scrub(str(exc))}", err=True)  # known secrets as ***
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("perflab: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("perflab: interrupted", err=True)
        sys.exit(130)
    # standalone_mode=False returns ctx.exit(n) codes instead of exiting: honour them
    if isinstance(rv, int) and rv != 0:
        sys.exit(rv)
