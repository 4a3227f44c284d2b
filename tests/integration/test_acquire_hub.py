"""The acquire stage against a real HTTP hub on 127.0.0.1, through the real huggingface_hub."""

import json
import os

import pytest

from llm_release.config import SourceConfig
from llm_release.errors import AcquireError, ConfigError, IntegrityError
from llm_release.hub.acquire import acquire, check_repo_contract
from tests.helpers import TINY_REPO

pytestmark = pytest.mark.integration


def snapshot_dir(hub_root, commit=None):
    repo = hub_root / TINY_REPO
    commit = commit or json.loads((repo / "refs.json").read_text())["main"]
    return repo / "commits" / commit


def test_download_is_pinned_verified_and_reused(home, hub, hub_root):
    acquired = acquire(SourceConfig(repo_id=TINY_REPO, endpoint=hub.url))
    assert acquired.commit == json.loads((hub_root / TINY_REPO / "refs.json").read_text())["main"]
    assert acquired.model_dir.name == acquired.commit and not acquired.reused
    check_repo_contract(acquired.model_dir)
    manifest = json.loads(acquired.manifest_path.read_text())
    shards = [f for f in manifest["files"] if f["path"].endswith(".safetensors")]
    assert len(shards) >= 2 and all(f["lfs"] and len(f["sha256"]) == 64 for f in shards)
    again = acquire(SourceConfig(repo_id=TINY_REPO, revision=acquired.commit, endpoint=hub.url))
    assert again.reused and again.downloaded_bytes == 0


def test_flipped_byte_on_the_hub_is_never_used(home, hub, hub_root):
    shard = sorted(snapshot_dir(hub_root).glob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(IntegrityError) as info:
        acquire(SourceConfig(repo_id=TINY_REPO, endpoint=hub.url))
    assert shard.name in str(info.value) and "sha256" in str(info.value)
    model_dirs = list((home / "models").rglob(shard.name))
    assert model_dirs == [], "a corrupt shard was left where a later stage could read it"
    assert not list((home / "models").rglob("*.manifest.json"))


def test_locally_corrupted_file_is_fetched_again(home, hub):
    acquired = acquire(SourceConfig(repo_id=TINY_REPO, endpoint=hub.url))
    shard = sorted(acquired.model_dir.glob("*.safetensors"))[0]
    good = shard.read_bytes()
    shard.write_bytes(b"\0" * len(good))
    again = acquire(SourceConfig(repo_id=TINY_REPO, endpoint=hub.url))
    assert not again.reused and again.downloaded_bytes == len(good)
    assert shard.read_bytes() == good


def test_a_changed_file_with_its_size_and_mtime_kept_is_fetched_again(home, hub):
    acquired = acquire(SourceConfig(repo_id=TINY_REPO, endpoint=hub.url))
    for name in ("config.json", sorted(acquired.model_dir.glob("*.safetensors"))[0].name):
        path = acquired.model_dir / name
        good, before = path.read_bytes(), path.stat()
        changed = bytearray(good)
        changed[len(changed) // 2] ^= 0x01
        path.write_bytes(bytes(changed))
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert path.stat().st_size == before.st_size
        assert path.stat().st_mtime_ns == before.st_mtime_ns
        again = acquire(SourceConfig(repo_id=TINY_REPO, endpoint=hub.url))
        assert not again.reused and again.downloaded_bytes == len(good), name
        assert path.read_bytes() == good
    assert acquire(SourceConfig(repo_id=TINY_REPO, endpoint=hub.url)).reused


def test_unknown_revision_and_repo_are_clear(home, hub):
    with pytest.raises(AcquireError, match="revision 'v9' does not exist"):
        acquire(SourceConfig(repo_id=TINY_REPO, revision="v9", endpoint=hub.url))
    with pytest.raises(AcquireError, match="was not found"):
        acquire(SourceConfig(repo_id="nobody/nothing", endpoint=hub.url))


def test_missing_tokenizer_breaks_the_contract(home, hub_root, tiny_model_dir, tmp_path):
    from demo.hub_server import HubServer, publish_repo

    broken = tmp_path / "broken"
    broken.mkdir()
    for f in tiny_model_dir.iterdir():
        if not f.name.startswith("tokenizer"):
            (broken / f.name).write_bytes(f.read_bytes())
    publish_repo(hub_root, "tests/no-tokenizer", broken)
    with HubServer(hub_root) as server:
        acquired = acquire(SourceConfig(repo_id="tests/no-tokenizer", endpoint=server.url))
    with pytest.raises(AcquireError, match="tokenizer"):
        check_repo_contract(acquired.model_dir)


def test_paths_with_spaces_are_refused(monkeypatch, hub, tmp_path):
    monkeypatch.setenv("LLM_RELEASE_HOME", str(tmp_path / "my models"))
    with pytest.raises(ConfigError, match="spaces"):
        acquire(SourceConfig(repo_id=TINY_REPO, endpoint=hub.url))


def test_local_folder_source_is_copied_verified_and_content_addressed(
    home, tiny_model_dir, monkeypatch
):
    monkeypatch.setenv("LLM_RELEASE_LOCAL_ROOTS", str(tiny_model_dir.parent))
    source = SourceConfig(hub="local", repo_id="local/tiny", local_path=str(tiny_model_dir))
    acquired = acquire(source)
    check_repo_contract(acquired.model_dir)
    for f in tiny_model_dir.iterdir():
        assert (acquired.model_dir / f.name).read_bytes() == f.read_bytes()
    assert acquire(source).reused
    from llm_release.hub.acquire import verify_dir

    assert verify_dir(acquired.model_dir) == []


def test_local_source_needs_a_path():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="local_path"):
        SourceConfig(hub="local", repo_id="local/x")


def test_modelscope_source_through_the_real_sdk(home, hub, hub_root, tiny_model_dir):
    """The same hub speaks ModelScope's file API; the modelscope SDK lists, we stream."""
    source = SourceConfig(hub="modelscope", repo_id=TINY_REPO, revision="main", endpoint=hub.url)
    acquired = acquire(source)
    check_repo_contract(acquired.model_dir)
    for f in tiny_model_dir.iterdir():
        assert (acquired.model_dir / f.name).read_bytes() == f.read_bytes()
    assert acquire(source).reused


def test_modelscope_sdk_downloads_from_the_local_hub(home, hub, tmp_path, tiny_model_dir):
    """The real SDK's own downloader accepts our endpoint and its SHA-256 listing."""
    from modelscope.hub.snapshot_download import snapshot_download

    out = snapshot_download(
        TINY_REPO, revision="main", endpoint=hub.url, local_dir=str(tmp_path / "ms")
    )
    shard = next(tiny_model_dir.glob("*.safetensors"))
    assert (tmp_path / "ms" / shard.name).read_bytes() == shard.read_bytes()
    assert out


def test_modelscope_unknown_model_is_clear(home, hub):
    with pytest.raises(AcquireError, match="ModelScope could not list"):
        acquire(SourceConfig(hub="modelscope", repo_id="nobody/none", endpoint=hub.url))


def test_a_client_that_hangs_up_leaves_no_traceback_on_stderr(tmp_path, capsys):
    """The hub runs in the CLI's process in tests and the demo: a client resetting its
    connection mid-request must not print a traceback beside the CLI's one-line errors."""
    import socket
    import struct
    import time

    import requests

    from demo.hub_server import HubServer

    with HubServer(tmp_path) as hub:
        host, port = hub.url.removeprefix("http://").split(":")
        for _ in range(3):
            sock = socket.create_connection((host, int(port)))
            sock.sendall(b"GET /api/models/a/b HTTP/1.1\r\nHost: x\r\n")  # no blank line
            # SO_LINGER 0: close sends a reset, as a client library's aborted connection does
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        time.sleep(0.5)
        answer = requests.get(f"{hub.url}/api/models/nobody/none", timeout=10)
    assert answer.status_code == 404  # still serving
    assert capsys.readouterr().err == ""
