"""Planning against a hub that stalls, trickles or inflates its metadata: every plan ends
within the operator's budget for all its reads (LLM_RELEASE_PLAN_DEADLINE_S) with a
one-line error naming the host and the budget, and the header caps hold before the bytes
are fetched. The hub is tests/hostile_hub.py on 127.0.0.1; the CLI runs as a process."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time

import pytest

from llm_release.errors import AcquireError
from llm_release.hub import hub_headers
from llm_release.hub.hub_headers import read_hub
from tests.hostile_hub import HostileHub

pytestmark = pytest.mark.integration
REPO = "slow/model"
DEADLINE_ENV = "LLM_RELEASE_PLAN_DEADLINE_S"  # the operator setting
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
}


def shard(name: str) -> bytes:
    """A valid safetensors file of one 2-element BF16 tensor."""
    header = json.dumps({name: {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}).encode()
    return struct.pack("<Q", len(header)) + header + b"\0" * 4


def publish(hub: HostileHub, shards: int, **shard_behaviour) -> None:
    """config.json, an index of ``shards`` shards, and the shards (range requests on)."""
    hub.plan.ranges = True
    hub.plan.add("config.json", json.dumps(CONFIG).encode())
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    index = {"metadata": {}, "weight_map": {f"w{i}": n for i, n in enumerate(names)}}
    hub.plan.add(hub_headers.INDEX_NAME, json.dumps(index).encode())
    for i, name in enumerate(names):
        hub.plan.add(name, shard(f"w{i}"), lfs=True, **shard_behaviour)


@pytest.fixture()
def hostile():
    with HostileHub() as hub:
        yield hub


def plan_cli(hub: HostileHub, budget_s: float, limit_s: float) -> tuple[int, str, float]:
    env = {**os.environ, DEADLINE_ENV: str(budget_s)}
    env.pop("HF_TOKEN", None)
    start = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "llm_release.cli", "plan", REPO, "--endpoint", hub.url],
            env=env,
            capture_output=True,
            text=True,
            timeout=limit_s,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"llm-release plan still reading the hub after {limit_s} s")
    return done.returncode, done.stderr, time.monotonic() - start


def test_plan_cli_ends_within_its_budget_against_a_trickling_config(hostile):
    # One byte every 0.2 s: each read gets a byte long before any read timeout, so only a
    # budget over all reads ends it (the config alone would take ~60 s).
    hostile.plan.add("config.json", json.dumps(CONFIG).encode(), trickle_s=0.2)
    code, err, took = plan_cli(hostile, budget_s=3, limit_s=30)
    host = hostile.url.removeprefix("http://")
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert f"{host} did not send the plan's config, index and shard headers within the 3 s" in err
    assert DEADLINE_ENV in err
    # interpreter start and imports come on top of the 3 s; the trickle needs ~60 s
    assert took < 3 + 12, took


def test_plan_cli_budget_spans_every_read_of_the_plan(hostile):
    # 40 shards, each answer 0.25 s late: every request is quick by itself, but the 80 range
    # reads of the plan take 20 s in all. The old per-read timeout never fires.
    publish(hostile, shards=40, delay_s=0.25)
    code, err, took = plan_cli(hostile, budget_s=3, limit_s=40)
    assert code == 2, err
    assert "within the 3 s budget" in err and len(err.strip().splitlines()) == 1, err
    assert took < 3 + 12, took
    # it stopped part-way: not every shard header was asked for
    asked = [path for path, _ in hostile.plan.requests if path.endswith(".safetensors")]
    assert 0 < len(asked) < 80


def test_read_hub_deadline_is_exact_against_a_silent_hub(hostile, monkeypatch):
    # Accepted, never answered: the per-read timeout (30 s) is capped by the budget left.
    monkeypatch.setenv(DEADLINE_ENV, "1.5")
    hostile.plan.silent = True
    start = time.monotonic()
    with pytest.raises(AcquireError, match=r"within the 1\.5 s budget"):
        read_hub(REPO, endpoint=hostile.url)
    assert time.monotonic() - start < 1.5 + 1.0


def test_read_hub_deadline_holds_while_a_trickle_keeps_every_read_alive(hostile, monkeypatch):
    # The second read of a shard header trickles: one byte per 0.3 s of a 60-byte header.
    monkeypatch.setenv(DEADLINE_ENV, "2")
    publish(hostile, shards=1, trickle_s=0.3)
    start = time.monotonic()
    with pytest.raises(AcquireError, match="within the 2 s budget") as caught:
        read_hub(REPO, endpoint=hostile.url)
    assert time.monotonic() - start < 2 + 0.5
    assert caught.value.one_line().count("\n") == 0


def test_an_index_of_too_many_shards_is_refused_before_any_shard_is_read(hostile, monkeypatch):
    monkeypatch.setenv(DEADLINE_ENV, "20")
    hostile.plan.ranges = True
    hostile.plan.add("config.json", json.dumps(CONFIG).encode())
    weight_map = {f"w{i}": f"model-{i:05d}.safetensors" for i in range(5000)}
    hostile.plan.add(hub_headers.INDEX_NAME, json.dumps({"weight_map": weight_map}).encode())
    with pytest.raises(AcquireError, match="names 5,000 shards, over the planner's limit of 4,096"):
        read_hub(REPO, endpoint=hostile.url)
    assert not [p for p, _ in hostile.plan.requests if p.endswith(".safetensors")]


def test_a_header_over_the_cap_is_refused_after_its_8_length_bytes(hostile, monkeypatch):
    monkeypatch.setenv(DEADLINE_ENV, "20")
    # within the caps and the budget, a plan reads exactly each header
    publish(hostile, shards=3)
    files = read_hub(REPO, endpoint=hostile.url)
    assert sorted(files.tensors) == ["w0", "w1", "w2"]
    assert sorted(files.shard_bytes_read.values()) == [len(shard("w0")) - 4] * 3
    hostile.plan.files.clear()
    hostile.plan.requests.clear()
    hostile.plan.add("config.json", json.dumps(CONFIG).encode())
    # 17 MiB of header promised (the old bound was 100 MB): refused before it is fetched
    hostile.plan.add("model.safetensors", struct.pack("<Q", 17 << 20) + b"{}", lfs=True)
    with pytest.raises(AcquireError, match=r"header length 17825792 is outside 2\.\.16777216"):
        read_hub(REPO, endpoint=hostile.url)
    ranges = [p for p, _ in hostile.plan.requests if p.endswith("model.safetensors")]
    assert len(ranges) == 1  # the 8 length bytes only
