"""The study write-up: Markdown in the seeds' structure, ``report.json``, and the chart.

Sections, as in ``tests/fixtures/seeds/studies/00[0-2]*.txt``: Conclusion (chart, recommended serving
command, baseline vs optimized table with percentages, notes), Optimization Objective,
Experimental Setup (model, probed hardware, detected engine versions, datasets, benchmark
commands), Experiment Results (one section per step, each configuration's serving script and
result block, crashes and refusals with their causes), Summary of Optimization Options, and
Other Benchmark Cases. A simulated study says so at the top.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, get_args

from perflab import __version__
from perflab.bench.metrics import BenchMetrics, name_of
from perflab.contract.status import Status
from perflab.lab.decide import DecideBy, Regression, latency_label, pct_name
from perflab.lab.report.blocks import callout, details
from perflab.lab.search import non_dominated
from perflab.lab.study import ConfigResult, Entry, Ranking, Step, StudyOutcome, slo_label, stopped_early_text
from perflab.observe import energy

if TYPE_CHECKING:
    from perflab.lab.store import Store

#: report.json's ``schema_version``: its keys and their types are perflab.lab.report.schema's
#: (published as docs/report.schema.json, which states this one value); bump it when a key is
#: renamed or removed or its meaning changes (a key added is an optional field of the same version)
SchemaVersion = Literal[1]
SCHEMA_VERSION: Final[int] = get_args(SchemaVersion)[0]

GREEN = "lightgreen"
RED = "#fbcaca"
CHART_NAME = "chart.png"
PARETO_NAME = "pareto.png"
#: an SLO plan's Pareto front of its grid or search (SVG: drawn without a plotting library)
FRONT_NAME = "front.svg"
#: said where chart.png and pareto.png would be when matplotlib (the ``perflab[charts]`` extra) is missing
CHARTS_MISSING = "charts need `pip install 'perflab[charts]'`"

NOTES = (
    "Our benchmark tests do not cover all possible optimization combinations. For example, we select the "
    "inference engine that performs best under its default configuration as the starting point for further "
    "tuning. This pruning approach yields a local optimum, which may not be the global optimum.",
    "There are other optimization methods that depend on specific user scenarios, including max batch size, "
    "schedule configuration, extended KV cache, CUDA graph, Torch Compile, etc. The conclusions in this document "
    "can serve as a starting point for more targeted optimizations.",
    "The tests are conducted on specific hardware and software setups. Advances in the inference engine may lead "
    "to new conclusions.",
)


@dataclass
class ReportContext:
    """What the report needs besides the decisions: the study's surroundings."""

    display: Mapping[str, str] = field(default_factory=dict)  # engine -> "TensorRT-LLM"
    versions: Mapping[str, str | None] = field(default_factory=dict)  # engine -> "1.2.0rc1"
    # engine -> where its version came from: "plan" (engine_versions) or "installed"
    version_origins: Mapping[str, str] = field(default_factory=dict)
    hardware: Mapping[str, Any] = field(default_factory=dict)  # HardwareSnapshot as JSON
    hardware_spec: str = "auto"
    simulated: bool = False
    time_scale: float = 1.0
    study_dir: Path | None = None
    generated_at: str = field(default_factory=lambda: _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"))
    interrupted: bool = False
    stop_reason: str | None = None  # the environment/storage fault that stopped the study
    leftovers: list[str] = field(default_factory=list)  # what a teardown left behind
    # Store.engine_hours(): {spent, full_method_estimate, saved_pct} (None: not recorded)
    engine_hours: Mapping[str, float] | None = None

    def name(self, engine: str) -> str:
        return self.display.get(engine, engine)


# --------------------------------------------------------------------------- small formatters


def report_context(store: Store) -> ReportContext:
    return ReportContext(
        display=store.get_meta("display", {}),
        versions=store.get_meta("versions", {}),
        version_origins=store.get_meta("version_origins", {}),
        hardware=store.get_meta("hardware", {}),
        hardware_spec=store.get_meta("hardware_spec", "auto"),
        simulated=bool(store.get_meta("simulated", False)),
        time_scale=float(store.get_meta("time_scale", 1.0)),
        study_dir=store.dir,
        interrupted=store.get_meta("last_state") == "interrupted",
        engine_hours=store.engine_hours(),
        stop_reason=store.get_meta("stop_reason"),
        leftovers=list(store.get_meta("leftovers") or []),
    )


def fmt_pct(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:+.{digits}f}%"


def pct_span(value: float | None) -> str:
    """The seeds' coloured change: green for a gain, red for a loss."""
    if value is None:
        return ""
    colour = GREEN if value >= 0 else RED
    return f'<span style="background-color:{colour};">({fmt_pct(value)})</span>'


def _num(v: Any) -> float | None:
    """A measured figure as a float; None when it is none (missing, NaN, not a number)."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v) else None


def _tpot(res: ConfigResult | None) -> float | None:
    return _num(res.metrics.mean_tpot_ms) if res is not None and res.metrics is not None else None


def _tps_text(res: ConfigResult) -> str:
    tps = res.tps
    text = f"{tps:.2f}" if tps is not None else "n/a"
    spread = res.noise.get(name_of(lambda m: m.total_token_throughput))
    if tps is not None and len(res.repeats) > 1 and spread is not None:
        text += f" ±{spread:.1f}%"  # the mean of the repeats, with their relative spread
    if res.replicas > 1 and tps is not None:
        text += f" ({res.replicas} replicas, {tps / res.replicas:.2f} each)"
    return text


def cell(res: ConfigResult | None, change: float | None = None, rank: Ranking | None = None,
         figure_change: float | None = None, regressions: Sequence[Regression] = (),
         threshold_pct: float | None = None) -> str:
    """A conclusion-table cell: ``Total TPS: X (+p%)<br>Mean TPOT(ms): Y``, or why there is none;
    when something other than throughput decides, its figure and the SLO's percentiles first;
    with ``regressions`` (the recommendation's latency metrics worse than the baseline's by more
    than ``threshold_pct``), the price of the decision, in red: a gain in throughput never
    hides a loss in latency."""
    if res is None:
        return "-"
    if res.status is not Status.OK:
        return short_status(res)
    tpot = _tpot(res)
    span = f" {pct_span(change)}" if change is not None else ""
    tpot_s = f"{tpot:.2f}" if tpot is not None else "n/a"
    tpot_reg = next((r for r in regressions if r.metric == name_of(lambda m: m.mean_tpot_ms)), None)
    if tpot_reg is not None:  # worse is a rise here: red, with the rise
        tpot_s += f' <span style="background-color:{RED};">({fmt_pct(tpot_reg.change_pct)})</span>'
    text = f"Total TPS: {_tps_text(res)}{span}<br>Mean TPOT(ms): {tpot_s}"
    if regressions:
        worse = "; ".join(r.text() for r in regressions)
        text += (f'<br><span style="background-color:{RED};">⚠ Latency worse than the baseline by more than '
                 f"{threshold_pct or 0:g}%: {_md_escape(worse)}</span>")
    if rank is not None and rank.decision.slo:
        checks = "<br>".join(_check_text(c) for c in rank.decision.slo.check(res.metrics))
        text = f"{checks}<br>{text}"
    if rank is not None and rank.decide_by.needs_slo:
        fspan = f" {pct_span(figure_change)}" if figure_change is not None else ""
        text = f"{rank.name}: {rank.text(res)}{fspan}<br>{text}"
    rate = res.success_rate
    if rate is not None and rate < 1.0:  # the number alone would hide why: say it
        text += f"<br>**Success rate: {rate * 100:.1f}%** — {_md_escape(res.error or 'see the run directory')}"
    return text


def _check_text(c: Any) -> str:
    """``p99 TPOT(ms): 41.20 (limit 50, met)`` for an :class:`perflab.lab.decide.SloCheck`."""
    measured = f"{c.measured:.2f}" if c.measured is not None else "n/a"
    return f"{slo_label(c.key, c.percentile)}(ms): {measured} (limit {c.limit:g}, {'met' if c.met else 'missed'})"


def short_status(res: ConfigResult) -> str:
    if res.status is Status.UNSUPPORTED:
        whys = [r.get("why", "") for r in res.reasons if r.get("severity", "error") == "error" and r.get("why")]
        return f"Not launched: {_md_escape(whys[0]) if whys else 'unsupported'}"
    if res.status in (Status.CRASHED, Status.TIMEOUT):
        c = res.cause or {}
        return f"Crash: {_md_escape(c.get('line') or c.get('explanation') or res.status)}"
    if res.status is Status.FAILED:
        return f"Benchmark failed: {_md_escape(res.error or '')}"
    if res.status is Status.STOPPED_EARLY:
        return f"Stopped early: {_md_escape(stopped_early_text(res.stopped_early))}"
    if not res.status.is_result:  # pending, interrupted
        return "Not measured (study incomplete)"
    return res.status


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _fence(body: str, lang: str = "") -> str:
    return f"```{lang}\n{body}\n```"


def result_block(res: ConfigResult) -> str:
    """What goes in a "Benchmark result" box: the vllm-bench-serve block, or the failure."""
    from perflab.bench.result import format_result_block

    lines: list[str] = []
    if res.status.measured and res.metrics:
        lines.append(format_result_block(res.metrics).rstrip("\n"))
        rate = res.success_rate
        if rate is not None and rate < 1.0:
            lines.append(f"# Success rate: {rate * 100:.1f}%")
            if res.error:
                lines.append(f"# Failed requests: {res.error}")
        lines += measured_notes(res)
        # the engine's caveats on what was measured (preflight's warnings)
        lines += [f"# {r.get('what', '')}: {r.get('why', '')}" for r in res.reasons if r.get("severity") == "warning"]
        return "\n".join(lines)
    if res.status is Status.UNSUPPORTED:
        lines.append("# Not launched: preflight found this configuration unsupported")
        for r in res.reasons:
            if r.get("severity", "error") != "error":
                continue
            src = f" (source: {r['source']})" if r.get("source") else ""
            lines.append(f"# {r.get('what', '')}: {r.get('why', '')}{src}")
        return "\n".join(lines)
    if res.status in (Status.CRASHED, Status.TIMEOUT, Status.STALLED):
        c = res.cause or {}
        if c.get("line"):
            lines.append(f"# {c['line'].strip()}")
        what = {Status.CRASHED: "Crash", Status.TIMEOUT: "Timeout", Status.STALLED: "Stalled"}[res.status]
        name = f" [{c['name']}]" if c.get("name") else ""
        lines.append(f"# {what}{name}: {c.get('explanation') or res.error or 'see the engine log'}")
        if c.get("hint"):
            lines.append(f"# Hint: {c['hint']}")
        if res.log:
            lines.append(f"# Engine log: {res.log}")
        return "\n".join(lines)
    if res.status is Status.FAILED:
        lines.append(f"# Benchmark failed: {res.error or 'see the run directory'}")
        if res.run_dir:
            lines.append(f"# Run directory: {res.run_dir}")
        return "\n".join(lines)
    # pending: never started, or started and cut off (a killed perflab, Ctrl-C) — what it
    # finished (profiles, load points) is kept and reused by the resume
    return ("# Not measured: the study stopped before this configuration's measurement finished; "
            "re-run the same command to resume")


def _load_text(load: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {_fmt_load(v)}" for k, v in load.items()) or "the profile's load"


def _fmt_load(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def measured_notes(res: ConfigResult) -> list[str]:
    """What repeats, load points, a capacity and an early stop add to a result block."""
    lines: list[str] = []
    if res.status is Status.STOPPED_EARLY:
        lines.append(f"# Stopped early (measured, not a failure): {stopped_early_text(res.stopped_early)}")
    if len(res.repeats) > 1:
        spread = ", ".join(f"{k} ±{v:.1f}%" for k, v in res.noise.items() if k in _SPREAD_KEYS)
        lines.append(f"# Mean of {len(res.repeats)} repeats; spread (relative standard deviation): {spread or 'n/a'}")
    for pt in res.points:
        m = BenchMetrics.of(pt.get("metrics") or {})
        slo_text: dict[Any, str] = {True: "; SLO met", False: "; SLO missed"}  # None: no SLO
        met = slo_text.get(pt.get("slo_met"), "")
        figs = [("", m.total_token_throughput, " tok/s"), ("mean TTFT ", m.mean_ttft_ms, " ms"),
                ("mean TPOT ", m.mean_tpot_ms, " ms")]
        text = ", ".join(f"{name}{f'{v:.2f}' if (v := _num(raw)) is not None else 'n/a'}{unit}"
                         for name, raw, unit in figs)
        lines.append(f"# Load {_load_text(pt.get('load') or {})}: {text}{met}")
    if res.capacity is not None:
        lines.append(f"# Capacity (the highest load meeting the SLO): {_fmt_load(res.capacity)}")
    elif any(pt.get("slo_met") is not None for pt in res.points):
        lines.append("# Capacity: no probed load met the SLO")
    return lines + energy.result_lines(res)  # power, energy and cost (issue #13)


#: the figures whose spread a result block shows (the ranking figures and the latencies)
_SPREAD_KEYS = (*(name_of(get) for get in (lambda m: m.total_token_throughput, lambda m: m.output_throughput,
                                            lambda m: m.request_goodput, lambda m: m.request_throughput,
                                            lambda m: m.mean_ttft_ms, lambda m: m.mean_tpot_ms)), "capacity")


def script_of(entry: Entry, ctx: ReportContext) -> str:
    """The serving script; before a run has built one, a description of the options."""
    if entry.result.script:
        return entry.result.script
    opts = entry.config.describe()
    return f"# {ctx.name(entry.config.engine)}: {opts or 'defaults'} (no launch was built)"


def info_box(title: str, body: str, lang: str = "") -> str:
    return "\n".join(details("info", title, _fence(body, lang)))


def hardware_text(ctx: ReportContext) -> str:
    accs = ctx.hardware.get("accelerators") or []
    if not accs:
        return "No accelerator was detected."
    groups: Counter[tuple[str, int, str]] = Counter()
    for a in accs:
        detail = ""
        if a.get("compute_capability"):
            cc = a["compute_capability"]
            detail = f"compute capability {cc[0]}.{cc[1]}"
        elif a.get("chip"):
            detail = f"chip {a['chip']}"
        groups[(a.get("name", "?"), int(a.get("memory_total_mib") or 0), detail)] += 1
    parts = []
    for (name, mib, detail), n in groups.items():
        mem = f"{mib / 1024:.0f} GiB" if mib else "memory unknown"
        extra = f", {detail}" if detail else ""
        parts.append(f"{n} × {name} ({mem}{extra})")
    drivers = sorted({a.get("driver_version") for a in accs if a.get("driver_version")})
    text = ", ".join(parts)
    if drivers:
        text += f"; driver {', '.join(drivers)}"
    host = ctx.hardware.get("host")
    if host:
        text += f"; host {host}"
    if ctx.simulated:
        text += f". Simulated ({ctx.hardware_spec})."
    return text


def hardware_short(ctx: ReportContext) -> str:
    accs = ctx.hardware.get("accelerators") or []
    if not accs:
        return "this machine"
    names = Counter(a.get("name", "?") for a in accs)
    name, n = names.most_common(1)[0]
    return f"{n}× {name}" + (" (simulated)" if ctx.simulated else "")


# --------------------------------------------------------------------------- sections


def chart_line(alt: str, name: str, charts: bool) -> str:
    """The Markdown of a PNG chart, or where there is none (no plotting library) the line saying so."""
    return f"![{alt}]({name})" if charts else f"*{alt}: {CHARTS_MISSING}*"


def _conclusion(o: StudyOutcome, ctx: ReportContext, charts: bool = True) -> list[str]:
    plan = o.plan
    out = ["## Conclusion", "", chart_line(plan.name, CHART_NAME, charts), ""]
    if o.optimized is None:
        why = not_eligible(o)
        out += [f"No measured configuration is eligible, so there is nothing to recommend: {'; '.join(why)}." if why
                else "No configuration served the main profile, so there is nothing to recommend; "
                "see Experiment Results for each engine's outcome.", ""]
    else:
        goal = {"throughput": "throughput", "goodput": "goodput under the service-level objective",
                "max-load": "the highest load meeting the service-level objective"}[str(o.rank.decide_by)]
        out += [f"Recommended configuration for optimizing {goal} of {plan.display_model} on {hardware_short(ctx)}:", "",
                *details("tip", "Serving Command", _fence(script_of(o.optimized, ctx), "bash"), open_=True), ""]
        if o.optimized.accuracy is not None:
            out += [f"Its accuracy price: {accuracy_price(o.optimized.accuracy, _is_reference(o, o.optimized))}.", ""]
    base_head = f"baseline ({o.baseline.label})"
    out += ["Comparison of benchmark results before and after optimization:", "",
            f"| Benchmark Case | {base_head} | Optimized |", "|----------|-------------------------------------------|-----------|"]
    rank = o.rank if o.rank.decision.slo else None
    threshold = plan.decision.guards.latency_regression_pct
    flagged = 0
    for case in o.cases:
        regs = case.latency_regressions(threshold)
        flagged += bool(regs)
        opt = cell(case.optimized, case.change_pct, rank, case.figure_change_pct(o.rank), regs, threshold)
        out.append(f"| **{case.profile.label}** | {cell(case.baseline, None, rank)} | {opt} |")
    if flagged:
        out += ["", f"⚠ The recommendation's latency is worse than the baseline's by more than {threshold:g}% on "
                f"{flagged} of {len(o.cases)} workloads (marked in red above); the plan's `guards:` can make such a "
                "configuration ineligible (`guards.latency_regression_pct` sets this threshold)."]
    if ctx.engine_hours:
        out += ["", engine_hours_line(ctx.engine_hours)]
    for line in energy.summary_lines(o.baseline, o.optimized, [e for st in o.steps for e in st.entries], plan.cost):
        out += ["", line]
    notes = [method_note(o), *NOTES[1:], *plan.notes]
    if ctx.simulated:
        notes.append("The numbers come from perflab's simulated engines, not from real accelerators; they show the "
                     "method and the tooling, not the engines' real performance.")
    out += ["", *callout("note", None, [f"{i}. {n}" for i, n in enumerate(notes, 1)])]
    if not o.complete:
        out += ["", *callout("warning", "Incomplete study", [
                "Some configurations were not measured (the run was interrupted or is still going). "
                "Re-run the same `perflab run` command to finish it."])]
    return [*out, ""]


def _setup(o: StudyOutcome, ctx: ReportContext) -> list[str]:
    plan = o.plan
    out = ["## Optimization Objective", "", plan.objective, ""]
    out += _slo_section(o)
    out += ["## Experimental Setup", "", "### Model", "", plan.display_model]
    if plan.display_model != plan.model:
        out[-1] += f" (`{plan.model}`)"
    for k, v in plan.model_metadata.items():
        out.append(f"- {k}: {v}")
    out += ["", "### Hardware", "", hardware_text(ctx), "", "### Engine Version", ""]
    engines: list[str] = []
    for s in o.steps:
        for e in s.entries:
            if e.config.engine not in engines:
                engines.append(e.config.engine)
    for engine in (o.baseline.config.engine,):
        if engine not in engines:
            engines.append(engine)
    for engine in engines:
        v = ctx.versions.get(engine)
        origin = " (commands built for the plan's engine_versions)" if ctx.version_origins.get(engine) == "plan" else ""
        out.append(f"- {ctx.name(engine)}: {'v' + v.lstrip('v') + origin if v else 'version not detected'}")
    out += ["", "### Benchmark Dataset", ""]
    for i, p in enumerate(plan.profiles, 1):
        main = " (main profile: engine selection and optimizations)" if p.name == plan.main_profile else ""
        out.append(f"{i}. {p.label}: {p.describe()}{main}")
    out += ["", "### Benchmark Script", "",
            "perflab's built-in client measured every configuration with the metric definitions of "
            "**vLLM bench CLI** (`vllm bench serve`); the equivalent commands are:", ""]
    def note(p: Any) -> str:
        return " (perflab generated ShareGPT-like conversations; the real dataset file gives:)" \
            if p.dataset == "synthetic-sharegpt" else ""

    served = o.baseline.config.serve_config().name  # what the engines served (perflab asks for it)
    body = "\n".join(f"# {p.label}{note(p)}\n{p.bench_command(plan.model, served)}" for p in plan.profiles)
    out.append(_fence(body, "bash"))
    if ctx.simulated and ctx.time_scale != 1.0:
        out += ["", f"Simulated time ran {ctx.time_scale:g}× faster than wall-clock time; every duration, latency "
                "and throughput in this report is in simulated (real-hardware) time."]
    return [*out, ""]


def engine_hours_line(h: Mapping[str, float]) -> str:
    """One line: what the study spent, and what the full method would have."""
    spent, full, saved = h.get("spent"), h.get("full_method_estimate"), h.get("saved_pct")
    text = f"Engine-hours: {spent:.2f} spent (accelerators × launch-to-teardown time, in the engines' time)"
    if full is not None and saved is not None and saved > 0:
        text += f"; the full method would have spent about {full:.2f} ({saved:.0f}% saved by stopping early)."
    else:
        text += "."
    return text


def _score_text(block: Mapping[str, Any]) -> str:
    score = block.get("score")
    if score is None:
        return "skipped" if str(block.get("gate", "")).startswith("skipped") else "n/a"
    return f"{score:.2f}" + (" (simulated)" if block.get("simulated") else "")


def _change_text(block: Mapping[str, Any]) -> str:
    drop = block.get("drop")
    return "n/a" if drop is None else f"{(-drop or 0.0):+.2f} points"


def _agreement_text(block: Mapping[str, Any], reference: bool = False) -> str:
    """``95.0% vs floor 100.0% (margin 10)``; a reference is compared with nothing but itself:
    ``reference: floor 100.0%``."""
    a = block.get("agreement")
    if not a:
        return "n/a"
    if reference:
        return f"reference: floor {a['floor']:.1f}%"
    return f"{a['exact_match']:.1f}% vs floor {a['floor']:.1f}% (margin {a['margin']:g})"


def _is_reference(o: StudyOutcome, e: Entry) -> bool:
    """Whether ``e`` is its engine's accuracy reference (its agreement is its own noise floor)."""
    from perflab.lab.plan import reference_config

    return reference_config(o.plan, e.config.engine).canonical() == e.config.canonical()


def accuracy_price(block: Mapping[str, Any], reference: bool = False) -> str:
    """The recommendation's accuracy, one phrase: ``perflab_arith 93.50 (simulated), -1.00 points
    vs the baseline's 94.50; agreement with vLLM 95.0% vs floor 100.0% (margin 10)``.
    ``reference``: the recommendation is its engine's reference (another engine's defaults, or
    the baseline itself), whose answers were compared with no other configuration's."""
    parts = []
    if block.get("score") is not None:
        text = f"{block['task']} {_score_text(block)}"
        if block.get("drop") is not None:
            text += f", {_change_text(block)} vs the baseline's {block['baseline_score']:.2f}"
        parts.append(text)
    elif block.get("task"):
        parts.append(f"{block['task']} not scored ({block.get('gate')})")
    if block.get("agreement") and reference:
        parts.append(f"greedy answers not compared with another configuration's (it is {block.get('reference')}'s "
                     f"accuracy reference: noise floor {block['agreement']['floor']:.1f}%)")
    elif block.get("agreement"):
        parts.append(f"agreement with {block.get('reference')} {_agreement_text(block)}")
    return "; ".join(parts) or str(block.get("gate"))


def accuracy_rows(o: StudyOutcome) -> list[dict[str, Any]]:
    """Every measured configuration's accuracy verdict (report.json's ``accuracy.rows``)."""
    return [{"label": e.label, "engine": e.config.engine, "eligible": e.eligible, "note": e.note, **(e.accuracy or {})}
            for e in _accuracy_entries(o)]


def _accuracy_entries(o: StudyOutcome) -> list[Entry]:
    """The configurations with a verdict: every measured one, and each engine's accuracy
    reference measured outside the steps (its noise floor judges that engine's candidates)."""
    return [e for e in [*_configurations(o), *o.references] if e.accuracy is not None]


def _accuracy_section(o: StudyOutcome) -> list[str]:
    """The accuracy gate's table: each measured configuration's score, its change from the
    baseline's, its agreement against its reference's noise floor, and the gate's verdict."""
    spec = o.plan.accuracy
    if spec is None:
        return []
    rule = []
    if spec.task is not None:
        rule.append(f"its {spec.task} score drops more than {spec.max_drop:g} point{'' if spec.max_drop == 1 else 's'} "
                    "below the baseline's")
    if spec.agreement:
        rule.append(f"its greedy answers agree with its engine's reference less than the reference's own noise floor "
                    f"(the reference answering twice, one prompt at a time then all at once) minus "
                    f"{spec.agreement_margin:g} points")
    out = ["## Accuracy", "", f"A configuration is rejected when {' or when '.join(rule)}. Configurations whose every "
           "change from their reference is lossless skip the task and keep the agreement check.", "",
           "| Configuration | Task | Score | Change vs baseline | Agreement vs floor | Gate |",
           "|---|---|---|---|---|---|"]
    rows = _accuracy_entries(o)
    for e in rows:
        b = e.accuracy or {}
        gate = str(b.get("gate"))
        if b.get("reason"):  # the gate's own reason (a configuration may be ineligible for others too)
            gate = b["reason"] if gate == "rejected" else f"{gate}: {b['reason']}"
        out.append(f"| {_md_escape(e.label)} | {b.get('task') or 'n/a'} | {_score_text(b)} | {_change_text(b)} | "
                   f"{_agreement_text(b, _is_reference(o, e))} | {_md_escape(gate)} |")
    if not rows:
        out.append("| (no configuration measured yet) | | | | | |")
    if any((e.accuracy or {}).get("simulated") for e in rows):
        out += ["", "Scores marked (simulated) come from perflab's simulated engines' accuracy model "
                "(docs/simulator.md gives each effect's published source), not from a real model."]
    return [*out, ""]


def not_eligible(o: StudyOutcome) -> list[str]:
    """``label (why)`` of each configuration measured on the main profile but not eligible
    (the accuracy gate, a guard, a low success rate): why a study that measured something
    recommends nothing."""
    return [f"{e.label} ({e.note})" for e in _configurations(o)
            if e.result.status.measured and not e.eligible and e.note]


def _configurations(o: StudyOutcome) -> list[Entry]:
    """Every configuration measured on the main profile, once each, in the study's order."""
    seen: set[str] = set()
    out: list[Entry] = []
    for e in [*(e for s in o.steps for e in s.entries), o.baseline]:
        key = e.config.key()
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def _slo_section(o: StudyOutcome) -> list[str]:
    """The decision rule and, per configuration, the measured percentile next to each limit."""
    rank, slo = o.rank, o.rank.decision.slo
    if not slo:
        return []
    keys = list(slo.limits())
    out = ["## Service-level objective", "", rank.rule(), ""]
    head = [f"{slo_label(k, slo.percentile)} (ms, limit {v:g})" for k, v in slo.limits().items()]
    out += ["| Configuration | " + " | ".join([f"{rank.name} ({rank.unit})", *head, "SLO"]) + " |",
            "|" + "---|" * (len(head) + 3)]
    for e in _configurations(o):
        res = e.result
        if not res.status.measured:
            out.append(f"| {_md_escape(e.label)} | {short_status(res)} |" + " |" * (len(keys) + 1))
            continue
        checks = slo.check(res.metrics)
        cells = [f"{c.measured:.2f}" if c.measured is not None else "n/a" for c in checks]
        verdict = "met" if all(c.met for c in checks) else "missed"
        fig = rank.text(res)
        if res.status is Status.STOPPED_EARLY:
            fig += " (stopped early)"
        out.append(f"| {_md_escape(e.label)} | {fig} | " + " | ".join([*cells, verdict]) + " |")
    out += ["", "The percentiles are those of the figures the configuration is ranked by"
            + (" (for capacity: at the highest load meeting the SLO, or the lowest load probed when none did)."
               if rank.decide_by.metric == "capacity" else ".")]
    throughput = Ranking()
    winner_tp = max((e for e in _configurations(o) if throughput.value(e.result) is not None),
                    key=lambda e: throughput.value(e.result) or 0.0, default=None)
    if rank.decide_by.needs_slo and o.optimized is not None and winner_tp is not None \
            and winner_tp.config != o.optimized.config:
        out += ["", f"Of the figures above, {winner_tp.label} has the highest total token throughput "
                f"({throughput.text(winner_tp.result)}): deciding by throughput would favour it; under the SLO, "
                f"{o.optimized.label} is the choice."]
    return [*out, ""]


def _entry_lines(e: Entry, ctx: ReportContext) -> list[str]:
    block = result_block(e.result)
    if e.note and e.result.status is not Status.STOPPED_EARLY:  # a stopped block says it once, itself
        block += f"\n# {e.note}"
    elif e.accuracy is not None and e.accuracy.get("reason"):  # the accuracy gate's verdict, beside the stop
        block += f"\n# {e.accuracy['reason']}"
    if e.result.reused:
        block += "\n# (measured in an earlier session of this study and reused)"
    return [e.label, info_box("Serving script", script_of(e, ctx), "bash"), "", info_box("Benchmark result", block), ""]


def search_lines(step: Step, rank: Ranking) -> list[str]:
    """Method grid or search: each trial (its point, figure, pruned or not, engine-hours), the
    best found, Optuna's parameter importances and, with an SLO, the Pareto front."""
    info = step.search or {}
    out: list[str] = []
    if info.get("method") == "search":
        sampler = "multi-objective TPE sampler" if info.get("objectives") else "TPE sampler"
        out += [f"Optuna's {sampler} (seed {info.get('seed')}) asked for {info.get('trials_asked')} distinct points "
                f"of the {info.get('points')}; {info.get('trials')} measured, {info.get('pruned')} pruned by early stop"
                + (f", budget {info['budget_engine_hours']:g} engine-hours" if info.get("budget_engine_hours") else "")
                + ".", ""]
    out += [f"| Trial | Configuration | {rank.name} | State | Engine-hours |", "|---|---|---|---|---|"]
    for e in step.entries:
        t = e.trial
        if t is None:
            continue
        value = t.get("value")
        fig = "n/a" if value is None else (f"≤ {value:.2f} {rank.unit} ({t.get('pruned_by') or 'bound'})"
                                           if t["state"] == "pruned" else rank.text(e.result))
        hours = "-" if t.get("engine_hours") is None else f"{t['engine_hours']:.3f}"
        best = " **(best)**" if step.chosen is e else ""
        out.append(f"| {t['number']} | {_md_escape(e.label)}{best} | {fig} | {t['state']} | {hours} |")
    if info.get("engine_hours") is not None:
        out += ["", f"Engine-hours of the {info.get('trials')} trials: {info['engine_hours']:.3f}."]
    if info.get("importances"):
        parts = ", ".join(f"{k} {v:.2f}" for k, v in info["importances"].items())
        of = f" of {rank.name}" if info.get("objectives") else ""  # several objectives: the ranking figure's
        out += ["", f"Parameter importances{of} (Optuna, fANOVA): {parts}."]
    if vs := info.get("vs_seeds"):
        out += ["", *vs_seeds_lines(vs, rank)]
    if info.get("front") is not None:
        out += ["", *front_lines(step, rank)]
    return [*out, ""]


def front_lines(step: Step, rank: Ranking) -> list[str]:
    """An SLO plan's Pareto front (the step's ``search.front``): a table of its trials, the
    recommended one marked, and the chart (:data:`FRONT_NAME`, :func:`front_chart`)."""
    info = step.search or {}
    front, objectives = info.get("front") or [], info.get("objectives") or []
    lat = [o["name"] for o in objectives if o["direction"] == "minimize"]
    what = "points" if info.get("method") == "grid" else "trials"
    slo = rank.decision.slo
    feasible = sum(e.trial is not None and e.trial["state"] == "complete" and e.eligible and slo.met(e.result.metrics)
                   for e in step.entries)
    out = [f"**Pareto front.** {len(front)} of the {feasible} complete, eligible {what} that meet the SLO: none of "
           f"them is bettered in every objective by another (maximize {rank.name}; minimize "
           f"{', '.join(latency_label(k) for k in lat)}). Which one to serve depends on the latency users need; "
           f"the recommendation stays the best {rank.name}.", ""]
    if front:
        out += [f"| Trial | Configuration | {rank.name} | " + " | ".join(f"{latency_label(k)} (ms)" for k in lat) + " |",
                "|---|---|---|" + "---|" * len(lat)]
        for f in front:
            mark = " **(recommended)**" if f.get("recommended") else ""
            ms = " | ".join("n/a" if f["latencies"].get(k) is None else f"{f['latencies'][k]:.2f}" for k in lat)
            out.append(f"| {f['number']} | {_md_escape(f['label'])}{mark} | {f['value']:.2f} {rank.unit} | {ms} |")
        out += ["", f"![Pareto front]({FRONT_NAME})"]
    if step.chosen is not None and not any(f.get("recommended") for f in front):
        why = {DecideBy.THROUGHPUT: "a throughput ranking reports the SLO, it does not rank by it",
               DecideBy.GOODPUT: f"goodput counts each request that meets every limit, the front asks the "
                                 f"p{pct_name(slo.percentile)} of each latency to meet it"}.get(rank.decide_by, "")
        out += ["", f"The recommendation, {_md_escape(step.chosen.label)}, is not on the front: it does not meet every "
                    f"SLO limit{f' ({why})' if why else ''}."]
    return out


def front_chart(o: StudyOutcome, ctx: ReportContext) -> str | None:
    """The Pareto front of an SLO plan's grid or search as SVG (one panel per SLO latency
    against the ranking figure); None when no step has a front."""
    from perflab.lab.report.svgchart import front_svg

    slo, rank = o.plan.decision.slo, o.rank
    for step in o.steps:
        info = step.search or {}
        if not info.get("front"):
            continue
        keys = list(slo.limits())
        trials: list[tuple[float, list[float], bool]] = []
        recommended = None
        for e in step.entries:
            fig = rank.value(e.result)
            if e.trial is None or e.trial["state"] != "complete" or fig is None:
                continue
            checks = slo.check(e.result.metrics)
            ys = [c.measured for c in checks if c.measured is not None]
            if len(ys) < len(checks):  # a latency not measured: no place in the chart
                continue
            trials.append((fig, ys, e.eligible and all(c.met for c in checks)))
            if e is step.chosen:
                recommended = (fig, ys)
        front = [(f["value"], [f["latencies"][slo.metric_key(k)] for k in keys]) for f in info["front"]]
        title = f"Pareto front of the {info.get('method')}" + (" — simulated" if ctx.simulated else "")
        return front_svg(title, f"{rank.name} ({rank.unit})",
                         [(f"{slo_label(k, slo.percentile)} (ms)", v) for k, v in slo.limits().items()],
                         trials, front, recommended)
    return None


def method_note(o: StudyOutcome) -> str:
    """The conclusion's first note: what the method could miss (the seeds' own words for
    theirs; for grid and search, what lies outside the measured points)."""
    step = next((s for s in o.steps if s.search is not None), None)
    info = step.search if step is not None and step.search is not None else {}
    if o.plan.method == "seeds" or not info:
        return NOTES[0]
    if o.plan.method == "grid":
        return (f"Every point of the declared space was measured ({info.get('points')} points); configurations "
                "outside it (other options, other values) were not.")
    text = (f"The search measured {info.get('trials')} of the space's {info.get('points')} points, chosen by Optuna's "
            "TPE sampler: its best is the best it found, not necessarily the space's (`method: grid` measures "
            "every point); configurations outside the declared space were not considered.")
    if info.get("vs_seeds"):
        text += (" The seeds' method ran first in the same study; the recommendation is the better of its pick "
                 "and the search's best.")
    return text


def vs_seeds_lines(vs: Mapping[str, Any], rank: Ranking) -> list[str]:
    """The search's best against the seeds' method's pick, both run in the study: each
    figure, the engine-hours each method spent, the gain and which one is recommended."""

    def row(method: str, side: Mapping[str, Any] | None, hours: float | None) -> str:
        label, fig = (_md_escape(side["label"]), f"{side['value']:.2f} {rank.unit}") if side else ("none eligible", "n/a")
        return f"| {method} | {label} | {fig} | {'-' if hours is None else f'{hours:.3f}'} |"

    gain = vs.get("gain_pct")
    chosen = "the search's best" if vs.get("recommended") == "search" else "the seeds' pick"
    return [f"| Method | Pick | {rank.name} | Engine-hours |", "|---|---|---|---|",
            row("Seeds' method", vs.get("seeds_pick"), vs.get("seeds_engine_hours")),
            row("Search", vs.get("search_best"), vs.get("search_engine_hours")), "",
            f"The search's best against the seeds' pick: {'n/a' if gain is None else fmt_pct(gain)}; "
            f"recommended: {chosen}."]


def _step(step: Step, ctx: ReportContext, rank: Ranking) -> list[str]:
    out = [f"### {step.title}", ""]
    if step.skipped:
        return [*out, step.skipped, ""]
    if step.search is not None:
        out += search_lines(step, rank)
    for e in step.entries:
        out += _entry_lines(e, ctx)
    if step.statement:
        out += [step.statement, ""]
    from perflab.observe.explain import explain_step  # why, in the engine's own metrics (issue #13)

    if why := explain_step(step):
        out += [why, ""]
    return out


def summary_rows(o: StudyOutcome, ctx: ReportContext) -> list[dict[str, Any]]:
    rows = []
    for s in o.steps:
        name = "Engine Selection" if s.kind == "engine" else s.name
        improvement = s.vs_baseline_pct if s.adopted else None
        r = o.rank
        if s.kind in ("engine", "grid", "search") and s.chosen is not None and s.base is None:
            base_text = f"{_tps_text(o.baseline.result)} tok/s" if r.decide_by is DecideBy.THROUGHPUT \
                else r.text(o.baseline.result)
            detail = f"{s.chosen.label} ({r.text(s.chosen.result)}) vs baseline {o.baseline.label} ({base_text})"
        elif s.skipped:
            detail = s.skipped
        elif s.chosen is not None:
            verdict = "adopted" if s.adopted else "within noise, not adopted" if s.within_noise else "not adopted"
            detail = f"best: {s.chosen.label} ({r.text(s.chosen.result)}, {fmt_pct(s.vs_base_pct)} vs {s.base.label if s.base else 'current best'}); {verdict}"
        elif any(e.result.status is Status.STOPPED_EARLY for e in s.entries):  # lost: measured, not adoptable
            detail = "not adopted"
        else:
            detail = "no usable result"
        failures = [f"{e.label}: {short_status(e.result) if not e.result.status.measured else e.note}"
                    + (f" ({e.result.error})" if e.result.status is Status.OK and e.result.error else "")
                    for e in s.entries if not e.eligible]
        if failures:
            detail += "; " + "; ".join(failures)
        rows.append({"option": name, "step": s.title, "adopted": s.adopted, "improvement_vs_baseline_pct": improvement,
                     "improvement_vs_previous_best_pct": s.vs_base_pct, "detail": detail,
                     "energy_cost": energy.efficiency_text(s.chosen) if s.chosen is not None else None})
    return rows


def _summary(o: StudyOutcome, ctx: ReportContext) -> list[str]:
    out = ["### Summary of Optimization Options", "",
           f"| Optimization Option | {o.rank.name} Improvement | Details |",
           "|-----------------------------|-------------------------------------|---------|"]
    rows = summary_rows(o, ctx)
    for row in rows:
        imp = row["improvement_vs_baseline_pct"]
        imp_s = f'<span style="background-color:{GREEN if imp >= 0 else RED};">{fmt_pct(imp)}</span>' if imp is not None else "-"
        out.append(f"| {row['option']} | {imp_s} | {_md_escape(row['detail'])} |")
    out += energy.step_lines(rows)
    what = {"throughput": "total token throughput", "goodput": "goodput (requests/s meeting the SLO)",
            "max-load": "capacity (the highest load meeting the SLO)"}[str(o.rank.decide_by)]
    out += ["", f"Improvements are in {what} on the main profile, relative to the baseline; "
            "a step's best variant is adopted only when it beats the current best"
            + (" by more than the measured noise." if o.plan.decision.repeats > 1 else ".")]
    return [*out, ""]


def _other(o: StudyOutcome, ctx: ReportContext) -> list[str]:
    plan = o.plan
    others = [c for c in o.cases if c.profile.name != plan.main_profile] or list(o.cases)
    out = ["### Other Benchmark Cases", "",
           "We further benchmarked the optimized configuration to evaluate its generalization under various workloads.", ""]

    def blocks(which: str) -> str:
        parts = []
        for c in others:
            res = c.baseline if which == "baseline" else c.optimized
            parts.append(f"# {c.profile.label}\n{result_block(res) if res is not None else '# not measured'}")
        return "\n\n".join(parts)

    out += [info_box("Baseline serving script", script_of(o.baseline, ctx), "bash"), "",
            info_box("Baseline benchmark results", blocks("baseline"), "bash"), ""]
    if o.optimized is not None:
        out += [info_box("Optimized serving script", script_of(o.optimized, ctx), "bash"), "",
                info_box("Optimized benchmark results", blocks("optimized"), "bash"), ""]
    return out


# --------------------------------------------------------------------------- Pareto


def accelerators_of(entry: Entry) -> int:
    """Accelerators one configuration occupies: tp × pp × dp per instance, times replicas."""
    return max(1, entry.config.serve_config().world_size) * entry.config.replicas


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the Pareto-optimal points when both coordinates are better larger: no other
    point is at least as good in both and better in one (:func:`perflab.lab.search.non_dominated`;
    of equal points, one). In order of the first coordinate."""
    one = {points[i]: i for i in non_dominated(points)}
    return sorted(one.values(), key=lambda i: points[i][0])


def results_by_profile(o: StudyOutcome) -> dict[str, list[tuple[str, Entry, ConfigResult]]]:
    """Per profile (plan order), every configuration measured on it, once each, as
    ``(label, entry, result)``: all configurations on the main profile, baseline and optimized
    on the others (the load curves, the Pareto chart and report.html's metrics read them)."""
    plan = o.plan
    by_profile: dict[str, list[tuple[str, Entry, ConfigResult]]] = {p.name: [] for p in plan.profiles}
    for e in _configurations(o):
        by_profile[plan.main_profile].append((e.label, e, e.result))
    for c in o.cases:
        for who, entry, res in (("Baseline", o.baseline, c.baseline), ("Optimized", o.optimized, c.optimized)):
            if entry is None or res is None:
                continue
            rows = by_profile[c.profile.name]
            if any(x[1].config == entry.config for x in rows):
                continue
            rows.append((f"{entry.label}" if c.profile.name == plan.main_profile else f"{who}: {entry.label}", entry, res))
    return by_profile


def pareto_data(o: StudyOutcome) -> list[dict[str, Any]]:
    """Per profile with load curves (a sweep, or a max-load search's probes): each configuration's
    points as output tokens/s per accelerator vs output tokens/s per user (1000 / mean TPOT),
    and the Pareto frontier over all of them (AIConfigurator's axes)."""
    plan = o.plan
    by_profile = results_by_profile(o)
    out: list[dict[str, Any]] = []
    for prof in plan.profiles:
        configs: list[dict[str, Any]] = []
        flat: list[tuple[float, float]] = []
        where: list[tuple[int, int]] = []
        for label, entry, res in by_profile[prof.name]:
            if not res.status.measured or len(res.points) < 2:
                continue
            accs = accelerators_of(entry)
            pts = []
            for pt in res.points:
                m = BenchMetrics.of(pt.get("metrics") or {})
                tpot, otps = _num(m.mean_tpot_ms), _num(m.output_throughput)
                if not tpot or otps is None:
                    continue
                pts.append({"load": dict(pt.get("load") or {}), "per_user": 1000.0 / tpot,
                            "per_accelerator": otps / accs, "slo_met": pt.get("slo_met"), "pareto": False})
                flat.append((1000.0 / tpot, otps / accs))
                where.append((len(configs), len(pts) - 1))
            if pts:
                configs.append({"label": label, "engine": entry.config.engine, "accelerators": accs, "points": pts})
        if not configs:
            continue
        frontier = []
        for i in pareto_front(flat):
            ci, pi = where[i]
            pt = configs[ci]["points"][pi]
            pt["pareto"] = True
            frontier.append({"label": configs[ci]["label"], "load": pt["load"], "per_user": pt["per_user"],
                             "per_accelerator": pt["per_accelerator"]})
        on = []
        for f in frontier:
            if f["label"] not in on:
                on.append(f["label"])
        out.append({"profile": prof.name, "label": prof.label,
                    "x": "output tokens/s per user (1000 / mean TPOT)", "y": "output tokens/s per accelerator",
                    "configurations": configs, "frontier": frontier, "on_frontier": on})
    return out


def _pareto_section(o: StudyOutcome, pareto: list[dict[str, Any]], charts: bool = True) -> list[str]:
    if not pareto:
        return []
    out = ["### Load Curves and Pareto Frontier", "", chart_line("Pareto frontier", PARETO_NAME, charts), "",
           "Output tokens/s per accelerator against output tokens/s per user (1000 / mean TPOT), one curve "
           "per configuration, measured at each load of the profile in one launch; a point is on the frontier "
           "when no other point is faster for the user *and* yields more per accelerator.", ""]
    for p in pareto:
        parts = []
        for label in p["on_frontier"]:
            xs = [f["per_user"] for f in p["frontier"] if f["label"] == label]
            parts.append(f"{label} ({min(xs):.1f}–{max(xs):.1f} tok/s per user)" if len(xs) > 1
                         else f"{label} ({xs[0]:.1f} tok/s per user)")
        out.append(f"- {p['label']}: on the frontier: {'; '.join(parts)}.")
        if len(p["on_frontier"]) > 1:
            out.append("  The curves cross: which configuration is best depends on the latency each user needs.")
    return [*out, ""]


def title_of(o: StudyOutcome, ctx: ReportContext) -> str:
    what = "Throughput" if not o.rank.decide_by.needs_slo else f"{o.rank.name} under a Latency Objective"
    return o.plan.title or f"Optimizing {o.plan.display_model} {what} on {hardware_short(ctx)}"


def render_markdown(o: StudyOutcome, ctx: ReportContext, *, charts: bool = True) -> str:
    """report.md's text; ``charts``: whether chart.png and pareto.png are written beside it
    (without matplotlib they are not, and the report says what would draw them)."""
    out = [f"# {title_of(o, ctx)}", ""]
    if ctx.simulated:
        out += [*callout("warning", "Simulated study", [
                f"Every number in this report was measured on perflab's simulated engines ({ctx.hardware_spec}), "
                "not on real accelerators."
                + (f" Simulated time ran {ctx.time_scale:g}× faster than real time; numbers are in simulated time."
                   if ctx.time_scale != 1.0 else "")]), ""]
    if ctx.stop_reason:
        out += [*callout("danger", "The study stopped",
                         [_md_escape(ctx.stop_reason), *(f"- {_md_escape(x)}" for x in ctx.leftovers)]), ""]
    out += _conclusion(o, ctx, charts)
    out += _setup(o, ctx)
    out += _accuracy_section(o)
    out += ["## Experiment Results", ""]
    for s in o.steps:
        out += _step(s, ctx, o.rank)
    out += _pareto_section(o, pareto_data(o), charts)
    out += _summary(o, ctx)
    out += _other(o, ctx)
    footer = f"Generated by perflab {__version__} on {ctx.generated_at}"
    if ctx.study_dir is not None:
        footer += f" from the study in `{ctx.study_dir}`"
    out += ["---", "", footer + "."]
    return "\n".join(out).rstrip() + "\n"


def build_json(o: StudyOutcome, ctx: ReportContext) -> dict[str, Any]:
    plan = o.plan
    return {
        "schema_version": SCHEMA_VERSION,
        "perflab_version": __version__,
        "generated_at": ctx.generated_at,
        "title": title_of(o, ctx),
        "simulated": ctx.simulated,
        "hardware_spec": ctx.hardware_spec,
        "time_scale": ctx.time_scale,
        "interrupted": ctx.interrupted,
        "stop_reason": ctx.stop_reason,
        "leftovers": list(ctx.leftovers),
        "model": {"id": plan.model, "name": plan.display_model, "metadata": dict(plan.model_metadata)},
        "objective": plan.objective,
        "decide_by": str(o.rank.decide_by),
        "slo": plan.decision.slo.to_json() if plan.decision.slo else None,
        "decision": plan.decision.to_json(),
        "latency_regression_pct": plan.decision.guards.latency_regression_pct,
        "ranking_metric": o.rank.metric,
        "pareto": pareto_data(o),
        "engine_hours": dict(ctx.engine_hours) if ctx.engine_hours is not None else None,
        "hardware": dict(ctx.hardware),
        "engines": {e: {"display_name": ctx.name(e), "version": ctx.versions.get(e)} for e in ctx.versions} or None,
        "main_profile": plan.main_profile,
        "min_success_rate": plan.min_success_rate,
        "profiles": [{"name": p.name, "label": p.label, **p.definition()} for p in plan.profiles],
        "recommended_command": o.optimized.result.script if o.optimized else None,
        "conclusion": [
            {"profile": c.profile.name, "label": c.profile.label,
             "baseline_total_token_throughput": c.baseline.tps,
             "baseline_mean_tpot_ms": _tpot(c.baseline),
             "baseline_ranking_figure": o.rank.value(c.baseline),
             "optimized_ranking_figure": o.rank.value(c.optimized) if c.optimized else None,
             "ranking_figure_change_pct": c.figure_change_pct(o.rank),
             "baseline_slo": [x.to_json() for x in plan.decision.slo.check(c.baseline.metrics)] or None,
             "optimized_slo": ([x.to_json() for x in plan.decision.slo.check(c.optimized.metrics)] or None)
             if c.optimized else None,
             "optimized_total_token_throughput": c.optimized.tps if c.optimized else None,
             "optimized_mean_tpot_ms": _tpot(c.optimized),
             "change_pct": c.change_pct,
             "baseline_success_rate": c.baseline.success_rate,
             "baseline_failures": _failures(c.baseline),
             "optimized_success_rate": c.optimized.success_rate if c.optimized else None,
             "optimized_failures": _failures(c.optimized) if c.optimized else None,
             "latency_regressions": [r.to_json() for r in
                                     c.latency_regressions(plan.decision.guards.latency_regression_pct)]}
            for c in o.cases
        ],
        "summary": summary_rows(o, ctx),
        "accuracy": ({"spec": {k: list(v) if isinstance(v, tuple) else v for k, v in vars(plan.accuracy).items()},
                      "rows": accuracy_rows(o)} if plan.accuracy is not None else None),
        **o.to_json(),
    }


def _failures(res: ConfigResult) -> str | None:
    """Why a result has no number, or why its requests failed (None when all went well)."""
    if res.status is Status.OK:
        rate = res.success_rate
        return res.error if rate is not None and rate < 1.0 else None
    return res.summary()
