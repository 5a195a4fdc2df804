"""The report writer against the seeds' own tables (seed 002's conclusion, seed 001's replicas)."""

from __future__ import annotations

import json

import anyio

from perflab.contract.status import Status
from perflab.lab.options import Configuration
from perflab.lab.plan import Profile, load_plan_text
from perflab.lab.report import ReportContext, build_json, render_markdown
from perflab.lab.report.publish import write_report
from perflab.lab.study import ConfigResult, conduct

DISPLAY = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
A100 = {"accelerators": [{"name": "NVIDIA A100-SXM4-80GB", "memory_total_mib": 81920, "compute_capability": [8, 0],
                          "driver_version": "550.127.05", "kind": "cuda"}] * 8, "host": "sim-host"}
CTX = ReportContext(display=DISPLAY, versions={"vllm": "0.11.0", "sglang": "0.5.5.post1", "trtllm": "1.2.0rc1"},
                    hardware=A100, hardware_spec="sim:a100-80g-x8", simulated=True, time_scale=30.0)


def _outcome(text, measure):
    plan = load_plan_text(text)
    return anyio.run(lambda: conduct(plan, measure, display=lambda e: DISPLAY.get(e, e)))


def _section(md: str, title: str) -> str:
    start = md.index(title)
    nxt = md.find("\n## ", start + len(title))
    return md[start: nxt if nxt >= 0 else len(md)]


def test_seed_002_report(seed_002, seed_measure):
    text, key = seed_002
    o = _outcome(text, seed_measure(key))
    md = render_markdown(o, CTX)

    # the seeds' structure, in order
    heads = ["# Optimizing Qwen3-32B Throughput on NVIDIA A100 GPUs", "## Conclusion", "## Optimization Objective",
             "## Experimental Setup", "### Model", "### Hardware", "### Engine Version", "### Benchmark Dataset",
             "### Benchmark Script", "## Experiment Results", "### 1. Choosing the Inference Engine",
             "### 2. Quantization in TensorRT-LLM/vLLM", "### 3. Max Batched Token Numbers in TensorRT-LLM",
             "### Summary of Optimization Options", "### Other Benchmark Cases"]
    positions = [md.index(h) for h in heads]
    assert positions == sorted(positions)
    assert md.index('> [!WARNING]\n> **Simulated study**') < md.index("## Conclusion")

    conclusion = _section(md, "## Conclusion")
    assert "![seed-002](chart.png)" in conclusion
    assert "trtllm-serve Qwen/Qwen3-32B" in conclusion  # the recommended command
    assert "| Benchmark Case | baseline (vLLM without any optimizations) | Optimized |" in conclusion
    green, red = '<span style="background-color:lightgreen;">', '<span style="background-color:#fbcaca;">'
    rows = {
        "ShareGPT": ("Total TPS: 1730.98<br>Mean TPOT(ms): 149.67", f"Total TPS: 2054.21 {green}(+18.7%)</span><br>Mean TPOT(ms): 89.01"),
        # the price of the decision (issue #24): Short Prompt's mean TPOT more than triples, flagged
        "Short Prompt": ("Total TPS: 2656.71<br>Mean TPOT(ms): 528.57", f"Total TPS: 3535.54 {green}(+33.1%)</span><br>Mean TPOT(ms): 1885.18 "
                         f"{red}(+256.7%)</span><br>{red}⚠ Latency worse than the baseline by more than 10%: mean TPOT +256.7%; "
                         "median TPOT +293.1%; p99 TPOT +292.7%"),
        "Medium Prompt": ("Total TPS: 2521.38<br>Mean TPOT(ms): 143.23", f"Total TPS: 2715.90 {green}(+7.7%)</span><br>Mean TPOT(ms): 145.49"),
        "Long Prompt": ("Total TPS: 1837.08<br>Mean TPOT(ms): 96.19", f"Total TPS: 2037.67 {green}(+10.9%)</span><br>Mean TPOT(ms): 100.09"),
        # the seed prints -13.8% here; the records give -12.1%
        "Very Long Prompt": ("Total TPS: 1798.45<br>Mean TPOT(ms): 67.87", f"Total TPS: 1580.36 {red}(-12.1%)</span><br>Mean TPOT(ms): 47.37"),
    }
    for label, (base, opt) in rows.items():
        assert f"| **{label}** | {base} | {opt}" in conclusion, label
    assert "worse than the baseline's by more than 10% on 4 of 5 workloads" in conclusion

    setup = _section(md, "## Experimental Setup")
    assert "8 × NVIDIA A100-SXM4-80GB (80 GiB, compute capability 8.0)" in setup
    for line in ("- vLLM: v0.11.0", "- SGLang: v0.5.5.post1", "- TensorRT-LLM: v1.2.0rc1"):
        assert line in setup
    assert "--random-input-len 32000 --random-output-len 100 --num-prompts 100 --seed 42" in setup

    results = _section(md, "## Experiment Results")
    assert "Result: TensorRT-LLM (2054.21 tok/s) > vLLM (1730.98 tok/s) > SGLang (1398.38 tok/s)" in results
    assert "Total Token throughput (tok/s):          2054.21" in results  # the vllm bench serve block
    assert "# KeyError: 'weight'" in results
    assert "# RuntimeError: Unsupported SM version for FP8 block scaling GEMM" in results
    assert "# Engine log: runs/x/engine.log" in results

    summary = _section(md, "### Summary of Optimization Options")
    assert f"| Engine Selection | {green}+18.7%</span> |" in summary
    assert "| Quantization | - |" in summary and "| Max Batched Token Numbers | - |" in summary

    other = md[md.index("### Other Benchmark Cases"):]
    assert other.count("============ Serving Benchmark Result ============") == 8  # 4 profiles × 2
    assert "# Very Long Prompt" in other

    data = build_json(o, CTX)
    assert data["simulated"] is True and data["recommended_command"] == "trtllm-serve Qwen/Qwen3-32B"
    assert [round(r["change_pct"], 1) for r in data["conclusion"]] == [18.7, 33.1, 7.7, 10.9, -12.1]
    assert data["summary"][0]["option"] == "Engine Selection"
    json.dumps(data)


def test_report_files(tmp_path, seed_002, seed_measure):
    text, key = seed_002
    o = _outcome(text, seed_measure(key))
    paths = write_report(o, CTX, tmp_path)
    png = paths["chart"].read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000
    data = json.loads(paths["json"].read_text())
    assert data["steps"][0]["chosen"] == "TensorRT-LLM"
    assert paths["markdown"].read_text().startswith("# Optimizing Qwen3-32B")


def test_replicas_refusals_and_low_success(seed_measure):
    """Seed 001's two TP4 instances, a preflight refusal, and seed 004's skipped optimization."""
    text = """
model: Qwen/Qwen3-235B-A22B-Instruct-2507
engines: [vllm, sglang]
serve: {tp: 8}
candidates:
  - name: Quantization
    engines: [winner, vllm]
    set: {model: Qwen/Qwen3-235B-A22B-Instruct-2507-FP8}
  - name: Parallelism
    engines: [vllm]
    set: {model: Qwen/Qwen3-235B-A22B-Instruct-2507-FP8, tp: 4, replicas: 2}
  - name: Speculative Decoding
    set: {speculative_config: {method: mtp, num_speculative_tokens: 4}}
profiles: {sharegpt: {label: ShareGPT, dataset: synthetic-sharegpt, num_prompts: 1000}}
"""
    base = seed_measure(lambda c, p: None)

    async def measure(config: Configuration, profiles: list[Profile], *, step, label, to_beat=None):
        o = config.options
        if config.engine == "sglang" and o["model"].endswith("FP8"):
            return {p.name: ConfigResult(Status.UNSUPPORTED, reasons=[{"what": "model=...-FP8 (FP8 checkpoint)",
                                                           "why": "NVIDIA A100-SXM4-80GB is SM80; SGLang's FP8 kernels need SM89+",
                                                           "source": "https://github.com/sgl-project/sglang/issues/5871",
                                                           "severity": "error"}],
                                   script="python3 -m sglang.launch_server --model-path Qwen/Qwen3-235B-A22B-Instruct-2507-FP8 --tp-size 8")
                    for p in profiles}
        rid = {("vllm", 8, False): "001-00", ("sglang", 8, False): "001-01", ("vllm", 8, True): "001-02",
               ("vllm", 4, True): "001-03"}.get((config.engine, o["tp"], o["model"].endswith("FP8")))
        if "speculative_config" in o:
            rid = "004-03"  # 514 of 1000 requests succeeded
        base.key = lambda c, p, rid=rid: rid
        return await base(config, profiles, step=step, label=label)

    o = _outcome(text, measure)
    md = render_markdown(o, CTX)
    quant, par, spec = o.steps[1:]
    assert quant.entries[0].result.status == Status.UNSUPPORTED
    assert "# Not launched: preflight found this configuration unsupported" in md
    assert "SGLang's FP8 kernels need SM89+ (source: https://github.com/sgl-project/sglang/issues/5871)" in md
    assert par.adopted and o.optimized.config.replicas == 2
    assert "Total TPS: 6038.38 (2 replicas, 3019.19 each)" in md
    assert "# Success rate: 51.4%, optimization skipped" in md
    assert not spec.adopted
