"""Running a small plan as a whole study on the simulator, quietly (the lab's slow tests)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import anyio


def run_sim_study(plan_text: str, out: Path, parallel: int | str = 1, stream: Any = None, **decision: Any) -> Any:
    """``perflab run`` of ``plan_text`` into ``out``; ``decision``: plan.decision fields to
    replace (``early_stop=False`` ...); ``parallel``: ``perflab run --parallel``. Returns the RunSummary."""
    from perflab.lab.plan import load_plan_text
    from perflab.lab.progress import StudyProgress
    from perflab.lab.run.runner import run_study
    from perflab.plugins import load

    plan = load_plan_text(plan_text, path=f"{out.name}.yaml")
    if decision:
        plan = dataclasses.replace(plan, decision=dataclasses.replace(plan.decision, **decision))
    with open(os.devnull, "w") as sink:
        progress = StudyProgress(plan.name, live=False, stream=stream or sink)
        return anyio.run(lambda: run_study(load(), plan, out, progress=progress, parallel=parallel))
