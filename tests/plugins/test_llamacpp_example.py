"""The out-of-tree llama.cpp example plugin against the real llama-server's behaviour.

The plugin is imported from its source tree (tests/external_plugins/llamacpp); the real
server log it is checked against is in that plugin's tests/fixtures (llama-server 0.6.0-dev,
upstream sources, on CPU). The conformance suite on the *installed* plugin runs in
tests/plugin_kit.
"""

from __future__ import annotations

import re
import stat
import sys
from pathlib import Path

import pytest
from perflab import Accelerator, HardwareSnapshot, ServeConfig

PLUGIN_SRC = Path(__file__).resolve().parents[1] / "external_plugins" / "llamacpp"
FIXTURES = PLUGIN_SRC / "tests" / "fixtures"

CPU = HardwareSnapshot(accelerators=(Accelerator(vendor="amd", kind="cpu", index=0, name="AMD EPYC", memory_total_mib=24000,
                                                 cores=2, cpu_list="0-1", source="procfs"),))
GPUS = HardwareSnapshot(accelerators=tuple(Accelerator(vendor="nvidia", kind="cuda", index=i, name="NVIDIA L4",
                                                       memory_total_mib=23034, compute_capability=(8, 9)) for i in range(2)))


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(PLUGIN_SRC))
    sys.modules.pop("perflab_llamacpp", None)
    import perflab_llamacpp

    yield perflab_llamacpp
    sys.modules.pop("perflab_llamacpp", None)


def build(plugin, hw: HardwareSnapshot = CPU, **kw):  # type: ignore[no-untyped-def]
    kw.setdefault("port", 8080)
    return plugin.LlamaCpp().build_launch(ServeConfig(model="/models/tiny-llama.gguf", **kw), hw, Path("/tmp"), None)


def check(plugin, config: ServeConfig, hw: HardwareSnapshot):  # type: ignore[no-untyped-def]
    return plugin.LlamaCpp().check_support(config, hw, None)


def test_ready_patterns_match_the_real_log_ready_lines_only(plugin) -> None:
    lines = (FIXTURES / "server.log").read_text().splitlines()
    patterns = plugin.LlamaCpp().readiness(build(plugin)).ready_log_patterns
    hits = [line for line in lines if any(re.search(p, line) for p in patterns)]
    # the two lines after which the server answers (a ready line only wakes the probes)
    assert hits == ["0.00.080.592 I srv  llama_server: model loaded",
                    "0.00.080.619 I srv  llama_server: listening on http://127.0.0.1:18080"]
    # and the wording of releases before 0.6 (tools/server/server.cpp main())
    old = "main: server is listening on http://127.0.0.1:8080"
    assert any(re.search(p, old) for p in patterns)
    sigterm = (FIXTURES / "sigterm.log").read_text().splitlines()
    assert sum(any(re.search(p, line) for p in patterns) for line in sigterm) == 2


@pytest.mark.parametrize(
    ("out", "version"),
    [
        ("version: 0.6.0-dev (build 1, commit abcdef0)\nbuilt with cc for x86_64-linux-gnu\n", "0.6.0-dev (build 1, commit abcdef0)"),
        ("version: 6123 (9a0e6ab1)\nbuilt with cc for x86_64-linux-gnu\n", "b6123 (9a0e6ab1)"),
        ("llama-server: unknown argument\n", None),
    ],
)
def test_version_formats(plugin, out: str, version: str | None) -> None:
    assert plugin.parse_version(out) == version


def test_version_from_the_executable(plugin, tmp_path: Path) -> None:
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\necho 'version: 0.6.0-dev (build 1, commit abcdef0)' >&2\necho 'built with cc for x86_64-linux-gnu' >&2\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    assert plugin.LlamaCpp().version({"PATH": str(tmp_path)}) == "0.6.0-dev (build 1, commit abcdef0)"
    assert plugin.LlamaCpp().version({"PATH": str(tmp_path / "none")}) is None


def test_ctx_size_is_shared_by_the_slots(plugin) -> None:
    # the real log: n_slots = 4, n_ctx_slot = 1024 -> --ctx-size 4096 --parallel 4 serves 1024 per request
    log = (FIXTURES / "server.log").read_text()
    m = re.search(r"n_slots = (\d+), n_ctx_slot = (\d+)", log)
    assert m
    slots, per_slot = int(m.group(1)), int(m.group(2))
    argv = build(plugin, max_model_len=per_slot, max_num_seqs=slots).argv
    i, j = argv.index("--ctx-size"), argv.index("--parallel")
    assert (int(argv[i + 1]), int(argv[j + 1])) == (slots * per_slot, slots)
    # max_model_len alone: llama-server's default 4 slots, passed explicitly
    argv = build(plugin, max_model_len=2048).argv
    assert argv[argv.index("--ctx-size") + 1] == "8192" and argv[argv.index("--parallel") + 1] == "4"
    argv = build(plugin, max_num_seqs=2).argv
    assert "--ctx-size" not in argv and argv[argv.index("--parallel") + 1] == "2"


def test_runs_on_cpu(plugin) -> None:
    registered = []
    plugin.perflab_register_engines(registered.append)
    (engine,) = registered
    info = engine.info
    assert "cpu" in info.accelerators and info.accelerators[0] == "cuda"
    spec = build(plugin, CPU)
    assert "CUDA_VISIBLE_DEVICES" not in spec.env
    refused = check(plugin, ServeConfig(model="m.gguf", devices=(0,)), CPU)
    assert [u.what for u in refused] == ["devices"]
    assert check(plugin, ServeConfig(model="m.gguf", devices=(0,)), GPUS) == []
    assert build(plugin, GPUS, devices=(1,)).env["CUDA_VISIBLE_DEVICES"] == "1"


# --------------------------------------------------------------------------- the GGUF's own tokenizer

def _gguf(path: Path, kv: dict[str, object]) -> Path:
    """A GGUF v3 file with these metadata keys and no tensors (gguf.md layout)."""
    import struct

    def s(text: str) -> bytes:
        raw = text.encode()
        return struct.pack("<Q", len(raw)) + raw

    def val(v: object) -> tuple[int, bytes]:
        if isinstance(v, str):
            return 8, s(v)
        if isinstance(v, bool):
            return 7, struct.pack("<?", v)
        if isinstance(v, int):
            return 5, struct.pack("<i", v)
        if isinstance(v, list):
            kinds_items = [val(x) for x in v]
            kind = kinds_items[0][0] if kinds_items else 8
            return 9, struct.pack("<IQ", kind, len(v)) + b"".join(b for _, b in kinds_items)
        raise TypeError(v)

    body = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv))
    for k, v in kv.items():
        kind, data = val(v)
        body += s(k) + struct.pack("<I", kind) + data
    path.write_bytes(body)
    return path


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's byte <-> printable-char table (what byte-level BPE vocabularies are written in)
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _tiny_bpe() -> tuple[list[str], list[str]]:
    byte_tokens = list(_bytes_to_unicode().values())
    merges = ["Ġ h", "e l", "l o", "el lo", "Ġh ello", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d"]
    merged = ["Ġh", "el", "lo", "ello", "Ġhello", "Ġw", "or", "Ġwor", "Ġworl", "Ġworld"]
    return byte_tokens + merged + ["<|endoftext|>"], merges


def test_gguf_tokenizer_matches_an_independent_bpe(plugin, tmp_path: Path) -> None:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    from perflab_llamacpp import gguf

    tokens, merges = _tiny_bpe()
    types = [1] * (len(tokens) - 1) + [3]
    path = _gguf(tmp_path / "tiny.gguf", {
        "general.architecture": "qwen3", "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.eos_token_id": len(tokens) - 1,
    })
    meta = gguf.read_metadata(path)
    assert meta["general.architecture"] == "qwen3" and meta["tokenizer.ggml.eos_token_id"] == len(tokens) - 1
    out = gguf.write_tokenizer_json(path, tmp_path / "tokenizer.json")
    ours = Tokenizer.from_file(str(out))
    ref = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, [tuple(m.split(" ")) for m in merges]))
    ref.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(gguf.QWEN2_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    ref.decoder = decoders.ByteLevel()
    # llama-server parses control tokens written in the prompt (tokenize with parse_special)
    ref.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    for text in ["hello world", " hello world 123", "hello<|endoftext|>", "héllo\n\nworld!"]:
        assert ours.encode(text, add_special_tokens=False).ids == ref.encode(text, add_special_tokens=False).ids
    ids = ours.encode(" hello world", add_special_tokens=False).ids
    assert [tokens[i] for i in ids] == ["Ġhello", "Ġworld"]
    assert ours.decode(ids) == " hello world"
    assert ours.encode("<|endoftext|>", add_special_tokens=False).ids == [len(tokens) - 1]  # control token kept whole
    # the bench loads it like any tokenizer.json
    from perflab.bench.tokenizer import load_tokenizer

    tok = load_tokenizer(str(out))
    assert tok.exact and tok.count(" hello world") == 2


@pytest.mark.parametrize(
    ("kv", "message"),
    [
        ({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a"]}, "'llama'"),
        ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": ["a"]}, "'default'"),
    ],
)
def test_gguf_tokenizers_not_rebuilt_are_a_preflight_warning(plugin, tmp_path: Path, kv: dict[str, object], message: str) -> None:
    from perflab_llamacpp import gguf

    path = _gguf(tmp_path / "m.gguf", kv)
    with pytest.raises(gguf.UnsupportedTokenizer, match=message):
        gguf.tokenizer_json(gguf.read_metadata(path))
    (warning,) = check(plugin, ServeConfig(model=str(path)), CPU)
    assert (warning.what, warning.severity) == ("tokenizer", "warning") and "approximate" in warning.why


def test_not_a_gguf(plugin, tmp_path: Path) -> None:
    from perflab_llamacpp import gguf

    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"PK\x03\x04 not gguf")
    with pytest.raises(gguf.GGUFError, match="not a GGUF"):
        gguf.read_metadata(bad)
    assert [u.what for u in check(plugin, ServeConfig(model=str(bad)), CPU)] == ["tokenizer"]
    tokens, merges = _tiny_bpe()
    good = _gguf(tmp_path / "ok.gguf", {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
                                          "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges})
    assert check(plugin, ServeConfig(model=str(good)), CPU) == []
