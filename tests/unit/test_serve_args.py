from pathlib import Path

from llm_release.config import ServingConfig
from llm_release.router import SlotTarget, render_config
from llm_release.serve import build_command, likely_cause


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


def test_router_config_parks_an_empty_canary_slot():
    text = render_config(
        listen_port=8080,
        socket_path=Path("/s"),
        pid_path=Path("/p"),
        stable=SlotTarget("127.0.0.1", 9001, 100),
        canary=None,
    )
    assert "server stable 127.0.0.1:9001 weight 100" in text
    assert "server canary 127.0.0.1:9 weight 0 disabled" in text
    assert "bind 127.0.0.1:8080" in text


def test_a_missing_kernel_is_named_even_far_above_the_log_tail():
    from llm_release.serve import diagnose

    log = (
        "INFO healthy\n"
        "(Worker pid=1) AttributeError: '_OpNamespace' '_C' object has no attribute "
        "'cpu_gemm_wna16'\n" + "ERROR traceback line\n" * 200
    )
    text = diagnose(log)
    assert "no kernel for this quantization scheme" in text and "cpu_gemm_wna16" in text
    assert diagnose("nothing useful") == "see the log tail below"
