"""The server-clock protocol, declared once: a server that stamps its own event times.

Any engine may offer it. A request carrying :data:`SERVER_CLOCK_HEADER` asks the server to
write, before the events of each step of its scheduler, an SSE comment
``: perflab-server-clock <t> <arrival>``: the step's end and the request's arrival on the
server's own clock (seconds). Comment lines are ignored by every SSE client (WHATWG rules), and
a server that does not offer the protocol ignores the unknown header, so asking is harmless.
The bench (:mod:`perflab.bench.runner`) asks when the lab knows the server offers it
(``BenchRequest.server_clock``), times the run on those stamps, and verifies them (every
request stamped, arrival before end). perflab's simulator (the perflab-sim distribution)
offers it, so simulated numbers are reproducible however loaded the host is.

A server whose clock runs faster than the host's (a simulator) also says so on every response
(:data:`TIME_SCALE_HEADER`): the bench's probe reads it, and measures in the server's seconds.
"""

from __future__ import annotations

import math

#: SSE comment a server writes, when the request asks (SERVER_CLOCK_HEADER), before the
#: events of each scheduler step:
#: ``: perflab-server-clock <t> <arrival>`` — the step's end and the request's arrival in the
#: engine's model time (seconds). Comment lines are ignored by every SSE client (WHATWG rules);
#: perflab's bench client reads them only when the lab knows the server offers the protocol
#: (BenchRequest.server_clock and the probe's answer, docs/simulator.md "Reproducible time").
SERVER_CLOCK_COMMENT = b"perflab-server-clock"
#: request header asking a server for those stamps; without it the stream is byte for
#: byte the real engine's, and a real engine ignores an unknown header. Value ``1``, or
#: ``burst <id>`` for the requests of one all-at-once batch (request rate inf): the engine stamps
#: that batch's requests with one arrival time, however long the host takes to send them.
SERVER_CLOCK_HEADER = "x-perflab-server-clock"
SERVER_CLOCK_BURST = "burst"
#: ``loop <id> <n> <c>``: the requests of one closed loop — ``n`` requests, at most ``c`` at
#: once, the next sent as soon as one ends (request rate inf with ``max_concurrency`` c < n, one
#: engine). The engine holds its model clock until the first ``c`` have arrived, and, each time
#: a request of the loop ends while fewer than ``n`` have arrived, until the next one does: the
#: client's reaction time (host time, ×scale in model time) is not the engine's.
SERVER_CLOCK_LOOP = "loop"
#: response header of a server whose clock runs faster than real time, on every response: its
#: value is the server's seconds per real second (``40``). The bench (its probe request) then
#: sends ``request_rate × scale`` requests per real second, multiplies what it measures by the
#: scale, and asks for the server-clock stamps when the lab asks for them; a server without it is
#: timed by the host's clock.
TIME_SCALE_HEADER = "x-perflab-time-scale"
#: response header of a server on a model clock (a simulator), on every response: the engine
#: seconds its start-up (launch to serving: loading weights, initialisation) and its teardown
#: take on that clock, ``<startup> <teardown>``. The lab counts them, not the host's wall time x
#: the time scale, in a simulated launch's engine-hours (the host's speed would move them).
LIFECYCLE_HEADER = "x-perflab-lifecycle"
#: an engine on a model clock that fails before it serves (no response carries the header)
#: writes the same value — its start-up until the failure, its teardown — to the file this
#: environment variable names, when the lab sets it (simulated launches)
LIFECYCLE_FILE_ENV = "PERFLAB_LIFECYCLE_FILE"


def format_lifecycle(startup_s: float, teardown_s: float) -> str:
    return f"{startup_s:.3f} {teardown_s:.3f}"


def parse_lifecycle(value: str) -> tuple[float, float] | None:
    """``(startup, teardown)`` engine seconds of a :data:`LIFECYCLE_HEADER` value; None if malformed."""
    parts = value.split()
    if len(parts) != 2:
        return None
    try:
        startup, teardown = float(parts[0]), float(parts[1])
    except ValueError:
        return None
    return (startup, teardown) if startup >= 0 and teardown >= 0 and math.isfinite(startup + teardown) else None


def clock_header_value(*, count: int, request_rate: float, max_concurrency: int | None, engines: int,
                       tag: str) -> str:
    """The :data:`SERVER_CLOCK_HEADER` value for a run of ``count`` requests sent at
    ``request_rate`` (inf: as fast as allowed) to ``engines`` endpoints; ``tag`` names the run."""
    if math.isinf(request_rate) and max_concurrency is not None and max_concurrency < count and engines == 1:
        return f"{SERVER_CLOCK_LOOP} {tag} {count} {max_concurrency}"
    if math.isinf(request_rate):
        return f"{SERVER_CLOCK_BURST} {tag}"
    return "1"


def parse_loop(value: str) -> tuple[str, int, int] | None:
    """``(id, n, c)`` of a ``loop`` header value; None for any other value."""
    parts = value.split()
    if len(parts) != 4 or parts[0] != SERVER_CLOCK_LOOP:
        return None
    try:
        n, c = int(parts[2]), int(parts[3])
    except ValueError:
        return None
    return (parts[1], n, c) if 0 < c < n else None


def format_clock(t: float, arrival: float) -> bytes:
    """The comment line (with its newline) stamping an engine step that ended at model time
    ``t`` for a request that arrived at ``arrival``."""
    return b": " + SERVER_CLOCK_COMMENT + f" {t:.6f} {arrival:.6f}\n".encode()


def parse_clock(value: bytes) -> tuple[float, float] | None:
    """``(t, arrival)`` from a comment's text after the prefix; None if malformed."""
    parts = value.split()
    if len(parts) != 2:
        return None
    try:
        t, arrival = float(parts[0]), float(parts[1])
    except ValueError:
        return None
    if not (math.isfinite(t) and math.isfinite(arrival)):
        return None
    return t, arrival
