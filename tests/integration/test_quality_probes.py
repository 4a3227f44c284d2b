"""The canary's quality probes through the project's real HAProxy.

Two small OpenAI-style servers stand in for the releases: they answer at once, so nothing
but their answers tells them apart. The stable one answers each eval item with its
reference; the broken canary invents a value where it must refuse (as a release whose
chat template or generation config broke would). The pinning header takes a probe to the
slot it names, only with the project's key, and HAProxy counts probes apart from users.
The rollout's own policy (rollout.walk) then rolls the broken canary back at its first
step on the quality check alone, with the slice and the scores in the verdict.

Integration level, not e2e: the tiny model of the e2e tests scores 0 on every eval set, so
a canary cannot answer worse than it. The latency side of each window is a passing verdict
here ("as fast"); analysis.with_quality is what turns it into a failure.
"""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from llm_release import server_key
from llm_release.canary import analysis, door, quality, rollout
from llm_release.canary.analysis import WindowVerdict
from llm_release.canary.router import ANSWERED_BY_HEADER, PIN_HEADER, Router, SlotTarget
from llm_release.config import RolloutConfig
from llm_release.serving.serve import free_port

pytestmark = pytest.mark.integration

OPERATOR_KEY = "operator-key-0123456789abcdef"
INVENTED = "It is 42 N·m [KB-9999]."


def reference(item: quality.ProbeItem) -> str:
    if item.eval_set == "refusal_kb":
        return "The passage does not state it."
    return f"{item.doc['answer']} [{item.doc['passage_id']}]"


class ChatBackend:
    """Answers chat completions at once with ``answer(prompt)``; counts what reached it."""

    def __init__(self, answer):
        self.chats = 0
        backend = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, body: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802
                self._send(b"{}")

            def do_POST(self):  # noqa: N802
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                backend.chats += 1
                content = answer(request["messages"][-1]["content"])
                message = {"role": "assistant", "content": content}
                choice = {"index": 0, "message": message, "finish_reason": "stop"}
                self._send(json.dumps({"object": "chat.completion", "choices": [choice]}).encode())

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture(scope="module")
def probe_set():
    return quality.build_probe_set("canary-under-test", items_per_set=8, min_per_slice=6)


@pytest.fixture()
def releases(probe_set):
    answers = {i.messages[-1]["content"]: i for i in probe_set.items}

    def good(prompt: str) -> str:
        return reference(answers[prompt]) if prompt in answers else "stable"

    def broken(prompt: str) -> str:
        item = answers.get(prompt)
        if item is None:
            return "canary"
        return INVENTED if item.eval_set == "refusal_kb" else reference(item)

    stable, canary = ChatBackend(good), ChatBackend(broken)
    yield stable, canary
    stable.close()
    canary.close()


@pytest.fixture()
def router(home, releases, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(OPERATOR_KEY + "\n")
    keys.chmod(0o600)
    stable, canary = releases
    r = Router(home / "router", free_port(), door.DoorSettings(keys_file=keys))
    r.start(SlotTarget("127.0.0.1", stable.port, 95), SlotTarget("127.0.0.1", canary.port, 5))
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if all(r.stats()[s]["status"] == "UP" for s in ("stable", "canary")):
            break
        time.sleep(0.1)
    yield r
    r.stop()


def chat(router: Router, key: str, pin: str | None) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} | ({PIN_HEADER: pin} if pin else {})
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    return requests.post(f"{router.url}/v1/chat/completions", json=body, headers=headers, timeout=5)


def probe_counters(router: Router) -> dict[str, int]:
    """HAProxy's exporter: requests of the probes backend per slot."""
    text = requests.get(
        f"http://127.0.0.1:{router.metrics_port}/metrics", headers=server_key.headers(), timeout=5
    ).text
    found = {}
    for line in text.splitlines():
        if line.startswith('haproxy_server_http_responses_total{proxy="probes"') and (
            'code="2xx"' in line
        ):
            server = line.split('server="')[1].split('"')[0]
            found[server] = int(float(line.split()[-1]))
    return found


def test_a_pin_reaches_its_slot_only_for_the_project_and_is_counted_apart(router, releases):
    stable, canary = releases
    # The canary's weight is 5%: twenty pinned requests all reach it, none the stable.
    answers = [chat(router, router.api_key, "canary") for _ in range(20)]
    assert {(a.status_code, a.headers[ANSWERED_BY_HEADER]) for a in answers} == {(200, "canary")}
    assert canary.chats == 20 and stable.chats == 0
    assert chat(router, router.api_key, "stable").headers[ANSWERED_BY_HEADER] == "stable"
    # Users' counters (backend 'releases', the analysis's role label) hold no probe.
    stats = router.stats()
    assert int(stats["canary"]["stot"]) == 0 and int(stats["stable"]["stot"]) == 0
    assert probe_counters(router) == {"stable": 1, "canary": 20}
    # An operator's key may not pin (403), and nothing reaches a server.
    refused = chat(router, OPERATOR_KEY, "canary")
    assert refused.status_code == 403 and "pin_not_allowed" in refused.text
    assert chat(router, "not-a-key-0123456789", "canary").status_code == 401
    assert chat(router, router.api_key, "both").status_code == 400
    assert canary.chats == 20 and stable.chats == 1
    # Unpinned, the operator's key is load-balanced as before.
    assert chat(router, OPERATOR_KEY, None).status_code == 200
    # A pin to a parked slot is refused by HAProxy, never answered by the other slot.
    router.set_target("canary", None)
    parked = chat(router, router.api_key, "canary")
    assert parked.status_code == 503 and canary.chats == 20
    router.set_target("canary", SlotTarget("127.0.0.1", canary.port, 5))
    assert chat(router, router.api_key, "canary").headers[ANSWERED_BY_HEADER] == "canary"


class ProbingActions:
    """rollout.walk's effects: the real router, a fast latency side, the real probes."""

    def __init__(self, router: Router, probe_set: quality.ProbeSet):
        self.router, self.probe_set = router, probe_set
        self.weights: list[int] = []
        self.rolled_back: str | None = None

    def still_canary(self) -> bool:
        return self.rolled_back is None

    def crash_looping(self) -> str | None:
        return None  # the fake servers do not crash: the quality check alone decides

    def set_weight(self, weight: int) -> None:
        self.router.set_weight("canary", weight)
        self.weights.append(weight)

    def warm_up(self, weight: int, seconds: float) -> None:
        pass

    def analyze(self, weight: int, index: int) -> WindowVerdict:
        fast = WindowVerdict(
            service="tiny",
            prometheus_url="http://127.0.0.1:9",
            started_at=time.time() - 20,
            ended_at=time.time(),
            window_s=20,
            canary_requests=30.0,
            stable_requests=90.0,
            checks=[],
            verdict="pass",
            reason="all 6 checks passed on 30 requests",
        )
        route = quality.ProbeRoute(self.router.url, self.router.api_key, "tiny", {})
        return analysis.probe_window(fast, self.probe_set, route)

    def ask(self, question, windows):
        raise AssertionError(f"asked {question!r}: the quality check should have decided")

    def promote(self) -> None:
        raise AssertionError("a canary that answers worse was promoted")

    def rollback(self, reason: str) -> None:
        self.router.set_target("canary", None)
        self.rolled_back = reason


def test_a_canary_that_answers_worse_but_as_fast_is_rolled_back_at_its_first_step(
    router, releases, probe_set
):
    stable, canary = releases
    config = RolloutConfig.model_validate({"steps": [25, 50, 100], "warmup_s": 0})
    actions = ProbingActions(router, probe_set)
    out = rollout.walk(config, "canary-under-test", actions)
    assert out.status == "rolled back" and out.reached_weight == 25
    assert len(out.windows) == 1
    window = out.windows[0].verdict
    assert window.verdict == "fail"
    assert "quality refusal_kb refusal: canary 0.000, stable 1.000 on 8 items" in out.reason
    refusal = {s.slice: s for s in window.quality}["quality refusal_kb refusal"]
    assert (refusal.canary, refusal.stable, refusal.outcome) == (0.0, 1.0, "fail")
    # The other slices answered like the stable: they pass.
    assert {s.outcome for s in window.quality if s.slice != refusal.slice} == {"pass"}
    sent = len(probe_set.items)
    assert window.probes.sent == window.probes.answered == {"stable": sent, "canary": sent}
    assert canary.chats == sent and stable.chats == sent
    assert router.stats()["canary"]["status"] == "MAINT"


def test_a_canary_that_answers_as_well_passes_the_same_check(router, releases, probe_set):
    stable, canary = releases
    router.set_target("canary", SlotTarget("127.0.0.1", stable.port, 5))
    actions = ProbingActions(router, probe_set)
    verdict = actions.analyze(25, 1)
    assert verdict.verdict == "pass", verdict.reason
    assert {s.outcome for s in verdict.quality} == {"pass"} and len(verdict.quality) == 5
