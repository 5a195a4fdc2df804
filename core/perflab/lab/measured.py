"""What a measurement holds beside its metrics, declared once.

The executor's :class:`perflab.lab.store.ProfileMeasurement` (what it stores) and the study's
:class:`perflab.lab.study.ConfigResult` (what the store's lookup gives back to decide with) both
carry these fields; both inherit them from :class:`MeasurementExtras`, and the store keeps
exactly :data:`EXTRA_FIELDS` in the ``measurements.extra`` column and in
``measurement-<profile>.json`` (issues #12 and #13).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


# kw_only: the fields go after the subclass's own in ``__init__`` (``ConfigResult(Status.OK,
# metrics, 200, capacity=8.0)`` keeps working) and may have defaults before its required ones
@dataclass(kw_only=True)
class MeasurementExtras:
    """The measurement's extras: ``repeats``, each repeat's metrics (one entry per repeat when
    there are more than one; ``metrics`` is their mean for numeric keys); ``noise``, their
    relative standard deviation in % per metric (empty with one repeat); ``points``, a sweep's
    or a max-load search's load points in load order (``{"load": {...}, "metrics", "repeats",
    "noise", "slo_met"}``); ``capacity``, the search's highest load meeting the SLO;
    ``stopped_early``, the figures that stopped it early; ``observed``, what was watched while it
    ran (:data:`perflab.observe.OBSERVED_KEYS`: server_metrics, telemetry, energy, cost),
    summaries only (the series are in the run directory)."""

    repeats: list[dict[str, Any]] = field(default_factory=list)
    noise: dict[str, float] = field(default_factory=dict)
    points: list[dict[str, Any]] = field(default_factory=list)
    capacity: float | None = None
    stopped_early: dict[str, Any] | None = None
    observed: dict[str, Any] = field(default_factory=dict)

    def extra(self) -> dict[str, Any]:
        """The extras by name, in declaration order (as stored)."""
        return {k: getattr(self, k) for k in EXTRA_FIELDS}


EXTRA_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(MeasurementExtras))
"""The names of :class:`MeasurementExtras`' fields: what the store keeps beside the metrics."""
