"""hub/handover: the baseline fetched by the measuring host from the release's own source
(``from_upstream``, ``upstream_handover``, ``receive`` with ``upstream``): which contenders
go that way, what the order carries (never a token), and a download held to the hashes the
release host proved, refused in one line when a file differs (acquire stood in)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

import llm_release.hub.handover as handover_module
from llm_release.config import SourceConfig
from llm_release.errors import AcquireError
from llm_release.hub.acquire import Acquired
from llm_release.hub.credentials import HubToken
from llm_release.hub.handover import Handover, from_upstream, receive, upstream_handover

UPSTREAM = "http://127.0.0.1:8765"
COMMIT = "c" * 40
HASHES = {
    "config.json": "1" * 64,
    "model.safetensors": "2" * 64,
    "tokenizer.json": "3" * 64,
    "original/consolidated.pth": "4" * 64,
}


def acquired_at(folder: Path, hashes: dict[str, str], commit: str = COMMIT) -> Acquired:
    """An acquire's outcome as ``acquire`` leaves it: the folder and its manifest."""
    model_dir = folder / "models" / "org--m" / commit
    model_dir.mkdir(parents=True, exist_ok=True)
    manifest = model_dir.with_name(commit + ".manifest.json")
    entries = [{"path": p, "size": 1, "sha256": sha, "lfs": False} for p, sha in hashes.items()]
    manifest.write_text(json.dumps({"repo_id": "org/m", "commit": commit, "files": entries}))
    return Acquired(model_dir, manifest, commit, "org/m", 0, False, endpoint=UPSTREAM)


# ---------------------------------------------------------------- which way it goes


@pytest.mark.parametrize(
    "role, hub, mode, upstream",
    [
        ("baseline", "huggingface", "upstream", True),
        ("baseline", "modelscope", "upstream", True),
        ("baseline", "local", "upstream", False),  # a folder of this host: no hub to ask
        ("baseline", "huggingface", "handover", False),  # the operator keeps hand-overs
        ("quantized", "huggingface", "upstream", False),  # built here: only here
        ("champion", "huggingface", "upstream", False),
    ],
)
def test_only_the_baseline_of_a_hub_source_is_fetched_from_its_source(role, hub, mode, upstream):
    assert from_upstream(role, hub, mode) is upstream


# ---------------------------------------------------------------- what the order carries


def test_the_order_names_the_source_at_the_acquired_commit_with_homes_hashes(tmp_path):
    source = SourceConfig(
        repo_id="org/m",
        revision="main",
        endpoint=UPSTREAM,
        allow_patterns=["*.json", "*.safetensors"],
        credentials_block="hub-read",
    )
    # the folder holds a file of an earlier, wider download of the same commit: not this
    # source's selection, so neither home's hashes nor the measuring host's download hold it
    handover = upstream_handover(source, acquired_at(tmp_path, HASHES))
    assert (handover.repo_id, handover.commit, handover.endpoint) == ("org/m", COMMIT, UPSTREAM)
    assert handover.files == {p: s for p, s in HASHES.items() if not p.endswith(".pth")}
    assert handover.upstream is not None and handover.upstream.credentials_block == "hub-read"
    # the measuring host asks for that commit, not the branch, with the same selection
    fetched = handover.source()
    assert (fetched.hub, fetched.revision, fetched.endpoint) == ("huggingface", COMMIT, UPSTREAM)
    assert fetched.allow_patterns == ["*.json", "*.safetensors"]
    assert fetched.credentials_block == "hub-read"
    # a flow run's parameter: it reads back as it was written
    assert Handover.model_validate(json.loads(handover.model_dump_json())) == handover


def test_a_modelscope_source_is_asked_for_its_revision_and_held_to_its_content_address(tmp_path):
    source = SourceConfig(hub="modelscope", repo_id="org/m", revision="v1.0", endpoint=UPSTREAM)
    handover = upstream_handover(source, acquired_at(tmp_path, HASHES))
    # ModelScope's commit is the listing's content address, not a revision it knows
    assert handover.source().revision == "v1.0" and handover.commit == COMMIT
    assert handover.source().hub == "modelscope"


def test_the_order_carries_a_block_name_and_never_a_token(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_HomeEnvironmentSecret")
    source = SourceConfig(repo_id="org/m", endpoint=UPSTREAM, credentials_block="hub-read")
    handover = upstream_handover(source, acquired_at(tmp_path, HASHES))
    text = handover.model_dump_json()
    assert "hf_HomeEnvironmentSecret" not in text and '"token":' not in text

    def secrets(model: type) -> list[str]:
        found = []
        for name, field in model.model_fields.items():
            kind = str(field.annotation)
            if "SecretStr" in kind or "HubToken" in kind:
                found.append(name)
            for arg in getattr(field.annotation, "__args__", ()):
                if isinstance(arg, type) and hasattr(arg, "model_fields"):
                    found += secrets(arg)
        return found

    assert secrets(Handover) == []


def test_a_source_that_is_no_hub_cannot_be_fetched_there(tmp_path):
    local = SourceConfig(hub="local", repo_id="org/m", local_path="/srv/models/m")
    with pytest.raises(AcquireError) as refused:
        upstream_handover(local, acquired_at(tmp_path, HASHES))
    line = refused.value.one_line()
    assert "\n" not in line and "LLM_RELEASE_FLEET_BASELINE=handover" in line


@pytest.mark.parametrize(
    "field, value",
    [
        ("revision", "../../etc"),
        ("revision", "-rf"),
        ("credentials_block", "Hub Read"),
        ("allow_patterns", ["*.json\n"]),
        ("hub", "local"),
        ("token", "hf_x"),
    ],
)
def test_a_forged_upstream_is_refused_before_any_request(tmp_path, field, value):
    source = SourceConfig(repo_id="org/m", endpoint=UPSTREAM)
    raw = json.loads(upstream_handover(source, acquired_at(tmp_path, HASHES)).model_dump_json())
    raw["upstream"][field] = value
    with pytest.raises(ValidationError):
        Handover.model_validate(raw)


# ---------------------------------------------------------------- the measuring host


@pytest.fixture
def measuring_host(tmp_path, monkeypatch):
    """``receive`` on the measuring host, its download (``acquire``) stood in: it serves
    ``served`` at ``commit`` and records what it was asked for."""
    asked: list[tuple[SourceConfig, HubToken | None]] = []
    serves = {"hashes": dict(HASHES), "commit": COMMIT}

    def acquire(source, *, token=None, settings=None):
        asked.append((source, token))
        return acquired_at(
            tmp_path / "host-b" / str(len(asked)), serves["hashes"], serves["commit"]
        )

    monkeypatch.setattr(handover_module, "acquire", acquire)
    return asked, serves


def upstream_order(tmp_path: Path) -> Handover:
    source = SourceConfig(repo_id="org/m", endpoint=UPSTREAM, allow_patterns=["*.json", "*.s*"])
    return upstream_handover(source, acquired_at(tmp_path / "home", HASHES))


def test_the_measuring_host_downloads_the_commit_and_holds_it_to_homes_hashes(
    tmp_path, measuring_host
):
    asked, _ = measuring_host
    order = upstream_order(tmp_path)
    token = HubToken(endpoint=UPSTREAM, token=SecretStr("hf_read"))
    folder = receive(order, token=token)
    assert folder.name == COMMIT
    ((source, given),) = asked
    assert (source.repo_id, source.revision, source.endpoint) == ("org/m", COMMIT, UPSTREAM)
    assert source.allow_patterns == ["*.json", "*.s*"] and given == token


def test_a_file_whose_hash_differs_from_homes_is_refused_in_one_line(tmp_path, measuring_host):
    _, serves = measuring_host
    serves["hashes"]["model.safetensors"] = "f" * 64  # the source serves other bytes now
    with pytest.raises(AcquireError) as refused:
        receive(upstream_order(tmp_path))
    line = refused.value.one_line()
    assert "\n" not in line
    assert f"org/m@{COMMIT[:12]} at {UPSTREAM} is not what the release host acquired" in line
    assert "changed model.safetensors" in line
    assert "LLM_RELEASE_FLEET_BASELINE=handover" in line


def test_a_missing_file_or_another_commit_is_refused(tmp_path, measuring_host):
    _, serves = measuring_host
    serves["hashes"] = {p: s for p, s in HASHES.items() if p != "tokenizer.json"}
    with pytest.raises(AcquireError, match="missing tokenizer.json"):
        receive(upstream_order(tmp_path))
    serves["hashes"], serves["commit"] = dict(HASHES), "d" * 40  # a ModelScope branch moved
    with pytest.raises(AcquireError, match=f"commit {'d' * 12}"):
        receive(upstream_order(tmp_path))


def test_a_source_this_host_cannot_reach_names_the_setting(tmp_path, monkeypatch):
    def unreachable(source, *, token=None, settings=None):
        raise AcquireError(f"cannot list org/m at {UPSTREAM}: ConnectError", hint="check it")

    monkeypatch.setattr(handover_module, "acquire", unreachable)
    with pytest.raises(AcquireError) as refused:
        receive(upstream_order(tmp_path))
    line = refused.value.one_line()
    assert "\n" not in line and line.startswith("the baseline was not fetched from the release's")
    assert "check it; or set LLM_RELEASE_FLEET_BASELINE=handover on the release host" in line
    # a hand-over through the fleet's hub: the download's own error, as it was
    handed = Handover(repo_id="fleet/m-x", commit=COMMIT, endpoint=UPSTREAM, files=HASHES)
    with pytest.raises(AcquireError) as refused:
        receive(handed)
    assert refused.value.one_line().startswith("cannot list org/m")
