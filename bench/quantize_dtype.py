"""Benchmark: the quantize stage of the demo model with the calibration math in bf16 against
the dtype the pipeline chooses for this CPU (float32 where bf16 is not native).

Both runs quantize the same model with the same recipe in this process, one after the other,
into a scratch folder (no cache hits). The last line is the chosen dtype's speed-up over bf16.
On a CPU with native bf16 the pipeline keeps bf16, and the line says so; float32 is still
timed there for comparison.

    .venv/bin/python bench/quantize_dtype.py [--model-dir DIR] [--scheme W4A16_AWQ]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from llm_release import paths  # noqa: E402
from llm_release.config import CandidateConfig  # noqa: E402
from llm_release.hardware import CpuInfo, Hardware, compute_dtype, detect  # noqa: E402
from llm_release.quantization.quantize import quantize  # noqa: E402


def demo_model() -> Path:
    from demo.demo_model import convert_smollm2

    return convert_smollm2(paths.home() / "build" / "smollm2-135m-instruct")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", type=Path)
    parser.add_argument("--scheme", default="W4A16_AWQ", choices=["W4A16_AWQ", "FP8_DYNAMIC"])
    args = parser.parse_args()
    model_dir = args.model_dir or demo_model()
    host = detect()
    chosen = compute_dtype(host)
    # The same CPU, described once with and once without native bf16: quantize() reads the
    # dtype from the host it is given, so this times exactly the two code paths.
    bf16_host = host.model_copy(
        update={"cpu": CpuInfo(**(host.cpu.model_dump() | {"flags": ["avx512_bf16"]}))}
    )
    fp32_host = Hardware(
        cpu=CpuInfo(**(host.cpu.model_dump() | {"flags": ["avx2"]})), machine=host.machine
    )
    print(f"host: {host.describe()}", flush=True)
    print(f"model: {model_dir}; scheme {args.scheme}; pipeline's choice here: {chosen}", flush=True)
    candidate = CandidateConfig(name="bench", scheme=args.scheme)
    scratch = Path(tempfile.mkdtemp(prefix="bench-quantize-"))
    seconds = {}
    try:
        for label, run_host in (("bf16", bf16_host), ("float32", fp32_host)):
            started = time.monotonic()
            quantize(model_dir, candidate, scratch / label, host=run_host)
            seconds[label] = time.monotonic() - started
            print(f"{label}: {seconds[label]:.1f} s", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    picked = "float32" if chosen == "float32" else "bf16"
    print(f"float32 vs bf16 on this CPU: {seconds['bf16'] / seconds['float32']:.2f}x")
    print(
        f"quantize speed-up of the chosen dtype ({picked}) over bf16: "
        f"{seconds['bf16'] / seconds[picked]:.2f}x"
    )


if __name__ == "__main__":
    main()
