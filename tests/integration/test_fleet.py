"""The fleet against a real Prefect server (the one ``make prefect-up`` starts, with its
credentials): two hosts join with their GPUs stated, one runs its worker on its own queue,
and ``flows.fleet list`` shows both as Prefect records them (issue 37, item 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llm_release.serving.serve import free_port, stop_process_group
from tests.helpers import prefect_deploy

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PREFECT = Path(sys.executable).parent / "prefect"


def fleet(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flows.fleet", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def listed(env: dict) -> dict[str, dict]:
    out = fleet(env, "list", "--json")
    assert out.returncode == 0, out.stderr
    return {host["name"]: host for host in json.loads(out.stdout)}


def slots_seen(env: dict, host: str | None) -> str:
    """The limit a run of ``host``'s worker takes its slots from, and its size (or the
    one-line error), as tasks.slots reads them with the worker's environment."""
    code = "from tasks.slots import host_limit, limit_name; print(limit_name(), host_limit())"
    run_env = env | ({"LLM_RELEASE_HOST_NAME": host} if host else {})
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=run_env, capture_output=True, text=True
    )
    return out.stdout.strip() if out.returncode == 0 else out.stderr.strip().splitlines()[-1]


def fleet_cards_seen(env: dict, host: str | None) -> list:
    """The cards a release's plan stage on ``host`` plans against (tasks.fleet)."""
    code = (
        "import json; from tasks.fleet import release_fleet; "
        "print(json.dumps([[c.name, len(c.gpus)] for c in release_fleet()]))"
    )
    run_env = env | ({"LLM_RELEASE_HOST_NAME": host} if host else {})
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=run_env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_hosts_join_with_their_gpus_and_a_worker_on_their_own_queue(prefect_api, tmp_path):
    env = prefect_api
    joined = fleet(env, "join", "gpu_a", "--gpus", "2", "--gpu-memory-gib", "79.6")
    assert joined.returncode == 0, joined.stderr
    assert "llm-release host gpu_a: 2 GPU × 79.6 GiB (stated); queue host-gpu_a" in joined.stdout
    assert "slots: llm-release-host-gpu_a = 2\n" in joined.stdout
    assert fleet(env, "join", "gpu_b", "--gpus", "1", "--gpu-memory-gib", "139.8").returncode == 0
    hosts = listed(env)
    assert sorted(hosts) == ["gpu_a", "gpu_b"]
    assert (hosts["gpu_a"]["gpus"], hosts["gpu_a"]["gpu_memory_gib"]) == (2, [79.6])
    assert hosts["gpu_b"]["queue"] == "host-gpu_b" and hosts["gpu_b"]["worker"] == "none"
    # each host's slots are a limit of its own, one per GPU: what its worker's runs take
    assert (hosts["gpu_a"]["slots"], hosts["gpu_b"]["slots"]) == (2, 1)
    assert slots_seen(env, "gpu_a") == "llm-release-host-gpu_a 2"
    assert slots_seen(env, "gpu_b") == "llm-release-host-gpu_b 1"
    assert "create llm-release-host --limit" in slots_seen(env, None)  # one-host mode's
    # a release's plan stage on a host of the fleet plans every host's card; outside it, none
    assert fleet_cards_seen(env, "gpu_b") == [["gpu_a", 2], ["gpu_b", 1]]
    assert fleet_cards_seen(env, None) == []

    # gpu_a's worker polls its queue alone; Prefect records it, and its heartbeats.
    worker = subprocess.Popen(
        [str(PREFECT), "worker", "start", "--pool", "llm-release"]
        + ["--work-queue", "host-gpu_a", "--name", "gpu_a"],
        env=env,
        stdout=open(tmp_path / "worker.log", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and listed(env)["gpu_a"]["worker"] != "ONLINE":
            time.sleep(1)
        hosts = listed(env)
        assert hosts["gpu_a"]["worker"] == "ONLINE", (tmp_path / "worker.log").read_text()[-2000:]
        assert hosts["gpu_a"]["last_heartbeat"] is not None
        assert hosts["gpu_b"]["worker"] == "none"
        table = fleet(env, "list").stdout
        assert "gpu_a" in table and "ONLINE" in table and "host-gpu_b" in table
    finally:
        stop_process_group(worker.pid, grace_s=10)

    # Joining again updates the card; the queue stays one.
    again = fleet(env, "join", "gpu_a", "--gpus", "4", "--gpu-memory-gib", "79.6")
    assert again.returncode == 0, again.stderr
    assert "slots: llm-release-host-gpu_a = 2 (kept as it was set" in again.stdout
    assert "prefect gcl update llm-release-host-gpu_a --limit 4" in again.stdout
    hosts = listed(env)
    assert hosts["gpu_a"]["gpus"] == 4 and len(hosts) == 2
    assert hosts["gpu_a"]["slots"] == 2  # a limit that exists is left as the operator set it


def test_bad_names_and_half_stated_gpus_are_one_line_before_the_api(prefect_api):
    env = prefect_api
    for args, says in (
        (["join", "Bad Name"], "is not a host name"),
        (["join", "a" * 300], "is not a host name"),
        (["join", "gpu_c", "--gpus", "2"], "--gpus and --gpu-memory-gib go together"),
    ):
        out = fleet(env, *args)
        assert out.returncode == 2 and says in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert listed(env) == {}


def test_a_card_edited_to_nonsense_shows_no_gpu_and_breaks_no_listing(prefect_api):
    """A card is a Prefect variable anyone with the API may edit: read as input."""
    env = prefect_api
    assert fleet(env, "join", "gpu_a", "--gpus", "1", "--gpu-memory-gib", "80").returncode == 0
    assert fleet(env, "join", "gpu_b", "--gpus", "2", "--gpu-memory-gib", "80").returncode == 0
    edit = (
        "from prefect.variables import Variable; "
        "Variable.set('llm_release_host_gpu_a', {'name': 'x', 'gpus': 'all'}, overwrite=True)"
    )
    done = subprocess.run([sys.executable, "-c", edit], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    hosts = listed(env)
    assert hosts["gpu_a"]["gpus"] == 0 and hosts["gpu_b"]["gpus"] == 2
    assert fleet_cards_seen(env, "gpu_b") == [["gpu_b", 2]]  # the plan leaves it out


def test_no_prefect_api_is_one_line_saying_how_to_start_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {
        "PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api",
        "PREFECT_HOME": str(tmp_path),
        "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}",
    }
    out = fleet(env, "list")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "did not answer" in out.stderr and "make prefect-up" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def release_runs(env: dict) -> list[str]:
    """The work queue of every flow run the server holds."""
    code = (
        "import json; from prefect.client.orchestration import get_client\n"
        "with get_client(sync_client=True) as c:\n"
        "    print(json.dumps([r.work_queue_name for r in c.read_flow_runs()]))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_release_sent_home_runs_on_that_hosts_worker_and_nowhere_else(prefect_api, tmp_path):
    """``flows.release --deployment --home gpu_a`` sends the run to ``host-gpu_a``: only the
    worker polling that queue takes it, and one whose host name is not gpu_a refuses it in
    the plan stage (a misconfigured worker would measure with another host's slots)."""
    env = prefect_api | {"LLM_RELEASE_PROJECT": str(ROOT)}
    assert fleet(env, "join", "gpu_a", "--gpus", "1", "--gpu-memory-gib", "80").returncode == 0
    prefect_deploy(env, "release", root=ROOT)

    def send(home: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "flows.release", "--deployment", "release/release"]
            + ["--home", home, "--deployment-timeout-s", "240"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    # a host that never joined: one line, and no run made on a queue nobody polls
    refused = send("gpu_z")
    assert refused.returncode != 0
    assert "host 'gpu_z' has not joined the fleet (hosts: gpu_a)" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert release_runs(env) == []

    # gpu_a's queue polled by a worker that says it is gpu_b
    worker = subprocess.Popen(
        [str(PREFECT), "worker", "start", "--pool", "llm-release"]
        + ["--work-queue", "host-gpu_a", "--name", "gpu_a"],
        cwd=ROOT,
        env=env | {"LLM_RELEASE_HOST_NAME": "gpu_b", "LLM_RELEASE_HOME": str(tmp_path / "b")},
        stdout=open(tmp_path / "worker.log", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        sent = send("gpu_a")
    finally:
        stop_process_group(worker.pid, grace_s=10)
    log = (tmp_path / "worker.log").read_text(errors="replace")
    assert release_runs(env) == ["host-gpu_a"]
    assert sent.returncode != 0, sent.stdout[-2000:] + log[-3000:]
    assert "ended Failed" in sent.stderr, sent.stderr + log[-3000:]
    assert "sent to host 'gpu_a' (queue host-gpu_a) but host 'gpu_b' took it" in log, log[-4000:]
