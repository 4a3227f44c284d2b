"""A candidate handed from one host to another through a real hub (the demo hub, the real
huggingface_hub client): the quantizing host's home publishes it once, the measuring host's
home downloads that commit and proves every file against the hub's listing and against the
hashes the hand-over carried; a hub whose file changed after the hand-over, and hand-overs
forged in the run's parameters, are refused (issue 37, item 2). The baseline is not handed
over: the measuring host fetches it from the release's source hub at the commit the release
host acquired and holds it to the hashes the release host proved; a source that serves
another file at that commit is refused."""

import json
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from demo.hub_server import HubServer, describe_files
from llm_release.config import SourceConfig
from llm_release.errors import AcquireError
from llm_release.fileio import atomic_write_text
from llm_release.hub.acquire import TransferSettings, acquire
from llm_release.hub.credentials import HubToken
from llm_release.hub.handover import Handover, hand_over, receive, repo_for, upstream_handover
from llm_release.hub.publish import PublishTarget
from llm_release.quantization.quantize import RECORD
from tests.helpers import TINY_REPO

pytestmark = pytest.mark.integration
FAST = TransferSettings(workers=3, stall_timeout_s=5.0, max_attempts=2, backoff_s=0.05)
SECRET = "hf_FleetHubWriteToken"
RUN = "20261205T220000Z-1a2b3c4d"


@pytest.fixture()
def fleet_hub(hub_root):
    with HubServer(hub_root, token=SECRET) as server:
        yield server


@pytest.fixture()
def handed_over(home, tiny_model_dir, fleet_hub, monkeypatch):
    """Host A (``home``) hands its w4a16 candidate over; host B's home is set afterwards."""
    candidate = home / "candidates" / "w4a16-0123"
    shutil.copytree(tiny_model_dir, candidate)
    (candidate / RECORD).write_text(json.dumps({"candidate": {"name": "w4a16"}}))
    repo = repo_for("fleet", "tests/tiny-llama", "w4a16", RUN)
    target = PublishTarget(
        repo_id=repo, endpoint=fleet_hub.url, token=HubToken(endpoint=fleet_hub.url, token=SECRET)
    )
    handover = hand_over(
        candidate,
        target,
        run_id=RUN,
        candidate="w4a16",
        scheme="W4A16_AWQ",
        upstream_repo="tests/tiny-llama",
        upstream_commit="a" * 40,
        exclude=(RECORD,),
    )
    host_b = home.parent / "host-b"
    monkeypatch.setenv("LLM_RELEASE_HOME", str(host_b))
    return handover, candidate, host_b


def test_the_measuring_host_gets_the_candidates_files_proven(handed_over, tiny_model_dir):
    handover, candidate, host_b = handed_over
    assert handover.repo_id == f"fleet/tiny-llama-w4a16-{RUN.lower()}"
    assert RECORD not in handover.files, "the record names host A's paths: it stays home"
    # what travels in the run's parameters reads back as it was written
    parameter = Handover.model_validate(json.loads(handover.model_dump_json()))
    folder = receive(parameter, settings=FAST)
    assert folder.is_relative_to(host_b)
    for file in tiny_model_dir.rglob("*"):
        rel = file.relative_to(tiny_model_dir).as_posix()
        if file.is_file() and rel != "README.md":  # the hand-over's card replaces it
            assert (folder / rel).read_bytes() == file.read_bytes(), rel
    assert sorted(p.name for p in folder.iterdir()) == sorted(handover.files)
    assert receive(parameter, settings=FAST) == folder  # a second receive reuses it


def test_files_other_than_those_handed_over_are_refused(handed_over, fleet_hub):
    handover, _, _ = handed_over
    # the hub serves, consistently with its own listing, files other than those host A
    # published (a rewritten commit, a forged listing): the hashes carried catch it
    weights = next(p for p in handover.files if p.endswith(".safetensors"))
    other = "b" * 64
    forged = handover.model_copy(update={"files": handover.files | {weights: other}})
    with pytest.raises(AcquireError, match=f"changed {weights}") as info:
        receive(forged, settings=FAST)
    assert "hand it over again" in info.value.one_line()
    dropped = {p: s for p, s in handover.files.items() if p != weights}
    with pytest.raises(AcquireError, match=f"not published {weights}"):
        receive(handover.model_copy(update={"files": dropped}), settings=FAST)


@pytest.mark.parametrize(
    "field, value",
    [
        ("repo_id", "../../etc"),
        ("commit", "main"),
        ("files", {"../../.ssh/authorized_keys": "a" * 64}),
        ("files", {"model.safetensors": "not-a-sha"}),
        ("files", {}),
    ],
)
def test_a_forged_hand_over_is_refused_before_any_request(handed_over, field, value):
    handover, _, _ = handed_over
    raw = json.loads(handover.model_dump_json()) | {field: value}
    with pytest.raises(ValidationError):
        Handover.model_validate(raw)


def test_repo_names_are_hub_names_whatever_the_candidate_is_called():
    assert repo_for("fleet", "Org/Qwen3.5-35B-A3B", "FP8 dynamic", RUN) == (
        f"fleet/qwen3.5-35b-a3b-fp8-dynamic-{RUN.lower()}"
    )
    assert len(repo_for("fleet", "o/" + "m" * 300, "c", RUN)) <= 96


def test_only_a_model_folder_of_the_project_is_handed_over(home, fleet_hub, tmp_path):
    from llm_release.errors import PublishError

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "config.json").write_text("{}")
    target = PublishTarget(repo_id="fleet/x", endpoint=fleet_hub.url)
    with pytest.raises(PublishError, match="not one of the project's model folders"):
        hand_over(
            Path(outside),
            target,
            run_id=RUN,
            candidate="x",
            scheme="bf16",
            upstream_repo="o/m",
            upstream_commit="a" * 40,
        )


# ---------------------------------------------------------------- the baseline, from its source


def fetched_upstream(home, hub, monkeypatch, tmp_path, kind="huggingface"):
    """The release host (``home``) acquires the tiny model from the upstream hub and makes
    the baseline's order; the measuring host's home is set afterwards. Nothing is published."""
    source = SourceConfig(hub=kind, repo_id=TINY_REPO, endpoint=hub.url)
    acquired = acquire(source, settings=FAST)
    order = upstream_handover(source, acquired)
    # what travels in the run's parameters reads back as it was written
    order = Handover.model_validate(json.loads(order.model_dump_json()))
    host_b = tmp_path / "host-b"
    monkeypatch.setenv("LLM_RELEASE_HOME", str(host_b))
    return acquired, order, host_b


@pytest.mark.parametrize("kind", ["huggingface", "modelscope"])
def test_the_baseline_is_fetched_from_its_source_and_proven_against_homes_hashes(
    home, hub, hub_root, monkeypatch, tmp_path, kind
):
    acquired, order, host_b = fetched_upstream(home, hub, monkeypatch, tmp_path, kind)
    assert (order.repo_id, order.commit, order.endpoint) == (TINY_REPO, acquired.commit, hub.url)
    assert order.upstream is not None and order.upstream.hub == kind
    folder = receive(order, settings=FAST)
    assert folder.is_relative_to(host_b) and folder.name == acquired.commit
    for path in order.files:
        assert (folder / path).read_bytes() == (acquired.model_dir / path).read_bytes(), path
    assert sorted(p.name for p in folder.iterdir()) == sorted(order.files)
    # nothing was uploaded: the hub holds the upstream repo and no hand-over repo
    assert sorted(p.relative_to(hub_root).as_posix() for p in hub_root.glob("*/*")) == [TINY_REPO]
    assert receive(order, settings=FAST) == folder  # a second receive reuses it


def test_a_source_that_serves_another_file_at_that_commit_is_refused(
    home, hub, hub_root, monkeypatch, tmp_path
):
    acquired, order, _ = fetched_upstream(home, hub, monkeypatch, tmp_path)
    # the hub rewrites the commit after the release host acquired it, consistently with its
    # own listing (a mirror that changed, a forged listing): every file proves against the
    # hub, and the release host's hashes catch it
    snapshot = hub_root / TINY_REPO / "commits" / acquired.commit
    shard = sorted(snapshot.glob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    listing = hub_root / TINY_REPO / "commits" / f"{acquired.commit}.json"
    atomic_write_text(listing, json.dumps(describe_files(snapshot), indent=1))
    with pytest.raises(AcquireError) as refused:
        receive(order, settings=FAST)
    line = refused.value.one_line()
    assert "\n" not in line and f"changed {shard.name}" in line
    assert "is not what the release host acquired" in line
    assert "LLM_RELEASE_FLEET_BASELINE=handover" in line
    # and an order whose hash is not home's (forged in the parameters) is refused as well
    config = "config.json"
    forged = order.model_copy(update={"files": order.files | {config: "b" * 64}})
    with pytest.raises(AcquireError, match=f"changed {config}"):
        receive(forged, settings=FAST)
