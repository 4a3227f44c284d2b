"""The acquire stage against a hub that lies: it names where files go, names no hash, sends
too much or nothing at all. Nothing outside the model folder may be created, changed or
removed, and each case ends in the project's error, in bounded time."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from llm_release.config import SourceConfig
from llm_release.errors import AcquireError
from llm_release.hub.acquire import TransferSettings, acquire, check_repo_contract
from llm_release.hub.credentials import HubToken
from tests.hostile_hub import HostileHub

pytestmark = pytest.mark.integration
FAST = TransferSettings(workers=2, stall_timeout_s=1.0, max_attempts=1, backoff_s=0.0)
REPO = "evil/model"


def tree(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file under ``root`` with its size, mtime and first bytes."""
    return {
        str(p): (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes()[:64])
        for p in sorted(root.rglob("*"))
        if p.is_file() or p.is_symlink()
    }


@pytest.fixture()
def hostile():
    with HostileHub() as hub:
        yield hub


def source(hub: HostileHub) -> SourceConfig:
    return SourceConfig(repo_id=REPO, endpoint=hub.url)


def sentinel(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"do not touch\n")
    return path


@pytest.mark.parametrize(
    "name",
    [
        "../x",
        "a/../../x",
        "../../../x",
        "./x",
        "a//x",
        "a\\..\\x",
        "x\x00y",
        ".git/config",
        "x.part",
    ],
)
def test_escaping_file_names_touch_nothing(home, hostile, name):
    commit = hostile.plan.commit
    # The escape targets of '../x' and 'a/../../x', filled with a file the old code deleted.
    guard = sentinel(home / "models" / "evil--model" / "x")
    outside = sentinel(home.parent / f"{home.name}-x")
    hostile.plan.add("config.json")
    hostile.plan.add(name, b"pwned\n")
    before = tree(home)
    start = time.monotonic()
    with pytest.raises(AcquireError) as info:
        acquire(source(hostile), settings=FAST)
    assert time.monotonic() - start < 5
    assert "file name" in str(info.value) and "\n" not in info.value.message
    assert tree(home) == before, "something under the home changed"
    assert not (home / "models" / "evil--model" / commit).exists()
    assert guard.read_bytes() == outside.read_bytes() == b"do not touch\n"
    assert not any("/resolve/" in path for path, _ in hostile.plan.requests)
    outside.unlink()


def test_absolute_file_name_touches_nothing(home, hostile, tmp_path):
    target = sentinel(tmp_path / "abs-target")
    hostile.plan.add(str(target), b"pwned\n")
    with pytest.raises(AcquireError, match="absolute path"):
        acquire(source(hostile), settings=FAST)
    assert target.read_bytes() == b"do not touch\n"
    assert not (home / "models").exists()


@pytest.mark.parametrize(
    "commit", ["..", "a/b", "../../../tmp/x", "", "ABCDEF" + "0" * 34, "0" * 39, 12345, None]
)
def test_bad_commit_ids_name_no_folder(home, hostile, commit):
    hostile.plan.commit = commit
    hostile.plan.add("config.json")
    before = tree(home)
    with pytest.raises(AcquireError, match="commit id"):
        acquire(source(hostile), settings=FAST)
    assert tree(home) == before and not (home / "models").exists()


def test_listing_with_a_name_twice_or_as_file_and_folder_is_refused(home, hostile):
    hostile.plan.add("a")
    hostile.plan.add("a/b")
    with pytest.raises(AcquireError, match="both a file and a folder"):
        acquire(source(hostile), settings=FAST)
    assert not (home / "models").exists()


@pytest.mark.parametrize("missing", ["hash", "size"])
def test_file_without_published_hash_or_size_is_refused(home, hostile, missing):
    hostile.plan.add("config.json")
    if missing == "hash":
        hostile.plan.add("notes.txt", b"trust me\n", hashed=False)
    else:
        hostile.plan.add("notes.txt", b"trust me\n", size=None)
    with pytest.raises(AcquireError, match="cannot be verified") as info:
        acquire(source(hostile), settings=FAST)
    assert "notes.txt" in str(info.value)
    assert not (home / "models").exists()


@pytest.mark.parametrize("how", ["extra", "endless"])
def test_over_long_stream_is_cut_one_byte_past_the_published_size(home, hostile, how):
    body = b"0123456789"
    hostile.plan.add("config.json")
    if how == "extra":
        hostile.plan.add("big.txt", body, extra=50 * 1024 * 1024)
    else:
        hostile.plan.add("big.txt", body, endless=True)
    received: list[int] = []
    start = time.monotonic()
    with pytest.raises(AcquireError, match="long stream"):
        acquire(
            source(hostile),
            settings=FAST,
            progress=lambda path, n: received.append(n) if path == "big.txt" else None,
        )
    assert time.monotonic() - start < 10
    assert sum(received) == len(body) + 1
    assert not [p for p in home.rglob("big.txt*")], "an over-long file was kept"


def test_silent_metadata_call_fails_within_the_stall_time(home, hostile):
    hostile.plan.silent = True
    start = time.monotonic()
    with pytest.raises(AcquireError, match="did not answer") as info:
        acquire(source(hostile), settings=FAST)
    assert time.monotonic() - start < 1.0 + 4
    assert "stall_timeout_s" in str(info.value)
    assert not (home / "models").exists()


def test_a_verified_file_comes_through(home, hostile):
    """The fixture itself is honest when told to be: the refusals above are not artefacts."""
    hostile.plan.add("config.json", b'{"a": 1}\n')
    hostile.plan.add("model.safetensors", b"w" * 1000, lfs=True)
    acquired = acquire(source(hostile), settings=FAST)
    assert (acquired.model_dir / "config.json").read_bytes() == b'{"a": 1}\n'
    assert (acquired.model_dir / "model.safetensors").read_bytes() == b"w" * 1000


@pytest.mark.parametrize("shard", ["../../x.safetensors", "/etc/passwd", "a/../../b"])
def test_index_naming_a_shard_outside_the_model_is_refused(tmp_path, shard):
    model = tmp_path / "m"
    model.mkdir()
    for name in ("config.json", "tokenizer_config.json", "generation_config.json"):
        (model / name).write_text("{}")
    (model / "tokenizer.json").write_text("{}")
    index = {"weight_map": {"w": shard}, "metadata": {}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(AcquireError, match="index shard name"):
        check_repo_contract(model)


def test_silent_modelscope_listing_fails_within_the_stall_time(home, hostile):
    import modelscope.hub.api  # noqa: F401 - a cold import takes seconds on a busy machine

    hostile.plan.silent = True
    start = time.monotonic()
    with pytest.raises(AcquireError, match="ModelScope could not list"):
        acquire(SourceConfig(hub="modelscope", repo_id=REPO, endpoint=hostile.url), settings=FAST)
    assert time.monotonic() - start < 1.0 + 4
    assert not (home / "models").exists()


def test_token_goes_to_its_hub_only_never_across_a_redirect(home, hostile, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_env_token_of_another_hub")
    body = b'{"a": 1}\n'
    with HostileHub() as other:
        other.plan.add("config.json", body)
        where = f"{other.url}/evil/model/resolve/{hostile.plan.commit}/config.json"
        hostile.plan.add("config.json", body, redirect=where)
        saved = HubToken(endpoint=hostile.url, token="hf_explicit_secret")
        acquired = acquire(source(hostile), settings=FAST, token=saved)
    assert (acquired.model_dir / "config.json").read_bytes() == body
    assert {auth for _, auth in hostile.plan.requests} == {"Bearer hf_explicit_secret"}
    assert other.plan.requests and all(auth is None for _, auth in other.plan.requests)
    for path in home.rglob("*"):
        if path.is_file():
            assert b"hf_explicit_secret" not in path.read_bytes(), path


@pytest.mark.parametrize("index", ["not json", "[1, 2]", '{"weight_map": [1]}'])
def test_a_broken_index_is_our_error(tmp_path, index):
    model = tmp_path / "m"
    model.mkdir()
    (model / "model.safetensors.index.json").write_text(index)
    with pytest.raises(AcquireError, match="not a valid safetensors index"):
        check_repo_contract(model)


def test_a_broken_manifest_is_our_error(tmp_path):
    from llm_release.hub.acquire import verify_dir

    model = tmp_path / ("0" * 40)
    model.mkdir()
    model.with_name(model.name + ".manifest.json").write_text('{"files": 3}')
    with pytest.raises(AcquireError, match="not a valid manifest"):
        verify_dir(model)


def test_the_project_hub_serves_no_repo_outside_its_root(tmp_path):
    """The local hub takes the repo id from the request's URL: '..' never leaves its root."""
    import http.client

    from demo.hub_server import HubServer, publish_repo
    from llm_release.errors import ConfigError

    outside = tmp_path / "x"
    (outside / "commits").mkdir(parents=True)
    (outside / "refs.json").write_text(json.dumps({"main": "0" * 40}))
    (outside / "commits" / ("0" * 40 + ".json")).write_text("[]")
    (tmp_path / "hub").mkdir()
    with HubServer(tmp_path / "hub") as server:
        conn = http.client.HTTPConnection("127.0.0.1", int(server.url.rsplit(":", 1)[1]))
        conn.request("GET", "/api/models/../x")
        assert conn.getresponse().status == 404
    with pytest.raises(ConfigError, match="owner/name"):
        publish_repo(tmp_path / "hub", "../x", tmp_path)
