"""The canary on live traffic, end to end on the tiny model: real vLLM servers behind the
project's HAProxy, scraped by the project's Prometheus, requests from the project's traffic
generator. The canary-rollout flow rolls back a canary that fails requests, by itself, with
the failing check and its numbers; rolls back a fast, error-free canary whose chat template
drops the user's message on its quality check alone; and walks a healthy canary to 100%
after an approval sent through Prefect's API, as the UI's form does. Then the stable server
is killed under steady traffic: restarted, serving, counted and alerted. The release record of the whole story is
a real PostgreSQL database (issue 25: the e2e once against PostgreSQL)."""

import hashlib
import json
import os
import re
import shutil
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil
import pytest
import requests

from demo.hub_server import HubServer
from llm_release import paths, registry, server_key
from llm_release.canary import promote
from llm_release.config import SourceConfig
from llm_release.hub.acquire import TransferSettings, acquire, verify_dir
from llm_release.load.traffic import Traffic
from llm_release.serving import processes, supervise
from tests.helpers import answer_paused_run

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

# Small windows and few requests: a test, not a verdict anyone relies on. Latency checks
# get a wide tolerance: both servers share two cores with everything else here, and the
# p95 of ~15 requests is their slowest one (a healthy canary measured 1.98 s against the
# stable's 0.64 s in one such window, under load from other jobs).
PUBLISH_REPO = "acme/tiny-canary"
PUBLISH_TOKEN = "hf_WriteTokenOfThePublishHubOnly"
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
                    # the caller's key (HAProxy's, Prometheus', the drain's) goes through
                    headers={
                        "Content-Type": self.headers.get("Content-Type", ""),
                        "Authorization": self.headers.get("Authorization", ""),
                    },
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


# The answer key: the tiny model has random weights, so it scores 0 on the shipped sets,
# canary and stable alike, and a quality check that passes on them says nothing. This set
# is made at test time from what the stable server answers, greedy (eval_sets/decoding.yaml,
# the probes' decoding): the same weights served right score 1 on every item, answers that
# went wrong score 0. The random model's greedy answers depend on the prompt (measured on
# this model, 2026-12-02: six prompts, six different answers, the same under concurrent load).
ANSWER_KEY_SET = "tiny_answer_key"
ANSWER_KEY_QUESTIONS = [
    "What is the coupling bolt torque of the pump P-1?",
    "How many hours between two oil changes of the press H-200?",
    "Which gloves does the grinding of the shaft S-7 need?",
    "Name the lubricant of the gearbox G-3.",
]
ANSWER_KEY_TASK = f"""task: {ANSWER_KEY_SET}
dataset_path: json
dataset_kwargs:
  data_files:
    test: data.jsonl
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: regex_match
metadata:
  version: 1
gates:
  critical: true
  metrics:
    regex_match: {{min_score: 0.5, max_drop: 0.10}}
"""
# A chat template that drops what the user says: every answer is the answer to nothing,
# as fast as a right one.
DEAF_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'user' %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def answer_key_eval_set(root, server_port: int) -> list[str]:
    """A critical eval set under ``root`` whose every item's ``answer_regex`` is the answer
    of the server on ``server_port`` to the item's prompt, as the quality probes send it;
    the answers, returned."""
    from llm_release.canary import quality
    from llm_release.evaluation import authoring, evalsets
    from llm_release.evaluation.evaluate import load_decoding
    from llm_release.evaluation.items import chat_messages

    shipped = paths.eval_sets_dir()
    root.mkdir(parents=True)
    for name in ("decoding.yaml", "defaults.yaml"):
        shutil.copy(shipped / name, root / name)
    shutil.copytree(shipped / "_template", root / "_template")
    folder = authoring.scaffold(ANSWER_KEY_SET, root, min_score=0.5, critical=True)
    (folder / "task.yaml").write_text(ANSWER_KEY_TASK)
    items = [
        {"id": f"key-{i}", "question": q, "answer": "", "tags": ["greedy"]}
        for i, q in enumerate(ANSWER_KEY_QUESTIONS, 1)
    ]
    data = folder / "data.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in items))
    eval_set = evalsets.load_eval_set(ANSWER_KEY_SET, root)
    decoding = load_decoding(root / "decoding.yaml")
    route = quality.ProbeRoute(url="", api_key="", service="tiny", request_body={})
    answers = []
    for item in items:
        probe = quality.ProbeItem(
            eval_set=ANSWER_KEY_SET,
            id=item["id"],
            tags=item["tags"],
            messages=chat_messages(eval_set, item),
            doc=item,
        )
        body = quality.request_json(
            quality.ProbeSet(release_id="key", seed=0, items=[], slices=[], decoding=decoding),
            probe,
            route,
        )
        response = requests.post(
            f"http://127.0.0.1:{server_port}/v1/chat/completions",
            json=body,
            headers=server_key.headers(),
            timeout=120,
        )
        response.raise_for_status()
        answers.append(response.json()["choices"][0]["message"]["content"])
    # An empty answer would match anything; the same answer to all says nothing of prompts.
    assert all(a.strip() for a in answers) and len(set(answers)) == len(answers), answers
    for item, answer in zip(items, answers, strict=True):
        item["answer"] = answer
        item["answer_regex"] = re.escape(answer)
    data.write_text("".join(json.dumps(item) + "\n" for item in items))
    return answers


def deaf_copy(model_dir, out_dir):
    """The same release with a broken chat template: a folder of links to ``model_dir``'s
    files but its own ``chat_template.jinja`` and ``tokenizer_config.json``, which drop the
    user's message."""
    out_dir.mkdir(parents=True)
    for path in model_dir.iterdir():
        if path.name not in ("chat_template.jinja", "tokenizer_config.json"):
            (out_dir / path.name).symlink_to(path.resolve())
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = DEAF_CHAT_TEMPLATE
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out_dir / "chat_template.jinja").write_text(DEAF_CHAT_TEMPLATE)
    return out_dir


def target(name, model_dir):
    from llm_release.config import ServingConfig
    from llm_release.results import DeployTarget

    return DeployTarget(
        candidate=name,
        scheme="unquantized",
        model_dir=model_dir,
        repo_id="tests/tiny-llama",
        commit=hashlib.sha1(name.encode()).hexdigest(),
        serving=ServingConfig(enforce_eager=True, max_model_len=512, max_num_seqs=4),
    )


def test_canary_rolls_back_by_itself_then_a_healthy_one_is_promoted(
    prefect_api, home, tiny_model_dir, monkeypatch, postgres_url, tmp_path
):
    from flows.canary import canary_rollout
    from llm_release.canary.prometheus import for_home
    from llm_release.config import RolloutConfig
    from llm_release.reporting import lineage
    from llm_release.serving.serve import free_port

    # The record on PostgreSQL: every registry read and write of the story goes there.
    monkeypatch.setenv("LLM_RELEASE_DATABASE_URL", postgres_url)

    # The quality probes after each window: the 4 items of the answer key, to both.
    monkeypatch.setenv("LLM_RELEASE_QUALITY_PROBE_ITEMS", "4")
    monkeypatch.setenv("LLM_RELEASE_QUALITY_PROBE_MIN_ITEMS", "1")
    config = RolloutConfig.model_validate(ROLLOUT)
    state = promote.deploy(
        target("stable", tiny_model_dir),
        target("faulty", tiny_model_dir),
        public_name="tiny",
        canary_weight=config.first_weight,
        router_port=free_port(),
    )
    # The answer key from the stable server, the only eval set the probes read.
    answer_key_eval_set(tmp_path / "eval_sets", state.stable.port)
    monkeypatch.setenv("LLM_RELEASE_EVAL_SETS", str(tmp_path / "eval_sets"))
    # The faulty canary: the router and Prometheus reach it through the fault proxy.
    proxy = FaultProxy(state.canary.port)
    # The proxy is this test's, not the canary's server: the recorded-port check
    # (promote.check_ports) would refuse it, as it refuses any port the release does not hold.
    own_ports = promote.backends.port_problems
    monkeypatch.setattr(
        promote.backends,
        "port_problems",
        lambda release: [] if release.port == proxy.port else own_ports(release),
    )
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

    # A canary whose chat template drops the user's message: fast and error-free, every
    # answer wrong. The quality check rolls it back at its first window, at 25%, with the
    # slice and both scores in the verdict.
    state = promote.deploy(
        None,
        target("deaf", deaf_copy(tiny_model_dir, tmp_path / "deaf")),
        public_name="tiny",
        canary_weight=config.first_weight,
    )
    deaf_id = state.canary.release_id
    out = canary_rollout(config, slo_ttft_p95_s=120)
    assert out.status == "rolled back" and out.release_id == deaf_id, out.reason
    assert out.reached_weight == 25 and len(out.windows) == 1, out.windows
    verdict = out.windows[0].verdict
    assert verdict.verdict == "fail" and verdict.probes.answered == {"stable": 4, "canary": 4}
    failing = [c for c in verdict.checks if c.outcome == "fail"]
    slice_name = f"quality {ANSWER_KEY_SET} regex_match"
    assert [c.name for c in failing] == [slice_name], verdict.checks
    assert (failing[0].canary, failing[0].stable) == (0.0, 1.0), failing[0]
    [scores] = verdict.quality
    assert (scores.slice, scores.canary, scores.stable) == (slice_name, 0.0, 1.0), scores
    assert slice_name in verdict.reason and "canary 0.000, stable 1.000" in verdict.reason
    after = registry.load()
    assert after.canary is None and after.history[-1]["event"] == "rollback"
    assert slice_name in after.history[-1]["reason"], after.history[-1]

    # A healthy canary: both windows pass, the flow pauses for approval, a person approves.
    # It serves from one of the project's own model folders, so at 100% the flow publishes
    # it to the operator's hub: a real hub that asks for its write token.
    healthy_dir = paths.models_dir() / "tests--tiny-llama" / ("healthy" * 6)[:40]
    shutil.copytree(tiny_model_dir, healthy_dir)
    monkeypatch.setenv("LLM_RELEASE_PUBLISH_REPO", PUBLISH_REPO)
    monkeypatch.setenv("LLM_RELEASE_PUBLISH_TOKEN", PUBLISH_TOKEN)
    state = promote.deploy(
        None,
        target("healthy", healthy_dir),
        public_name="tiny",
        canary_weight=config.first_weight,
    )
    healthy_id = state.canary.release_id
    with HubServer(tmp_path / "publish-hub", token=PUBLISH_TOKEN) as publish_hub:
        monkeypatch.setenv("LLM_RELEASE_PUBLISH_ENDPOINT", publish_hub.url)
        approver = answer_paused_run(True, "two clean windows")
        out = canary_rollout(config, slo_ttft_p95_s=120)
        approver.join(timeout=30)
        assert out.status == "promoted", out.reason
        # Published by the flow's own step: on the record, and on the hub at that commit,
        # every file proven by the project's download path.
        event = registry.load().history[-1]
        assert (event["event"], event["release"], event["repo"]) == (
            "publish",
            healthy_id,
            PUBLISH_REPO,
        ), event
        acquired = acquire(
            SourceConfig(repo_id=PUBLISH_REPO, revision=event["commit"], endpoint=publish_hub.url),
            settings=TransferSettings(workers=2, stall_timeout_s=5.0, max_attempts=2),
        )
        assert acquired.commit == event["commit"] and verify_dir(acquired.model_dir) == []
        for name in ("config.json", "model.safetensors.index.json", "README.md"):
            assert (acquired.model_dir / name).is_file(), name
    # Each step ends on a passing window; none failed (a thin window may be inconclusive).
    verdicts = [(w.weight, w.verdict.verdict) for w in out.windows]
    assert (25, "pass") in verdicts and verdicts[-1] == (50, "pass"), verdicts
    assert all(v != "fail" for _, v in verdicts), verdicts
    # The same model answers the probes alike through the pinned slots: every window's
    # quality check ran on real answers, both scored above 0 on the answer key, and passed
    # (the probes counted apart, in HAProxy).
    for w in out.windows:
        assert w.verdict.probes.answered == {"stable": 4, "canary": 4}, w.verdict.probes
        [scores] = w.verdict.quality
        assert scores.outcome == "pass" and scores.canary > 0 and scores.stable > 0, scores
        assert any(c.name.startswith("quality ") for c in w.verdict.checks)
    assert [(a.by, a.approve) for a in out.answers] == [("person", True)]
    after = registry.load()
    assert after.stable.release_id == healthy_id and after.canary is None

    status = promote.status()
    assert status["rollout"]["state"] == "promoted"
    assert status["rollout"]["last_window"]["verdict"] == "pass"
    # The record is PostgreSQL's (no SQLite file in the home), and it holds the whole story:
    # the first stable replaced, the faulty canary rolled back, the healthy one stable.
    assert not (home / "record.db").exists()
    lines = {line.release_id: line for line in lineage.history("tiny")}
    states = {release_id: line.state for release_id, line in lines.items()}
    # The walks are on the record (these releases have no run folder): each window with its
    # verdict, the approval with who gave it.
    deaf_walk = lines[deaf_id]
    assert [(w.weight, w.verdict) for w in deaf_walk.windows] == [(25, "fail")], deaf_walk
    assert "quality" in deaf_walk.windows[0].reason and deaf_walk.rollout == "rolled back"
    healthy_walk = lines[healthy_id]
    assert [(w.weight, w.verdict) for w in healthy_walk.windows] == verdicts, healthy_walk
    assert len(healthy_walk.approvals) == 1 and "person" in healthy_walk.approvals[0]
    # Each step of the walk as a step: its weight, when it began, how it ended.
    weights = [s.weight for s in healthy_walk.steps]
    assert weights == sorted(weights) and {w for w, _ in verdicts} <= set(weights), weights
    assert healthy_walk.steps[-1].outcome == "promoted", healthy_walk.steps
    assert sum(len(s.windows) for s in healthy_walk.steps) == len(verdicts)
    assert "canary walk" not in healthy_walk.from_report + healthy_walk.missing
    assert states[faulty_id] == "rolled back" and states[deaf_id] == "rolled back", states
    assert states[healthy_id] == "stable", states
    assert sorted(states.values()) == ["replaced", "rolled back", "rolled back", "stable"]
    # The new stable release's alert rules are loaded into the project's Prometheus.
    rules = requests.get(
        f"{for_home().url}/api/v1/rules", auth=for_home().http_auth(), timeout=10
    ).json()["data"]
    names = json.dumps(rules)
    assert healthy_id in names and "TTFT" in names.upper()

    # Kill -9 the stable server (as the OOM killer would) under steady traffic: its
    # supervisor reaps the whole process group (the engine core too) and starts it again;
    # back through the router and serving the traffic, the restart counted in Prometheus
    # and alerted (the restart rule has no 'for': it fires at its first evaluation).
    assert "LLMReleaseServerRestarted" in names and "LLMReleaseServerCrashLooping" in names
    stable = after.stable
    before = supervise.read_state(stable.log_path)
    assert before.state == "running" and before.restarts == 0
    tree = [p.pid for p in psutil.Process(before.server_pid).children(recursive=True)]
    assert tree, "vLLM's engine core runs as a child of its API server"
    router = promote.router_for(registry.load())
    traffic = Traffic(
        f"{router.url}/v1",
        "tiny",
        rate_rps=2.0,
        duration_s=stable.serving.startup_timeout_s + 120,
        concurrency=4,
        max_tokens=4,
        timeout_s=30,
        api_key=router.api_key,
    ).start()
    traffic_t0 = time.monotonic()  # its samples' clock (sent at: seconds since start)
    time.sleep(2)  # steady before the kill
    killed = time.monotonic()
    os.kill(before.server_pid, signal.SIGKILL)
    deadline = killed + stable.serving.startup_timeout_s + 30
    while time.monotonic() < deadline:
        now = supervise.read_state(stable.log_path)
        if now.state == "running" and now.restarts == 1:
            break
        time.sleep(0.5)
    assert now.state == "running" and now.restarts == 1, now
    back_s = time.monotonic() - killed
    assert not any(processes.is_alive(pid) for pid in tree), "an orphan of the killed server"
    # Healthy to the supervisor; HAProxy takes it back at its next check (inter 1s, rise
    # 1): serving through the load balancer within a few seconds of that.
    healthy_at = time.monotonic()
    while True:
        answer = requests.post(
            f"{router.url}/v1/chat/completions",
            headers=router.auth_headers,
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2,
            },
            timeout=60,
        )
        if answer.status_code == 200 or time.monotonic() - healthy_at > 10:
            break
        time.sleep(0.5)
    assert answer.status_code == 200, (answer.status_code, answer.text[:300], back_s)
    serving_again = time.monotonic() - traffic_t0
    query = f'llm_release_server_restarts_total{{role="stable", release="{healthy_id}"}}'
    for _ in range(30):
        counted = for_home().client.value(query)
        if counted == 1:
            break
        time.sleep(1)
    assert counted == 1, (query, counted)
    # The alert, active in Prometheus (firing: no 'for' to wait out).
    for _ in range(30):
        alerts = requests.get(
            f"{for_home().url}/api/v1/alerts", auth=for_home().http_auth(), timeout=10
        ).json()
        restarted = [
            a
            for a in alerts["data"]["alerts"]
            if a["labels"]["alertname"] == "LLMReleaseServerRestarted"
            and a["labels"].get("release") == healthy_id
        ]
        if restarted and restarted[0]["state"] == "firing":
            break
        time.sleep(1)
    assert restarted and restarted[0]["state"] == "firing", alerts["data"]["alerts"]
    assert restarted[0]["labels"]["role"] == "stable", restarted
    # ... and sent to the project's Alertmanager, which routes it to the receiver (its
    # delivery to a webhook, once, is tests/integration/test_alert_delivery.py's).
    from llm_release.canary import alertmanager

    # (its API asks for the project's credentials: basic auth, basic_auth.py)
    am = alertmanager.for_home()
    received = []
    for _ in range(30):
        received = [
            a
            for a in requests.get(f"{am.url}/api/v2/alerts", auth=am.http_auth(), timeout=10).json()
            if a["labels"]["alertname"] == "LLMReleaseServerRestarted"
            and a["labels"].get("release") == healthy_id
        ]
        if received:
            break
        time.sleep(1)
    # (active, or suppressed while a critical alert of the service still fires: inhibition)
    assert received and received[0]["status"]["state"] in ("active", "suppressed"), received
    # The steady traffic is served again since the server came back: what failed, failed
    # while it was down.
    time.sleep(max(0.0, serving_again + 6 - (time.monotonic() - traffic_t0)))
    report = traffic.stop()
    samples = traffic.samples()
    served_again = [err for sent, _, err in samples if sent > serving_again + 1]
    assert served_again and not any(served_again), (report.summary(), samples[-10:])
    assert report.succeeded > 0, report.summary()
    assert registry.load().stable.pid == stable.pid  # the same supervisor, the same record
