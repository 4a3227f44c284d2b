"""The whole release flow on a tiny model: real Prefect, vLLM, lm-eval, GuideLLM, HAProxy,
with the release record on a real PostgreSQL (issue 25: the release, canary and rollback
once against PostgreSQL; the CLI's processes share it), and its lineage read back."""

import json
import shutil
import subprocess
import sys

import pytest
import requests

from demo.hub_server import publish_repo
from llm_release import registry
from tests.helpers import (
    TINY_REPO,
    chromium_page,
    lb_headers,
    prefect_server_with_ui,
    vllm_processes,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory):
    """This module's runs go to a full ``prefect server start`` with its UI on (the test
    harness serves no UI), so the run's page can be opened in a browser."""
    with prefect_server_with_ui(tmp_path_factory.mktemp("prefect-ui")) as url:
        yield url


def cli(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "llm_release.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def lb_get(status: dict, count: int) -> None:
    url, headers = status["lb_url"], lb_headers(status)
    for _ in range(count):
        assert requests.get(f"{url}/v1/models", headers=headers, timeout=10).status_code == 200


def prefect_task_runs(flow_run_id) -> dict:
    """The run's task states and its failed-task count, read from the API as the UI does."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    only_run = FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))

    async def read():
        async with get_client() as client:
            task_runs = await client.read_task_runs(flow_run_filter=only_run)
            # The dashboard's "failed" figure: POST /task_runs/count with a state filter.
            response = await client._client.post(
                "/task_runs/count",
                json={
                    "flow_runs": only_run.model_dump(mode="json"),
                    "task_runs": {"state": {"type": {"any_": ["FAILED"]}}},
                },
            )
            return task_runs, response.json()

    task_runs, failed = asyncio.run(read())
    return {"states": {t.name: t.state.type.value for t in task_runs}, "failed_count": failed}


def prefect_artifacts(flow_run_id) -> dict:
    """The artifacts this run published, by key, read from the API as the UI does."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])
                )
            )

    return {a.key: a for a in asyncio.run(read())}


# Two releases, four candidates, the probe and the UI checks: 1,100 s on this 2-core host
# beside another end-to-end file (2026-12-01); twice the suite's 20-minute hang limit leaves a
# slower CPU room, and a hang still ends the test, not the CI run.
@pytest.mark.timeout(2400)
def test_release_end_to_end(
    prefect_api,
    home,
    hub,
    hub_root,
    tiny_model_dir,
    tmp_path,
    sets_reported_only,
    monkeypatch,
    postgres_url,
):
    from flows.release import release
    from llm_release.config import ReleaseConfig
    from llm_release.serving.serve import free_port

    # The record on PostgreSQL, for the flows here and the CLI's processes alike.
    monkeypatch.setenv("LLM_RELEASE_DATABASE_URL", postgres_url)

    # The broken candidate's flag, unknown to vLLM, passes the allow-list only as the
    # operator's addition (a run form cannot add flags).
    monkeypatch.setenv("LLM_RELEASE_ALLOW_SERVING_FLAGS", "--no-such-vllm-flag")

    router_port = free_port()
    final = release(
        ReleaseConfig.model_validate(
            {
                "source": {"repo_id": TINY_REPO, "endpoint": hub.url},
                "candidates": [
                    {"name": "fp8-dynamic", "scheme": "FP8_DYNAMIC"},
                    {
                        "name": "w4a16-awq",
                        "scheme": "W4A16_AWQ",
                        "num_calibration_samples": 16,
                        "max_seq_length": 128,
                    },
                    {
                        "name": "broken",
                        "scheme": "FP8_DYNAMIC",
                        "extra_serving_args": ["--no-such-vllm-flag"],
                    },
                ],
                "serving": {"enforce_eager": True, "max_model_len": 1024, "max_num_seqs": 8},
                "evaluation": {"limit": 4},
                # The canary stays at its first step for the manual override below; the
                # progressive walk has its own test (tests/e2e/test_canary_e2e.py).
                "rollout": {"mode": "hold"},
                "load": {
                    "concurrencies": [1, 2],
                    "requests_per_level": 2,
                    "prompt_tokens": 32,
                    "output_tokens": 8,
                },
                # This test checks the mechanics; a loaded 2-core CI box must not flip the SLO gate.
                "gates": {"ttft_p95_slo_s": 120},
                "router_port": router_port,
            }
        ),
        return_state=True,
    )
    # A direct caller still gets the typed outcome, whatever the run's state is named.
    out = final.result()
    run_dir = home / "runs" / out.run_id
    report = json.loads((run_dir / "report.json").read_text())
    results = {r["name"]: r for r in report["results"]}
    assert set(results) == {"baseline", "fp8-dynamic", "w4a16-awq", "broken"}
    # Each candidate is measured, or skipped because the probe found that this host's
    # serving runtime cannot serve its scheme (W4A16 on an AVX2-only CPU); nothing else.
    unservable = {s["candidate"] for s in report["host"]["schemes"] if s["status"] == "unsupported"}
    assert "baseline" not in unservable
    for name in ("baseline", "fp8-dynamic", "w4a16-awq"):
        r = results[name]
        if r["status"] == "skipped":
            assert name in unservable and "cannot serve" in r["error"], r["error"]
            continue
        assert r["status"] == "measured", r["error"]
        assert [e["eval_set"] for e in r["evals"]] == ["manufacturing_kb", "refusal_kb"]
        assert all(e["num_items"] == 4 and len(e["items"]) == 4 for e in r["evals"])
        assert [lv["concurrency"] for lv in r["load"]["levels"]] == [1, 2]
        assert all(lv["requests"] == 2 and lv["ttft_p95_ms"] > 0 for lv in r["load"]["levels"])
    runs = prefect_task_runs(final.state_details.flow_run_id)
    assert final.is_completed()
    if results["broken"]["status"] == "skipped":
        assert "broken" in unservable
    else:
        assert results["broken"]["status"] == "failed"
        assert "--no-such-vllm-flag" in results["broken"]["error"]
        # What the UI shows: the broken candidate is a Failed task run, the others are not,
        # the dashboard's failed count is not zero, and the run's state names the failure.
        assert runs["states"]["measure-broken"] == "FAILED", runs["states"]
        assert runs["failed_count"] >= 1
        assert final.name == "Completed with failed candidates"
        assert "broken" in final.message and "--no-such-vllm-flag" in final.message
        assert set(out.failed) == {"broken"}
    for name, r in results.items():
        if r["status"] != "failed":
            assert runs["states"][f"measure-{name}"] == "COMPLETED", (name, runs["states"])
    artifacts = prefect_artifacts(final.state_details.flow_run_id)
    assert {"release-candidates", "release-report", "release-plots"} <= set(artifacts)
    # The run links to the record: the deployed releases' lineage, read back from it.
    deployed = registry.load()
    assert "release-lineage" in artifacts, set(artifacts)
    lineage_md = artifacts["release-lineage"].data
    assert deployed.stable.release_id in lineage_md and "llm-release history" in lineage_md
    if deployed.canary is not None:
        assert deployed.canary.release_id in lineage_md, lineage_md
    # What a person sees: the run's page and its candidates table in the Prefect UI, in a
    # real browser (headless Chromium); the screenshots stay in the run folder.
    run_page = chromium_page(
        f"{prefect_api}/runs/flow-run/{final.state_details.flow_run_id}",
        run_dir / "ui-run.png",
        until=f">{final.name}<",
    )
    # The state badge shows the state's name ("Completed with failed candidates").
    assert f">{final.name}<" in run_page, run_page[-2000:]
    table_page = chromium_page(
        f"{prefect_api}/artifacts/artifact/{artifacts['release-candidates'].id}",
        run_dir / "ui-candidates.png",
        until='title="verdict"',
    )
    header = table_page.index('title="verdict"')  # the first column
    assert all(table_page.index(f">{name}<") > header for name in results), table_page[-3000:]
    # The report names the CPU and runtime its figures come from.
    assert out.host in (run_dir / "report.md").read_text()
    assert report["host"]["served_dtype"] in {"bfloat16", "float32"}

    decision = report["decision"]
    verdicts = {v["name"]: v for v in decision["verdicts"]}
    assert set(verdicts) == set(results)
    assert not verdicts["broken"]["eligible"]
    measured = {n for n in ("fp8-dynamic", "w4a16-awq") if results[n]["status"] == "measured"}
    assert (decision["winner"] in measured) if measured else decision["winner"] is None
    if decision["winner"]:
        assert verdicts[decision["winner"]]["eligible"]
    assert "## Gates" in (run_dir / "report.md").read_text()

    # The broken candidate left nothing behind; the baseline is stable, the winner the canary.
    state = registry.load()
    assert state.stable.candidate == "baseline"
    if decision["winner"]:
        assert state.canary.candidate == decision["winner"]
        assert len(vllm_processes(under=home)) == 2
        cli("canary", "promote")
        status = json.loads(cli("canary", "status", "--json"))
        assert [(r["role"], r["weight"]) for r in status["releases"]] == [("stable", 100)]
        assert len(vllm_processes(under=home)) == 1
        state = registry.load()
        assert state.stable.candidate == decision["winner"] and state.canary is None
    else:
        assert state.canary is None and len(vllm_processes(under=home)) == 1

    # The scheduled check sees the released commit and exits without touching a model.
    from flows.model_update import model_update

    later = {
        "source": {"repo_id": TINY_REPO, "endpoint": hub.url},
        "candidates": [],
        "serving": {"enforce_eager": True, "max_model_len": 1024, "max_num_seqs": 8},
        # The first release's evaluation and load: the champion's measurement is reused
        # (the same model, items, load and serving), only the new commit is measured.
        "evaluation": {"limit": 4},
        "load": {
            "concurrencies": [1, 2],
            "requests_per_level": 2,
            "prompt_tokens": 32,
            "output_tokens": 8,
        },
        "gates": {"ttft_p95_slo_s": 120},
        "router_port": router_port,
        "rollout": {"mode": "hold"},
    }
    update = model_update(ReleaseConfig.model_validate(later))
    assert (update.status, update.commit) == ("up-to-date", state.stable.commit), update

    # Upstream moves 'main' to a new commit: the next check releases it. With no quantized
    # candidate the new commit's baseline is the contender, and it goes out as the canary.
    moved = tmp_path / "moved"
    shutil.copytree(tiny_model_dir, moved)
    generation = json.loads((moved / "generation_config.json").read_text())
    (moved / "generation_config.json").write_text(json.dumps(generation | {"top_k": 20}))
    new_commit = publish_repo(hub_root, TINY_REPO, moved)
    assert new_commit != state.stable.commit
    update = model_update(ReleaseConfig.model_validate(later))
    assert update.status == "judged" and update.commit == new_commit, update
    # Judged against the champion (the promoted winner, or the first baseline) and out.
    assert update.release.winner == "baseline", update.release.summary
    second = json.loads((home / "runs" / update.release.run_id / "report.json").read_text())
    assert [r["role"] for r in second["results"]] == ["champion", "baseline"], [
        (r["name"], r["status"], r["error"]) for r in second["results"]
    ]
    champion = next(r for r in second["results"] if r["role"] == "champion")
    assert champion["reused_from"] == out.run_id, champion["reused_from"]
    references = {g["reference"] for v in second["decision"]["verdicts"] for g in v["gates"]}
    assert f"champion ({state.stable.release_id})" in references, references
    status = json.loads(cli("canary", "status", "--json"))
    commits = {r["role"]: r["commit"] for r in status["releases"]}
    assert commits == {"stable": state.stable.commit, "canary": new_commit}, status
    assert len(vllm_processes(under=home)) == 2, vllm_processes(under=home)

    # 95/5 behind the load balancer, then a rollback: the canary gets nothing more.
    assert status["lb_url"] == f"http://127.0.0.1:{router_port}"
    lb_get(status, 100)
    status = json.loads(cli("canary", "status", "--json"))
    served = {r["role"]: r for r in status["releases"]}
    assert served["canary"]["weight"] == 5 and served["stable"]["weight"] == 95, served
    assert 3 <= served["canary"]["requests"] <= 7, served
    assert served["stable"]["requests"] + served["canary"]["requests"] == 100, served

    cli("canary", "rollback")
    lb_get(status, 50)
    status = json.loads(cli("canary", "status", "--json"))
    assert [r["role"] for r in status["releases"]] == ["stable"], status
    assert registry.load().canary is None
    assert len(vllm_processes(under=home)) == 1, vllm_processes(under=home)
    # HAProxy's own counter for the canary slot did not move after the rollback.
    assert status["releases"][0]["requests"] == served["stable"]["requests"] + 50, (status, served)

    # The record is PostgreSQL's, and 'history' answers where each release came from.
    assert not (home / "record.db").exists()
    lineage = {r["release_id"]: r for r in json.loads(cli("history", "--json"))}
    first = lineage[state.stable.release_id]
    assert first["state"] == "stable" and first["upstream_commit"] == state.stable.commit, first
    assert first["run_id"] and first["decision"] and not first["missing"], first
    assert not first["from_report"], first  # the record holds it all
    assert first["scores"] and all(s["eval_set"] for s in first["scores"]), first
    # Recorded at deploy: the served folder's files and hashes, and each eval set's own.
    assert first["origin_recorded"] and first["artifact_sha256"], first
    assert "config.json" in first["artifact_sha256"], first["artifact_sha256"]
    assert all(len(s["eval_set_sha256"] or "") == 64 for s in first["scores"]), first
    rolled = [r for r in lineage.values() if r["state"] == "rolled back"]
    assert [r["upstream_commit"] for r in rolled] == [new_commit], lineage
    assert any(e["event"] == "rollback" for e in rolled[0]["events"])

    cli("down")
    assert vllm_processes(under=home) == []

    # After a reboot (or 'down'), 'llm-release up' brings the record's stable back: a real
    # vLLM under its supervisor, behind the door. No key and a wrong key are refused before
    # vLLM; the project's key gets the real model's answer.
    cli("up")
    status = json.loads(cli("canary", "status", "--json"))
    [stable] = status["releases"]
    assert (stable["role"], stable["release_id"]) == ("stable", state.stable.release_id)
    assert len(vllm_processes(under=home)) == 1, vllm_processes(under=home)
    url = f"{status['lb_url']}/v1/chat/completions"
    body = {
        "model": state.stable.public_name,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 4,
    }
    for refused in ({}, {"Authorization": "Bearer wrong-key-0123456789abcdef"}):
        reply = requests.post(url, json=body, headers=refused, timeout=30)
        assert reply.status_code == 401, (refused, reply.status_code, reply.text[:200])
    answer = requests.post(url, json=body, headers=lb_headers(status), timeout=300)
    assert answer.status_code == 200, answer.text[:300]
    assert answer.json()["choices"][0]["message"]["role"] == "assistant"
    assert answer.json()["model"] == state.stable.public_name
    cli("down")
    assert vllm_processes(under=home) == []
