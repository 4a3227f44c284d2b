"""The torch peak of vLLM's profile run: what ``determine_available_memory`` logs as "torch
peak memory increase" and takes out of the KV cache, modelled from the tensors vLLM
allocates, per model runner and compilation mode.

vLLM (``v1/worker/gpu_worker.py``, 0.26) resets the allocator's peak, runs
``GPUModelRunner.profile_run`` (a forward of ``max_num_batched_tokens`` tokens split into
``min(tokens, max_num_seqs)`` requests, then the sampler on one row per request) and takes
the peak above what was allocated before. Which tensors are alive at that peak was read on
an H200 with torch's allocator history around ``profile_run``
(``scripts/gpu/peak_trace/``, raw ``*.peak.json`` under ``docs/gpu-sizing-2026-12-06-h200/``)
for dense, sliding-window, FP8, W4A16, MoE, MLA-MoE and Gated-DeltaNet shapes, eager and
compiled; each term below names the allocation it stands for and the source line that makes
it. ``T`` is the profile's tokens, ``H`` the hidden size, ``a`` the activation dtype's bytes.
The peak is the largest of three moments:

* **The forward** (``model.forward`` on T tokens):
  - dense MLP: the residual, the normed hidden states and the MLP's output (3 × T·H·a; Gemma 2/3
    keep two more for their pre/post feed-forward norms), the gate_up projection (T·2I·a) and
    its activation (T·I·a), and cuBLAS's 32 MiB workspace (torch's default on Hopper,
    ``:4096:8``), allocated by the first unquantized GEMM and kept;
  - fused MoE: the modular kernel's workspace (``fused_moe/modular_kernel.py``
    ``workspace_shapes`` through ``v1/worker/workspace.py``, kept once allocated):
    T·top-k·(max(2·I_moe, H) + max(I_moe, H))·a, plus three hidden-state buffers and the
    larger of the attention's moment (the QKV projection and three query-width buffers, or
    MLA's below) and the shared experts' MLP (3·T·I_shared·a); a model's leading dense layers
    (DeepSeek's first_k_dense_replace) run their dense MLP before the workspace exists;
  - MLA (``layers/attention/mla_attention.py``), in a MoE or a dense model (where it is
    the larger of it and the dense MLP): in the profile run the prefill context's
    worst case, ``chunked_prefill_workspace_size × heads × (qk_nope + v)·a`` with the
    workspace ``max(min(max(8·max_model_len, 4·max_num_seqs·block), 65,536),
    max_num_seqs·block)`` tokens, beside the query (T·heads·(qk_nope + qk_rope)·a) and the
    compressed KV (T·(kv_lora_rank + qk_rope)·a);
  - Gated DeltaNet: its input projections (T·(2 key + 3 value widths)·a); a Mamba2 mixer
    its in_proj (T·(2·inner + 2·groups·state + heads)·a), a Mamba one T·2·inner·a (from the
    source, not traced).
* **The sampler** on ``rows = min(T, max_num_seqs)``:
  - the V1 runner (``v1/sample/sampler.py``, ``ops/topk_topp_sampler.py``): logits in the
    model dtype, in float32, the probabilities and the exponential noise (rows·V·(a + 12)),
    the rows' hidden states and the Triton top-k/top-p buffer (``topk_topp_triton.py``: one
    float32 row of V per program, ``min(next_pow2(min(SMs, rows)), SMs)`` programs), beside
    the kept workspaces and the forward's T·H·a hidden states the runner still holds;
  - the V2 runner (``v1/worker/gpu/sample/``): the logits in the model dtype, processed in
    place (rows·V·a), beside the T·H·a hidden states still held.
* **Compilation** (the V2 runner with CUDA graphs: ``compilation/compiler_interface.py``
  ``standalone_compile`` on concrete example inputs): the first piecewise graph's inputs,
  the embedding table among them (V/tp·H·a) and two T·H·a hidden states.
"""

from __future__ import annotations

from llm_release.sizing.architecture import ModelArch

MiB = 2**20
# torch's cuBLAS workspace on Hopper (CUBLAS_WORKSPACE_CONFIG default :4096:8)
CUBLAS_WORKSPACE_BYTES = 32 * MiB
# streaming multiprocessors of an H100 / H200 (the Triton sampler buffer's program count)
GPU_SMS = 132
# MLA's chunked-prefill workspace ceiling and the block size it assumes (FlashMLA's 64)
MLA_WORKSPACE_MAX_TOKENS = 64 * 1024
MLA_BLOCK = 64
# model types whose decoder layer keeps pre- and post-feed-forward norms beside the residual
SANDWICH_NORM_TYPES = frozenset({"gemma2", "gemma3", "gemma3_text"})


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def moe_workspace_bytes(arch: ModelArch, tp: int, tokens: int) -> int:
    """The fused-MoE kernel's two workspaces for ``tokens`` (kept once allocated)."""
    if not arch.moe:
        return 0
    inter = arch.moe.moe_intermediate_size // tp
    hidden = arch.hidden_size
    per_token = max(2 * inter, hidden) + max(inter, hidden)
    return tokens * arch.moe.experts_per_token * per_token * arch.dtype_bytes


def mla_workspace_tokens(max_model_len: int, max_num_seqs: int) -> int:
    """MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size (0.26)."""
    size = min(max(8 * max_model_len, 4 * max_num_seqs * MLA_BLOCK), MLA_WORKSPACE_MAX_TOKENS)
    return max(size, max_num_seqs * MLA_BLOCK)


def attention_bytes(
    arch: ModelArch, tp: int, tokens: int, *, max_model_len: int, max_num_seqs: int
) -> int:
    """The attention's moment: MLA's prefill workspace with its query and compressed KV, or
    the QKV projection and three query-width buffers; a Gated DeltaNet's input projections
    beside it."""
    a = arch.dtype_bytes
    if arch.mla:
        m = arch.mla
        heads = arch.num_attention_heads // tp
        work = mla_workspace_tokens(max_model_len, max_num_seqs)
        attention = work * heads * (m.qk_nope_head_dim + m.v_head_dim) * a
        attention += tokens * heads * (m.qk_nope_head_dim + m.qk_rope_head_dim) * a
        attention += tokens * (m.kv_lora_rank + m.qk_rope_head_dim) * a
    else:
        q_width = arch.num_attention_heads // tp * arch.head_dim
        kv_width = max(1, arch.num_kv_heads // tp) * arch.head_dim
        attention = tokens * (q_width + 2 * kv_width) * a + 3 * tokens * q_width * a
    if arch.linear:
        lin = arch.linear
        if lin.kind == "mamba2":  # in_proj: gate and x, B and C per group, dt per head
            widths = 2 * lin.intermediate_size + 2 * lin.n_groups * lin.state_size + lin.num_heads
        elif lin.kind == "mamba1":  # in_proj: x and gate
            widths = 2 * lin.intermediate_size
        else:
            widths = 2 * lin.num_k_heads * lin.head_k_dim + 3 * lin.num_v_heads * lin.head_v_dim
        attention += tokens * widths // tp * a
    return attention


def forward_peak_bytes(
    arch: ModelArch, tp: int, tokens: int, *, max_model_len: int, max_num_seqs: int
) -> int:
    """The forward's peak above the weights (and what it keeps: MoE workspaces, cuBLAS)."""
    a = arch.dtype_bytes
    hidden = tokens * arch.hidden_size * a
    buffers = 3 + (2 if arch.model_type in SANDWICH_NORM_TYPES else 0)
    dense_mlp = CUBLAS_WORKSPACE_BYTES + buffers * hidden
    dense_mlp += 3 * tokens * (arch.intermediate_size // tp) * a
    sizes = {"max_model_len": max_model_len, "max_num_seqs": max_num_seqs}
    if not arch.moe:
        # a dense model's MLP outweighs its attention, but for MLA's prefill workspace
        if not arch.mla:
            return dense_mlp
        mla = CUBLAS_WORKSPACE_BYTES + 3 * hidden + attention_bytes(arch, tp, tokens, **sizes)
        return max(dense_mlp, mla)
    # a MoE model's layers: its leading dense layers run before any expert allocates the
    # kept workspace; in every other layer the workspace is there for the attention and the
    # experts (with the shared experts' MLP beside them)
    kept = CUBLAS_WORKSPACE_BYTES + moe_workspace_bytes(arch, tp, tokens) + 3 * hidden
    attention = attention_bytes(arch, tp, tokens, **sizes)
    shared = 3 * tokens * (arch.moe.shared_intermediate_size // tp) * a
    peak = kept + max(attention, shared)
    return max(peak, dense_mlp) if arch.moe.dense_layers else peak


def sampler_peak_bytes(arch: ModelArch, tp: int, tokens: int, rows: int, *, v1_runner: bool) -> int:
    """The sampler step's peak above the weights, with what the forward kept."""
    a = arch.dtype_bytes
    vocab = arch.vocab_size
    kept = CUBLAS_WORKSPACE_BYTES + moe_workspace_bytes(arch, tp, tokens)
    if v1_runner:
        programs = min(_next_pow2(min(GPU_SMS, rows)), GPU_SMS)
        kept += rows * arch.hidden_size * a + programs * vocab * 4
        return kept + tokens * arch.hidden_size * a + rows * vocab * (a + 12)
    return kept + tokens * arch.hidden_size * a + rows * vocab * a


def compile_peak_bytes(arch: ModelArch, tp: int, tokens: int) -> int:
    """standalone_compile's concrete example inputs of the first piecewise graph (V2)."""
    a = arch.dtype_bytes
    return arch.vocab_size // tp * arch.hidden_size * a + 2 * tokens * arch.hidden_size * a


def profile_moments(
    arch: ModelArch,
    tp: int,
    tokens: int,
    *,
    max_num_seqs: int,
    max_model_len: int,
    v1_runner: bool,
    compiled: bool,
) -> dict[str, int]:
    """Each moment's peak (the forward, the sampler, compilation where it happens)."""
    rows = min(tokens, max_num_seqs)
    moments = {
        "the forward": forward_peak_bytes(
            arch, tp, tokens, max_model_len=max_model_len, max_num_seqs=max_num_seqs
        ),
        f"the sampler's {rows:,} rows": sampler_peak_bytes(
            arch, tp, tokens, rows, v1_runner=v1_runner
        ),
    }
    if compiled and not v1_runner:
        moments["compilation's example inputs"] = compile_peak_bytes(arch, tp, tokens)
    return moments


def profile_peak_bytes(arch: ModelArch, tp: int, tokens: int, **settings: int | bool) -> int:
    """vLLM's "torch peak memory increase" for one rank (module docstring): the largest of
    profile_moments, whose keyword settings it takes."""
    return max(profile_moments(arch, tp, tokens, **settings).values())  # type: ignore[arg-type]
