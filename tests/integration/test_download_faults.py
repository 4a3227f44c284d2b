"""The acquire stage against a Hub endpoint that misbehaves, through the real hub client:
each fault ends in a verified model or in a clear error, never in bad bytes being used."""

import json
import time

import pytest

from demo.hub_server import publish_repo
from llm_release.config import SourceConfig
from llm_release.errors import AcquireError, IntegrityError
from llm_release.hub.acquire import TransferSettings, acquire, check_repo_contract, verify_dir
from tests.faulty_hub import FaultyHub
from tests.helpers import TINY_REPO

pytestmark = pytest.mark.integration
FAST = TransferSettings(workers=3, stall_timeout_s=1.0, max_attempts=3, backoff_s=0.05)


@pytest.fixture()
def faulty(hub_root, tiny_model_dir):
    publish_repo(hub_root, TINY_REPO, tiny_model_dir)
    with FaultyHub(hub_root) as hub:
        yield hub


@pytest.fixture()
def shards(tiny_model_dir):
    return sorted(p.name for p in tiny_model_dir.glob("*.safetensors"))


def source(hub):
    return SourceConfig(repo_id=TINY_REPO, endpoint=hub.url)


def assert_matches(acquired, tiny_model_dir):
    assert verify_dir(acquired.model_dir) == []
    for shard in tiny_model_dir.glob("*.safetensors"):
        assert (acquired.model_dir / shard.name).read_bytes() == shard.read_bytes()
    assert not list(acquired.model_dir.glob("*.part"))


def test_http_500_then_success(home, faulty, shards, tiny_model_dir):
    faulty.plan.add(shards[1], "http500", "http500")
    acquired = acquire(source(faulty), settings=FAST)
    assert_matches(acquired, tiny_model_dir)
    assert len(faulty.plan.gets(shards[1])) == 3


def test_connection_reset_mid_shard_resumes_from_the_bytes_on_disk(
    home, faulty, shards, tiny_model_dir
):
    faulty.plan.add(shards[0], "reset")
    acquired = acquire(source(faulty), settings=FAST)
    assert_matches(acquired, tiny_model_dir)
    first, second = faulty.plan.gets(shards[0])
    half = (tiny_model_dir / shards[0]).stat().st_size // 2
    assert first is None and second.startswith("bytes=")
    resumed_at = int(second.removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= half  # the bytes already on disk were not fetched again


def test_stalled_transfer_is_aborted_and_retried(home, faulty, shards, tiny_model_dir):
    faulty.plan.stall_s = 20
    faulty.plan.add(shards[0], "stall")
    started = time.monotonic()
    acquired = acquire(source(faulty), settings=FAST)
    assert time.monotonic() - started < 15, "the watchdog did not cut the stalled transfer"
    assert_matches(acquired, tiny_model_dir)
    assert faulty.plan.gets(shards[0])[1].startswith("bytes=")


def test_flipped_byte_once_is_fetched_again(home, faulty, shards, tiny_model_dir):
    faulty.plan.add(shards[1], "flip")
    acquired = acquire(source(faulty), settings=FAST)
    assert_matches(acquired, tiny_model_dir)
    assert faulty.plan.gets(shards[1]) == [None, None]


def test_truncated_shard_every_time_fails_naming_it(home, faulty, shards):
    faulty.plan.add(shards[1], "short", "short", "short")
    with pytest.raises(IntegrityError) as info:
        acquire(source(faulty), settings=FAST)
    message = str(info.value)
    assert shards[1] in message and ("broke after" in message or "short" in message)
    assert not list((home / "models").rglob(shards[1]))
    assert not list((home / "models").rglob("*.manifest.json"))


def test_first_shard_failing_stops_before_the_fan_out(home, faulty, shards):
    faulty.plan.add(shards[0], "http500", "http500", "http500")
    with pytest.raises(IntegrityError, match="first file already failed"):
        acquire(source(faulty), settings=FAST)
    assert faulty.plan.gets(shards[1]) == [] and faulty.plan.gets(shards[2]) == []


def test_wrong_published_size_fails(home, hub_root, faulty, shards):
    listing_path = next((hub_root / TINY_REPO / "commits").glob("*.json"))
    listing = json.loads(listing_path.read_text())
    entry = next(e for e in listing if e["rfilename"] == shards[2])
    entry["size"] += 10
    entry["lfs"]["size"] += 10
    listing_path.write_text(json.dumps(listing))
    with pytest.raises(IntegrityError, match=shards[2]):
        acquire(source(faulty), settings=FAST)


def test_rerun_after_failure_keeps_verified_files(home, faulty, shards):
    faulty.plan.add(shards[2], "short", "short", "short")
    with pytest.raises(IntegrityError):
        acquire(source(faulty), settings=FAST)
    before = len(faulty.plan.requests)
    acquired = acquire(source(faulty), settings=FAST)
    fetched = {
        path.rsplit("/", 1)[-1] for path, _ in faulty.plan.requests[before:] if "/resolve/" in path
    }
    assert fetched == {shards[2]}
    assert verify_dir(acquired.model_dir) == []


def test_verify_names_every_bad_file(home, faulty, shards):
    acquired = acquire(source(faulty), settings=FAST)
    (acquired.model_dir / shards[0]).write_bytes(b"x")
    (acquired.model_dir / "config.json").unlink()
    problems = verify_dir(acquired.model_dir)
    assert len(problems) == 2
    assert any(shards[0] in p and "bytes" in p for p in problems)
    assert any("config.json: missing" in p for p in problems)


def test_index_naming_a_missing_shard(home, hub_root, tiny_model_dir, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in tiny_model_dir.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    index = json.loads((broken / "model.safetensors.index.json").read_text())
    first_tensor = next(iter(index["weight_map"]))
    index["weight_map"][first_tensor] = "model-00009-of-00009.safetensors"
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    publish_repo(hub_root, "tests/bad-index", broken)
    with FaultyHub(hub_root) as hub:
        acquired = acquire(SourceConfig(repo_id="tests/bad-index", endpoint=hub.url), settings=FAST)
    with pytest.raises(AcquireError, match="model-00009-of-00009.safetensors"):
        check_repo_contract(acquired.model_dir)


def test_token_reaches_the_hub_but_no_file_or_repr(home, faulty, monkeypatch):
    secret = "hf_ThisIsATestTokenThatMustNotLeak"
    monkeypatch.setenv("HF_TOKEN", secret)
    # the environment's token goes only to huggingface.co and the endpoints named for it
    monkeypatch.setenv("LLM_RELEASE_HF_TOKEN_ENDPOINTS", faulty.url)
    acquired = acquire(source(faulty), settings=FAST)
    assert f"Bearer {secret}" in faulty.plan.authorizations
    assert secret not in repr(acquired)
    for path in home.rglob("*"):
        if path.is_file() and path.stat().st_size < 5_000_000:
            assert secret.encode() not in path.read_bytes(), path


def test_vllm_servers_never_inherit_secrets(monkeypatch):
    from llm_release.config import ServingConfig
    from llm_release.serving.serve import server_env

    monkeypatch.setenv("HF_TOKEN", "hf_x")
    monkeypatch.setenv("PREFECT_API_KEY", "pnu_x")
    env = server_env(ServingConfig())
    assert "HF_TOKEN" not in env and "PREFECT_API_KEY" not in env


def test_a_hugging_face_token_never_goes_to_a_modelscope_hub(home, faulty, monkeypatch):
    secret = "hf_ThisTokenIsForHuggingFaceOnly"
    monkeypatch.setenv("HF_TOKEN", secret)
    ms = SourceConfig(hub="modelscope", repo_id=TINY_REPO, revision="main", endpoint=faulty.url)
    acquired = acquire(ms, settings=FAST)
    assert verify_dir(acquired.model_dir) == []
    assert faulty.plan.requests, "the hub saw no request"
    assert not any(secret in auth for auth in faulty.plan.authorizations)
