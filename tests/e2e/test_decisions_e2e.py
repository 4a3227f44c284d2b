"""Decisions that hold up, end to end on tiny models: a challenger judged against the
release serving users, an inconclusive gate decided by a human through Prefect's API (as
the UI does), judged commits remembered, and a first release that fails an absolute gate.

The scores are made deterministic with two eval sets on one prompt repeated: a random-weight
model always answers something, a "silent" copy (final norm zeroed, so every logit is 0 and
it emits only a special token) answers nothing. ``answer_regex`` is ``\\S`` (an answer is
there) or ``^`` (always true), so the silent model's drop is exactly the share of ``\\S``
items: 1 of 20 (0.05, inconclusive against a 0.10 margin) or 10 of 10 (a clear failure).
"""

import json
import shutil
import time

import pytest
import requests

from demo.hub_server import publish_repo
from llm_release import registry
from tests.helpers import TINY_REPO, answer_paused_run, vllm_processes

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


@pytest.fixture()
def silent_model_dir(tmp_path, tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    out = tmp_path / "silent"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    with torch.no_grad():
        model.model.norm.weight.zero_()
    model.save_pretrained(out, max_shard_size="10MB")
    for f in tiny_model_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template", "generation")):
            shutil.copy2(f, out / f.name)
    return out


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


# Three releases and a review (728 s on this 2-core host beside the release e2e, 2026-12-01):
# more than the suite's 20-minute hang limit allows a slower CPU.
@pytest.mark.timeout(2400)
def test_champion_review_and_memory(prefect_api, home, hub, hub_root, eval_sets, silent_model_dir):
    from flows.model_update import model_update
    from flows.release import release
    from llm_release.serving.serve import free_port

    port = free_port()
    first = release(config(hub, port, ["mostly_free"]))
    assert first.stable == "baseline" and first.verdict == "deployed", first.summary
    champion = registry.load().stable

    # Upstream publishes a model that answers nothing: 1 of 20 items flips, drop 0.05 against
    # a 0.10 margin, interval above it: inconclusive, and the set asks a human. Rejected.
    silent_commit = publish_repo(hub_root, TINY_REPO, silent_model_dir)
    reviewer = answer_paused_run(False, "item 0 lost its answer")
    update = model_update(config(hub, port, ["mostly_free"]))
    reviewer.join(timeout=5)
    assert update.status == "judged" and update.commit == silent_commit
    assert update.release.verdict == "review rejected" and update.release.winner is None
    assert "item 0 lost its answer" in update.release.summary
    rejected = report(home, update.release.run_id)
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

    items = pd.read_csv(home / "runs" / update.release.run_id / "items.csv")
    assert len(items) == 20 and list(items.columns[4:6]) == ["champion", "baseline"]
    assert items.loc[
        items["item"] == "mostly_free-0", ["champion", "baseline"]
    ].values.tolist() == [[1.0, 0.0]]
    assert registry.load().canary is None
    assert len(vllm_processes(under=home)) == 1

    # The nightly run asks the same question again: answered from memory, in seconds.
    started = time.monotonic()
    again = model_update(config(hub, port, ["mostly_free"]))
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
    assert requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).status_code == 200

    # A live canary: the scheduled run says so and exits cleanly.
    live = model_update(config(hub, port, ["mostly_free"]))
    assert live.status == "canary-live"


def test_a_first_release_that_fails_an_absolute_gate_deploys_nothing(
    prefect_api, home, hub_root, eval_sets, silent_model_dir
):
    from demo.hub_server import HubServer
    from flows.release import release
    from llm_release.serving.serve import free_port

    publish_repo(hub_root, TINY_REPO, silent_model_dir)
    with HubServer(hub_root) as hub:
        outcome = release(config(hub, free_port(), ["nonempty"]))
    assert outcome.stable is None and outcome.winner is None
    assert outcome.verdict == "rejected" and outcome.deployment is None
    # With no champion the floor is what refused it, and the decision says which.
    assert "refused by floors: baseline: nonempty/regex_match 0.000 below floor 0.500" in (
        outcome.summary
    ), outcome.summary
    assert registry.load().stable is None
    assert vllm_processes(under=home) == []
