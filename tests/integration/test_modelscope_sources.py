"""ModelScope sources from the command line (`download`, `plan`, `release --hub modelscope`)
and in the plan stage: sized from config, index and shard headers read through ModelScope's
file API with range requests, as for a Hugging Face hub (the demo hub speaks both)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from llm_release.cli import main
from llm_release.config import ReleaseConfig
from llm_release.hub.hub_headers import read_hub, read_local
from llm_release.serving.capacity import read_release_model
from tests.helpers import TINY_REPO

pytestmark = pytest.mark.integration


def _snapshot(hub_root):
    repo = hub_root / TINY_REPO
    return repo / "commits" / json.loads((repo / "refs.json").read_text())["main"]


def test_modelscope_headers_only_through_its_file_api(hub, hub_root, tiny_model_dir):
    files = read_hub(TINY_REPO, endpoint=hub.url, hub="modelscope")
    assert files.tensors == read_local(tiny_model_dir).tensors
    assert files.config == json.loads((tiny_model_dir / "config.json").read_text())
    assert len(files.shards) >= 2
    for shard in _snapshot(hub_root).glob("*.safetensors"):
        header_end = 8 + struct.unpack("<Q", shard.read_bytes()[:8])[0]
        # the hub's own counter: the length and the header, not one byte of tensor data
        assert hub.counter.max_end[shard.name] == header_end < shard.stat().st_size


def test_the_plan_stage_sizes_a_modelscope_source(hub, tiny_model_dir):
    config = ReleaseConfig.model_validate(
        {"source": {"hub": "modelscope", "repo_id": TINY_REPO, "endpoint": hub.url}}
    )
    files = read_release_model(config)
    assert files is not None and files.tensors == read_local(tiny_model_dir).tensors
    assert files.source.startswith(hub.url)


def test_plan_and_download_take_hub_modelscope(home, hub, tiny_model_dir, capsys):
    argv = ["plan", TINY_REPO, "--hub", "modelscope", "--endpoint", hub.url]
    assert main(argv + ["--cpu-kvcache-gib", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fits"]
    code = main(["download", TINY_REPO, "--hub", "modelscope", "--endpoint", hub.url, "--quiet"])
    out = capsys.readouterr().out
    assert code == 0, out
    manifest = json.loads(Path(out.split("manifest: ", 1)[1].strip()).read_text())
    assert manifest["hub"] == "modelscope"
    assert {f["path"] for f in manifest["files"]} >= {"config.json", "model.safetensors.index.json"}


def test_plan_of_a_missing_modelscope_model_is_one_line(hub, capsys):
    assert main(["plan", "nobody/none", "--hub", "modelscope", "--endpoint", hub.url]) == 2
    err = capsys.readouterr().err
    assert "HTTP 404" in err and len(err.strip().splitlines()) == 1


def test_the_release_command_line_takes_hub_modelscope(monkeypatch, tmp_path):
    from flows.cli import cli_config

    monkeypatch.setattr("sys.argv", ["release", "--repo-id", TINY_REPO, "--hub", "modelscope"])
    assert cli_config("t").config.source.hub == "modelscope"
    # named on the command line, it wins over the config file's source.hub
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"source": {"repo_id": TINY_REPO, "hub": "huggingface"}}))
    monkeypatch.setattr("sys.argv", ["release", "--config", str(config), "--hub", "modelscope"])
    assert cli_config("t").config.source.hub == "modelscope"
    monkeypatch.setattr("sys.argv", ["release", "--config", str(config)])
    assert cli_config("t").config.source.hub == "huggingface"
