"""Publishing the winner: the tiny model goes to a real demo hub through the real
huggingface_hub client (create_repo, upload_folder over Git LFS), comes back through the
project's own download path (every file's SHA-256 checked) at the new commit, and its model
card parses back with huggingface_hub. Hostile writes are refused by the hub itself."""

import base64
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import requests
from huggingface_hub import ModelCard, metadata_load

from demo.hub_server import HubServer
from llm_release import registry
from llm_release.canary.publish import publish_release
from llm_release.cli import main
from llm_release.config import ServingConfig, SourceConfig
from llm_release.errors import ConfigError, PublishError
from llm_release.hub.acquire import TransferSettings, acquire, verify_dir
from llm_release.hub.credentials import HubToken
from llm_release.hub.publish import PublishTarget, publish_target
from llm_release.quantization.quantize import RECORD
from llm_release.registry import Release
from llm_release.results import CANDIDATE_RESULT, CandidateResult, EvalResult, MetricScore

pytestmark = pytest.mark.integration
FAST = TransferSettings(workers=3, stall_timeout_s=5.0, max_attempts=2, backoff_s=0.05)
SECRET = "hf_WriteTokenForThePublishHubOnly"
REPO = "acme/tiny-llama-w4a16"
CALIBRATION_SHA = "c" * 64


@pytest.fixture()
def write_hub(hub_root):
    with HubServer(hub_root, token=SECRET) as server:
        yield server


@pytest.fixture()
def release(home, tiny_model_dir, tmp_path):
    """A released candidate: its folder with the quantization record, its run folder with
    the measurement written when it was measured."""
    model_dir = home / "candidates" / "w4a16-0123"
    shutil.copytree(tiny_model_dir, model_dir)
    recipe = {"name": "w4a16", "scheme": "W4A16_AWQ", "calibration_set": "maintenance"}
    (model_dir / RECORD).write_text(
        json.dumps(
            {"candidate": recipe, "cache_key": "9" * 64, "calibration_sha256": CALIBRATION_SHA}
        )
    )
    run_dir = home / "runs" / "20261202T000000Z-abcd"
    scores = {"exact_match": MetricScore(value=0.75, ci_low=0.5, ci_high=0.9)}
    result = CandidateResult(
        name="w4a16",
        scheme="W4A16_AWQ",
        status="measured",
        evals=[EvalResult(eval_set="maintenance_qa", num_items=20, metrics=scores)],
    )
    (run_dir / "candidates" / "w4a16").mkdir(parents=True)
    (run_dir / "candidates" / "w4a16" / CANDIDATE_RESULT).write_text(result.model_dump_json())
    return Release(
        release_id="w4a16-aaaaaaaa-20261202000000",
        candidate="w4a16",
        scheme="W4A16_AWQ",
        repo_id="tests/tiny-llama",
        commit="a" * 40,
        model_dir=str(model_dir),
        public_name="svc",
        port=20001,
        log_path="/dev/null",
        run_dir=str(run_dir),
        serving=ServingConfig(),
    )


def target_for(hub, token: str | None = SECRET) -> PublishTarget:
    bound = HubToken(endpoint=hub.url, token=token) if token else None
    return PublishTarget(repo_id=REPO, endpoint=hub.url, token=bound)


def test_the_winner_is_published_and_downloads_verified_at_its_commit(
    release, write_hub, tiny_model_dir, monkeypatch
):
    monkeypatch.setenv("LLM_RELEASE_PUBLISH_REPO", REPO)
    monkeypatch.setenv("LLM_RELEASE_PUBLISH_ENDPOINT", write_hub.url)
    monkeypatch.setenv("LLM_RELEASE_PUBLISH_TOKEN", SECRET)
    published = publish_release(release, progress=lambda _: None)  # the operator's target
    assert published is not None and published.repo_id == REPO
    assert RECORD not in published.files, "the record names local paths: it stays home"
    # the record's lineage names the revision (llm-release history)
    event = registry.load().history[-1]
    assert (event["event"], event["release"], event["commit"]) == (
        "publish",
        release.release_id,
        published.commit,
    )

    acquired = acquire(
        SourceConfig(repo_id=REPO, revision=published.commit, endpoint=write_hub.url),
        settings=FAST,
    )
    assert acquired.commit == published.commit
    assert verify_dir(acquired.model_dir) == []
    for file in tiny_model_dir.rglob("*"):
        rel = file.relative_to(tiny_model_dir)
        if file.is_file() and rel.as_posix() != "README.md":  # the model card replaces it
            assert (acquired.model_dir / rel).read_bytes() == file.read_bytes(), rel
    assert not (acquired.model_dir / RECORD).exists()

    card = ModelCard.load(acquired.model_dir / "README.md")
    assert card.data.base_model == "tests/tiny-llama"
    [result] = card.data.eval_results
    assert (result.dataset_name, result.metric_type, result.metric_value) == (
        "maintenance_qa",
        "exact_match",
        0.75,
    )
    meta = metadata_load(acquired.model_dir / "README.md")
    lineage = meta["llm_release"]
    assert meta["quantization"]["scheme"] == "W4A16_AWQ"
    assert lineage["upstream_commit"] == "a" * 40
    assert lineage["calibration_set"] == "maintenance"
    assert lineage["calibration_sha256"] == CALIBRATION_SHA
    weights = "model-00001-of-00003.safetensors"
    assert (
        lineage["files"][weights]
        == hashlib.sha256((tiny_model_dir / weights).read_bytes()).hexdigest()
    )

    again = publish_release(release, target_for(write_hub))
    assert again.commit == published.commit, "the same release is the same content commit"


def test_a_promote_from_the_cli_publishes_the_release_too(release, write_hub, monkeypatch, capsys):
    # 'llm-release canary promote' takes the canary to 100% as the canary flow does, so it
    # publishes as the flow does: the revision downloads, the record names it.
    stable = release.model_copy(update={"release_id": "baseline-aaaaaaaa-1", "pid": 0})
    state = registry.RegistryState(stable=stable, canary=release, canary_weight=50)
    state.log("canary", release=release.release_id, weight=50)
    registry.save(state)
    monkeypatch.setenv("LLM_RELEASE_PUBLISH_REPO", REPO)
    monkeypatch.setenv("LLM_RELEASE_PUBLISH_ENDPOINT", write_hub.url)
    monkeypatch.setenv("LLM_RELEASE_PUBLISH_TOKEN", SECRET)
    assert main(["canary", "promote", "--drain-timeout", "1"]) == 0
    out = capsys.readouterr().out
    assert f"promoted {release.release_id}" in out
    event = registry.load().history[-1]
    assert (event["event"], event["release"]) == ("publish", release.release_id)
    assert f"published {release.release_id} as {REPO}@{event['commit']}" in out
    acquired = acquire(
        SourceConfig(repo_id=REPO, revision=event["commit"], endpoint=write_hub.url),
        settings=FAST,
    )
    assert verify_dir(acquired.model_dir) == []


def test_a_promote_whose_publish_fails_says_so_and_exits_4(release, write_hub, monkeypatch, capsys):
    state = registry.RegistryState(canary=release, canary_weight=50)
    registry.save(state)
    monkeypatch.setenv("LLM_RELEASE_PUBLISH_REPO", REPO)
    monkeypatch.setenv("LLM_RELEASE_PUBLISH_ENDPOINT", write_hub.url)
    monkeypatch.setenv("LLM_RELEASE_PUBLISH_TOKEN", "hf_NotTheHubsToken")
    assert main(["canary", "promote", "--drain-timeout", "1"]) == 4
    said = capsys.readouterr()
    assert f"promoted {release.release_id}" in said.out
    assert f"warning: {release.release_id} not published:" in said.err
    assert "hf_NotTheHubsToken" not in said.err + said.out
    assert registry.load().stable.release_id == release.release_id  # promoted all the same


def test_the_publish_token_goes_to_its_hub_only(release, write_hub, hub_root, tmp_path):
    with pytest.raises(PublishError, match="failed"):
        publish_release(release, target_for(write_hub, token=None))
    with HubServer(tmp_path / "other") as other:
        bound_elsewhere = PublishTarget(
            repo_id=REPO, endpoint=other.url, token=HubToken(endpoint=write_hub.url, token=SECRET)
        )
        with pytest.raises(ConfigError, match="would go to"):
            publish_release(release, bound_elsewhere)
    assert not (hub_root / REPO).exists() and not (tmp_path / "other" / REPO).exists()


def test_publishing_is_off_unless_the_operator_names_a_repo(release, monkeypatch):
    monkeypatch.delenv("LLM_RELEASE_PUBLISH_REPO", raising=False)
    assert publish_target() is None and publish_release(release) is None
    monkeypatch.setenv("LLM_RELEASE_PUBLISH_REPO", "no-owner")
    with pytest.raises(ConfigError, match="owner/name"):
        publish_target()


def _commit(hub, ops, auth=SECRET):
    lines = [{"key": "header", "value": {"summary": "x"}}, *ops]
    return requests.post(
        f"{hub.url}/api/models/{REPO}/commit/main",
        data="".join(json.dumps(line) + "\n" for line in lines),
        headers={"Authorization": f"Bearer {auth}", "Content-Type": "application/x-ndjson"},
        timeout=10,
    )


def test_hostile_writes_are_refused(write_hub, hub_root):
    auth = {"Authorization": f"Bearer {SECRET}"}
    created = requests.post(
        f"{write_hub.url}/api/repos/create", json={"name": REPO}, headers=auth, timeout=10
    )
    assert created.status_code == 200, created.text
    content = base64.b64encode(b"owned").decode()
    for path in ("../escape.txt", "/etc/passwd", "a\\b.txt", "x/../../y", ".git/config", ""):
        answer = _commit(write_hub, [{"key": "file", "value": {"path": path, "content": content, "encoding": "base64"}}])  # fmt: skip
        assert answer.status_code == 400, (path, answer.text)
    assert not (hub_root / "acme" / "escape.txt").exists()
    assert _commit(write_hub, [], auth="wrong").status_code == 401

    # An upload whose bytes are not the object it announced is refused and never kept.
    data = b"the real bytes"
    oid = hashlib.sha256(data).hexdigest()
    batch = requests.post(
        f"{write_hub.url}/{REPO}.git/info/lfs/objects/batch",
        json={"operation": "upload", "transfers": ["basic"], "objects": [{"oid": oid, "size": 14}]},
        headers=auth,
        timeout=10,
    ).json()
    href = batch["objects"][0]["actions"]["upload"]["href"]
    assert requests.put(href, data=b"other bytes!!!", timeout=10).status_code == 422
    assert requests.put(href, data=data, timeout=10).status_code == 403, "one use only"
    lfs = {"key": "lfsFile", "value": {"path": "w.safetensors", "algo": "sha256", "oid": oid}}
    assert _commit(write_hub, [lfs]).status_code == 422
    assert not list((hub_root / REPO).rglob(oid))


def test_a_record_naming_a_folder_outside_the_model_folders_uploads_and_deletes_nothing(
    release, write_hub, tmp_path
):
    from llm_release.hub.acquire import resolve

    first = publish_release(release, target_for(write_hub))
    ssh = tmp_path / "dotssh"
    ssh.mkdir()
    (ssh / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nsecret\n")
    (ssh / "config.json").write_text("{}")
    link = Path(release.model_dir).parent / "linked-out"
    link.symlink_to(ssh, target_is_directory=True)
    dotted = Path(release.model_dir) / os.path.relpath(ssh, release.model_dir)  # '..' out
    for model_dir in (ssh, link, dotted):
        hostile = release.model_copy(update={"model_dir": str(model_dir)})
        with pytest.raises(PublishError, match="outside the project's model folders"):
            publish_release(hostile, target_for(write_hub))
    source = SourceConfig(repo_id=REPO, revision="main", endpoint=write_hub.url)
    commit, files = resolve(source, token=HubToken(endpoint=write_hub.url, token=SECRET))
    assert commit == first.commit, "the repo moved: something was uploaded or deleted"
    assert sorted(f.path for f in files) == sorted(first.files)
    assert "id_ed25519" not in {f.path for f in files}
