"""Client-side tokenizers: how perflab counts tokens and builds prompts of an exact length.

Three kinds, chosen by :func:`load_tokenizer` (``--tokenizer``):

``whitespace``
    The rule of perflab's simulated engines (perflab-sim's tokenizer): a text is
    ``len(text.split())`` tokens and every generated token is one word. Random prompts of N
    words are exactly N tokens on the simulator. The default when the server is perflab's
    simulator (it answers with the header ``x-perflab-time-scale``,
    :data:`perflab.bench.serverclock.TIME_SCALE_HEADER`).
``hf``
    A Hugging Face fast tokenizer read from a local ``tokenizer.json`` (or a model directory
    holding one) through the ``tokenizers`` library. Random prompts are built from token ids
    and re-encoded until they are exactly N tokens (special tokens such as BOS excluded, as
    ``vllm bench serve`` counts them).
``approx``
    No tokenizer available (a hub model id, no network). Prompts are N common English words,
    each a single token in the usual BPE vocabularies (GPT-2, Llama, Qwen); lengths of other
    texts are estimated with a GPT-2-style pre-tokenizer split. Input and output token totals
    are then taken from the server's ``usage`` (``prompt_tokens``, ``completion_tokens``).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from perflab.contract.errors import UsageError

# Common English words that are one token (with their leading space) in GPT-2, Llama-3 and
# Qwen2/3 vocabularies; prompts made of them have about one token per word on any server.
WORDS: tuple[str, ...] = tuple(
    dict.fromkeys(
        """
    the of and to in is was for on that with as by at from his her he she it an be are this
    which or had not but were have they one you all we can there their been has more if will
    would when who so no out up about into only what time some could them other than then
    its also two first new after year years most over such made many these may people
    world like where between did state just back through way under well city because both
    during should each those work life use while part three being high four before down
    school family very own last country great found since long house several day even
    same small world old good home water number group game name music line city power
    land place right left show book team war end set line form area place light hand side
    point field level cost head open play story early river party start given body best
    case real free love war air past today hard film known local major late word kind
    near road south north east west fire sound ground rate plan week money test short term
    black white red green blue gold stone glass paper table door room car ship train road
    bridge tower park garden tree flower bird fish horse dog cat king queen prince church
    market bank price trade farm food bread milk wine tea coffee salt sugar fruit apple
    """.split()
    )
)

_GPT2_PIECES = re.compile(r"""'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+""")


class Tokenizer(Protocol):
    """What the benchmark needs from a tokenizer."""

    kind: str  # "whitespace" | "hf" | "approx"
    name: str  # shown in results (tokenizer_id)
    exact: bool  # counts equal the server's (False: estimates)

    def count(self, text: str) -> int: ...

    def random_text(self, rng: random.Random, n: int) -> tuple[str, int]:
        """A random text of ``n`` tokens and its actual token count."""
        ...


@dataclass
class WhitespaceTokenizer:
    """The simulated engines' rule: one token per whitespace-separated word."""

    kind: str = "whitespace"
    name: str = "whitespace"
    exact: bool = True

    def count(self, text: str) -> int:
        return len(text.split())

    def random_text(self, rng: random.Random, n: int) -> tuple[str, int]:
        return " ".join(rng.choices(WORDS, k=n)), n


@dataclass
class ApproxTokenizer:
    """No real tokenizer: common words for prompts, a GPT-2-like split to estimate lengths."""

    kind: str = "approx"
    name: str = "approx"
    exact: bool = False

    def count(self, text: str) -> int:
        return sum(1 for piece in _GPT2_PIECES.findall(text) if not piece.isspace())

    def random_text(self, rng: random.Random, n: int) -> tuple[str, int]:
        return " ".join(rng.choices(WORDS, k=n)), n


class HFTokenizer:
    """A ``tokenizers`` fast tokenizer from a local ``tokenizer.json``."""

    kind = "hf"
    exact = True

    def __init__(self, path: Path, name: str | None = None) -> None:
        try:
            from tokenizers import Tokenizer as _Tok
        except ImportError:  # pragma: no cover - the dependency is declared
            raise UsageError("--tokenizer needs the 'tokenizers' package: pip install 'perflab[tokenizers]'") from None
        self.path = path
        self.name = name or str(path)
        self._tok = _Tok.from_file(str(path))
        # Added (special) tokens are left out of the draw; decoding skips any that slip in.
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=False)
        self._clean: list[int] | None = None

    def _candidates(self) -> list[int]:
        """Ids that decode on their own to valid text: a lone byte-level token of a multi-byte
        character decodes to U+FFFD, which re-encodes to more tokens, and the length loop
        would chase it. Computed once per tokenizer (off the timed path)."""
        if self._clean is None:
            clean = [i for i in range(self.vocab_size) if (t := self.decode([i])) and "\ufffd" not in t and t.strip()]
            self._clean = clean or list(range(self.vocab_size))
        return self._clean

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def random_text(self, rng: random.Random, n: int) -> tuple[str, int]:
        """Random ids, decoded and re-encoded until the text is exactly ``n`` tokens.

        Decoding then re-encoding can merge or split tokens at the seams (vLLM's
        ``RandomDataset`` notes the same); the loop truncates or tops up with more random
        ids, a few rounds at most, and returns the text's real count.
        """
        if n <= 0:
            return "", 0
        cands = self._candidates()
        ids = rng.choices(cands, k=n)
        for _ in range(16):
            text = self.decode(ids)
            re_ids = self.encode(text)
            if len(re_ids) == n:
                return text, n
            if len(re_ids) > n:
                ids = re_ids[:n]
            else:
                ids = re_ids + rng.choices(cands, k=n - len(re_ids))
        text = self.decode(ids)
        return text, self.count(text)


def _find_tokenizer_json(spec: str) -> Path | None:
    path = Path(spec).expanduser()
    if path.is_file() and path.name.endswith(".json"):
        return path
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return path / "tokenizer.json"
    return None


def load_tokenizer(spec: str | None, *, model: str | None = None, simulated: bool = False) -> Tokenizer:
    """Resolve ``--tokenizer``.

    :param spec: ``"whitespace"``, ``"approx"``, a ``tokenizer.json`` path, a directory
        holding one, or ``None``/``"auto"``.
    :param model: the model name; a local model directory provides its tokenizer in auto mode.
    :param simulated: the server is perflab's simulator (auto mode then uses whitespace).
    """
    if spec in (None, "", "auto"):
        if simulated:
            return WhitespaceTokenizer()
        if model:
            found = _find_tokenizer_json(model)
            if found is not None:
                return HFTokenizer(found, name=model)
            if Path(model).expanduser().exists():
                # a local model without a tokenizer.json (a GGUF file, say): say so on stderr
                # (stdout may be --json), never count silently approximately
                import sys

                print(f"perflab: warning: no tokenizer.json for {model}: prompt lengths are approximate; "
                      "pass --tokenizer FILE (for a GGUF, the llama.cpp example plugin's "
                      "perflab_llamacpp.gguf.write_tokenizer_json writes its own)", file=sys.stderr)
        return ApproxTokenizer()
    if spec == "whitespace":
        return WhitespaceTokenizer()
    if spec in ("approx", "none"):
        return ApproxTokenizer()
    found = _find_tokenizer_json(spec)
    if found is None:
        raise UsageError(
            f"--tokenizer {spec!r}: expected 'whitespace', 'approx', a tokenizer.json file or a "
            "local model directory containing tokenizer.json (hub ids are not downloaded)"
        )
    return HFTokenizer(found, name=spec)


def tokenizer_spec(tok: Tokenizer) -> str:
    """A spec that :func:`load_tokenizer` turns back into the same tokenizer (for workers)."""
    if isinstance(tok, HFTokenizer):
        return str(tok.path)
    return tok.kind
