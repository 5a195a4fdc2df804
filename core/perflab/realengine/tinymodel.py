"""Build a tiny Qwen3-architecture model from nothing: no hub, no download.

A byte-level BPE tokenizer (2048 entries) is trained with ``tokenizers`` on text generated
here from a fixed seed, a tiny ``Qwen3ForCausalLM`` ``config.json`` is written (hidden size 256,
4 layers, 4 heads of 64, 2 KV heads, 2048 positions), and random weights are saved as
``model.safetensors``. Everything is deterministic: the same script gives the same bytes.

Real engines (vLLM's CPU build) load and serve it, which is all perflab's real-engine tests
need: the output is random text, but the server, its scheduler, streaming, metrics, crashes
and teardown are the engine's own.

This file is a standalone script on purpose: it runs under the *engine's* Python (which has
``numpy``, ``tokenizers`` and ``safetensors``), not perflab's::

    /path/to/vllm-env/bin/python core/perflab/realengine/tinymodel.py OUT_DIR
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

VOCAB_SIZE = 2048
HIDDEN = 256
LAYERS = 4
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 64
INTERMEDIATE = 512
MAX_POSITIONS = 2048
SEED = 20261124

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Qwen-style ChatML template (the structure of Qwen3's, without tools and thinking).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

WORDS = (
    "the a an of to in and for on with by at from as is are was be this that it its engine "
    "server model token tokens request requests latency throughput batch cache prefix prompt "
    "output input decode prefill memory device accelerator kernel graph tensor parallel expert "
    "quantization weight weights layer attention head scheduler queue stream first time per "
    "second mean median p99 percentile benchmark study report configuration flag option launch "
    "ready health metrics crash teardown process port worker core thread node cluster rank "
    "gpu npu cpu fp8 int4 awq bf16 float half speculative draft accept reject sequence length "
    "context window maximum minimum number count rate concurrency goodput slo target objective "
    "which how why what when where who will would could should can may might must not no yes "
    "fast slow small large tiny huge better worse best worst more less most least high low "
    "one two three four five six seven eight nine ten hundred thousand million zero "
    "run runs running started stopped failed passed measured compared chosen adopted skipped"
).split()


def corpus(n_sentences: int = 4000) -> list[str]:
    rng = random.Random(SEED)
    lines = []
    for _ in range(n_sentences):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 18))]
        sentence = " ".join(words).capitalize() + rng.choice([".", ".", ".", "?", "!"])
        if rng.random() < 0.2:
            sentence += f" {rng.randint(0, 99999)}"
        lines.append(sentence)
    return lines


def build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "model_max_length": MAX_POSITIONS,
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "unk_token": None,
                "add_bos_token": False,
                "clean_up_tokenization_spaces": False,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
        + "\n"
    )


def build_config(out: Path, vocab_size: int, eos_id: int, pad_id: int) -> None:
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": True,
        "use_cache": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": LAYERS,
        "initializer_range": 0.02,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "torch_dtype": "bfloat16",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": eos_id, "eos_token_id": [eos_id], "pad_token_id": pad_id}, indent=2) + "\n"
    )


def build_weights(out: Path, vocab_size: int) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(SEED)

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones((n,), dtype=np.float32)

    tensors = {"model.embed_tokens.weight": normal(vocab_size, HIDDEN), "model.norm.weight": ones(HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": ones(HIDDEN),
            p + "post_attention_layernorm.weight": ones(HIDDEN),
            p + "self_attn.q_proj.weight": normal(HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.k_proj.weight": normal(KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.v_proj.weight": normal(KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.o_proj.weight": normal(HIDDEN, HEADS * HEAD_DIM),
            p + "self_attn.q_norm.weight": ones(HEAD_DIM),
            p + "self_attn.k_norm.weight": ones(HEAD_DIM),
            p + "mlp.gate_proj.weight": normal(INTERMEDIATE, HIDDEN),
            p + "mlp.up_proj.weight": normal(INTERMEDIATE, HIDDEN),
            p + "mlp.down_proj.weight": normal(HIDDEN, INTERMEDIATE),
        }
    # float32 on disk (numpy has no bfloat16); the engine casts to the dtype it runs in.
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def build(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    eos_id, pad_id = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    if eos_id is None or pad_id is None:  # build_tokenizer always adds both
        raise RuntimeError(f"{out / 'tokenizer.json'} lacks <|im_end|> or <|endoftext|>")
    build_config(out, vocab, eos_id=eos_id, pad_id=pad_id)
    build_weights(out, vocab)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: tinymodel.py OUT_DIR", file=sys.stderr)
        return 2
    print(build(Path(argv[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
