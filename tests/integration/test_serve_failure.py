"""A candidate whose vLLM server cannot start fails alone, with the log tail, leaving no process."""

import pytest

from llm_release.config import EvalConfig, LoadProfile, ServingConfig
from llm_release.decision.candidate import measure
from tests.helpers import vllm_processes

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_bad_arguments_fail_the_candidate_with_the_log_tail(
    home, tiny_model_dir, tmp_path, monkeypatch
):
    # Only servers of this test's model: another pytest worker may be starting its own.
    before = vllm_processes(under=tiny_model_dir.parent)
    # A flag vLLM does not know gets past the allow-list only as the operator's addition.
    monkeypatch.setenv("LLM_RELEASE_ALLOW_SERVING_FLAGS", "--no-such-vllm-flag")
    serving = ServingConfig(enforce_eager=True, extra_args=["--no-such-vllm-flag"])
    result = measure(
        name="broken",
        scheme="FP8_DYNAMIC",
        model_dir=tiny_model_dir,
        tokenizer_dir=tiny_model_dir,
        serving=serving,
        evaluation=EvalConfig(),
        load=LoadProfile(),
        out_dir=tmp_path / "broken",
        public_name="tiny",
    )
    assert result.status == "failed"
    assert "ServeError" in result.error
    assert "bad vLLM arguments" in result.error
    assert "--no-such-vllm-flag" in result.error, "the server's log tail is not in the error"
    assert vllm_processes(under=tiny_model_dir.parent) == before


def test_a_server_that_dies_after_it_was_ready_is_reported_with_its_own_exit(
    tiny_model_dir, tmp_path
):
    import os
    import signal

    import requests

    from llm_release.decision.candidate import _server_watch
    from llm_release.errors import ServeError
    from llm_release.serving.serve import VllmServer

    serving = ServingConfig(enforce_eager=True, max_model_len=256, max_num_seqs=2)
    with VllmServer(tiny_model_dir, ["tiny"], serving, tmp_path / "vllm.log") as server:
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait(timeout=30)
        with pytest.raises(ServeError) as caught, _server_watch(server, "evaluation"):
            requests.get(f"{server.base_url}/v1/models", timeout=5)
    message = str(caught.value)
    assert "exited with code -9 during evaluation" in message
    assert "ConnectionError" in message, "the client's own error is kept beside the cause"
    assert "--- server log tail ---" in message


def test_a_picked_port_taken_before_vllm_binds_it_is_picked_again(
    tiny_model_dir, tmp_path, monkeypatch
):
    """The port is free when picked and held by another listener when vLLM, ~25 s later,
    comes to bind it (CI, 2026-12-02): the server comes up on a second pick."""
    import socket

    import requests

    from llm_release import server_key
    from llm_release.serving import serve
    from llm_release.serving.serve import VllmServer

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        picks = iter([taken])
        real_pick = serve.free_port
        monkeypatch.setattr(serve, "free_port", lambda **kw: next(picks, None) or real_pick(**kw))
        serving = ServingConfig(enforce_eager=True, max_model_len=256, max_num_seqs=2)
        log = tmp_path / "vllm.log"
        with VllmServer(tiny_model_dir, ["tiny"], serving, log) as server:
            assert server.port != taken
            models = requests.get(
                f"{server.base_url}/v1/models", headers=server_key.headers(), timeout=10
            ).json()
            assert [m["id"] for m in models["data"]] == ["tiny"]
    text = log.read_text()
    assert f"--port {taken}" in text and "Address already in use" in text, "no first start"
    assert f"--port {server.port}" in text
