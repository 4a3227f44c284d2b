"""GuideLLM 0.8.1 takes the gates' SLO (--metrics slo) and reports each level's attainment,
run for real against GuideLLM's own mock server (no vLLM): the argument is accepted, the
report carries the SLO back, and goodput is read from what GuideLLM measured."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from llm_release.config import Gates, LoadProfile
from llm_release.load.loadtest import goodput, run_load_test, slo_for
from llm_release.serving.serve import free_port

pytestmark = pytest.mark.integration


@pytest.fixture()
def mock_server(tmp_path):
    """GuideLLM's mock OpenAI server: TTFT 20 ms, ITL 5 ms, 8 tokens, one request at a time
    (so 4 streams queue, and TTFT grows with the load)."""
    port = free_port()
    log = (tmp_path / "mock.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "guidellm", "mock-server", "--host", "127.0.0.1"]
        + ["--port", str(port), "--model", "m", "--ttft-ms", "20", "--itl-ms", "5"]
        + ["--output-tokens", "8", "--max-concurrent-requests", "1"],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, (tmp_path / "mock.log").read_text()
            assert time.monotonic() < deadline, "the mock server never answered /health"
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_guidellm_measures_attainment_of_the_gates_slo(mock_server, tokenizer_dir, tmp_path):
    slo = slo_for(Gates(ttft_p95_slo_s=5.0, itl_p95_slo_ms=250))
    profile = LoadProfile(
        concurrencies=[1, 4], requests_per_level=8, prompt_tokens=16, output_tokens=8
    )
    result = run_load_test(mock_server, "m", tokenizer_dir, profile, tmp_path / "load", slo=slo)
    assert result.slo == slo
    report = json.loads((tmp_path / "load" / "guidellm.json").read_text())
    # GuideLLM measured against the SLO it was given
    assert {json.dumps(b["config"]["slo"], sort_keys=True) for b in report["benchmarks"]} == {
        json.dumps({"e2el_ms": None, "tpot_ms": 250.0, "ttft_ms": 5000.0}, sort_keys=True)
    }
    # the warm-up ran first, at the top level, and is not a result
    assert [b["config"]["strategy"]["streams"] for b in report["benchmarks"]] == [4, 1, 4]
    # one wave of 4 requests (a request a stream), then the 8 of each level
    done = [b["metrics"]["request_totals"]["successful"] for b in report["benchmarks"]]
    limits = [
        [
            c.get("metadata", {}).get("max_requests")
            for c in b["scheduler_state"]["end_queuing_constraints"].values()
        ]
        for b in report["benchmarks"]
    ]
    assert done == [4, 8, 8], (done, limits)  # limits: GuideLLM's count for each benchmark
    assert result.warm_up == 4 and result.attempts == 1  # no level had to run again
    assert [lv.concurrency for lv in result.levels] == [1, 4]
    for level in result.levels:
        assert level.requests == 8 and level.errors == 0
        # a mock answer takes ~60 ms: well within 5 s and 250 ms per token
        assert level.slo_attainment == 1.0 and level.goodput_rps > 0
    assert goodput(result.levels, slo).concurrency == 4
    # the same measurement under an SLO it cannot meet: 5 ms tokens against a 1 ms ceiling
    tight = slo.model_copy(update={"itl_p95_ms": 1.0})
    missed = goodput(result.levels, tight)
    assert missed.concurrency == 0 and missed.failures[1].startswith("ITL p95")
