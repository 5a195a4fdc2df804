"""The tokenizer inside a GGUF file, for counting tokens exactly as llama-server does.

llama-server tokenizes with the vocabulary stored in the model file itself (the
``tokenizer.ggml.*`` keys written by llama.cpp's convert_hf_to_gguf.py; format:
ggml-org/ggml docs/gguf.md). A client that guesses token counts from words would be silently
approximate, so this module reads those keys and rebuilds the same tokenizer as a Hugging
Face ``tokenizer.json`` (which ``perflab bench --tokenizer FILE`` loads):

* ``tokenizer.ggml.model == "gpt2"`` — byte-level BPE (GPT-2, Llama 3, Qwen2/3, ...):
  ``tokens`` is the vocabulary (ids are positions), ``merges`` the BPE merges, and
  ``tokenizer.ggml.pre`` names the pre-tokenizer regex (``llama_vocab::impl::load`` in
  src/llama-vocab.cpp maps it to the regexes below).
* anything else (``llama`` SentencePiece, ``bert`` WordPiece, ...) raises
  :class:`UnsupportedTokenizer`: the caller must say so, never fall back quietly.

Only the metadata is read (the tensors are skipped), with the standard library.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

MAGIC = b"GGUF"

# GGUF value types (gguf.md, "enum gguf_metadata_value_type")
_SCALARS: dict[int, str] = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9

#: Pre-tokenizer regexes by ``tokenizer.ggml.pre`` (src/llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_*).
GPT2_REGEX = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"""
LLAMA3_REGEX = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_REGEX = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_REGEXES: dict[str, str] = {
    "gpt-2": GPT2_REGEX,  # ("default" is another, multi-regex pre-tokenizer: not rebuilt)
    "llama3": LLAMA3_REGEX,
    "llama-bpe": LLAMA3_REGEX,
    "smaug-bpe": LLAMA3_REGEX,
    "qwen2": QWEN2_REGEX,
    "deepseek-r1-qwen": QWEN2_REGEX,
}
#: ``tokenizer.ggml.token_type`` values that are special, not text (llama.h LLAMA_TOKEN_TYPE_*)
CONTROL, USER_DEFINED = 3, 4


class GGUFError(ValueError):
    """Not a GGUF file, or a truncated one."""


class UnsupportedTokenizer(ValueError):
    """The GGUF's tokenizer kind cannot be rebuilt exactly here."""


def _reader(fh: BinaryIO, endian: str) -> tuple[Callable[[str], Any], Callable[[], str]]:
    def scalar(fmt: str) -> Any:
        size = struct.calcsize(endian + fmt)
        data = fh.read(size)
        if len(data) != size:
            raise GGUFError("truncated GGUF metadata")
        return struct.unpack(endian + fmt, data)[0]

    def string() -> str:
        n = scalar("Q")
        data = fh.read(n)
        if len(data) != n:
            raise GGUFError("truncated GGUF string")
        return data.decode("utf-8", errors="replace")

    return scalar, string


def read_metadata(path: str | Path) -> dict[str, Any]:
    """Every metadata key of a GGUF (v2/v3) file; arrays become lists."""
    with open(path, "rb") as fh:
        if fh.read(4) != MAGIC:
            raise GGUFError(f"{path}: not a GGUF file (no 'GGUF' magic)")
        raw = fh.read(4)
        endian = "<" if struct.unpack("<I", raw)[0] < 0x10000 else ">"  # big-endian files exist
        version = struct.unpack(endian + "I", raw)[0]
        if version < 2:
            raise GGUFError(f"{path}: GGUF version {version} is not supported (v2 and v3 are)")
        scalar, string = _reader(fh, endian)
        scalar("Q")  # tensor count
        n_kv = scalar("Q")

        def value(kind: int) -> Any:
            if kind in _SCALARS:
                return scalar(_SCALARS[kind])
            if kind == _STRING:
                return string()
            if kind == _ARRAY:
                item_kind, count = scalar("I"), scalar("Q")
                return [value(item_kind) for _ in range(count)]
            raise GGUFError(f"{path}: unknown GGUF value type {kind}")

        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = string()
            meta[key] = value(scalar("I"))
        return meta


def tokenizer_json(meta: dict[str, Any]) -> dict[str, Any]:
    """A Hugging Face ``tokenizer.json`` (as a dict) equal to the GGUF's own tokenizer."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise UnsupportedTokenizer(
            f"GGUF tokenizer model {kind!r}: only byte-level BPE ('gpt2') is rebuilt; pass --tokenizer with the "
            "model's tokenizer.json"
        )
    pre = str(meta.get("tokenizer.ggml.pre", "default"))
    regex = PRE_REGEXES.get(pre)
    if regex is None:
        known = ", ".join(sorted(PRE_REGEXES))
        raise UnsupportedTokenizer(f"GGUF pre-tokenizer {pre!r} is not one of {known}; pass --tokenizer")
    tokens: list[str] = list(meta.get("tokenizer.ggml.tokens") or [])
    if not tokens:
        raise UnsupportedTokenizer("the GGUF has no tokenizer.ggml.tokens")
    types: list[int] = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    merges = [m for m in meta.get("tokenizer.ggml.merges") or []]
    special = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": types[i] == CONTROL}
        for i, t in enumerate(tokens)
        if i < len(types) and types[i] in (CONTROL, USER_DEFINED)
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": special,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            ],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": merges,
        },
    }


def write_tokenizer_json(gguf_path: str | Path, out: str | Path) -> Path:
    """Write the GGUF's tokenizer as ``out`` (a tokenizer.json) and return its path."""
    out = Path(out)
    out.write_text(json.dumps(tokenizer_json(read_metadata(gguf_path)), ensure_ascii=False))
    return out
