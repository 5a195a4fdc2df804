"""When each request is sent: ``vllm bench serve``'s arrival process.

``request_rate = inf`` sends everything at once (``--max-concurrency`` then paces it).
Otherwise the gaps are gamma-distributed with shape ``burstiness`` and mean ``1/rate``
(burstiness 1 is a Poisson process; below 1 burstier, above 1 more regular, ``inf``
constant gaps), and, as vLLM does, the cumulative times are rescaled so that the last request
is sent at exactly ``n / rate`` — runs with different seeds then offer the same load.
Source: vllm/benchmarks/serve.py ``get_request``. The draws use Python's ``random`` (vLLM
uses numpy's), so individual times differ from vLLM's for the same seed; the distribution
is the same.
"""

from __future__ import annotations

import math
import random


def arrival_offsets(n: int, request_rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Send time of each of ``n`` requests, in seconds after the first dispatch."""
    if n <= 0:
        return []
    if math.isinf(request_rate):
        return [0.0] * n
    if burstiness <= 0 or request_rate <= 0:
        raise ValueError("request rate and burstiness must be positive")
    rng = random.Random(seed)
    if math.isinf(burstiness):
        gaps = [1.0 / request_rate] * n
    else:
        theta = 1.0 / (request_rate * burstiness)
        gaps = [rng.gammavariate(burstiness, theta) for _ in range(n)]
    offsets = []
    total = 0.0
    for g in gaps:
        total += g
        offsets.append(total)
    if offsets[-1] > 0:
        factor = (n / request_rate) / offsets[-1]
        offsets = [o * factor for o in offsets]
    return offsets
