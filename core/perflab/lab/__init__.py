"""The lab: run a whole study from a plan file and write it up.

* :mod:`perflab.lab.plan` — the plan file schema and its validation;
* :mod:`perflab.lab.options` — serving-option dictionaries, deltas and configurations;
* :mod:`perflab.lab.study` — the seeds' method (engine selection, one optimization at a time,
  combinations, other benchmark cases) as a pure function over a ``measure`` callback;
* :mod:`perflab.lab.store` — the study directory: SQLite index and one directory per run;
* :mod:`perflab.lab.run.executor` — measuring one configuration for real (supervisor + bench);
* :mod:`perflab.lab.run.runner` — ties them together, resumable, Ctrl-C safe;
* :mod:`perflab.lab.report` / :mod:`perflab.lab.report.chart` — Markdown, report.json and the PNG;
  :mod:`perflab.lab.report.publish` writes them (with report.html, audited); :mod:`perflab.lab.report.stored`
  rebuilds a study's outcome from its store for ``perflab report``, ``compare`` and ``audit``;
* :mod:`perflab.lab.progress` — the live display; :mod:`perflab.lab.demo` — ``perflab demo``.
"""
