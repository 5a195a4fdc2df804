"""The options of SGLang's server (``python -m sglang.launch_server``), release 0.5.5.

Extracted, in declaration order, from ``ServerArgs.add_cli_args`` in
python/sglang/srt/server_args.py of the PyPI wheel sglang==0.5.5 (choices lists resolved from
the module's ``*_CHOICES`` constants, ``ReasoningParser.DetectorMap`` and
``FunctionCallParser.ToolCallParserEnum``; defaults from the ``ServerArgs`` dataclass).
Help texts are left out. The rows are data, in perflab_sim/data/sglang_args.json. ``prepare_server_args`` parses them with a plain
``argparse.ArgumentParser()``.

Row: (option strings, extra argparse keywords) with keywords among action, type ("str",
"int", "float", "json_list_type", "nullable_str"), choices, nargs, const, default, required.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

Row = tuple[tuple[str, ...], dict[str, Any]]

V0_5_5: tuple[Row, ...] = tuple(
    (tuple(options), kwargs)
    for options, kwargs in json.loads(resources.files("perflab_sim").joinpath("data/sglang_args.json").read_text())["0.5.5"]
)
