"""The plan as text: the table ``llm-release plan`` prints."""

from __future__ import annotations

from llm_release.sizing.architecture import GiB
from llm_release.sizing.planner import CapacityPlan

# ---------------------------------------------------------------- output


def _gib(n: int) -> str:
    return f"{n / GiB:,.2f}"


def format_plan(p: CapacityPlan) -> str:
    from tabulate import tabulate

    a = p.arch
    kinds = ", ".join(f"{a.count(k)} {k}" for k in ("full", "sliding", "linear") if a.count(k))
    lines = [
        f"{p.model}: {a.architecture}, {a.num_layers} layers ({kinds}), "
        f"{a.num_kv_heads} KV heads × {a.head_dim}"
        + (f", MLA latent {a.mla.kv_lora_rank}+{a.mla.qk_rope_head_dim}" if a.mla else "")
        + (f", window {a.sliding_window}" if a.sliding_window else ""),
        f"weights ({p.weights.source}, {p.weights.scheme}): {_gib(p.weights.total_bytes)} GiB — "
        + ", ".join(f"{k} {_gib(v)} GiB" for k, v in p.weights.by_dtype.items()),
        f"KV per token: {p.kv_bytes_per_token_unsharded:,} B (vLLM) vs "
        f"{p.seeds_kv_bytes_per_token:,} B (seeds' hidden×layers×4×bytes); "
        f"max_model_len {p.max_model_len:,}",
    ]
    headers = [
        "TP",
        "weights/GPU GiB",
        "overhead GiB",
        "KV mem GiB",
        "KV B/token",
        "state B/seq",
        "block",
        "KV tokens",
        "max conc.",
        "min util",
        "fits",
    ]
    rows = [
        [
            o.tensor_parallel_size,
            _gib(o.weights_per_gpu_bytes),
            _gib(o.overhead_per_gpu_bytes),
            _gib(o.kv_memory_per_gpu_bytes),
            f"{o.kv_bytes_per_token:,}",
            f"{o.state_bytes_per_sequence:,}",
            o.block_size,
            f"{o.kv_cache_tokens:,}",
            f"{o.max_concurrency:,.2f}",
            "-" if o.min_gpu_memory_utilization is None else f"{o.min_gpu_memory_utilization:.2f}",
            "yes" if o.fits else "no: " + "; ".join(o.reasons),
        ]
        for o in p.options
    ]
    lines.append(tabulate(rows, headers=headers, tablefmt="github"))
    lines.append(("FITS " if p.fits else "DOES NOT FIT ") + p.verdict.split(": ", 1)[-1])
    if p.recommendation:
        r = p.recommendation
        extra = (
            f" --gpu-memory-utilization {r.gpu_memory_utilization}"
            if r.gpu_memory_utilization is not None
            else f" (VLLM_CPU_KVCACHE_SPACE={r.cpu_kvcache_space_gib})"
        )
        lines.append(
            f"recommended: --tensor-parallel-size {r.tensor_parallel_size} --max-model-len "
            f"{r.max_model_len} --max-num-seqs {r.max_num_seqs}{extra}"
        )
    if p.alternative:
        r = p.alternative
        lines.append(
            f"would fit: --tensor-parallel-size {r.tensor_parallel_size} --max-model-len "
            f"{r.max_model_len} --max-num-seqs {r.max_num_seqs}"
        )
    lines.extend(f"note: {n}" for n in p.notes)
    return "\n".join(lines)
