"""vLLM's profile peak (sizing/profile.py) against the peaks vLLM 0.26 logged on the H100 and
H200 for the sizing matrix's rows, and against the allocations the peak traces named."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from llm_release.sizing import parse_config
from llm_release.sizing.planner import v1_runner
from llm_release.sizing.profile import (
    compile_peak_bytes,
    forward_peak_bytes,
    mla_workspace_tokens,
    moe_workspace_bytes,
    profile_peak_bytes,
    sampler_peak_bytes,
)

ROOT = Path(__file__).resolve().parents[3]
SHAPES = ROOT / "scripts" / "gpu" / "shapes"
GiB = 2**30


def _arch(shape: str):
    return parse_config(json.loads((SHAPES / shape / "config.json").read_text()))


def _rows() -> list[dict]:
    rows = []
    for path in sorted((ROOT / "docs").glob("gpu-sizing-*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["profile_vllm"].get("torch_peak_increase_gib") is not None]


ROWS = _rows()


def test_the_rows_cover_both_runners_and_both_modes():
    archs = {r["model"]: _arch(r["model"]) for r in ROWS}
    runners = {v1_runner(archs[r["model"]], r["vllm_version"]) for r in ROWS}
    eager = {"--enforce-eager" in r["settings"]["flags"] for r in ROWS}
    assert len(ROWS) >= 16 and runners == {True, False} and eager == {True, False}


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['model']}-{r['settings']['flags']}")
def test_the_modelled_peak_is_vllms_within_005_gib(row):
    arch = _arch(row["model"])
    flags = row["settings"]["flags"]
    seqs = re.search(r"--max-num-seqs (\d+)", flags)
    peak = profile_peak_bytes(
        arch,
        1,
        8192,  # vLLM's batched tokens for its server on a GPU of >= 70 GiB (the rows' log)
        max_num_seqs=int(seqs.group(1)) if seqs else 1024,
        max_model_len=row["settings"]["max_model_len"],
        v1_runner=v1_runner(arch, row["vllm_version"]),
        compiled="--enforce-eager" not in flags,
    )
    assert abs(peak / GiB - row["profile_vllm"]["torch_peak_increase_gib"]) <= 0.05


def test_the_fused_moe_workspace_is_the_traced_allocation():
    # docs/gpu-sizing-2026-12-06-h200/*.peak.json: workspace.py _ensure_workspace_size
    assert moe_workspace_bytes(_arch("qwen3-30b-a3b"), 1, 8192) == 536_870_912
    assert moe_workspace_bytes(_arch("deepseek-v2-lite"), 1, 8192) == 478_150_656
    assert moe_workspace_bytes(_arch("llama3.1-8b"), 1, 8192) == 0
    # tensor parallelism splits the experts' intermediate width, not the hidden size
    assert moe_workspace_bytes(_arch("deepseek-v2-lite"), 2, 8192) < 478_150_656


def test_mla_workspace_follows_vllms_rule():
    assert mla_workspace_tokens(32768, 32) == 65536  # 8 full lengths, capped at 64k
    assert mla_workspace_tokens(2048, 4) == 16384  # 8 × 2,048
    assert mla_workspace_tokens(2048, 4096) == 4096 * 64  # at least one block per sequence


def test_the_v1_sampler_outweighs_the_forward_at_vllms_default_rows_only():
    arch = _arch("qwen3-30b-a3b")
    forward = forward_peak_bytes(arch, 1, 8192, max_model_len=8192, max_num_seqs=1024)
    assert sampler_peak_bytes(arch, 1, 8192, 1024, v1_runner=True) > forward
    assert sampler_peak_bytes(arch, 1, 8192, 32, v1_runner=True) < forward
    # the V2 runner's sampler keeps its logits in the model dtype, processed in place
    assert sampler_peak_bytes(arch, 1, 8192, 1024, v1_runner=False) < forward


def test_compiling_on_the_v2_runner_holds_the_embedding_table():
    arch = _arch("gemma3-27b-text")
    table = arch.vocab_size * arch.hidden_size * 2
    assert compile_peak_bytes(arch, 1, 8192) >= table
    eager = profile_peak_bytes(
        arch, 1, 8192, max_num_seqs=1024, max_model_len=8192, v1_runner=False, compiled=False
    )
    graphs = profile_peak_bytes(
        arch, 1, 8192, max_num_seqs=1024, max_model_len=8192, v1_runner=False, compiled=True
    )
    assert eager < table <= graphs
    # the V1 runner compiles without the table (the Qwen3-30B-A3B graphs row: 0.87 GiB)
    v1 = profile_peak_bytes(
        arch, 1, 8192, max_num_seqs=32, max_model_len=8192, v1_runner=True, compiled=True
    )
    assert v1 < table


def test_a_moe_models_dense_layers_and_shared_experts_are_moments_of_their_own():
    arch = _arch("deepseek-v2-lite")  # one leading dense layer (intermediate 10,944), 2 shared
    kwargs = {"max_model_len": 32768, "max_num_seqs": 32}
    base = forward_peak_bytes(arch, 1, 8192, **kwargs)
    # the MLA moment is the larger one here (the traced 1.13 GiB): neither term moves it
    wide_dense = arch.model_copy(update={"intermediate_size": 60_000})
    assert forward_peak_bytes(wide_dense, 1, 8192, **kwargs) > base  # its dense layer now
    moe = arch.moe.model_copy(update={"dense_layers": 0})
    assert forward_peak_bytes(wide_dense.model_copy(update={"moe": moe}), 1, 8192, **kwargs) == base
    shared = arch.model_copy(
        update={"moe": arch.moe.model_copy(update={"shared_intermediate_size": 60_000})}
    )
    assert forward_peak_bytes(shared, 1, 8192, **kwargs) > base


def test_a_dense_model_with_mla_holds_mlas_prefill_workspace():
    """MLA's prefill workspace is the attention's, whatever the MLP: a dense model with MLA
    (MiniCPM3's kind) peaks at it where its MLP is the smaller moment."""
    moe_arch = _arch("deepseek-v2-lite")
    dense_mla = moe_arch.model_copy(update={"moe": None})
    kwargs = {"max_model_len": 32768, "max_num_seqs": 32}
    m, heads, a = dense_mla.mla, dense_mla.num_attention_heads, dense_mla.dtype_bytes
    workspace = mla_workspace_tokens(32768, 32) * heads * (m.qk_nope_head_dim + m.v_head_dim) * a
    with_mla = forward_peak_bytes(dense_mla, 1, 2048, **kwargs)
    without = forward_peak_bytes(dense_mla.model_copy(update={"mla": None}), 1, 2048, **kwargs)
    assert with_mla >= workspace > without


def test_the_plan_names_the_moment_of_its_profile_peak():
    from llm_release.sizing import PlanRequest, estimate_weights, plan

    def note(shape: str, **request) -> str:
        arch = _arch(shape)
        result = plan(
            arch,
            estimate_weights(arch, "bf16"),
            PlanRequest(device="gpu", gpu_memory_gib=139.8, gpu_counts=[1], **request),
        )
        (found,) = [n for n in result.notes if n.startswith("vLLM's profile peak")]
        return found

    assert "the sampler's 1,024 rows (V1 model runner" in note(
        "qwen3-30b-a3b", vllm_version="0.26.0"
    )
    assert "compilation's example inputs (V2" in note("gemma3-27b-text", vllm_version="0.26.0")
    assert "the forward (V2" in note("gemma3-27b-text", vllm_version="0.26.0", enforce_eager=True)
    # a version whose runner is not modelled: the larger of V1's and V2's peaks, said so
    unknown = note("qwen3-30b-a3b", vllm_version="0.27.1")
    assert "V1 model runner" in unknown and "0.27.1's runner is not modelled" in unknown
    assert "V2 model runner" in note("qwen3-30b-a3b", vllm_version="0.32.0")
