"""perflab's conformance suite run against the installed llama-cpp plugin."""

from pathlib import Path

from perflab.testing import EngineConformance


class TestLlamaCppConformance(EngineConformance):
    engine = "llama-cpp"
    distribution = "perflab-plugin-llamacpp"
    model = "/models/Qwen3-8B-Q4_K_M.gguf"
    configs = [{"max_model_len": 8192}, {"max_num_seqs": 4}, {"kv_cache_dtype": "q8_0"}, {"prefix_caching": False}]
    unsupported_configs = [{"tp": 2}, {"speculative_config": {"method": "ngram"}}, {"kv_cache_dtype": "fp8"}]
    crash_samples = {
        "model-load-failed": (
            "llama_model_load: error loading model: tensor 'blk.0.attn_q.weight' data is not within the file bounds\n"
            "llama_model_load_from_file_impl: failed to load model\n"
        ),
        # llama.cpp's wording for a file of random bytes (gguf.cpp, then llama-model-loader.cpp)
        "not-a-gguf-file": (
            "gguf_init_from_file_impl: invalid magic characters: 'vers', expected 'GGUF'\n"
            "llama_model_load: error loading model: llama_model_loader: failed to load model from /models/x.gguf\n"
            "llama_model_load_from_file_impl: failed to load model\n"
        ),
        "address-in-use": "main: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080\n",
        "out-of-memory": (
            "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9216.00 MiB on device 0: cudaMalloc failed: out of memory\n"
        ),
    }
    stand_in = Path(__file__).parent / "fake_llama_server.py"
