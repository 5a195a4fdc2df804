"""The parts of an engine's lifecycle that :mod:`perflab.supervisor` puts together.

* :mod:`.ports` — free ports, "is this port still bound, and by whom".
* :mod:`.procs` — start an engine through the keeper, notice its exit at once, find and
  stop everything it spawned (process group, session, descendants, an environment marker
  scoped to study and run), find running engines for ``perflab ps``/``perflab kill``.
* :mod:`.keeper` — the double-forked child subreaper between perflab and each engine: when
  perflab dies (its lifeline pipe closes), it stops the engine's tree.
* :mod:`.output` — stream the engine's stdout/stderr to its log file, keep a tail.
* :mod:`.readiness_probe` — HTTP probes and the one-token generation that prove an engine serves.
* :mod:`.registry` — every live engine of this process, torn down on Ctrl-C/SIGTERM/exit.
"""
