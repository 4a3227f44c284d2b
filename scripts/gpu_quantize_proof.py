"""Prove the quantize stage on a GPU: the same code path the pipeline runs, on CUDA.

Builds a random-weight Llama of a given size with SmolLM2's tokenizer, quantizes it to
FP8_DYNAMIC and W4A16 (AWQ, calibrated on calibration/manufacturing_maintenance.jsonl)
through llm_release.quantization.quantize.quantize, checks each artifact's contract, re-runs to show
the content-addressed cache hit, and prints one JSON line per step.

    python scripts/gpu_quantize_proof.py --tokenizer DIR --out DIR [--hidden 2048 --layers 16]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--seq", type=int, default=512)
    args = parser.parse_args()
    os.environ["LLM_RELEASE_HOME"] = str(args.out / "home")

    import torch

    from llm_release.config import CandidateConfig
    from llm_release.quantization.quantize import check_artifact, dir_size, quantize
    from llm_release.serving.tiny_models import build_tiny_model

    print(
        json.dumps(
            {
                "torch": torch.__version__,
                "cuda": torch.cuda.is_available(),
                "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            }
        ),
        flush=True,
    )
    started = time.monotonic()
    model_dir = build_tiny_model(
        args.out / "model", args.tokenizer, hidden_size=args.hidden, layers=args.layers
    )
    print(
        json.dumps(
            {
                "step": "build",
                "seconds": round(time.monotonic() - started, 1),
                "bytes": dir_size(model_dir),
            }
        ),
        flush=True,
    )
    for candidate in (
        CandidateConfig(name="fp8-dynamic", scheme="FP8_DYNAMIC"),
        CandidateConfig(
            name="w4a16-awq",
            scheme="W4A16_AWQ",
            group_size=128,
            num_calibration_samples=args.samples,
            max_seq_length=args.seq,
        ),
    ):
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        wall = time.monotonic()
        result = quantize(model_dir, candidate)
        check_artifact(result.model_dir, candidate.scheme)
        peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
        again = quantize(model_dir, candidate)
        print(
            json.dumps(
                {
                    "step": candidate.name,
                    "device": result.device,
                    "seconds": round(result.seconds, 2),
                    "wall_s": round(time.monotonic() - wall, 2),
                    "peak_gpu_gib": peak and round(peak, 2),
                    "bytes": dir_size(result.model_dir),
                    "baseline_bytes": dir_size(model_dir),
                    "rerun_cached": again.cached,
                    "quant_method": json.loads((result.model_dir / "config.json").read_text())[
                        "quantization_config"
                    ]["quant_method"],
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
