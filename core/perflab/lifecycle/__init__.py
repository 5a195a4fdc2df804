"""The parts of an engine's lifecycle that :mod:`perflab.supervisor` puts together.

* :mod:`.ports` — free ports, "is this port still bound, and by whom".
* :mod:`.procs` — start a process in its own session, notice its exit at once, find and
  kill everything it spawned (process group, session, descendants, an environment marker).
* :mod:`.output` — stream the engine's stdout/stderr to its log file, keep a tail.
* :mod:`.readiness_probe` — HTTP probes and the one-token generation that prove an engine serves.
* :mod:`.registry` — every live engine of this process, torn down on Ctrl-C/SIGTERM/exit.
"""
