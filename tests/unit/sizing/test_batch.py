"""A GPU server's default batch size: the workload's sequences the KV cache holds, at most
vLLM's default, one max_model_len sequence still fitting, under a hybrid's state blocks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llm_release.sizing import PlanRequest, estimate_weights, parse_config, plan
from llm_release.sizing.batch import (
    choose_max_num_seqs,
    extra_blocks,
    seqs_bytes,
    vllm_default_max_num_seqs,
)
from llm_release.sizing.kv import Runtime, default_batched_tokens, kv_layout
from llm_release.sizing.planner import request_runtime

DATA = Path(__file__).parents[1] / "data" / "gpu"
H200_GIB = 139.80


def shape_plan(name: str, util: float, length: int, **serving):
    arch = parse_config(json.loads((DATA / f"{name}.config.json").read_text()))
    request = PlanRequest(
        device="gpu",
        gpu_memory_gib=H200_GIB,
        gpu_counts=[1],
        gpu_memory_utilization=util,
        max_model_len=length,
        enable_prefix_caching=arch.linear is None,  # vLLM turns it off for hybrids
        **serving,
    )
    return plan(arch, estimate_weights(arch, "bf16"), request)


def test_vllms_own_default_by_gpu():
    assert vllm_default_max_num_seqs(139.8, "NVIDIA H200") == 1024
    assert vllm_default_max_num_seqs(79.2, "NVIDIA A100-SXM4-80GB") == 256
    assert vllm_default_max_num_seqs(44.0, "NVIDIA L40S") == 256


@pytest.mark.parametrize(
    ("memory", "name", "tokens"),
    [
        (139.8, "NVIDIA H200", 8192),
        (178.4, "NVIDIA B200", 16384),
        (79.2, "NVIDIA H100 80GB HBM3", 8192),
        (79.2, "NVIDIA A100-SXM4-80GB", 2048),  # large batches slowed A100s (vLLM PR 17885)
        (44.0, "NVIDIA L40S", 2048),
    ],
)
def test_vllms_own_step_budget_by_gpu(memory, name, tokens):
    assert default_batched_tokens(Runtime(gpu_memory_gib=memory, gpu_name=name)) == tokens


def test_the_seeds_shape_gets_the_sequences_of_its_workload_not_of_32k():
    result = shape_plan("qwen3-30b-a3b-shape", 0.9, 32768)
    option = result.options[0]
    choice = choose_max_num_seqs(result, 768, 1024)
    assert int(option.max_concurrency) == 22  # what the project gave before: 0.31× vLLM
    assert choice.blocks_per_workload_request == 48  # 768 tokens in blocks of 16
    assert 900 < choice.max_num_seqs <= option.num_blocks // 48 < 1024
    assert "768-token sequences" in choice.reason


def test_a_small_kv_cache_never_gets_vllms_default_and_still_holds_max_model_len():
    """Qwen3.5-35B-A3B at 0.5 and 32k: vLLM's 1,024 left less than one sequence (it refused
    to start); the choice stays under the state blocks and keeps one 32k sequence. The plan
    is made for one sequence, as resolve_batch makes it; at vLLM's default the plan itself
    says vLLM would refuse (more sequences than state blocks)."""
    default = shape_plan("qwen3.5-35b-a3b-shape", 0.5, 32768)
    assert not default.fits and "linear-attention state block" in default.options[0].reasons[0]
    assert shape_plan("qwen3.5-35b-a3b-shape", 0.5, 32768, enforce_eager=True).fits  # no graphs
    result = shape_plan("qwen3.5-35b-a3b-shape", 0.5, 32768, max_num_seqs=1)
    option = result.options[0]
    choice = choose_max_num_seqs(result, 768, 1024)
    assert result.fits
    assert 1 <= choice.max_num_seqs < option.num_blocks  # vLLM refuses more than its blocks
    used = choice.max_num_seqs * choice.blocks_per_workload_request
    assert used <= option.num_blocks
    assert choice.max_num_seqs < 100


def test_vllms_default_when_the_kv_cache_holds_more_than_it():
    result = shape_plan("llama-2.5b-random", 0.9, 4096)
    choice = choose_max_num_seqs(result, 768, 1024)
    assert choice.max_num_seqs == 1024 and "own default" in choice.reason


def test_the_choice_falls_as_requests_grow_and_as_the_cap_does():
    result = shape_plan("qwen3-30b-a3b-shape", 0.9, 32768)
    counts = [choose_max_num_seqs(result, n, 1024).max_num_seqs for n in (256, 768, 4096, 32768)]
    assert counts == sorted(counts, reverse=True)
    assert counts[-1] == int(result.options[0].max_concurrency)  # the worst case is the floor
    assert choose_max_num_seqs(result, 768, 256).max_num_seqs == 256


def test_the_profile_share_counts_only_sequences_beyond_what_the_plan_holds():
    """vLLM 0.26 profiles a MoE model's sampler on the V1 runner: rows·vocab·14 bytes and
    more; a server of fewer sequences than the plan's takes nothing back (erring safe)."""
    result = shape_plan("qwen3-30b-a3b-shape", 0.9, 32768, max_num_seqs=32, vllm_version="0.26.0")
    runtime = Runtime(device="gpu", gpu_memory_gib=H200_GIB)
    grown = seqs_bytes(result, runtime, 1024) - seqs_bytes(result, runtime, 32)
    assert grown >= (1024 - 32) * 151_936 * 14  # the sampler's rows alone
    assert extra_blocks(result, runtime, 16, 1 << 20) == 0
    assert extra_blocks(result, runtime, 1024, 1 << 20) >= grown // (1 << 20)


@pytest.mark.parametrize("util", [0.47, 0.48])
def test_a_model_that_does_not_hold_one_sequence_gets_one(util):
    result = shape_plan("qwen3.5-35b-a3b-shape", util, 32768, vllm_version="0.26.0")
    assert not result.fits and result.options[0].max_concurrency < 1
    choice = choose_max_num_seqs(result, 768, 1024)
    assert choice.max_num_seqs == 1 and "does not hold one sequence" in choice.reason


def hybrid_on_one_h100():
    """Qwen3.5-35B-A3B's shape on one H100 at 0.9 and 32k, prefix caching on (align mode)."""
    arch = parse_config(json.loads((DATA / "qwen3.5-35b-a3b-shape.config.json").read_text()))
    request = PlanRequest(
        device="gpu",
        gpu_memory_gib=79.18,
        gpu_counts=[1],
        gpu_memory_utilization=0.9,
        max_model_len=32768,
        enable_prefix_caching=True,
        max_num_seqs=1,
        vllm_version="0.26.0",
    )
    return plan(arch, estimate_weights(arch, "bf16"), request)


def test_a_hybrid_served_with_prefix_caching_counts_the_state_blocks_a_running_request_holds():
    """vLLM 0.26, mamba_cache_mode align (the project serves with prefix caching on): a
    768-token request holds 1 attention block (of 1,056 tokens) and 1 state block in each of
    the 3 Gated DeltaNet groups, 4 in all; it takes a second state block a group only while
    it crosses a block boundary, and vLLM reserves that second one for a max_model_len
    request (38). Counting 2 a group at 768 tokens gave 7 and 36 sequences on one H100,
    where 100 streams then queued (TTFT p95 13.4 s, 2026-12-07)."""
    result = hybrid_on_one_h100()
    arch = result.arch
    choice = choose_max_num_seqs(result, 768, 1024)
    assert (choice.blocks_per_workload_request, choice.blocks_per_full_request) == (4, 38)
    blocks = result.options[0].num_blocks
    assert choice.max_num_seqs * 4 <= blocks < (choice.max_num_seqs + 8) * 4
    assert choice.max_num_seqs > 50  # 36 with 2 state blocks a group
    # past one block (1,056 tokens) a running request may hold both states of a group
    assert choose_max_num_seqs(result, 2000, 1024).blocks_per_workload_request == 2 + 3 * 2
    runtime = Runtime(device="gpu", gpu_memory_gib=79.18, enable_prefix_caching=True)
    linear = [g for g in kv_layout(arch, runtime, 768, running=True).groups if g.kind == "linear"]
    assert [g.blocks_per_request for g in linear] == [1, 1, 1]
    reserved = [g for g in kv_layout(arch, runtime, 768).groups if g.kind == "linear"]
    assert [g.blocks_per_request for g in reserved] == [2, 2, 2]  # what vLLM reserves
    off = Runtime(device="gpu", gpu_memory_gib=79.18, enable_prefix_caching=False)
    assert [g.blocks_per_request for g in kv_layout(arch, off, 32768).groups][1:] == [1, 1, 1]


def test_the_null_block_is_never_handed_out():
    """vLLM's BlockPool keeps block 0 as its null block (v1/core/block_pool.py): a KV cache of
    exactly k requests' blocks admits k - 1 of them, and one block more admits k."""
    result = hybrid_on_one_h100()
    runtime = request_runtime(result.arch, result.request, 1)
    k = choose_max_num_seqs(result, 768, 1024).max_num_seqs
    per_block = kv_layout(result.arch, runtime, result.max_model_len).bytes_per_block
    exact = k * 4 + extra_blocks(result, runtime, k, per_block)

    def with_blocks(n: int):
        option = result.options[0].model_copy(update={"num_blocks": n})
        return result.model_copy(update={"options": [option]})

    assert choose_max_num_seqs(with_blocks(exact), 768, 1024).max_num_seqs == k - 1
    assert choose_max_num_seqs(with_blocks(exact + 1), 768, 1024).max_num_seqs == k
