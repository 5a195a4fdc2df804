"""MindIE's installed version, read from its ``version.info`` file.

MindIE's set_env.sh exports ``MIES_INSTALL_PATH=/usr/local/Ascend/mindie/latest/mindie-service``
and the package's ``version.info`` sits one level up, in ``/usr/local/Ascend/mindie/latest``
(the installation guide: ``cat /usr/local/Ascend/mindie/latest/version.info``). Both
``$MIES_INSTALL_PATH/version.info`` and ``$MIES_INSTALL_PATH/../version.info`` are tried.
The file is ``key : value`` lines::

    Ascend-mindie : MindIE 2.1.RC2.B080
    mindie-rt: 2.1.RC2.B080
    mindie-torch: 2.1.RC2.B080
    mindie-service: 2.1.RC2.B080
    mindie-llm: 2.1.RC2.B080
    mindie-sd:2.1.RC2.B080
    Platform : aarch64

The ``Ascend-mindie`` value (without its ``MindIE`` prefix) is the version; ``mindie-service``
then ``mindie-llm`` are fallbacks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

DEFAULT_INSTALL_PATH = "/usr/local/Ascend/mindie/latest/mindie-service"
VERSION_FILE = "version.info"
KEYS = ("ascend-mindie", "mindie-service", "mindie-llm")


def parse_version_info(text: str) -> str | None:
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            values[key.strip().lower()] = value.strip()
    for key in KEYS:
        value = re.sub(r"(?i)^mindie\s+", "", values.get(key, "")).strip()
        if value:
            return value
    return None


def version_files(env: Mapping[str, str]) -> list[Path]:
    install = Path(env.get("MIES_INSTALL_PATH") or DEFAULT_INSTALL_PATH)
    return [install / VERSION_FILE, install.parent / VERSION_FILE]


def installed_version(env: Mapping[str, str]) -> str | None:
    for path in version_files(env):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        version = parse_version_info(text)
        if version:
            return version
    return None


def release(version: str | None) -> tuple[int, int] | None:
    """``2.1.RC1`` -> (2, 1); None when unknown or unparsable."""
    m = re.match(r"\s*(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None
