"""The release is sized before any download: a setting that cannot hold one sequence stops it."""

import pytest

from llm_release.config import ReleaseConfig
from llm_release.errors import ConfigError
from llm_release.hardware import CpuInfo, Hardware
from llm_release.hub.hub_headers import ModelFiles
from llm_release.serving.capacity import plan_release
from tests.unit.sizing.test_planner import llama

CPU = Hardware(cpu=CpuInfo(model_name="cpu", cores=2, flags=["avx2"]), machine="x86_64")


def release(max_model_len: int) -> ReleaseConfig:
    return ReleaseConfig.model_validate(
        {
            "source": {"repo_id": "meta/llama-3-8b"},
            "serving": {"dtype": "bfloat16", "max_model_len": max_model_len},
        }
    )


def test_a_serving_config_that_cannot_fit_is_refused_naming_the_number():
    llama3_8b = llama(
        num_hidden_layers=32,
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=32768,
    )
    files = ModelFiles(source="hub", config=llama3_8b, tensors={}, shards=[])
    # Llama-3-8B keeps 128 KiB of KV per token in bf16: 1 GiB of CPU KV space holds 8,192.
    ok = plan_release(release(4096), CPU, files)
    assert ok.fits and ok.options[0].kv_cache_tokens == 8192
    with pytest.raises(ConfigError) as caught:
        plan_release(release(16384), CPU, files)
    assert "16,384" in caught.value.message or "16384" in caught.value.message
    assert "max_model_len" in caught.value.hint


# ---------------------------------------------------------------- max_num_seqs from the plan

GPU = Hardware(
    cpu=CpuInfo(model_name="cpu", cores=16, flags=["avx2"]), machine="x86_64", gpus=["H200"]
)


def _model_dir(tmp_path, **over):
    import json

    import torch
    from safetensors.torch import save_file

    folder = tmp_path / "m"
    folder.mkdir()
    cfg = llama(**over)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(
        {"model.embed_tokens.weight": torch.zeros(cfg["vocab_size"], cfg["hidden_size"])},
        folder / "model.safetensors",
    )
    return folder


def test_a_gpu_server_gets_the_sequences_of_its_workload_not_of_max_model_len(tmp_path):
    from llm_release.config import ServingConfig
    from llm_release.serving.capacity import plan_for_dir, resolve_batch

    # 64 layers of 8 KV heads × 128 at 32k tokens: 8 GiB per full-length sequence, so an
    # 80 GiB card (assumed here: no GPU) at 0.9 holds a handful of those — and hundreds of
    # the 768-token requests the release is sized for
    folder = _model_dir(
        tmp_path,
        num_hidden_layers=64,
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=32768,
    )
    serving = ServingConfig(max_model_len=32768, dtype="bfloat16", request_tokens=768)
    resolved = resolve_batch(folder, serving, GPU)
    option = plan_for_dir(folder, serving.model_copy(update={"max_num_seqs": 1}), GPU).options[0]
    full_length = int(option.max_concurrency)
    assert full_length < 16
    # 768 tokens are 48 blocks of 16: the blocks the KV cache has, less the sampler's share
    assert option.num_blocks // 48 - 30 <= resolved.max_num_seqs <= option.num_blocks // 48
    assert resolved.max_num_seqs > 20 * full_length
    assert serving.max_num_seqs is None  # the config itself is left as it was
    # longer requests, fewer sequences
    longer = resolve_batch(folder, serving.model_copy(update={"request_tokens": 4096}), GPU)
    assert full_length <= longer.max_num_seqs < resolved.max_num_seqs


def test_a_release_sizes_its_servers_for_its_load_profile():
    config = ReleaseConfig.model_validate(
        {
            "source": {"repo_id": "meta/llama-3-8b"},
            "load": {"prompt_tokens": 512, "output_tokens": 256},
        }
    )
    assert config.serving.request_tokens == 768
    pinned = ReleaseConfig.model_validate(
        {"source": {"repo_id": "meta/llama-3-8b"}, "serving": {"request_tokens": 2000}}
    )
    assert pinned.serving.request_tokens == 2000


def test_a_small_model_on_a_gpu_is_capped_at_vllms_own_default(tmp_path):
    from llm_release.config import GPU_MAX_NUM_SEQS_CAP, ServingConfig
    from llm_release.serving.capacity import resolve_batch

    folder = _model_dir(tmp_path)
    resolved = resolve_batch(folder, ServingConfig(max_model_len=2048, dtype="bfloat16"), GPU)
    assert resolved.max_num_seqs == GPU_MAX_NUM_SEQS_CAP == 1024


def test_cpu_default_and_an_explicit_value_are_kept(tmp_path):
    from llm_release.config import CPU_MAX_NUM_SEQS, ServingConfig
    from llm_release.serving.capacity import resolve_batch

    folder = _model_dir(tmp_path)
    assert resolve_batch(folder, ServingConfig(), CPU).max_num_seqs == CPU_MAX_NUM_SEQS == 16
    assert resolve_batch(folder, ServingConfig(max_num_seqs=7), GPU).max_num_seqs == 7


def test_the_server_command_carries_the_resolved_value(tmp_path):
    from pathlib import Path

    from llm_release.config import ServingConfig
    from llm_release.serving.capacity import resolve_batch
    from llm_release.serving.serve import vllm_args

    folder = _model_dir(tmp_path)
    serving = resolve_batch(folder, ServingConfig(max_model_len=2048, dtype="bfloat16"), GPU)
    args = vllm_args(Path(folder), "127.0.0.1", 8000, ["m"], serving, cuda=True)
    assert args[args.index("--max-num-seqs") + 1] == "1024"


def test_a_config_only_folder_is_sized_from_its_parameter_count(tmp_path):
    # a full-size shape served with --load-format dummy has no weight shards to read
    import json

    from llm_release.config import ServingConfig
    from llm_release.serving.capacity import plan_for_dir
    from llm_release.sizing import estimate_params, parse_config

    folder = tmp_path / "shape"
    folder.mkdir()
    cfg = llama(
        num_hidden_layers=32,
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
    )
    (folder / "config.json").write_text(json.dumps(cfg))
    result = plan_for_dir(folder, ServingConfig(dtype="bfloat16"), GPU)
    assert result.weights.source == "estimate"
    assert result.weights.total_bytes == 2 * estimate_params(parse_config(cfg)).total > 14e9

    # the tuner plans each setting of such a folder the same way (2026-12-06, an H100: it
    # read the folder for shards and stopped before its first server)
    from llm_release.results import Setting
    from llm_release.serving.tune import planner_fits

    fits = planner_fits(folder, ServingConfig(dtype="bfloat16", max_model_len=2048), GPU)
    assert fits(Setting(max_num_seqs=8)) is None
    assert "the planner" in fits(Setting(max_num_seqs=8, gpu_memory_utilization=0.05))


# ---------------------------------------------------------------- tensor_parallel_size auto


def _gpus(count: int) -> Hardware:
    return Hardware(
        cpu=CpuInfo(model_name="cpu", cores=16, flags=["avx2"]),
        machine="x86_64",
        gpus=["NVIDIA H200"] * count,
    )


def _weights_of(gib: float) -> dict:
    from llm_release.sizing.weights import TensorInfo

    # bf16 matrices of 8192 × 8192 (128 MiB each), as many as the size needs
    return {
        f"model.layers.{i}.w": TensorInfo(dtype="BF16", shape=[8192, 8192])
        for i in range(int(gib * 8))
    }


def _big() -> dict:
    return llama(
        num_hidden_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=8192,
    )


def _auto(tp="auto") -> ReleaseConfig:
    return ReleaseConfig.model_validate(
        {
            "source": {"repo_id": "org/big"},
            "serving": {"dtype": "bfloat16", "max_model_len": 8192, "tensor_parallel_size": tp},
        }
    )


@pytest.fixture()
def h200_memory(monkeypatch):
    from llm_release import hardware

    monkeypatch.setattr(hardware, "gpu_memory_gib", lambda: 139.8)


@pytest.mark.parametrize(("weights_gib", "gpus", "planned"), [(20, 8, 1), (200, 8, 2), (400, 8, 4)])
def test_auto_is_the_smallest_tensor_parallel_size_that_fits(
    h200_memory, weights_gib, gpus, planned
):
    from llm_release.serving.capacity import as_planned

    files = ModelFiles(source="hub", config=_big(), tensors=_weights_of(weights_gib), shards=[])
    plan = plan_release(_auto(), _gpus(gpus), files)
    assert [o.tensor_parallel_size for o in plan.options] == [1, 2, 4, 8]
    config = as_planned(_auto(), plan)
    assert config.serving.tensor_parallel_size == planned
    assert ("--tensor-parallel-size" in config.serving.parallel_args()) == (planned > 1)


def test_auto_never_plans_more_gpus_than_the_host_has(h200_memory):
    files = ModelFiles(source="hub", config=_big(), tensors=_weights_of(400), shards=[])
    with pytest.raises(ConfigError, match="cannot fit"):
        plan_release(_auto(), _gpus(2), files)  # 400 GiB of weights on 2 × 139.8 GiB


def test_an_explicit_size_is_kept_and_a_cpu_host_plans_one(h200_memory):
    from llm_release.serving.capacity import as_planned

    files = ModelFiles(source="hub", config=_big(), tensors=_weights_of(20), shards=[])
    explicit = _auto(tp=4)
    assert as_planned(explicit, plan_release(explicit, _gpus(8), files)) == explicit
    cpu = ModelFiles(source="hub", config=_big(), tensors={}, shards=[])
    assert as_planned(_auto(), plan_release(_auto(), CPU, cpu)).serving.tensor_parallel_size == 1


def test_an_unplanned_auto_never_reaches_a_server():
    from llm_release.config import ServingConfig

    with pytest.raises(ConfigError, match="not planned"):
        ServingConfig(tensor_parallel_size="auto").parallel_args()


@pytest.mark.parametrize("value", [0, -2, "AUTO", "auto; rm -rf /", "2 --enforce-eager", 1.5])
def test_a_run_form_tensor_parallel_size_is_a_positive_number_or_auto(value):
    from pydantic import ValidationError

    from llm_release.config import ServingConfig

    with pytest.raises(ValidationError):
        ServingConfig(tensor_parallel_size=value)


def test_the_fit_on_a_gpu_is_judged_for_the_batch_the_server_will_get(h200_memory):
    """No max_num_seqs: the server gets what fits at start (resolve_batch), so the plan stage
    judges the fit for one sequence, not for the sampler of vLLM's default 1,024; an explicit
    1,024 is planned as given."""
    files = ModelFiles(source="hub", config=_big(), tensors=_weights_of(20), shards=[])
    unset = plan_release(_auto(tp=1), _gpus(1), files)
    assert unset.request.max_num_seqs == 1
    assert any("max_num_seqs is chosen at start" in n for n in unset.notes)
    given = _auto(tp=1).model_copy(deep=True)
    given.serving.max_num_seqs = 1024
    explicit = plan_release(given, _gpus(1), files)
    assert explicit.request.max_num_seqs == 1024
    assert explicit.options[0].overhead_per_gpu_bytes > unset.options[0].overhead_per_gpu_bytes
    cpu = ModelFiles(source="hub", config=_big(), tensors={}, shards=[])
    assert plan_release(_auto(), CPU, cpu).request.max_num_seqs is None


# ---------------------------------------------------------------- a fleet's cards (issue 37)


def _card(name: str, gpus: int, gib: float, gpu_name: str = ""):
    from datetime import UTC, datetime

    from llm_release.fleet import GpuCard, HostCard

    return HostCard(
        name=name,
        gpus=[GpuCard(index=i, memory_gib=gib, name=gpu_name) for i in range(gpus)],
        source="stated",
        declared_at=datetime.now(UTC),
    )


def test_a_release_that_fits_no_host_of_the_fleet_is_refused_with_every_hosts_figures(
    h200_memory,
):
    files = ModelFiles(source="hub", config=_big(), tensors=_weights_of(400), shards=[])
    fleet = [_card("gpu_a", 2, 139.8), _card("gpu_b", 1, 80), _card("cpu_c", 0, 1)]
    with pytest.raises(ConfigError, match="fits no host of the fleet") as refused:
        plan_release(_auto(), _gpus(2), files, fleet, "gpu_a")
    message = str(refused.value)
    # this host's verdict first, then every other host's own, the own card not twice
    assert message.count("gpu_a") == 1 and "gpu_a (this host, 2 GPU(s)): does not fit" in message
    assert "gpu_b (1 × 80 GiB): does not fit" in message
    assert "cpu_c (no GPU): not planned: no GPU" in message


def test_a_release_that_fits_another_host_but_not_this_one_says_where_to_start_it(h200_memory):
    files = ModelFiles(source="hub", config=_big(), tensors=_weights_of(200), shards=[])
    fleet = [_card("gpu_a", 1, 139.8), _card("gpu_b", 8, 139.8), _card("gpu_c", 1, 24)]
    with pytest.raises(ConfigError, match="fits gpu_b of the fleet, not gpu_a") as refused:
        plan_release(_auto(), _gpus(1), files, fleet, "gpu_a")
    assert "host-gpu_b" in (refused.value.hint or "")


def test_a_release_that_fits_here_names_the_hosts_that_could_hold_it(h200_memory):
    files = ModelFiles(source="hub", config=_big(), tensors=_weights_of(20), shards=[])
    alone = plan_release(_auto(), _gpus(1), files)
    fleet = [_card("gpu_b", 1, 139.8), _card("gpu_c", 1, 24), _card("gpu_a", 1, 139.8)]
    plan = plan_release(_auto(), _gpus(1), files, fleet, "gpu_a")
    # the same plan for this host, with the fleet's note
    assert plan.options == alone.options and plan.notes[:-1] == alone.notes
    assert plan.notes[-1] == "fleet: also fits gpu_b; not gpu_c (1 × 24 GiB)"
    # a fleet of this host alone changes nothing
    assert plan_release(_auto(), _gpus(1), files, [fleet[2]], "gpu_a") == alone


def test_the_hosts_a_measurement_may_go_to_are_those_the_plan_says_it_fits(h200_memory):
    from llm_release.serving.capacity import as_planned, fleet_fits

    files = ModelFiles(source="hub", config=_big(), tensors=_weights_of(20), shards=[])
    fleet = [
        _card("gpu_b", 1, 139.8),
        _card("gpu_c", 1, 24),
        _card("gpu_a", 1, 139.8),
        _card("cpu_d", 0, 1),
        _card("gpu_e", 2, 139.8),
    ]
    # as the plan stage's note names them (this host, gpu_a, aside; a CPU host not planned)
    assert fleet_fits(_auto(), _gpus(1), files, fleet, "gpu_a") == ["gpu_b", "gpu_e"]
    # the measure stage judges the settings as planned (tensor_parallel_size fixed)
    planned = as_planned(_auto(), plan_release(_auto(), _gpus(1), files))
    assert fleet_fits(planned, _gpus(1), files, fleet, "gpu_a") == ["gpu_b", "gpu_e"]
    assert fleet_fits(_auto(), _gpus(1), files, [], "gpu_a") == []


@pytest.mark.parametrize(
    ("gpus", "tp", "tokens"),
    [(["NVIDIA H200"], 1, 8192), (["NVIDIA A100-SXM4-80GB"], 1, 2048), ([], 2, 4096)],
)
def test_vllms_own_step_budget_for_a_server_on_this_host(monkeypatch, gpus, tp, tokens):
    from llm_release import hardware
    from llm_release.config import ServingConfig
    from llm_release.serving.capacity import default_batched_tokens

    memory = 139.8 if gpus == ["NVIDIA H200"] else 79.2
    monkeypatch.setattr(hardware, "gpu_memory_gib", lambda: memory)
    host = CPU.model_copy(update={"gpus": gpus})
    serving = ServingConfig(tensor_parallel_size=tp)
    assert default_batched_tokens(serving, host) == tokens


def test_a_cards_gpu_name_reaches_its_plan(h200_memory):
    """A host of A100s of 80 GB is planned with vLLM's A100 budget (2,048 tokens a step, less
    activation memory) where an H100 of the same memory gets 8,192; a card stated without a
    name is planned as the larger default."""
    from llm_release.serving.capacity import card_host, plan_for

    files = ModelFiles(source="hub", config=_big(), tensors=_weights_of(20), shards=[])
    plans = {
        gpu_name: plan_for(
            _auto(tp=1), card_host(_card("h", 1, 79.2, gpu_name), _gpus(1)), files, 79.2
        )
        for gpu_name in ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "")
    }
    a100, h100, unnamed = (plans[n] for n in plans)
    assert a100.request.gpu_name == "NVIDIA A100-SXM4-80GB"
    assert a100.options[0].overhead_per_gpu_bytes < h100.options[0].overhead_per_gpu_bytes
    assert unnamed.options == h100.options


@pytest.mark.parametrize("bad", ["NVIDIA\nA100", "x" * 101, "GPU\x1b[31m"])
def test_a_cards_gpu_name_is_printable_and_short(bad):
    from pydantic import ValidationError

    from llm_release.fleet import GpuCard

    with pytest.raises(ValidationError):
        GpuCard(index=0, memory_gib=80, name=bad)
