"""The ``measure`` deployment on a host of the fleet (issue 37, item 2), against a real
Prefect server: the release host (a process with its own home) hands the tiny model over
through a real hub and sends one ``MeasureOrder`` to host gpu_b's queue (``run_deployment``);
gpu_b's worker (another home, the record shared) receives the candidate and proves every
file, serves it in real vLLM, evaluates and load-tests it; the release host reads the
result back from the record. A host that has not joined gets nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from demo.hub_server import HubServer
from llm_release.serving.serve import stop_process_group
from tests.helpers import prefect_deploy

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PREFECT = Path(sys.executable).parent / "prefect"
RUN = "20261206T120000Z-5e4d3c2b"
SECRET = "hf_FleetHubWriteToken"

# The release host's side, in a process of its own: hand over, send, read back.
DISPATCH = """
import json, sys
from pathlib import Path
from prefect import flow
from llm_release.config import EvalConfig, LoadProfile, ServingConfig
from llm_release.decision.remote import MeasureOrder, OrderedContender
from llm_release.errors import ReleaseError
from llm_release.hub.credentials import HubToken
from llm_release.hub.handover import hand_over, repo_for
from llm_release.hub.publish import PublishTarget
from tasks.dispatch import measure_on_host

model_dir, hub, token, run_id, host = sys.argv[1:6]
target = PublishTarget(repo_id=repo_for("fleet", "tests/tiny-llama", "baseline", run_id),
                       endpoint=hub, token=HubToken(endpoint=hub, token=token))
handover = hand_over(Path(model_dir), target, run_id=run_id, candidate="baseline",
                     scheme="unquantized", upstream_repo="tests/tiny-llama",
                     upstream_commit="a" * 40)
order = MeasureOrder(
    run_id=run_id, release_host="gpu_a", public_name="tiny", handover=handover,
    contender=OrderedContender(name="baseline", role="baseline", scheme="unquantized",
        serving=ServingConfig(enforce_eager=True, max_model_len=1024, max_num_seqs=8)),
    evaluation=EvalConfig(limit=4),
    load=LoadProfile(concurrencies=[1], requests_per_level=2, prompt_tokens=32, output_tokens=8),
)

@flow(name="release-host")
def send():
    state = measure_on_host(order, host, timeout_s=900, return_state=True)
    return state.result(raise_on_failure=False)

result = send()
if isinstance(result, ReleaseError):
    print(json.dumps({"refused": result.one_line()}))
else:
    print(json.dumps({"result": result.model_dump(mode="json")}))
"""


def dispatch(env: dict, home: Path, model_dir: Path, hub: str, host: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", DISPATCH, str(model_dir), hub, SECRET, RUN, host],
        cwd=ROOT,
        env=env | {"LLM_RELEASE_HOME": str(home), "LLM_RELEASE_HOST_NAME": "gpu_a"},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_contender_is_measured_by_the_host_whose_queue_it_was_sent_to(
    prefect_api, tiny_model_dir, hub_root, tmp_path
):
    record = f"sqlite:///{tmp_path / 'record.db'}"  # the fleet's one record
    env = prefect_api | {
        "LLM_RELEASE_PROJECT": str(ROOT),
        "LLM_RELEASE_DATABASE_URL": record,
        "LLM_RELEASE_PROBES": os.environ["LLM_RELEASE_PROBES"],
    }
    for host in ("gpu_a", "gpu_b"):
        joined = subprocess.run(
            [sys.executable, "-m", "flows.fleet", "join", host, "--gpus", "0"]
            + ["--gpu-memory-gib", "1"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        assert joined.returncode == 0, joined.stderr
    prefect_deploy(env, "measure", root=ROOT)
    host_b = tmp_path / "host-b"
    worker = subprocess.Popen(
        [str(PREFECT), "worker", "start", "--pool", "llm-release"]
        + ["--work-queue", "host-gpu_b", "--name", "gpu_b"],
        cwd=ROOT,
        env=env | {"LLM_RELEASE_HOME": str(host_b), "LLM_RELEASE_HOST_NAME": "gpu_b"},
        stdout=open(tmp_path / "worker-b.log", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    home_a = tmp_path / "host-a"
    model_dir = home_a / "candidates" / "baseline"
    shutil.copytree(tiny_model_dir, model_dir)
    try:
        with HubServer(hub_root, token=SECRET) as hub:
            # a host that never joined: refused before any run is made for it
            refused = dispatch(env, home_a, model_dir, hub.url, "gpu_z")
            assert "host gpu_z has not joined the fleet" in refused["refused"]
            started = time.monotonic()
            sent = dispatch(env, home_a, model_dir, hub.url, "gpu_b")
            print(f"measured on gpu_b in {time.monotonic() - started:.0f} s")
    finally:
        stop_process_group(worker.pid, grace_s=10)
    log = (tmp_path / "worker-b.log").read_text(errors="replace")
    result = sent.get("result") or {}
    assert result.get("status") == "measured", json.dumps(sent)[:3000] + log[-3000:]
    assert [lv["concurrency"] for lv in result["load"]["levels"]] == [1]
    assert result["evals"] and all(e["num_items"] == 4 for e in result["evals"])
    # measured on gpu_b: its own home received the model and ran vLLM; host A served nothing
    assert Path(result["model_dir"]).is_relative_to(host_b), result["model_dir"]
    assert (host_b / "runs" / RUN / "candidates" / "baseline" / "vllm.log").is_file()
    assert not (home_a / "runs").exists()
    assert "gpu_z" not in log
