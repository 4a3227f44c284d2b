"""The memory side of speculative decoding on a seeds' shape (issue 38, item 3): a Qwen3.5
MoE shape (hybrid Gated DeltaNet + attention, ``--load-format dummy``) with the one
multi-token-prediction layer the real checkpoints carry (``mtp_num_hidden_layers`` 1), served
by vLLM without speculation, with its MTP head and with prompt lookup; for each, the plan's
KV cache beside the one vLLM logged, and whether the server answered. Dummy weights accept
no drafts, so nothing here is a speed figure.

    python scripts/gpu/speculation_memory.py --work DIR --jsonl OUT.jsonl \\
        [--shape scripts/gpu/shapes/qwen3.5-a3b-16layer] [--max-model-len 32768] \\
        [--util 0.5] [--seqs 64] [--speculation none,mtp:1,ngram:3:4]

Each row is appended to OUT.jsonl as its server stops (a cut call keeps what has ended);
each server's log is DIR/<row>/vllm.log. Needs the operator's allow-list for the dummy
loader, as any release: LLM_RELEASE_ALLOW_SERVING_FLAGS=--load-format (set here).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "bench"), str(ROOT / "scripts/gpu"), str(ROOT)]

from tune_goodput import _speculations  # noqa: E402

HYBRID_FLAGS = [
    "--load-format",
    "dummy",
    "--gdn-prefill-backend",
    "triton",
    "--language-model-only",
]


def shape_folder(shape: Path, work: Path, tokenizer: Path) -> Path:
    """``shape``'s config with one MTP layer, and the demo model's tokenizer files."""
    from release_proof import _build_config_only

    config = json.loads((shape / "config.json").read_text())
    config.setdefault("text_config", config)["mtp_num_hidden_layers"] = 1
    return _build_config_only(work / f"{shape.name}-mtp", config, tokenizer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--shape", type=Path, default=ROOT / "scripts/gpu/shapes/qwen3.5-a3b-16layer"
    )
    parser.add_argument("--tokenizer", type=Path, required=True, help="a tokenizer folder")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--jsonl", type=Path, required=True)
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument("--util", type=float, default=0.5)
    parser.add_argument("--seqs", type=int, default=64)
    parser.add_argument("--speculation", type=_speculations, default=_speculations("none,mtp:1"))
    args = parser.parse_args()
    os.environ.setdefault("LLM_RELEASE_ALLOW_SERVING_FLAGS", "--load-format")

    import requests

    from llm_release import server_key
    from llm_release.config import ServingConfig
    from llm_release.hardware import detect
    from llm_release.serving import capacity
    from llm_release.serving.serve import VllmServer
    from llm_release.sizing.vllm_report import parse_vllm_kv_report

    host = detect()
    folder = shape_folder(args.shape, args.work, args.tokenizer)
    for spec in args.speculation:
        name = spec.label().replace(":", "-").replace("/", "-") if spec else "none"
        serving = ServingConfig(
            max_model_len=args.max_model_len,
            dtype="bfloat16",
            enforce_eager=True,  # a start a row; graphs move no KV in the plan's account
            gpu_memory_utilization=args.util,
            max_num_seqs=args.seqs,
            speculation=spec,
            startup_timeout_s=900,
            probe_schemes=False,
            extra_args=HYBRID_FLAGS,
        )
        plan = capacity.plan_for_dir(folder, serving, host)
        option = next(o for o in plan.options if o.tensor_parallel_size == 1)
        row = {
            "shape": args.shape.name,
            "mtp_num_hidden_layers": 1,
            "speculation": spec.model_dump(exclude_none=True) if spec else None,
            "max_model_len": args.max_model_len,
            "gpu_memory_utilization": args.util,
            "max_num_seqs": args.seqs,
            "gpu": host.cuda,
            "plan_fits": plan.fits,
            "plan_weights_gib": round(plan.weights.total_bytes / 2**30, 2),
            "plan_kv_tokens": option.kv_cache_tokens,
            "plan_notes": plan.notes,
        }
        log_path = args.work / name / "vllm.log"
        began = time.monotonic()
        try:
            with VllmServer(folder, ["shape"], serving, log_path) as server:
                row["start_s"] = round(time.monotonic() - began, 1)
                reply = requests.post(
                    f"{server.base_url}/v1/completions",
                    json={"model": "shape", "prompt": "The line stopped because", "max_tokens": 16},
                    headers=server_key.headers(),
                    timeout=120,
                )
                row["answered"] = reply.status_code == 200
        except Exception as exc:  # noqa: BLE001 - a setting vLLM refuses is a row too
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        report = parse_vllm_kv_report(log_path.read_text()) if log_path.exists() else None
        if report:
            row |= {
                "vllm_kv_tokens": report.kv_cache_tokens,
                "vllm_weights_gib": report.weights_gib,
                "vllm_kv_memory_gib": report.kv_memory_gib,
                "vllm_version": report.vllm_version,
                "plan_over_vllm": round(option.kv_cache_tokens / report.kv_cache_tokens - 1, 4),
            }
        args.jsonl.parent.mkdir(parents=True, exist_ok=True)
        with args.jsonl.open("a") as out:
            out.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
