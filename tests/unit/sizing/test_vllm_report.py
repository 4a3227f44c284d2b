"""vLLM's KV report parsed from real vLLM 0.32 CPU log lines (tests/unit/data)."""

from pathlib import Path

from llm_release.sizing.vllm_report import parse_vllm_kv_report, relative_error

DATA = Path(__file__).parents[1] / "data"


def test_real_cpu_log_excerpt_gives_the_last_starts_numbers():
    text = (DATA / "vllm_kv_report.log").read_text()
    report = parse_vllm_kv_report(text)
    # the excerpt holds three starts; the last one is the Gemma 3 model at 2048 tokens
    assert report.device == "CPU"
    assert report.kv_cache_tokens == 729_444
    assert report.max_model_len == 2048
    assert report.max_concurrency == 356.17
    assert report.kv_memory_gib == 1.0
    second = parse_vllm_kv_report(text.split("# 3)")[0])
    assert (second.kv_cache_tokens, second.max_model_len) == (524_288, 256)


def test_first_start_in_the_excerpt():
    text = (DATA / "vllm_kv_report.log").read_text()
    first = text.split("# 2)")[0]
    report = parse_vllm_kv_report(first)
    assert (report.kv_cache_tokens, report.max_model_len, report.max_concurrency) == (
        2_097_152,
        1024,
        2048.0,
    )
    assert report.vllm_version == "0.32.0"


def test_gpu_lines_and_hybrid_block_size():
    # the GPU worker's and the hybrid platform's wording in vLLM 0.32's sources
    # (v1/worker/gpu_worker.py, platforms/interface.py, v1/core/kv_cache_utils.py)
    text = (
        "INFO [interface.py:1093] Setting attention block size to 1056 tokens to ensure "
        "that attention page size is >= mamba page size.\n"
        "INFO [gpu_model_runner.py:1] Model loading took 64.52 GiB memory and 30.1 seconds\n"
        "INFO [gpu_worker.py:759] Available KV cache memory: 5.81 GiB\n"
        "INFO [kv_cache_utils.py:2327] GPU KV cache size: 180,224 tokens, Maximum "
        "concurrency for 32,768 tokens per request: 5.50x\n"
    )
    report = parse_vllm_kv_report(text)
    assert report.device == "GPU" and report.kv_cache_tokens == 180_224
    assert report.kv_memory_gib == 5.81 and report.attention_block_size == 1056
    assert report.weights_gib == 64.52 and report.max_concurrency == 5.5


def test_a_log_without_a_report_gives_none():
    assert parse_vllm_kv_report("INFO starting\nERROR died\n") is None


def test_relative_error_sign():
    assert relative_error(101, 100) == 0.01
    assert relative_error(99, 100) == -0.01


def test_real_hybrid_log_gives_the_grown_block():
    # Qwen3-Next on vLLM CPU: the attention block grew to 640 tokens to hold a GDN state
    report = parse_vllm_kv_report((DATA / "vllm_kv_report_hybrid.log").read_text())
    assert report.attention_block_size == 640
    assert (report.kv_cache_tokens, report.max_concurrency) == (335_462, 163.8)
    assert report.vllm_version == "0.32.0"


def test_vllm_026_two_line_report_and_debug_profile():
    # vLLM 0.26 (kv_cache_utils.py:2177) writes the size and the concurrency as two lines;
    # its GPU worker logs the memory profile at DEBUG (gpu_worker.py:559)
    text = (
        "(EngineCore pid=812) INFO 12-01 21:10:03 [gpu_model_runner.py:4180] Model loading "
        "took 2.19 GiB memory and 3.2 seconds\n"
        "(EngineCore pid=812) DEBUG 12-01 21:10:20 [gpu_worker.py:559] Memory profiling takes "
        "4.51 seconds. Total non KV cache memory: 2.93GiB; torch peak memory increase: 0.62GiB; "
        "non-torch forward increase memory: 0.12GiB; weights memory: 2.19GiB.\n"
        "(EngineCore pid=812) INFO 12-01 21:10:20 [gpu_worker.py:560] Available KV cache "
        "memory: 122.75 GiB\n"
        "(EngineCore pid=812) INFO 12-01 21:10:20 [gpu_worker.py:575] CUDA graph memory "
        "profiling is enabled (default since v0.21.0). The current --gpu-memory-utilization="
        "0.9000 is equivalent to --gpu-memory-utilization=0.8969 without CUDA graph memory "
        "profiling. To maintain the same effective KV cache size as before, increase "
        "--gpu-memory-utilization to 0.9031. To disable, set "
        "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0.\n"
        "(EngineCore pid=812) INFO 12-01 21:10:20 [kv_cache_utils.py:2177] GPU KV cache size: "
        "4,025,520 tokens\n"
        "(EngineCore pid=812) INFO 12-01 21:10:20 [kv_cache_utils.py:2178] Maximum concurrency "
        "for 4,096 tokens per request: 982.79x\n"
    )
    report = parse_vllm_kv_report(text)
    assert report.device == "GPU"
    assert (report.kv_cache_tokens, report.max_model_len) == (4_025_520, 4096)
    assert report.max_concurrency == 982.79 and report.kv_memory_gib == 122.75
    assert report.profile.non_kv_gib == 2.93 and report.profile.weights_gib == 2.19
    assert report.profile.torch_peak_increase_gib == 0.62
    assert report.profile.non_torch_increase_gib == 0.12
    assert report.profile.cuda_graph_util == 0.0031
    # the first line alone (a start still logging) is not a report yet
    assert parse_vllm_kv_report(text.rsplit("(EngineCore", 1)[0]) is None


def test_real_vllm_026_gpu_log_from_the_h200():
    # the project's FP8 candidate of SmolLM2 served three times on the H200 (its log kept the
    # three starts; docs/gpu-serving-2026-12-01/trip6/proof-logs.tgz), vLLM 0.26 at DEBUG
    report = parse_vllm_kv_report((DATA / "vllm_kv_report_026_gpu.log").read_text())
    assert report.vllm_version == "0.26.0" and report.device == "GPU"
    assert (report.kv_cache_tokens, report.max_model_len) == (5_839_712, 4096)
    assert report.max_concurrency == 1425.71 and report.kv_memory_gib == 125.31
    assert report.weights_gib == 0.15
    assert report.profile.non_kv_gib == 0.51 and report.profile.non_torch_increase_gib == 0.22
