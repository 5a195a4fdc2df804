"""The consistency rules of ``perflab audit``: each one a named check of one benchmark result
(vLLM ``--save-result`` field names) or of one summary-table row, with a one-line message
that quotes the numbers.

Definitions are vLLM's (``vllm/benchmarks/serve.py``, ``calculate_metrics``, vLLM 0.11 to
0.33; perflab.bench.metrics has the same): throughputs are counts / benchmark duration; a
request's TPOT is (E2EL − TTFT) / (output tokens − 1); ``max_output_tokens_per_s`` is the
largest number of output tokens (vLLM: chunks) whose arrival falls into one one-second
bucket; vLLM's ``max_concurrent_requests`` is the largest number of requests touching one
such bucket, perflab's the exact maximum of overlapping requests.

Numbers carry their written precision: a value printed with two decimals stands for anything
within ±0.005 of it (a JSON number for what its digits say: 0.49 is 0.485 to 0.495, a computed
float is itself), and every comparison allows for that (interval arithmetic) before it adds
its own tolerance (see each rule). The tolerances are listed in
``docs/user-guide.md`` ("perflab audit").
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from perflab.bench.metrics import BenchMetrics, name_of, stat_name


@dataclass(frozen=True)
class Rule:
    name: str
    checks: str  # what it checks, one line (``perflab audit --help``, docs)


RULES: tuple[Rule, ...] = (
    Rule("throughput", "request/output/total token throughput = completed requests / input+output tokens ÷ duration"),
    Rule("tpot-latency", "mean TPOT agrees with (mean E2EL − mean TTFT) / (output tokens per request − 1)"),
    Rule("latency-duration", "requests fit in the run: mean E2EL ≤ duration × concurrency ÷ completed requests"),
    Rule("stat-order", "mean and median TTFT/TPOT/E2EL ≤ P99 (ITL: within the run), percentiles increase, "
                       "all inside [min, max]"),
    Rule("peak-output", "peak output tok/s ≤ the tokens the requests of one second can generate"),
    Rule("peak-concurrency", "peak concurrent requests ≤ requests sent, and ≤ the configured max concurrency"),
    Rule("table-change", "a table's (+x%) change recomputed from the two numbers of its row"),
)
RULE_NAMES = tuple(r.name for r in RULES)

# Relative slack on top of the printing precision for identities that hold exactly
# (counts ÷ duration): floating point and a time-scaled simulator's conversions.
EXACT_REL = 1e-3
# Fixed output length (random datasets): mean TPOT = (mean E2EL − mean TTFT)/(n − 1) holds
# exactly; 2 % covers requests that stop early at EOS without moving the mean much.
FIXED_LEN_REL = 0.02
# Varying output lengths (ShareGPT): the mean of per-request ratios is not the ratio of the
# means (short requests weigh as much as long ones); on perflab's simulated ShareGPT runs (the
# demo study) the two differ by 1 to 14 % — a factor of 2 either way is an inconsistency.
VARIABLE_LEN_FACTOR = 2.0
LATENCIES = ("ttft", "tpot", "itl", "e2el")


@dataclass(frozen=True)
class Issue:
    rule: str
    message: str


class Num:
    """A number as it was written: ``value`` ± ``half`` (half a unit of its last digit)."""

    __slots__ = ("half", "value")

    def __init__(self, value: float, half: float = 0.0) -> None:
        self.value, self.half = float(value), float(half)

    @property
    def lo(self) -> float:
        return self.value - self.half

    @property
    def hi(self) -> float:
        return self.value + self.half


def _written_half(v: float) -> float:
    """Half a unit of the last digit of a JSON number as written: 0.49 stands for 0.485 to
    0.495 (a result copied from a printed block); a computed float's 16 digits stand for itself."""
    text = repr(v)
    if "e" in text or "." not in text:
        return 0.0
    decimals = len(text.split(".")[1])
    return 0.5 * 10.0 ** -decimals if decimals <= 6 else 0.0


def _gt(a: Num, b: Num) -> bool:
    """``a`` is surely greater than ``b``: beyond both printing precisions and float noise
    (a simulator's identical values give mean == P99)."""
    return a.lo > b.hi + 1e-9 * max(1.0, abs(b.value))


def _f(x: float) -> str:
    return f"{x:.2f}" if abs(x) < 1e6 else f"{x:,.0f}"


def _pct(x: float, digits: int = 2) -> str:
    return f"{x:+.{digits}f}%".replace("-", "−")


@dataclass(frozen=True)
class ResultView:
    """One result's numbers with their precision, and how they were produced."""

    metrics: BenchMetrics
    printed: bool = False  # read from a printed block: floats ±0.005, seconds ±0.005 s
    # how max_concurrent_requests was counted: "exact" (perflab's client: the true overlap),
    # "buckets" (vLLM: requests touching a one-second bucket), "unknown" (a printed vLLM 0.33
    # block: perflab's and vLLM's look alike) — each bound is applied only where it holds
    peak_counting: str = "unknown"
    num_prompts: int | None = None
    details: Mapping[str, Any] | None = None  # per-request lists of a --save-result JSON

    def __post_init__(self) -> None:
        object.__setattr__(self, "metrics", BenchMetrics.of(self.metrics))  # a report's or a file's, as read

    def fig(self, get: Callable[[BenchMetrics], object]) -> Num | None:
        """The figure ``get`` reads, with its precision (:meth:`num`)."""
        return self.num(name_of(get))

    def num(self, key: str) -> Num | None:
        v = self.metrics.get(key)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or math.isnan(v) or math.isinf(v):
            return None
        if isinstance(v, int) and not (self.printed and key.endswith("_ms")):
            return Num(v)
        if not self.printed:
            return Num(v, _written_half(float(v)))
        seconds = key.endswith("_e2el_ms") and "latency" in (self.metrics.get("percentile_metrics") or ())
        return Num(v, 5.0 if seconds else 0.005)

    def sent(self) -> int | None:
        done = self.metrics.completed
        if self.num_prompts:
            return int(self.num_prompts)
        if isinstance(done, (int, float)):
            return int(done) + int(self.metrics.failed or 0)
        return None

    def concurrency(self) -> tuple[float, str] | None:
        """The most requests in flight at once: the configured cap, else the peak measured
        (vLLM's bucket count is ≥ the true overlap, so it bounds it too), else the requests."""
        cap = self.metrics.max_concurrency
        if isinstance(cap, (int, float)) and cap > 0:
            return float(cap), "max concurrency"
        peak = self.fig(lambda m: m.max_concurrent_requests)
        if peak is not None and peak.value > 0:
            return peak.hi, "peak concurrent requests"
        sent = self.sent()
        return (float(sent), "requests") if sent else None


def _ratio_range(count: float, d: Num) -> tuple[float, float]:
    return count / (d.hi if d.hi > 0 else d.value), count / (d.lo if d.lo > 0 else d.value)


def check_throughput(r: ResultView) -> list[Issue]:
    out: list[Issue] = []
    d = r.fig(lambda m: m.duration)
    if d is None or d.value <= 0:
        return out
    tin, tout = r.fig(lambda m: m.total_input_tokens), r.fig(lambda m: m.total_output_tokens)
    done = r.fig(lambda m: m.completed)
    figures: tuple[tuple[Callable[[BenchMetrics], object], str, Num | None, str], ...] = (
        (lambda m: m.request_throughput, "request throughput", done, "requests"),
        (lambda m: m.output_throughput, "output throughput", tout, "output tokens"),
        (lambda m: m.total_token_throughput, "total token throughput",
         Num(tin.value + tout.value) if tin and tout else None, "input+output tokens"),
    )
    for get, label, count, what in figures:
        rep = r.fig(get)
        if rep is None or count is None:
            continue
        lo, hi = _ratio_range(count.value, d)
        if rep.hi < lo * (1 - EXACT_REL) or rep.lo > hi * (1 + EXACT_REL):
            expected = count.value / d.value
            out.append(Issue("throughput", f"{label} {_f(rep.value)}/s but {count.value:.0f} {what} in {_f(d.value)} s "
                                           f"is {_f(expected)}/s ({_pct((rep.value / expected - 1) * 100, 1)})"))
    return out


def _tokens_per_request(r: ResultView) -> tuple[float, bool] | None:
    """Mean output tokens per completed request, and whether every request had that many."""
    tout, done = r.metrics.total_output_tokens, r.metrics.completed
    if not isinstance(tout, (int, float)) or not isinstance(done, (int, float)) or done <= 0:
        return None
    n = tout / done
    lens = [x for x in (r.details or {}).get("output_lens") or [] if x]
    fixed = len(set(lens)) == 1 if lens else abs(n - round(n)) < 1e-9
    return n, fixed


def _per_request_tpot(details: Mapping[str, Any]) -> float | None:
    """vLLM's mean TPOT from a --save-detailed result's per-request lists, in ms."""
    ttfts, lats, lens = details.get("ttfts"), details.get("latencies"), details.get("output_lens")
    if not (isinstance(ttfts, list) and isinstance(lats, list) and isinstance(lens, list)):
        return None
    if not (len(ttfts) == len(lats) == len(lens)):
        return None
    errors = details.get("errors") if isinstance(details.get("errors"), list) and len(details["errors"]) == len(lens) else None
    tpots = [(lat - ttft) / (n - 1) for i, (ttft, lat, n) in enumerate(zip(ttfts, lats, lens, strict=True))
             if n and n > 1 and not (errors and errors[i])]
    return math.fsum(tpots) / len(tpots) * 1000 if tpots else None


def check_tpot_latency(r: ResultView) -> list[Issue]:
    tpot, ttft, e2el = r.fig(lambda m: m.mean_tpot_ms), r.fig(lambda m: m.mean_ttft_ms), r.fig(lambda m: m.mean_e2el_ms)
    per_req = r.details and _per_request_tpot(r.details)
    if tpot is not None and per_req:
        if abs(tpot.value - per_req) > tpot.half + per_req * EXACT_REL:
            return [Issue("tpot-latency", f"mean TPOT {_f(tpot.value)} ms but its requests' (E2EL − TTFT)/(tokens − 1) "
                                          f"average {_f(per_req)} ms")]
        return []
    tpr = _tokens_per_request(r)
    if tpot is None or ttft is None or e2el is None or tpr is None or tpr[0] <= 1:
        return []
    n, fixed = tpr
    lo = (e2el.lo - ttft.hi) / (n - 1)
    hi = (e2el.hi - ttft.lo) / (n - 1)
    expected = (e2el.value - ttft.value) / (n - 1)
    if fixed:
        bad = tpot.hi < lo * (1 - FIXED_LEN_REL) or tpot.lo > hi * (1 + FIXED_LEN_REL)
    else:
        bad = tpot.hi * VARIABLE_LEN_FACTOR < lo or tpot.lo > hi * VARIABLE_LEN_FACTOR
    if not bad:
        return []
    how = f"every request {n:.0f} tokens" if fixed else f"{n:.1f} tokens per request on average"
    return [Issue("tpot-latency", f"mean TPOT {_f(tpot.value)} ms but (mean E2EL {_f(e2el.value)} − mean TTFT "
                                  f"{_f(ttft.value)} ms)/({n:.1f} − 1) = {_f(expected)} ms ({how})")]


def check_latency_duration(r: ResultView) -> list[Issue]:
    """Σ E2EL = ∫ requests in flight dt ≤ concurrency × duration (Little's law as a bound).
    Without E2EL, a fixed output length gives it: E2EL = TTFT + TPOT × (n − 1) per request."""
    d, done = r.fig(lambda m: m.duration), r.metrics.completed
    conc = r.concurrency()
    if d is None or not isinstance(done, (int, float)) or done <= 0 or conc is None:
        return []
    e2el = r.fig(lambda m: m.mean_e2el_ms)
    derived = ""
    if e2el is None:
        tpr = _tokens_per_request(r)
        ttft, tpot = r.fig(lambda m: m.mean_ttft_ms), r.fig(lambda m: m.mean_tpot_ms)
        if tpr is None or not tpr[1] or ttft is None or tpot is None or tpr[0] <= 1:
            return []
        n = tpr[0]
        e2el = Num(ttft.value + tpot.value * (n - 1), ttft.half + tpot.half * (n - 1))
        derived = f" (mean TTFT {_f(ttft.value)} ms + mean TPOT {_f(tpot.value)} ms × {n - 1:.0f} tokens)"
    c, what = conc
    limit_s = min(d.hi, d.hi * c / done)
    if e2el.lo / 1000 <= limit_s * (1 + EXACT_REL):
        return []
    bound = (f"{done:.0f} requests, at most {c:.0f} at a time ({what}), in {_f(d.value)} s"
             if limit_s < d.hi else f"the run took {_f(d.value)} s")
    return [Issue("latency-duration", f"mean E2EL {_f(e2el.value / 1000)} s{derived} but {bound} "
                                      f"allow at most {_f(limit_s)} s per request")]


_PCT_RE = re.compile(r"^p(\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")


def _detail_values(r: ResultView, metric: str) -> list[float] | None:
    """A latency's per-request values (seconds) from the result's lists, when it has them."""
    d = r.details or {}
    if metric == "e2el":
        lats, errs = d.get("latencies"), d.get("errors")
        if not isinstance(lats, list):
            return None
        if isinstance(errs, list) and len(errs) == len(lats):
            return [x for x, e in zip(lats, errs, strict=True) if not e]
        return [x for x in lats if x]  # vLLM writes 0.0 for a failed request
    if metric == "ttft" and isinstance(d.get("ttfts"), list):
        errs = d.get("errors")
        ok = [not e for e in errs] if isinstance(errs, list) and len(errs) == len(d["ttfts"]) else [True] * len(d["ttfts"])
        return [x for x, good in zip(d["ttfts"], ok, strict=True) if good]
    if metric == "itl" and isinstance(d.get("itls"), list):
        return [g for gaps in d["itls"] if isinstance(gaps, list) for g in gaps]
    return None


def check_stat_order(r: ResultView) -> list[Issue]:
    out: list[Issue] = []
    for m in LATENCIES:
        label = m.upper()
        stats: list[tuple[str, Num]] = []
        mean, median = r.num(stat_name("mean", m)), r.num(stat_name("median", m))
        pcts = sorted((float(g.group(1)), k) for k in r.metrics if (g := _PCT_RE.match(k)) and g.group(2) == m)
        pvals = [(p, v) for p, k in pcts if (v := r.num(k)) is not None]
        p99 = next((v for p, v in pvals if p == 99.0), None)
        # percentiles, the median among them (P50), in increasing order
        chain = sorted([*((p, f"P{p:g}", v) for p, v in pvals), *([(50.0, "median", median)] if median else [])],
                       key=lambda t: t[0])
        for (_, na, a), (_, nb, b) in itertools.pairwise(chain):
            if _gt(a, b):
                out.append(Issue("stat-order", f"{na} {label} {_f(a.value)} ms > {nb} {label} {_f(b.value)} ms "
                                               "(percentiles cannot decrease)"))
        if mean is not None and p99 is not None and _gt(mean, p99):
            # mean ≤ 0.99·P99 + 0.01·(mean of the top 1 %): what the top 1 % would need
            top = (mean.value - 0.99 * p99.value) / 0.01
            d = r.fig(lambda x: x.duration)
            if m != "itl":
                out.append(Issue("stat-order", f"mean {label} {_f(mean.value)} ms > P99 {label} {_f(p99.value)} ms "
                                               f"(the slowest 1 % of requests would have to average {_f(top)} ms)"))
            elif d is not None and top > d.hi * 1000 * (1 + EXACT_REL):
                # token gaps have a heavy tail (preemptions, other requests' prefills stall
                # every stream): only a gap longer than the whole run is impossible
                out.append(Issue("stat-order", f"mean ITL {_f(mean.value)} ms > P99 ITL {_f(p99.value)} ms: the "
                                               f"slowest 1 % of gaps would have to average {_f(top / 1000)} s, longer "
                                               f"than the {_f(d.value)} s run"))
        values = _detail_values(r, m)
        if values:
            lo, hi = min(values) * 1000, max(values) * 1000
            stats = [(n, v) for n, v in (("mean", mean), ("median", median), *((f"P{p:g}", v) for p, v in pvals))
                     if v is not None]
            for name, v in stats:
                slack = max(v.half, 1e-6 * max(abs(hi), 1.0))
                if v.value < lo - slack or v.value > hi + slack:
                    out.append(Issue("stat-order", f"{name} {label} {_f(v.value)} ms outside its requests' "
                                                   f"[min {_f(lo)}, max {_f(hi)}] ms"))
        for key in (stat_name("mean", m), stat_name("median", m)):
            stat = r.num(key)
            if stat is not None and stat.hi < 0:
                out.append(Issue("stat-order", f"{key} is negative ({_f(stat.value)} ms)"))
    return out


def check_peak_output(r: ResultView) -> list[Issue]:
    peak, tout = r.fig(lambda m: m.max_output_tokens_per_s), r.fig(lambda m: m.total_output_tokens)
    if peak is None or tout is None:
        return []
    if peak.lo > tout.value * (1 + EXACT_REL):
        return [Issue("peak-output", f"peak output {_f(peak.value)} tok/s > the {tout.value:.0f} output tokens of the "
                                     "whole run (one second cannot hold more)")]
    # vLLM's peak concurrency counts the requests touching a one-second bucket: the bucket's
    # tokens come from those requests, each at most its length (known when fixed)
    tpr = _tokens_per_request(r)
    conc = r.fig(lambda m: m.max_concurrent_requests)
    if r.peak_counting == "buckets" and tpr and tpr[1] and conc is not None and conc.value > 0:
        bound = conc.hi * tpr[0]
        if peak.lo > bound * (1 + EXACT_REL):
            return [Issue("peak-output", f"peak output {_f(peak.value)} tok/s > {conc.value:.0f} concurrent requests × "
                                         f"{tpr[0]:.0f} tokens each = {bound:.0f} tokens (all they generate)")]
    return []


def check_peak_concurrency(r: ResultView) -> list[Issue]:
    peak = r.fig(lambda m: m.max_concurrent_requests)
    if peak is None:
        return []
    sent = r.sent()
    if sent is not None and peak.lo > sent:
        return [Issue("peak-concurrency", f"peak concurrent requests {_f(peak.value)} > the {sent} requests sent")]
    cap = r.metrics.max_concurrency
    # vLLM counts a request in every second it touches, so back-to-back requests read as
    # concurrent (vllm/benchmarks/serve.py, "concurrent_requests_per_second"): only perflab's
    # exact count is held to the cap
    if r.peak_counting == "exact" and isinstance(cap, (int, float)) and cap > 0 and peak.lo > cap:
        return [Issue("peak-concurrency", f"peak concurrent requests {_f(peak.value)} > max concurrency {cap:.0f}")]
    return []


RESULT_CHECKS = (check_throughput, check_tpot_latency, check_latency_duration, check_stat_order,
                 check_peak_output, check_peak_concurrency)


def check_result(r: ResultView) -> list[Issue]:
    return [issue for check in RESULT_CHECKS for issue in check(r)]


# --------------------------------------------------------------------------- tables

_NUMBER = r"(\d+(?:\.\d+)?)"
_LINE_RE = re.compile(r"^\s*(?:\*\*)?([A-Za-z][\w ()/.-]*?)\s*:\s*" + _NUMBER + r"(?:\s*[x×]\s*(\d+))?")
_CHANGE_RE = re.compile(r"\(\s*([+\-−])\s*" + _NUMBER + r"\s*%\s*\)")


def _decimals(text: str) -> int:
    return len(text.split(".")[1]) if "." in text else 0


def _cell_lines(cell: str) -> list[str]:
    return [x for x in re.split(r"<br\s*/?>|\n", cell) if x.strip()]


def _figures(cell: str) -> dict[str, tuple[Num, tuple[float, Num] | None, str]]:
    """``label -> (value, change, text)`` for each ``Label: 123.45[x2] [(+x%)]`` line of a cell."""
    out: dict[str, tuple[Num, tuple[float, Num] | None, str]] = {}
    for line in _cell_lines(cell):
        m = _LINE_RE.match(re.sub(r"<[^>]+>", "", line))
        if not m:
            continue
        label, raw, mult = m.group(1).strip(), m.group(2), int(m.group(3) or 1)
        value = Num(float(raw) * mult, 0.5 * 10 ** -_decimals(raw) * mult)
        c = _CHANGE_RE.search(line)
        change = None
        if c:
            sign = -1.0 if c.group(1) in "-−" else 1.0
            change = (sign * float(c.group(2)), Num(sign * float(c.group(2)), 0.5 * 10 ** -_decimals(c.group(2))))
        out.setdefault(label, (value, change, raw + (f"x{mult}" if mult != 1 else "")))
    return out


def check_table_row(cells: Sequence[str]) -> tuple[int, list[Issue]]:
    """A row whose cells show ``Label: X (+p%)`` in one and ``Label: Y`` in another: p must be
    X/Y − 1 (within the printed digits of X, Y and p). Returns the changes checked and the issues."""
    figs = [_figures(c) for c in cells]
    out: list[Issue] = []
    checked = 0
    for i, f in enumerate(figs):
        for label, (x, change, xtext) in f.items():
            if change is None:
                continue
            refs = [g[label] for j, g in enumerate(figs) if j != i and label in g and g[label][1] is None]
            if len(refs) != 1:
                continue
            y, _, ytext = refs[0]
            if y.value <= 0:
                continue
            checked += 1
            lo = ((x.lo / y.hi) - 1) * 100
            hi = ((x.hi / y.lo) - 1) * 100
            stated = change[1]
            if stated.hi < lo - 1e-9 or stated.lo > hi + 1e-9:
                actual = (x.value / y.value - 1) * 100
                digits = max(_decimals(f"{abs(stated.value)}"), 1)
                out.append(Issue("table-change", f"{label} {xtext} vs {ytext}: stated {_pct(stated.value, digits)}, "
                                                 f"recomputed {_pct(actual, digits)}"))
    return checked, out
