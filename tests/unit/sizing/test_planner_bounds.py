"""The planner bounds what a hub's metadata can make it do: every number it reads from
config.json is an integer within a limit that real models stay far below, non-finite
numbers, deep nesting and oversized files are refused in one line naming the field, the
value and the limit; safetensors headers are capped per shard, in total and in count. A
hostile config runs through ``llm-release plan`` under a memory and CPU limit."""

from __future__ import annotations

import json
import resource
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llm_release.errors import AcquireError, ConfigError
from llm_release.hub.hub_headers import read_local
from llm_release.sizing import PlanRequest, estimate_weights, parse_config, plan

BASE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
}
MOE = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}


def model_dir(root: Path, config: dict | bytes) -> Path:
    """A folder with ``config`` (a dict, or raw bytes) and a one-tensor model.safetensors."""
    root.mkdir(parents=True, exist_ok=True)
    raw = config if isinstance(config, bytes) else json.dumps(config).encode()
    (root / "config.json").write_bytes(raw)
    header = json.dumps({"w": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}).encode()
    (root / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    return root


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# ---------------------------------------------------------------- the limits of config.json


@pytest.mark.parametrize(
    ("field", "real", "limit", "extra"),
    [
        # real: the largest public value known (see planner.py's CONFIG_LIMITS comment)
        ("num_hidden_layers", 126, 1024, {}),  # Llama 3.1 405B
        ("num_attention_heads", 128, 1024, {}),  # Llama 3.1 405B
        ("num_key_value_heads", 128, 1024, {}),  # DeepSeek-V3 (MLA: one per head)
        ("hidden_size", 16384, 65536, {}),  # Llama 3.1 405B
        ("intermediate_size", 53248, 1 << 20, {}),  # Llama 3.1 405B
        ("num_experts", 512, 4096, MOE),  # Qwen3.5-397B-A17B
        ("vocab_size", 262144, 1 << 21, {}),  # Gemma 3
        ("max_position_embeddings", 10_485_760, 1 << 24, {}),  # Llama 4 Scout
        ("sliding_window", 4096, 1 << 24, {}),
        ("head_dim", 256, 8192, {}),  # Qwen3.5
        ("kv_lora_rank", 512, 65536, {"qk_rope_head_dim": 64}),  # DeepSeek-V3
        ("layer_types", 126, 1024, {}),  # entries
    ],
)
def test_each_limit_admits_real_models_and_refuses_one_more(field, real, limit, extra):
    def config(value: int) -> dict:
        if field == "layer_types":
            return {**BASE, **extra, field: ["full_attention"] * value, "num_hidden_layers": 2}
        return {**BASE, **extra, field: value}

    arch = parse_config(config(real))
    assert arch.num_layers >= 2
    # the worst value a limit admits still plans in well under a second
    start = time.process_time()
    at_limit = parse_config(config(limit))
    plan(at_limit, estimate_weights(at_limit, "bf16"), PlanRequest(gpu_counts=[1, 2, 4, 8]))
    assert time.process_time() - start < 2.0
    with pytest.raises(ConfigError) as caught:
        parse_config(config(limit + 1))
    line = caught.value.one_line()
    assert f"'{field}'" in line and f"{limit:,}" in line, line
    if field != "layer_types":
        assert f"is {limit + 1}, outside 0..{limit:,}" in line, line


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_hidden_layers", 32.0),
        ("hidden_size", 4096.5),
        ("num_key_value_heads", 8.0),
        ("sliding_window_pattern", 6.0),
        ("max_position_embeddings", 1e7),
        ("num_experts", 64.0),
    ],
)
def test_a_float_where_an_integer_is_required_is_refused(field, value):
    config = {**BASE, field: value, **({"sliding_window": 128} if "pattern" in field else {})}
    with pytest.raises(ConfigError, match=f"'{field}' is {value!r}, not an integer"):
        parse_config(config)


@pytest.mark.parametrize(
    ("snippet", "field", "shown"),
    [
        ('"hidden_size": NaN', "hidden_size", "NaN"),
        ('"vocab_size": Infinity', "vocab_size", "Infinity"),
        ('"max_position_embeddings": -Infinity', "max_position_embeddings", "-Infinity"),
        ('"num_hidden_layers": 1e400', "num_hidden_layers", "1e400"),
        ('"rope_scaling": {"factor": Infinity}', "rope_scaling.factor", "Infinity"),
        ('"layer_types": ["full_attention", NaN]', "layer_types.1", "NaN"),
    ],
)
def test_non_finite_numbers_are_refused_naming_their_field(tmp_path, snippet, field, shown):
    raw = json.dumps(BASE)[:-1] + ", " + snippet + "}"
    with pytest.raises(ConfigError) as caught:
        parse_config(read_local(model_dir(tmp_path, raw.encode())).config)
    line = caught.value.one_line()
    assert f"config.json field '{field}' is {shown}, not a finite number" in line, line


@pytest.mark.parametrize("depth", [40, 100_000])
def test_deep_nesting_is_refused(tmp_path, depth):
    raw = json.dumps(BASE)[:-1] + f', "quantization_config": {nested(depth)}}}'
    with pytest.raises(ConfigError, match="nested deeper than the planner's limit of 32 levels"):
        read_local(model_dir(tmp_path, raw.encode()))


def test_real_nesting_is_accepted(tmp_path):
    # compressed-tensors' quantization_config is the deepest real one: 5 levels
    groups = {"group_0": {"weights": {"num_bits": 4, "strategy": "group"}, "targets": ["Linear"]}}
    config = {**BASE, "quantization_config": {"config_groups": groups}}
    assert read_local(model_dir(tmp_path, config)).config == config


def test_an_oversized_config_is_refused_before_it_is_parsed(tmp_path):
    config = {**BASE, "_name_or_path": "x" * (5 << 20)}
    with pytest.raises(ConfigError, match="over the planner's limit of 4,194,304"):
        read_local(model_dir(tmp_path, config))


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"layer_types": "full_attention"}, "'layer_types' is 'full_attention', not a list"),
        ({"architectures": "LlamaForCausalLM"}, "'architectures' is 'LlamaForCausalLM', not a"),
        ({"architectures": {"a": 1}}, "'architectures' is {'a': 1}, not a list"),
        ({"torch_dtype": ["bfloat16"]}, "'torch_dtype' is ['bfloat16'], not a name"),
        ({"model_type": "m" * 300}, "'model_type' is 'mmm"),
        ({**MOE, "num_experts_per_tok": 9}, "routes 9 of 8 experts per token"),
        ({"num_attention_heads": 128, "head_dim": None}, "num_attention_heads 128 > hidden_size"),
    ],
)
def test_malformed_fields_are_refused_in_one_line(over, message):
    with pytest.raises(ConfigError) as caught:
        parse_config({**BASE, **over})
    line = caught.value.one_line()
    assert message in line and "\n" not in line, line


# ---------------------------------------------------------------- safetensors header caps


def test_an_index_of_too_many_shards_is_refused_before_any_is_opened(tmp_path):
    root = model_dir(tmp_path / "m", BASE)
    (root / "model.safetensors").unlink()
    weight_map = {f"w{i}": f"model-{i:05d}.safetensors" for i in range(4097)}
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(AcquireError, match="names 4,097 shards, over the planner's limit of 4,096"):
        read_local(root)


def test_one_header_over_16_mib_is_refused(tmp_path):
    root = model_dir(tmp_path / "m", BASE)
    (root / "model.safetensors").write_bytes(struct.pack("<Q", (16 << 20) + 1) + b"{}")
    with pytest.raises(AcquireError, match=r"header length 16777217 is outside 2\.\.16777216"):
        read_local(root)


def test_the_headers_of_all_shards_are_capped_in_total(tmp_path):
    # five shards of 15 MiB headers each (metadata padding): each under the 16 MiB cap,
    # together over the 64 MiB total; the fifth is refused before its header is read
    root = model_dir(tmp_path / "m", BASE)
    (root / "model.safetensors").unlink()
    names = [f"model-{i}-of-5.safetensors" for i in range(1, 6)]
    for name in names:
        header = json.dumps({"__metadata__": {"pad": "x" * (15 << 20)}}).encode()
        (root / name).write_bytes(struct.pack("<Q", len(header)) + header)
    weight_map = {f"w{i}": name for i, name in enumerate(names)}
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(AcquireError, match="more than the planner's limit of 67,108,864 bytes"):
        read_local(root)


# ---------------------------------------------------------------- the CLI under limits

MEMORY_LIMIT = 1536 << 20  # bytes of address space: the CLI's plan needs ~1 GiB of it
CPU_LIMIT_S = 30


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_LIMIT_S, CPU_LIMIT_S))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        # the case: a float layer count with a sliding-window pattern
        (
            '"num_hidden_layers": 1e9, "sliding_window": 4096, "sliding_window_pattern": 6',
            "config.json field 'num_hidden_layers' is 1000000000.0, not an integer (0..1,024)",
        ),
        (
            '"num_hidden_layers": 1000000000, "sliding_window": 4096',
            "config.json field 'num_hidden_layers' is 1000000000, outside 0..1,024",
        ),
        ('"hidden_size": NaN', "config.json field 'hidden_size' is NaN, not a finite number"),
        ('"vocab_size": 1e400', "config.json field 'vocab_size' is 1e400, not a finite number"),
        (f'"x": {nested(100_000)}', "nested deeper than the planner's limit of 32 levels"),
    ],
    ids=["float-layers", "int-layers", "nan", "overflow", "deep"],
)
def test_plan_cli_refuses_a_hostile_config_under_memory_and_cpu_limits(tmp_path, raw, message):
    # appended after BASE's own fields: JSON's last duplicate key wins
    root = model_dir(tmp_path / "m", (json.dumps(BASE)[:-1] + ", " + raw + "}").encode())
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "llm_release.cli", "plan", str(root), "--cpu-kvcache-gib", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limits,
    )
    took = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-2000:]
    assert message in lines[0], lines[0]
    # the interpreter and the CLI's imports take most of it; the old code took 34 s of CPU
    # on the first case, then ran out of memory
    assert cpu < 15 and took < 30, (cpu, took)
