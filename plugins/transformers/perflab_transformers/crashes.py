"""Named reasons ``transformers serve`` dies, matched in its log (transformers 5.19.0).

Most specific first; perflab.contract.crashes.SHARED_SIGNATURES (model not found: a missing
model path reads ``huggingface_hub.errors.HFValidationError: Repo id must be in the form ...``,
tests/fixtures/real/transformers-5.19.0-cpu/faults/missing-model.log) are tried after these.
"""

from __future__ import annotations

import re

from perflab.contract.crashes import Signature

T = "transformers 5.19.0: transformers"

SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "bad-flag",
        # Typer/Click's usage error: "Error: No such option '--cb-bogus'." (bad-flag.log),
        # "Error: Invalid value for '--port': ..." and "Error: Missing argument ..."
        re.compile(r"^Error: (?:No such option|Invalid value for|Missing argument|Got unexpected extra argument)"),
        "transformers serve refused its command line (Typer's parser, exit code 2)",
        "check extra_args and the engine options against `transformers serve --help` of the installed version",
        f"{T}/cli/serve.py (Typer options of Serve)",
    ),
    Signature(
        "accelerate-missing",
        re.compile(r"requires `accelerate`"),
        "transformers loads the model with a device_map, which needs the accelerate package; it is not installed "
        "in the engine's environment",
        "pip install accelerate in the environment that runs transformers serve",
        f"{T}/integrations/accelerate.py",
    ),
    Signature(
        "serving-deps-missing",
        re.compile(r"Missing dependencies for serving"),
        "transformers serve needs FastAPI and Uvicorn (transformers[serving]); they are not installed",
        "pip install 'transformers[serving]' in the engine's environment",
        f"{T}/cli/serve.py",
    ),
    Signature(
        "bad-option-value",
        re.compile(r"Unsupported quantization method: |Unsupported attention implementation: "),
        "transformers serve refused an option's value (quantization or attention implementation)",
        "quantization: bnb-4bit or bnb-8bit; attention: eager, sdpa, flash_attention_2/3, flex_attention or a hub kernel",
        f"{T}/cli/serving/model_manager.py",
    ),
    Signature(
        "cuda-oom",
        re.compile(r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError: CUDA"),
        "a CUDA allocation failed: the GPU ran out of memory",
        "lower cb_num_blocks / mem_fraction (--cb-max-memory-percent), or use a smaller dtype",
        "https://pytorch.org/docs/stable/generated/torch.cuda.OutOfMemoryError.html",
    ),
    Signature(
        "address-in-use",
        re.compile(r"(?i)address already in use|\[Errno 98\]"),
        "Uvicorn could not bind the port: it is taken",
        "stop whatever holds the port or choose another port",
        "https://github.com/encode/uvicorn/blob/master/uvicorn/server.py",
    ),
)
