"""The Prefect UI as the control room, against a real `prefect server start` (its services:
the repossessor frees expired slot leases, triggers and actions run automations):
`prefect deploy --all`, a process worker, runs started through the API as the UI starts
them, host slots shared by two runs and freed after a killed run, and notifications to a
webhook on 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from demo.hub_server import HubServer, publish_repo
from llm_release.serving.serve import free_port
from tests.helpers import drain_prefect_slot_services, stop_group

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DEPLOYMENTS = {
    "release",
    "release-gpu",
    "model-update",
    "canary-rollout",
    "promote",
    "rollback",
    "eval-only",
    "measure",
}
REPO = "tests/control-room"
# The shortest lease Prefect 3.9's API accepts (ge=60 on /v2/concurrency_limits/increment-with-lease).
LEASE_S = 60


def wait_for(predicate, timeout_s: float, step_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step_s)
    return predicate()


class Receiver(BaseHTTPRequestHandler):
    bodies: list[dict] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        length = int(self.headers.get("Content-Length", 0))
        self.bodies.append(json.loads(self.rfile.read(length) or b"{}"))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def control(tmp_path_factory):
    """A Prefect server with every service, the environment a worker and `prefect deploy`
    see, and the settings this process's client uses."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    base = tmp_path_factory.mktemp("control")
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    common = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "LLM_RELEASE_"))}
    server_env = common | {
        "PREFECT_HOME": str(base / "server-home"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        # No cron runs of model-update during the test; expired leases looked at each second.
        "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false",
        "PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS": "1",
    }
    server = subprocess.Popen(
        [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=server_env,
        stdout=open(base / "server.log", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    home = Path(tempfile.mkdtemp(prefix="llmr-ctl-", dir="/tmp"))
    client_env = common | {
        "PREFECT_API_URL": url,
        "PREFECT_HOME": str(base / "client-home"),
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",
        "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}",
        "LLM_RELEASE_PROJECT": str(ROOT),
        "LLM_RELEASE_HOME": str(home),
        "LLM_RELEASE_SLOT_LEASE_S": str(LEASE_S),
    }
    control_cleanup = []
    try:
        started = time.monotonic()
        healthy = wait_for(lambda: _healthy(url), 120)
        assert healthy, (base / "server.log").read_text()[-3000:]
        print(f"prefect server healthy after {time.monotonic() - started:.1f}s")
        with temporary_settings({PREFECT_API_URL: url}):
            try:
                yield {
                    "url": url,
                    "env": client_env,
                    "home": home,
                    "base": base,
                    "cleanup": control_cleanup,
                }
            finally:
                drain_prefect_slot_services()
    finally:
        for close in control_cleanup:
            close()
        stop_group(server)


def _healthy(url: str) -> bool:
    try:
        return requests.get(f"{url}/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def holder(control, tag: str, seconds: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.slot_holder", tag, str(seconds)],
        cwd=ROOT,
        env=control["env"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def marks(output: str) -> dict[str, float]:
    return {
        f"{w[0]} {w[1]}": float(w[2])
        for w in (line.split() for line in output.splitlines())
        if len(w) == 3 and w[0] in ("WAITING", "TAKEN", "FREED")
    }


def active_slots() -> int:
    from prefect.client.orchestration import get_client

    from tasks.slots import HOST_LIMIT

    with get_client(sync_client=True) as client:
        return client.read_global_concurrency_limit_by_name(HOST_LIMIT).active_slots


def test_two_runs_share_one_host_slot(control):
    """Two runs started together: the second waits until the first releases the slot."""
    # each holds it 10 s: long enough for the later one to have started and be waiting on a
    # loaded 2-core CI host (CI65: with 3 s it was still starting when the slot came free)
    first, second = holder(control, "a", 10), holder(control, "b", 10)
    out = {name: p.communicate(timeout=120)[0] for name, p in (("a", first), ("b", second))}
    assert first.returncode == 0 and second.returncode == 0, out
    t = marks(out["a"]) | marks(out["b"])
    (early, late) = sorted("ab", key=lambda n: t[f"TAKEN {n}"])
    assert t[f"TAKEN {late}"] >= t[f"FREED {early}"], t
    # The later run was ready before the slot came free: it waited, it was not just late.
    assert t[f"WAITING {late}"] < t[f"FREED {early}"], t
    assert active_slots() == 0


@pytest.fixture(scope="module")
def killed_slot(control) -> dict:
    """A run SIGKILLed while a step holds the slot: no `finally` runs. Its lease (LEASE_S)
    starts at the kill; the slot count is read right after it."""
    proc = holder(control, "killed", 600)
    line = proc.stdout.readline()
    while line and not line.startswith("TAKEN"):
        line = proc.stdout.readline()
    assert line.startswith("TAKEN"), "the holder never took the slot"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    return {"wall": time.time(), "active_after_kill": active_slots()}


def test_killed_run_holds_its_slot_until_the_lease_expires(waiting_eval, killed_slot):
    # waiting_eval first: the deployments exist before the kill, and eval-only is submitted
    # right after it, inside the lease (LEASE_S), whatever the module's other tests take.
    assert killed_slot["active_after_kill"] == 1


@pytest.fixture(scope="module")
def receiver():
    Receiver.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", Receiver.bodies
    server.shutdown()


def python_ok(control, *args: str) -> None:
    """Run ``python ARGS`` from the repository with the control room's environment; it must
    succeed within two minutes."""
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=control["env"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def control_setup(control, webhook_url: str) -> None:
    python_ok(control, "-m", "flows.control", "--webhook-url", webhook_url)


@pytest.fixture(scope="module")
def notifications(control, receiver):
    """The blocks and the automations that post to the webhook receiver: what every test
    of a notification needs, whichever of them runs first."""
    control_setup(control, receiver[0])
    return receiver


def test_setup_registers_blocks_and_notifications(control, notifications):
    from prefect.client.orchestration import get_client

    control_setup(control, notifications[0])  # idempotent: a second setup changes nothing
    with get_client(sync_client=True) as client:
        assert client.read_block_type_by_slug("llm-release-hub-credentials")
        for name in ("llm-release: run failed", "llm-release: rollback"):
            assert len(client.read_automations_by_name(name)) == 1


@pytest.fixture(scope="module")
def worker(control):
    env = control["env"]
    subprocess.run(
        [str(BIN / "prefect"), "work-pool", "create", "llm-release", "--type", "process"],
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    proc = subprocess.Popen(
        [str(BIN / "prefect"), "worker", "start", "--pool", "llm-release"],
        cwd=ROOT,
        env=env,
        stdout=open(control["base"] / "worker.log", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    yield proc
    stop_group(proc)


@pytest.fixture(scope="module")
def deployed(control, worker) -> dict:
    """`prefect deploy --all` from prefect.yaml, as an operator runs it, with a worker polling
    the pool: every deployment by name."""
    from prefect.client.orchestration import get_client

    started = time.monotonic()
    proc = subprocess.run(
        [str(BIN / "prefect"), "--no-prompt", "deploy", "--all"],
        cwd=ROOT,
        env=control["env"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(f"prefect deploy --all: {time.monotonic() - started:.1f}s")
    with get_client(sync_client=True) as client:
        return {d.name: d for d in client.read_deployments()}


def test_deploy_all_gives_every_action_a_typed_form(deployed):
    deployments = deployed
    assert set(deployments) == DEPLOYMENTS
    # The forms' defaults are the named profiles: on this CPU host, the CPU host's settings
    # (configs/cpu-host.json), which ask a person; the demo's file is the same settings with
    # the approvals given by the config (what `make demo` passes explicitly).
    from llm_release.config import ReleaseConfig

    host = json.loads((ROOT / "configs" / "cpu-host.json").read_text())
    demo = json.loads((ROOT / "configs" / "demo.json").read_text())
    for name in ("release", "model-update"):
        defaults = dict(deployments[name].parameters["config"])
        assert defaults.pop("source")["repo_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
        assert defaults == host, name
    assert demo.pop("review") == {"auto": "approve"}
    assert {k: demo["rollout"].pop(k) for k in ("approval", "approval_timeout_s")} == {
        "approval": "approve",
        "approval_timeout_s": 300,
    }
    assert {k: host["rollout"].pop(k) for k in ("approval", "approval_timeout_s")} == {
        "approval": "ask",
        "approval_timeout_s": 3600,
    }
    assert demo == host
    # No deployment approves by itself: an inconclusive gate and the step to 100% wait for
    # a person (no answer in time rejects, or rolls back).
    for name in ("release", "model-update", "release-gpu"):
        config = ReleaseConfig.model_validate(deployments[name].parameters["config"])
        assert config.review.auto is None and config.rollout.approval == "ask", name
    # The nightly schedule is deployed paused: nothing runs on a host until someone says so.
    assert [(s.schedule.cron, s.active) for s in deployments["model-update"].schedules] == [
        ("0 2 * * *", False)
    ]
    gpu = ReleaseConfig.model_validate(deployments["release-gpu"].parameters["config"])
    assert not gpu.serving.enforce_eager and gpu.load.concurrencies == [10, 50, 100]
    for name, deployment in deployments.items():
        if "config" in deployment.parameters:
            ReleaseConfig.model_validate(deployment.parameters["config"])
        schema = deployment.parameter_openapi_schema
        assert schema["properties"], name
        for param, spec in schema["properties"].items():
            assert untyped(spec, schema.get("definitions", {})) == [], (name, param, spec)


def untyped(spec: dict, definitions: dict, seen: frozenset = frozenset()) -> list[str]:
    """Parts of a parameter's schema that a form can only show as a free JSON box."""
    if "$ref" in spec:
        ref = spec["$ref"].split("/")[-1]
        return [] if ref in seen else untyped(definitions[ref], definitions, seen | {ref})
    if "anyOf" in spec or "allOf" in spec:
        return [
            p
            for s in spec.get("anyOf", []) + spec.get("allOf", [])
            for p in untyped(s, definitions, seen)
        ]
    kind = spec.get("type")
    if kind is None and "enum" not in spec and "const" not in spec:
        return [json.dumps(spec)[:80]]
    if kind == "object":
        if "properties" in spec:
            return [p for s in spec["properties"].values() for p in untyped(s, definitions, seen)]
        extra = spec.get("additionalProperties")
        if not isinstance(extra, dict):
            return [json.dumps(spec)[:80]]
        return untyped(extra, definitions, seen)
    if kind == "array":
        return untyped(spec.get("items", {}), definitions, seen) if spec.get("items") else ["array"]
    return []


def run(name: str, parameters: dict, timeout_s: float = 120):
    from prefect.deployments import run_deployment

    # The run's own clock, as the UI shows it: from its creation (the click) to its end.
    flow_run = run_deployment(name=name, parameters=parameters, timeout=timeout_s, poll_interval=1)
    return flow_run, (flow_run.end_time - flow_run.created).total_seconds()


def test_model_update_of_a_released_commit_ends_in_seconds(
    control, deployed, tmp_path, monkeypatch
):
    from llm_release import registry
    from llm_release.config import ServingConfig

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    commit = publish_repo(tmp_path / "hub", REPO, model)
    # The worker's home: this commit is the stable release there.
    monkeypatch.setenv("LLM_RELEASE_HOME", str(control["home"]))
    stable = registry.Release(
        release_id="baseline-1",
        candidate="baseline",
        scheme="none",
        repo_id=REPO,
        commit=commit,
        model_dir=str(model),
        public_name="control-room",
        port=20001,
        pid=1,
        log_path="/dev/null",
        serving=ServingConfig(),
    )
    registry.save(registry.RegistryState(stable=stable))
    with HubServer(tmp_path / "hub") as hub:
        flow_run, seconds = run(
            "model-update/model-update",
            {"config": {"source": {"repo_id": REPO, "endpoint": hub.url}}},
        )
        # What `make demo` does (flows.model_update --deployment): the run's typed outcome,
        # read back from the result the worker's run persisted.
        from flows.cli import through_deployment
        from flows.model_update import UpdateOutcome
        from llm_release.config import ReleaseConfig

        outcome = through_deployment(
            "model-update/model-update",
            ReleaseConfig.model_validate({"source": {"repo_id": REPO, "endpoint": hub.url}}),
            120,
            UpdateOutcome,
        )
    print(f"model-update (already released) through the worker: {seconds:.1f}s")
    assert flow_run.state.is_completed(), flow_run.state
    assert seconds < 15
    assert (outcome.status, outcome.commit) == ("up-to-date", commit), outcome


@pytest.fixture(scope="module")
def waiting_eval(control, deployed, killed_slot) -> dict:
    """`eval-only` started from the deployment while the killed run's slot is still leased:
    it waits for the slot, then evaluates the stable release's server (an OpenAI-compatible
    fake: the flow's plumbing is under test; lm-eval's scoring has its own tests). Started
    early in the module so that its wait, the lease's, runs while the other tests do."""
    from prefect.deployments import run_deployment

    from llm_release import registry
    from llm_release.config import ServingConfig
    from llm_release.serving import processes
    from tests.fake_openai import FakeServer

    active_at_submit = active_slots()
    home = Path(tempfile.mkdtemp(prefix="llmr-eval-", dir="/tmp"))
    server = FakeServer("stable-eval-1", 0, home, home=home)
    control["cleanup"].append(server.close)
    # The stable release's folder, one of the home's model folders (the only kind a
    # recorded model_dir is read as).
    model = home / "models" / "stable-eval"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    stable = registry.Release(
        release_id="stable-eval-1",
        candidate="baseline",
        scheme="none",
        repo_id=REPO,
        commit="0" * 40,
        model_dir=str(model),
        public_name="control-room",
        port=server.port,
        pid=server.pid,
        pid_started=processes.start_time(server.pid),
        log_path="/dev/null",
        serving=ServingConfig(),
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLM_RELEASE_HOME", str(home))
        registry.save(registry.RegistryState(stable=stable))
    # A run's own settings, as the UI's custom run sets them: this run's home.
    flow_run = run_deployment(
        name="eval-only/eval-only",
        parameters={"evaluation": {"eval_sets": ["refusal_kb"], "limit": 2}},
        job_variables={"env": control["env"] | {"LLM_RELEASE_HOME": str(home)}},
        timeout=0,
    )
    return {"run": flow_run.id, "home": home, "active_at_submit": active_at_submit}


def test_eval_only_is_submitted_while_the_killed_runs_lease_holds_the_slot(waiting_eval):
    assert waiting_eval["active_at_submit"] == 1, "submitted before the lease expired"


def test_rollback_without_a_canary_fails_with_one_line(control, deployed, notifications):
    flow_run, seconds = run("rollback/rollback", {"reason": "latency regression"})
    print(f"rollback (no canary) through the worker: {seconds:.1f}s")
    assert flow_run.state.is_failed(), flow_run.state
    message = flow_run.state.message
    assert "there is no canary to roll back" in message and "\n" not in message, message
    # The automation on failed runs posts to the webhook, with the run's message.
    posted = wait_for(lambda: [b for b in notifications[1] if b.get("kind") == "run failed"], 30)
    assert posted and posted[0]["flow"] == "rollback", notifications[1]
    assert "there is no canary to roll back" in posted[0]["message"]


def test_eval_only_without_a_stable_release_fails_with_one_line(control, deployed):
    flow_run, _ = run("eval-only/eval-only", {"evaluation": {"limit": 2}})
    assert flow_run.state.is_failed()
    assert "no live stable release" in flow_run.state.message
    assert "\n" not in flow_run.state.message


def test_a_rollback_event_reaches_the_webhook_with_its_reason(control, notifications):
    # Emitted from a process of its own with this server's environment, as a flow run's
    # process emits it. In this pytest process Prefect's events worker is a singleton that
    # an earlier module's flow may have started against its own, since stopped, server
    # (CI: "Unable to connect to 'ws://127.0.0.1:32851'", the event dropped).
    script = (
        "from prefect.events.worker import EventsWorker\n"
        "from tasks.notify import emit_rollback\n"
        "emit_rollback('fp8-dynamic-abc', 'TTFT p95 4.2 s over the 3 s ceiling')\n"
        "EventsWorker.drain_all()\n"
    )
    python_ok(control, "-c", script)
    posted = wait_for(lambda: [b for b in notifications[1] if b.get("kind") == "rollback"], 30)
    assert posted == [
        {
            "kind": "rollback",
            "release": "fp8-dynamic-abc",
            "reason": "TTFT p95 4.2 s over the 3 s ceiling",
        }
    ]


def test_the_killed_runs_slot_came_free_and_the_waiting_run_took_it(killed_slot, waiting_eval):
    """With one slot, the waiting eval-only run can only have started evaluating once the
    killed run's lease expired; when it ends, no slot is taken."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    def finished():
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(waiting_eval["run"])
        return run if run.state.is_final() else None

    flow_run = wait_for(finished, 240, 1)
    assert flow_run and flow_run.state.is_completed(), flow_run and flow_run.state
    with get_client(sync_client=True) as client:
        logs = client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run.id]))
        )
        artifacts = {a.key: a for a in client.read_artifacts() if a.flow_run_id == flow_run.id}
    (asked,) = [
        log.timestamp.timestamp() for log in logs if "waiting for a host slot" in log.message
    ]
    (taken,) = [log.timestamp.timestamp() for log in logs if "host slot taken" in log.message]
    waited = taken - killed_slot["wall"]
    print(
        f"eval-only: slot taken {waited:.0f}s after the kill; "
        f"run {(flow_run.end_time - flow_run.created).total_seconds():.0f}s"
    )
    assert waited >= LEASE_S, "the run took a slot that a killed run's lease still held"
    # Freed by the server's repossessor (every second here) once the lease expired.
    free_at = max(asked, killed_slot["wall"] + LEASE_S)
    assert taken - free_at <= 30, "the killed run's slot was not freed after its lease"
    assert active_slots() == 0
    (report,) = (waiting_eval["home"] / "runs").glob(
        f"eval-*-{str(flow_run.id)[:8]}/eval-report.md"
    )
    assert report.read_text().startswith("# Evaluation of stable release stable-eval-1")
    # the eval set's row of the scores table (tabulate pads the cells to the column's width)
    assert re.search(r"^\| refusal_kb +\|", report.read_text(), re.MULTILINE)
    assert re.search(r"^\| refusal_kb +\|", artifacts["eval-only"].data, re.MULTILINE)
