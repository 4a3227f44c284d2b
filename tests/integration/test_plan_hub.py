"""Planning a repo on a real HTTP hub reads config, index and shard headers: no weights."""

import json
import struct

import pytest

from llm_release.errors import AcquireError
from llm_release.hub.hub_headers import read_hub, read_local
from tests.helpers import TINY_REPO

pytestmark = pytest.mark.integration


def _snapshot(hub_root):
    repo = hub_root / TINY_REPO
    return repo / "commits" / json.loads((repo / "refs.json").read_text())["main"]


def test_hub_read_fetches_headers_only(hub, hub_root, tiny_model_dir):
    files = read_hub(TINY_REPO, endpoint=hub.url)
    snapshot = _snapshot(hub_root)
    assert files.commit == snapshot.name
    assert len(files.shards) >= 2
    assert files.tensors == read_local(tiny_model_dir).tensors
    shard_bytes = 0
    for shard in files.shards:
        data = (snapshot / shard).read_bytes()
        header_end = 8 + struct.unpack("<Q", data[:8])[0]
        # the hub's own counters: exactly the length and the header, nothing past it
        assert hub.counter.bytes[shard] == header_end == files.shard_bytes_read[shard]
        assert hub.counter.max_end[shard] == header_end < len(data)
        shard_bytes += len(data)
    assert sum(hub.counter.bytes[s] for s in files.shards) < 0.01 * shard_bytes


def test_hub_read_refuses_a_hostile_header_length(hub, hub_root):
    shard = sorted(_snapshot(hub_root).glob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[:8] = struct.pack("<Q", 1 << 40)
    shard.write_bytes(bytes(data))
    with pytest.raises(AcquireError, match="header length 1099511627776 is outside"):
        read_hub(TINY_REPO, endpoint=hub.url)
    assert hub.counter.bytes[shard.name] == 8


def test_hub_read_unknown_repo_says_so(hub):
    with pytest.raises(AcquireError, match="HTTP 404"):
        read_hub("nobody/nothing", endpoint=hub.url)


def test_plan_command_on_a_hub_repo(hub, hub_root, capsys):
    from llm_release.cli import main

    code = main(
        ["plan", TINY_REPO, "--endpoint", hub.url, "--cpu-kvcache-gib", "1"]
        + ["--max-model-len", "1024", "--json"]
    )
    plan = json.loads(capsys.readouterr().out)
    assert code == 0 and plan["fits"]
    # the same number the tiny model's vLLM CPU log reports (tests/unit/data)
    assert plan["options"][0]["kv_cache_tokens"] == 2_097_152
    snapshot = _snapshot(hub_root)
    for shard in snapshot.glob("*.safetensors"):
        header_end = 8 + struct.unpack("<Q", shard.read_bytes()[:8])[0]
        assert hub.counter.max_end[shard.name] == header_end


def test_plan_command_exits_1_when_it_does_not_fit(hub, capsys):
    from llm_release.cli import main

    code = main(
        ["plan", TINY_REPO, "--endpoint", hub.url, "--cpu-kvcache-gib", "1"]
        + ["--max-model-len", "4000000"]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "DOES NOT FIT" in out and "not one sequence of max_model_len 4,000,000" in out
