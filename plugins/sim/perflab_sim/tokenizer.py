"""The simulated engines' tokenizer: one token per whitespace-separated word.

Simulated engines have no vocabulary, so token counts follow one rule the benchmark client
reproduces exactly (``perflab``'s bench counts simulated tokens with these functions):

- a text is ``len(text.split())`` tokens (Python's ``str.split()``: runs of any whitespace
  separate words, leading/trailing whitespace is ignored);
- a completion prompt is a string, a list of strings (the first one is used, as a batch of one),
  or token ids (a list of ints counts its length);
- a chat prompt is the contents of all messages joined with newlines: string contents as is,
  list contents by their ``{"type": "text"}`` parts; other parts (images) count nothing. No
  chat template tokens are added;
- an empty prompt counts as one token (the BOS token every engine adds);
- generated text is ``" tok"`` per token, so it splits back into exactly as many words.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

OUTPUT_TOKEN = " tok"


def count_text(text: str) -> int:
    return len(text.split())


def chat_text(messages: Sequence[Mapping[str, Any]]) -> str:
    parts: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, Mapping) and part.get("type") == "text":
                    parts.append(str(part.get("text", "")))
    return "\n".join(parts)


def completion_prompt(prompt: Any) -> tuple[str | None, int]:
    """(prompt text or None for token ids, token count) of an OpenAI ``prompt`` field."""
    if isinstance(prompt, str):
        return prompt, max(1, count_text(prompt))
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, int):
            return None, max(1, len(prompt))
        if isinstance(first, str):
            return first, max(1, count_text(first))
        if isinstance(first, list):
            return None, max(1, len(first))
    return "", 1


def chat_prompt(messages: Sequence[Mapping[str, Any]]) -> tuple[str, int]:
    text = chat_text(messages)
    return text, max(1, count_text(text))


def output_text(tokens: int) -> str:
    return OUTPUT_TOKEN * tokens


def block_hashes(text: str | None, block_size: int) -> tuple[int, ...]:
    """Chained hashes of the prompt's full blocks of ``block_size`` words, as a prefix cache
    keys blocks: equal hashes mean equal prefixes up to and including that block."""
    if not text:
        return ()
    words = text.split()
    out: list[int] = []
    prev = b""
    for start in range(0, len(words) - block_size + 1, block_size):
        digest = hashlib.blake2b(prev + "\x00".join(words[start : start + block_size]).encode(), digest_size=8).digest()
        out.append(int.from_bytes(digest, "big"))
        prev = digest
    return tuple(out)
