"""Publishing uploads only the project's own model folders. A release record naming any
other folder (a worker's ssh folder, a link out of the candidates, a path through '..', a
folder of the home that holds no model) is refused in one line before any request reaches
the hub, so nothing is uploaded and nothing on the hub is deleted; a candidate's folder
still goes up. A restart serves from the same folders only (the same check)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from llm_release import paths, registry
from llm_release.canary import publish as canary_publish
from llm_release.config import ServingConfig
from llm_release.decision.contenders import list_contenders
from llm_release.errors import PublishError, StateError
from llm_release.hub import publish as hub_publish
from llm_release.hub.publish import PublishTarget
from llm_release.registry import Release

ENDPOINT = "http://127.0.0.1:9"  # nothing answers there: every request is the stand-in's


class RecordingHub:
    """Stands in for ``huggingface_hub.HfApi``: records every call, uploads nothing."""

    calls: list[tuple] = []

    def __init__(self, endpoint=None, token=None):
        self.calls.append(("client", endpoint))

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id))

    def upload_folder(self, *, repo_id, folder_path, delete_patterns=None, **kwargs):
        files = sorted(
            os.path.relpath(os.path.join(d, f), folder_path)
            for d, _, names in os.walk(folder_path)
            for f in names
        )
        self.calls.append(("upload_folder", repo_id, delete_patterns, files))
        return SimpleNamespace(oid="c" * 40)


@pytest.fixture()
def hub_calls(monkeypatch):
    import huggingface_hub

    RecordingHub.calls = []
    monkeypatch.setattr(huggingface_hub, "HfApi", RecordingHub)
    monkeypatch.setattr(hub_publish, "_check_listing", lambda *a, **k: None)
    return RecordingHub.calls


def _release(model_dir) -> Release:
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
        serving=ServingConfig(),
    )


TARGET = PublishTarget(repo_id="acme/published", endpoint=ENDPOINT)


def _secrets(tmp_path):
    ssh = tmp_path / "dotssh"
    ssh.mkdir()
    (ssh / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nsecret\n")
    (ssh / "config.json").write_text("{}")  # looks like a model folder all the same
    return ssh


def test_a_record_naming_a_folder_outside_the_model_folders_publishes_nothing(
    home, tmp_path, hub_calls
):
    ssh = _secrets(tmp_path)
    candidates = home / "candidates"  # paths.candidates_dir()
    candidates.mkdir(parents=True)
    (candidates / "linked-out").symlink_to(ssh, target_is_directory=True)
    (home / "alertmanager").mkdir()
    (home / "alertmanager" / "webhook_url").write_text("https://hooks.example/T0KEN")
    hostile = [
        ssh,  # any folder of the worker
        candidates / "linked-out",  # a link in the candidates that leads out
        candidates / ".." / ".." / ssh.relative_to("/"),  # '..' out of the candidates
        home / "alertmanager",  # the home, but no model folder
        candidates,  # the root itself
        home / "models" / ".." / "alertmanager",
    ]
    for model_dir in hostile:
        with pytest.raises(PublishError, match="outside the project's model folders") as caught:
            canary_publish.publish_release(_release(model_dir), TARGET)
        assert "\n" not in caught.value.one_line()
        assert hub_calls == [], f"{model_dir}: a request reached the hub"
    # the lower layer refuses such a folder too, whoever calls it
    lineage = canary_publish.lineage_of(_release(ssh))
    with pytest.raises(PublishError, match="not one of the project's model folders"):
        hub_publish.publish(ssh, lineage, [], TARGET)
    assert hub_calls == []
    assert not any(e["event"] == "publish" for e in registry.load().history)


def test_a_candidates_folder_still_publishes(home, tiny_folder, hub_calls):
    published = canary_publish.publish_release(_release(tiny_folder), TARGET)
    assert published is not None and published.commit == "c" * 40
    kinds = [call[0] for call in hub_calls]
    assert kinds == ["client", "create_repo", "upload_folder"]
    _, repo, deleted, files = hub_calls[-1]
    assert repo == "acme/published" and deleted == "*"
    assert files == ["README.md", "config.json", "model.safetensors"]
    assert registry.load().history[-1]["event"] == "publish"
    # a downloaded model's folder is the project's too
    downloaded = paths.models_dir() / "tests--tiny" / ("b" * 40)
    downloaded.mkdir(parents=True)
    (downloaded / "config.json").write_text("{}")
    assert canary_publish.publish_release(_release(downloaded), TARGET) is not None


@pytest.fixture()
def tiny_folder(home):
    folder = home / "candidates" / "w4a16-0123456789abcdef"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\0" * 16)
    return folder


def test_the_restart_and_the_champion_use_the_same_check(home, tmp_path, tiny_folder):
    from llm_release.canary import promote

    ssh = _secrets(tmp_path)
    outside = _release(ssh).model_copy(update={"log_path": str(home / "servers" / "x.log")})
    with pytest.raises(StateError, match=r"stable release model_dir .* is outside the project"):
        promote._restart(outside, "stable")
    assert registry.recorded_model_dir(_release(tiny_folder), "x") == tiny_folder.resolve()

    from llm_release.config import ReleaseConfig, SourceConfig
    from llm_release.serving.probe import HostSupport

    host = HostSupport.model_construct(served_dtype="float32")
    config = ReleaseConfig(source=SourceConfig(repo_id="tests/tiny"), candidates=[])
    [champion, _baseline] = list_contenders(config, tiny_folder, "b" * 40, host, _release(ssh))
    assert champion.role == "champion" and champion.outcome is not None
    assert champion.outcome.status == "skipped" and "outside" in champion.outcome.error
