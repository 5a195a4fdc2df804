"""The engine's own metrics during a benchmark (issue #13): the ``server_metrics`` watcher.

The engine's plugin names its Prometheus endpoint and which of its metric names mean what
(the optional ``metrics`` engine method, :class:`~perflab.contract.types.MetricsEndpoint`).
:class:`MetricsWatcher` GETs that endpoint on every replica of a launch at each sample
(:func:`perflab.observe.watch` paces it: about every engine second), parses the text with
``prometheus_client``'s parser and reduces it to one value per role
(:data:`~perflab.contract.types.METRIC_ROLES`): counts and counters are summed over their label sets
(vLLM's data-parallel ranks, ``finished_reason`` ...) and over the replicas; the KV-cache usage
is the fullest rank's (a full rank is what preempts); a hit-rate or acceptance gauge is the
mean of its series.

The summary (:meth:`MetricsWatcher.summarize`) is the agreed ``server_metrics`` shape::

    {"source": "/metrics", "samples": n,
     "kv_cache_usage": {"peak": 0..1, "mean": 0..1}, "running": {"peak", "mean"},
     "waiting": {"peak", "mean"}, "preemptions": int,
     "prefix_cache_hit_rate": 0..1 | None, "spec_decode_acceptance": 0..1 | None}

Counters are taken as their change between the first and the last sample of the benchmark
(the warm-up requests the bench sends first are inside it); a key is absent when the engine
does not export that metric. A scrape that fails is logged once per endpoint and skipped:
never a failure of the measurement.
"""

from __future__ import annotations

import functools
import math
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any

import anyio
import httpx
import structlog
from prometheus_client.parser import text_string_to_metric_families

from perflab import redact
from perflab.contract.types import MetricsEndpoint
from perflab.observe import Sample, timed_run
from perflab.plugins import PluginManager

log = structlog.get_logger(__name__)

KEY = "server_metrics"
SCRAPE_TIMEOUT_S = 3.0  # a loaded engine answers /metrics in milliseconds; more is a failed scrape
#: the gauges summarized as peak and mean (the others are rates, folded into one figure)
LEVELS = ("kv_cache_usage", "running", "waiting")
#: (the rate's key in the summary, its counters (numerator, denominator), its gauge)
RATES = (
    ("prefix_cache_hit_rate", ("prefix_cache_hits", "prefix_cache_queries"), "prefix_cache_hit_rate"),
    ("spec_decode_acceptance", ("spec_decode_accepted", "spec_decode_draft"), "spec_decode_acceptance"),
)
RATE_GAUGES = tuple(gauge for _, _, gauge in RATES)
# the endpoints whose failure was already logged (once per endpoint, whatever the profile)
_noted: set[str] = set()


def _base(name: str) -> str:
    """A family name as the parser gives it: a counter's ``_total`` is not part of it."""
    return name.removesuffix("_total")


def parse(texts: Sequence[str], endpoint: MetricsEndpoint) -> dict[str, float]:
    """One value per role the endpoint names, from the exposition texts of the replicas (a
    role none of them exports is absent)."""
    wanted: dict[str, str] = {_base(name): role for role, name in endpoint.names().items()}
    series: dict[str, list[float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            role = wanted.get(_base(family.name))
            if role is None:
                continue
            for s in family.samples:
                # a counter's samples are NAME_total and NAME_created; only the first counts
                if family.type == "counter" and not s.name.endswith("_total"):
                    continue
                if math.isfinite(s.value):
                    series.setdefault(role, []).append(float(s.value))
    out: dict[str, float] = {}
    for role, values in series.items():
        if role == "kv_cache_usage":
            out[role] = max(values)
        elif role in RATE_GAUGES:
            out[role] = fmean(values)
        else:
            out[role] = math.fsum(values)
    return out


def _delta(samples: Sequence[Sample], role: str) -> float | None:
    """A counter's change over the samples (after a restart of the engine: its last value)."""
    got = [s.values[role] for s in samples if role in s.values]
    if not got:
        return None
    change = got[-1] - got[0]
    return change if change >= 0 else got[-1]


def summarize(samples: Sequence[Sample], source: str = "/metrics") -> dict[str, Any] | None:
    """The agreed ``server_metrics`` summary of a benchmark's samples (None: no sample)."""
    if not samples:
        return None
    out: dict[str, Any] = {"source": source, "samples": len(samples)}
    # where the timed run's start and end were sampled (perflab.observe.TimedRun), the figures
    # are the timed run's: the loading and the warm-up before it are not part of the measurement
    samples = timed_run(samples) or samples
    for role in LEVELS:
        got = [s.values[role] for s in samples if role in s.values]
        if got:
            out[role] = {"peak": round(max(got), 4), "mean": round(fmean(got), 4)}
    preemptions = _delta(samples, "preemptions")
    if preemptions is not None:
        out["preemptions"] = round(preemptions)
    for key, (num, den), gauge in RATES:
        hits, total = _delta(samples, num), _delta(samples, den)
        # a rate gauge holds the engine's latest batches: at the first sample (before this
        # benchmark's requests, or its timed run's) those of the previous one
        gauges = [s.values[gauge] for s in samples[1:] or samples if gauge in s.values]
        if total is not None and hits is not None:
            out[key] = round(min(1.0, hits / total), 4) if total > 0 else None
        elif gauges:
            # a gauge that never left 0 for the acceptance: no speculative decoding
            idle = key == "spec_decode_acceptance" and not any(gauges)
            out[key] = None if idle else round(fmean(gauges), 4)
    return out


@dataclass(frozen=True)
class Target:
    """One replica's metrics URL and the headers its clients send."""

    url: str
    headers: Mapping[str, str]


class MetricsWatcher:
    """Scrapes one launch's replicas (:class:`perflab.observe.Watcher`, key ``server_metrics``)."""

    key = KEY

    def __init__(self, endpoint: MetricsEndpoint, targets: Sequence[Target], timeout_s: float = SCRAPE_TIMEOUT_S) -> None:
        self.endpoint = endpoint
        self.targets = tuple(targets)
        self.timeout_s = timeout_s
        self.failures = 0

    async def _get(self, client: httpx.AsyncClient, target: Target, into: list[str | None], i: int) -> None:
        try:
            resp = await client.get(target.url, headers=dict(target.headers))
            resp.raise_for_status()
            into[i] = resp.text
        except httpx.HTTPError as exc:
            self.failures += 1
            if target.url not in _noted:
                _noted.add(target.url)
                missing = isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code == 404
                log.warning("observe.metrics-scrape-failed", url=target.url, error=f"{type(exc).__name__}: {exc}",
                            hint=(self.endpoint.missing_hint if missing else "") or None,
                            note="the engine's metrics are skipped where they fail; the measurement goes on")

    async def sample(self) -> Mapping[str, float] | None:
        texts: list[str | None] = [None] * len(self.targets)
        async with (
            httpx.AsyncClient(timeout=self.timeout_s, trust_env=False, verify=_tls()) as client,
            anyio.create_task_group() as tg,
        ):
            for i, target in enumerate(self.targets):
                tg.start_soon(self._get, client, target, texts, i)
        if any(t is None for t in texts):
            return None  # a replica missing: its counters would make the sums jump
        try:
            return parse([t for t in texts if t is not None], self.endpoint) or None
        except ValueError as exc:  # not Prometheus text
            if self.endpoint.path not in _noted:
                _noted.add(self.endpoint.path)
                log.warning("observe.metrics-unparsable", path=self.endpoint.path, error=str(exc))
            return None

    def summarize(self, samples: Sequence[Sample]) -> dict[str, Any] | None:
        return summarize(samples, self.endpoint.path)


@functools.cache
def _tls() -> ssl.SSLContext:
    """The TLS context of every scrape, made once: a client's default one loads the system CA
    bundle (about 18 ms of CPU, holding the GIL), and a scrape comes every engine second while
    the benchmark's client shares the process."""
    return ssl.create_default_context()


def metrics_url(base_url: str, endpoint: MetricsEndpoint) -> str:
    """The endpoint's URL on a replica serving at ``base_url`` (its own port, if it has one)."""
    url = httpx.URL(base_url)
    if endpoint.port is not None:
        url = url.copy_with(port=endpoint.port)
    return str(url.copy_with(path=endpoint.path, query=None))


def metrics_watchers(pm: PluginManager, engine: str, instances: Sequence[Any], env: Mapping[str, str] | None = None) -> list[MetricsWatcher]:
    """The watcher of a launch's engine metrics: one for all its replicas (``instances``: the
    running engines, each with ``launch`` and ``base_url``); none when the plugin names no
    endpoint (or the engine is not registered). ``env``: the lab's environment (an API key there
    is sent as the bench sends it)."""
    rec = pm.engines.get(engine)
    if rec is None:
        return []
    targets: list[Target] = []
    endpoint: MetricsEndpoint | None = None
    for inst in instances:
        found = rec.metrics(inst.launch)
        if found is None:
            continue
        endpoint = endpoint or found
        headers = redact.auth_headers(inst.launch.argv, {**(env or {}), **inst.launch.env})
        targets.append(Target(metrics_url(inst.base_url, found), headers))
    return [MetricsWatcher(endpoint, targets)] if endpoint is not None and targets else []


__all__ = ["KEY", "MetricsWatcher", "Target", "metrics_url", "metrics_watchers", "parse", "summarize"]
