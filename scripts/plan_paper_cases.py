"""The planner on the seeds' models (config values in tests/unit/data/paper_configs.json),
for 80 GB GPUs ×1/×2/×4/×8, bf16 / FP8 / 4-bit weights; prints the README's markdown.

    python scripts/plan_paper_cases.py [--max-model-len 32768] [--concurrency 50]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from llm_release.sizing import GiB, PlanRequest, estimate_weights, parse_config, plan

CONFIGS = Path(__file__).resolve().parents[1] / "tests" / "unit" / "data" / "paper_configs.json"
SCHEMES = {"bf16": "BF16", "fp8": "FP8", "w4a16": "W4A16 (g128)"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--gpu-memory-gib", type=float, default=80)
    args = parser.parse_args()
    configs = {k: v for k, v in json.loads(CONFIGS.read_text()).items() if not k.startswith("_")}
    print(
        f"max_model_len {args.max_model_len:,} (or the model's maximum when smaller), "
        f"{args.concurrency} concurrent sequences, "
        f"{args.gpu_memory_gib:g} GB GPUs at gpu_memory_utilization 0.9, KV cache bf16, "
        "prefix caching on. Each cell: KV-cache tokens / max concurrency at max_model_len; "
        "✗ = does not fit (reason below the table).\n"
    )
    print(
        "| model | KV B/token (vLLM) | seeds' formula | state/seq | weights | GiB | "
        "TP 1 | TP 2 | TP 4 | TP 8 | recommended |"
    )
    print("|---|---:|---:|---:|---|---:|---|---|---|---|---|")
    reasons: list[str] = []
    for name, config in configs.items():
        arch = parse_config(config)
        max_len = min(args.max_model_len, arch.max_position_embeddings or args.max_model_len)
        for scheme, label in SCHEMES.items():
            weights = estimate_weights(arch, scheme)
            p = plan(
                arch,
                weights,
                PlanRequest(
                    gpu_memory_gib=args.gpu_memory_gib,
                    max_model_len=max_len,
                    concurrency=args.concurrency,
                ),
                model=name,
            )
            cells = []
            for o in p.options:
                if o.fits:
                    cells.append(f"{o.kv_cache_tokens:,} / {o.max_concurrency:,.1f}")
                else:
                    mark = f"✗{len(reasons) + 1}"
                    reasons.append(
                        f"{mark} {name} {label} TP {o.tensor_parallel_size}: {o.reasons[0]}"
                    )
                    cells.append(mark)
            r = p.recommendation
            rec = (
                f"TP {r.tensor_parallel_size}, max-num-seqs {r.max_num_seqs}" if r else "none fits"
            )
            state = p.options[0].state_bytes_per_sequence
            print(
                f"| {name} ({max_len // 1024}K) | {p.kv_bytes_per_token_unsharded:,} | {p.seeds_kv_bytes_per_token:,} | "
                f"{state / 2**20:,.1f} MiB | {label} | {weights.total_bytes / GiB:,.1f} | "
                + " | ".join(cells)
                + f" | {rec} |"
            )
    print()
    for reason in reasons:
        print(f"- {reason}")


if __name__ == "__main__":
    main()
