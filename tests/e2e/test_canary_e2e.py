"""The canary on live traffic, end to end on the tiny model: real vLLM servers behind the
project's HAProxy, scraped by the project's Prometheus, requests from the project's traffic
generator. The canary-rollout flow rolls back a canary that fails requests, by itself, with
the failing check and its numbers; and walks a healthy canary to 100% after an approval
sent through Prefect's API, as the UI's form does."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from llm_release import registry
from llm_release.canary import promote
from tests.helpers import answer_paused_run

pytestmark = [pytest.mark.slow]

# Small windows and few requests: a test, not a verdict anyone relies on. Latency checks
# get a wide tolerance: both servers share two cores with everything else here, and the
# p95 of ~15 requests is their slowest one (a healthy canary measured 1.98 s against the
# stable's 0.64 s in one such window, under load from other jobs).
ROLLOUT = {
    "steps": [25, 50, 100],
    "windows_per_step": 1,
    "approval": "ask",
    "approval_timeout_s": 300,
    "warmup_s": 5,  # exercised, kept short (the default, 30 s, is for the demo's bf16 CPU)
    "analysis": {
        "window_s": 20,
        "min_canary_requests": 5,
        "latency_max_ratio": 3.0,
        "latency_slack_s": 2.0,
    },
    "traffic": {"rate_rps": 3.0, "concurrency": 4, "max_tokens": 8},
}


class FaultProxy:
    """In front of a real vLLM server: passes everything through, but answers every other
    chat completion with HTTP 500, as a broken build of a model server would."""

    def __init__(self, target_port: int):
        self.calls = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if method == "POST" and self.path.endswith("/chat/completions"):
                    proxy.calls += 1
                    if proxy.calls % 2 == 0:
                        self._send(500, b'{"error": {"message": "injected fault"}}')
                        return
                upstream = requests.request(
                    method,
                    f"http://127.0.0.1:{target_port}{self.path}",
                    data=body or None,
                    headers={"Content-Type": self.headers.get("Content-Type", "")},
                    timeout=120,
                )
                self._send(upstream.status_code, upstream.content)

            def _send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802
                self._forward("GET")

            def do_POST(self):  # noqa: N802
                self._forward("POST")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def target(name, model_dir):
    from llm_release.config import ServingConfig
    from llm_release.results import DeployTarget

    return DeployTarget(
        candidate=name,
        scheme="unquantized",
        model_dir=model_dir,
        repo_id="tests/tiny-llama",
        commit=(name * 40)[:40],
        serving=ServingConfig(enforce_eager=True, max_model_len=512, max_num_seqs=4),
    )


def test_canary_rolls_back_by_itself_then_a_healthy_one_is_promoted(
    prefect_api, home, tiny_model_dir
):
    from flows.canary import canary_rollout
    from llm_release.canary.prometheus import for_home
    from llm_release.config import RolloutConfig
    from llm_release.serving.serve import free_port

    config = RolloutConfig.model_validate(ROLLOUT)
    state = promote.deploy(
        target("stable", tiny_model_dir),
        target("faulty", tiny_model_dir),
        public_name="tiny",
        canary_weight=config.first_weight,
        router_port=free_port(),
    )
    # The faulty canary: the router and Prometheus reach it through the fault proxy.
    proxy = FaultProxy(state.canary.port)
    try:
        with registry.locked() as current:
            current.canary = current.canary.model_copy(update={"port": proxy.port})
            promote._apply(promote.router_for(current), current)
        faulty_id = state.canary.release_id

        out = canary_rollout(config, slo_ttft_p95_s=120)
    finally:
        proxy.close()
    assert out.status == "rolled back" and out.release_id == faulty_id
    # At its first failing window (a thin window before it is inconclusive, not a pass).
    assert out.reached_weight == 25 and out.windows[-1].verdict.verdict == "fail"
    assert all(w.verdict.verdict == "inconclusive" for w in out.windows[:-1]), out.windows
    failing = [c for c in out.windows[-1].verdict.checks if c.outcome == "fail"]
    assert failing and all(c.canary is not None for c in failing), out.windows[-1].verdict
    assert any("error" in c.name for c in failing)
    assert out.traffic is not None and out.traffic.failed > 0
    after = registry.load()
    assert after.canary is None and after.rollout.state == "rolled back"
    assert after.history[-1]["event"] == "rollback" and after.history[-1].get("reason")

    # A healthy canary: both windows pass, the flow pauses for approval, a person approves.
    state = promote.deploy(
        None,
        target("healthy", tiny_model_dir),
        public_name="tiny",
        canary_weight=config.first_weight,
    )
    healthy_id = state.canary.release_id
    approver = answer_paused_run(True, "two clean windows")
    out = canary_rollout(config, slo_ttft_p95_s=120)
    approver.join(timeout=30)
    assert out.status == "promoted", out.reason
    # Each step ends on a passing window; none failed (a thin window may be inconclusive).
    verdicts = [(w.weight, w.verdict.verdict) for w in out.windows]
    assert (25, "pass") in verdicts and verdicts[-1] == (50, "pass"), verdicts
    assert all(v != "fail" for _, v in verdicts), verdicts
    assert [(a.by, a.approve) for a in out.answers] == [("person", True)]
    after = registry.load()
    assert after.stable.release_id == healthy_id and after.canary is None

    status = promote.status()
    assert status["rollout"]["state"] == "promoted"
    assert status["rollout"]["last_window"]["verdict"] == "pass"
    # The new stable release's alert rules are loaded into the project's Prometheus.
    rules = requests.get(f"{for_home().url}/api/v1/rules", timeout=10).json()["data"]
    names = json.dumps(rules)
    assert healthy_id in names and "TTFT" in names.upper()
