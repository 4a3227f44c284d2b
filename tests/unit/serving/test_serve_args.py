import socket
from pathlib import Path

import pytest
from pydantic import ValidationError

from llm_release.canary.router import SlotTarget, render_config
from llm_release.config import ServingConfig
from llm_release.serving import serve
from llm_release.serving.serve import (
    build_command,
    cpu_threads_bind,
    diagnose,
    likely_cause,
    server_env,
)


def test_operator_settings_reach_the_vllm_command():
    serving = ServingConfig(
        max_model_len=4096,
        max_num_seqs=32,
        enable_prefix_caching=False,
        enforce_eager=True,
        extra_args=["--seed", "7"],
    )
    cmd = build_command(Path("/py"), Path("/m"), 9000, ["public", "cand"], serving, cuda=False)
    joined = " ".join(cmd)
    assert "--max-model-len 4096" in joined and "--max-num-seqs 32" in joined
    assert "--no-enable-prefix-caching" in cmd and "--enforce-eager" in cmd
    assert "--served-model-name public cand" in joined and joined.endswith("--seed 7")
    assert "--gpu-memory-utilization" not in cmd
    gpu = build_command(Path("/py"), Path("/m"), 9000, ["p"], serving, cuda=True)
    assert "--gpu-memory-utilization" in gpu


def test_likely_cause_reads_the_log():
    assert "bad vLLM arguments" in likely_cause("api_server.py: error: unrecognized arguments: --x")
    assert "out of memory" in likely_cause("torch.OutOfMemoryError: CUDA out of memory")
    assert likely_cause("something else") == "see the log tail below"
    # vLLM CPU 0.32's own words on a quantized Qwen3-MoE (2026-11-30)
    for line in (
        "ValueError: Unsupported FP8 MoE backend: NONE",
        "ValueError: No WNA16 MoE backend supports the deployment configuration.",
    ):
        assert "no mixture-of-experts kernel" in likely_cause(f"INFO ...\n{line}\n")
    traceback = '    raise ValueError(f"Unsupported FP8 MoE backend: {fp8_backend.value}")\n'
    found = diagnose(traceback + "ValueError: Unsupported FP8 MoE backend: NONE\n")
    assert "backend: NONE" in found, found  # vLLM's message, not the traceback's source line


def test_router_config_parks_an_empty_canary_slot():
    text = render_config(
        listen_port=8080,
        socket_path=Path("/s"),
        pid_path=Path("/p"),
        stable=SlotTarget("127.0.0.1", 9001, 100),
        canary=None,
        key_map=Path("/k.map"),
    )
    assert "server stable 127.0.0.1:9001 weight 100" in text
    assert "server canary 127.0.0.1:9 weight 0 disabled" in text
    assert "bind 127.0.0.1:8080" in text


def test_a_missing_kernel_is_named_even_far_above_the_log_tail():
    from llm_release.serving.serve import diagnose

    log = (
        "INFO healthy\n"
        "(Worker pid=1) AttributeError: '_OpNamespace' '_C' object has no attribute "
        "'cpu_gemm_wna16'\n" + "ERROR traceback line\n" * 200
    )
    text = diagnose(log)
    assert "no kernel for this quantization scheme" in text and "cpu_gemm_wna16" in text
    assert diagnose("nothing useful") == "see the log tail below"


def test_stable_and_canary_never_share_a_core():
    serving = ServingConfig()
    # 2 cores: the stable (and every candidate measured alone) keeps core 0, what vLLM's auto
    # chose; the canary gets core 1 instead of sharing core 0.
    assert cpu_threads_bind(serving, "stable", {0, 1}) == "0"
    assert cpu_threads_bind(serving, "candidate", {0, 1}) == "0"
    assert cpu_threads_bind(serving, "canary", {0, 1}) == "1"
    # odd counts give the stable the larger half; gaps in the allowed set are kept
    assert cpu_threads_bind(serving, "stable", {2, 3, 5, 7, 8}) == "2,3,5"
    assert cpu_threads_bind(serving, "canary", {2, 3, 5, 7, 8}) == "7,8"
    # one CPU: both get it (nothing to split)
    assert cpu_threads_bind(serving, "canary", {4}) == "4"


def test_an_explicit_binding_goes_to_vllm_as_written_and_junk_is_refused():
    for value in ("auto", "nobind", "0-3,8"):
        serving = ServingConfig(cpu_threads_bind=value)
        assert cpu_threads_bind(serving, "canary", {0, 1}) == value
        assert server_env(serving, "canary")["VLLM_CPU_OMP_THREADS_BIND"] == value
    for junk in ("0;rm -rf /", "all", "1-"):
        with pytest.raises(ValidationError):
            ServingConfig(cpu_threads_bind=junk)


def test_free_port_is_below_the_ephemeral_range_and_free():
    port = serve.free_port()
    assert serve.PORT_FLOOR <= port < serve._ephemeral_low()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_free_port_skips_a_port_a_server_holds(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            free = probe.getsockname()[1]
        picks = iter([taken, free])
        monkeypatch.setattr(serve, "_ephemeral_low", lambda: 65536)
        monkeypatch.setattr(serve.random, "randrange", lambda low, high: next(picks))
        assert serve.free_port() == free


def test_free_port_lets_the_kernel_pick_when_the_range_is_too_small(monkeypatch):
    def never(low, high):
        raise AssertionError("no room below the ephemeral range: no random pick")

    monkeypatch.setattr(serve, "_ephemeral_low", lambda: serve.PORT_FLOOR + 10)
    monkeypatch.setattr(serve.random, "randrange", never)
    port = serve.free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


@pytest.mark.parametrize(
    "name", ["--host=0.0.0.0", "--trust-remote-code", "-h", "", "a b", "x" * 200, "../m"]
)
def test_a_served_name_that_is_not_a_name_never_reaches_vllm(name):
    from llm_release.errors import ConfigError

    for names in ([name], ["public", name]):
        with pytest.raises(ConfigError, match="served name"):
            build_command(Path("/py"), Path("/m"), 9000, names, ServingConfig(), cuda=False)
        with pytest.raises(ConfigError, match="served name"):
            serve.vllm_args(Path("/m"), "0.0.0.0", 8000, names, ServingConfig(), cuda=True)


def test_a_model_folder_that_reads_as_a_flag_never_reaches_vllm():
    from llm_release.errors import ConfigError

    with pytest.raises(ConfigError, match="model folder"):
        build_command(Path("/py"), Path("--host=0.0.0.0"), 9000, ["p"], ServingConfig(), cuda=False)


def test_speculation_reaches_vllm_as_json_of_a_method_and_numbers():
    import json

    from llm_release.config import Speculation

    serving = ServingConfig(
        speculation={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    )
    cmd = build_command(Path("/py"), Path("/m"), 9000, ["p"], serving, cuda=False)
    value = cmd[cmd.index("--speculative-config") + 1]
    assert json.loads(value) == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 4,
    }
    assert "--speculative-config" not in build_command(
        Path("/py"), Path("/m"), 9000, ["p"], ServingConfig(), cuda=False
    )
    assert Speculation(method="mtp", num_speculative_tokens=1).label() == "mtp:1"


@pytest.mark.parametrize(
    "given",
    [
        {"method": "ngram", "num_speculative_tokens": 3, "model": "/srv/other-model"},
        {"method": "draft_model", "num_speculative_tokens": 3},
        {"method": "ngram", "num_speculative_tokens": 0},
        {"method": "ngram", "num_speculative_tokens": 9},
        {"method": "ngram", "num_speculative_tokens": "3; rm"},
        {"method": "mtp", "num_speculative_tokens": 1, "prompt_lookup_max": 4},
        {
            "method": "ngram",
            "num_speculative_tokens": 2,
            "prompt_lookup_min": 5,
            "prompt_lookup_max": 3,
        },
    ],
)
def test_a_speculation_that_is_not_a_method_and_numbers_is_refused(given):
    with pytest.raises(ValidationError):
        ServingConfig(speculation=given)
