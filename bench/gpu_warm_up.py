"""Benchmark (GPU): what a load test's warm-up level keeps out of the measured levels.

On an H100 (2026-12-07) the GPU demo's update measured its new revision's baseline with a
TTFT p95 of 2,605 ms at 10 streams and 3,012 ms at 50, against 81 and 169 ms for the same
weights a release earlier: the revision's sampling defaults (``generation_config.json``:
temperature 0.2, top_p 0.9) send GuideLLM's requests through vLLM 0.26's top-k/top-p
sampler, whose Triton kernel is compiled on its first use ("Triton kernel JIT compilation
during inference: _topk_topp_kernel"), so the lowest levels paid a one-time stall and the
update missed the 3 s SLO. ``LoadProfile.warm_up`` now runs one unmeasured level at the top
concurrency first.

This starts that revision once (the demo's model with the update's generation defaults,
``configs/demo-gpu-update.json``'s serving, a fresh Triton cache) through the project's own
``VllmServer`` and ``run_load_test``, and reads GuideLLM's report whole: the warm-up level (a
cold server at the top concurrency) against the same concurrency measured after it. Prints
the levels, the ratio of the warm-up's TTFT p95 to the measured top level's (the reference,
same server, same run), and the vLLM log's JIT warnings; appends one JSON line to ``--out``:

    .venv/bin/python bench/gpu_warm_up.py [--config configs/demo-gpu-update.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

JIT = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d).*JIT compilation during inference: (\S+)")


def update_model(work: Path) -> Path:
    """The demo's next revision as ``make demo`` publishes it (converted once)."""
    from demo.demo_model import convert_smollm2, demo_update

    base = work / "smollm2-135m-instruct"
    if not (base / "config.json").exists():
        convert_smollm2(base)
    return demo_update(base, work / "smollm2-135m-instruct-update")


def row_of(level, window=None) -> dict:
    row = {
        "concurrency": level.concurrency,
        "output_tok_s": round(level.output_tokens_per_s, 1),
        "ttft_p50_ms": round(level.ttft_p50_ms),
        "ttft_p95_ms": round(level.ttft_p95_ms),
        "itl_p95_ms": round(level.itl_p95_ms, 2),
        "errors": level.errors,
    }
    if window is not None:
        row["window_utc"] = [
            datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S.%f")[:-3] for t in window
        ]
    return row


def main(argv: list[str] | None = None) -> int:
    from tabulate import tabulate

    from llm_release import paths
    from llm_release.config import ReleaseConfig
    from llm_release.load.loadtest import parse_report, read_report, run_load_test
    from llm_release.serving.serve import Owner, VllmServer

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "demo-gpu-update.json")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    config = ReleaseConfig.model_validate(
        {"source": {"repo_id": "HuggingFaceTB/SmolLM2-135M-Instruct"}}
        | json.loads(args.config.read_text())
    )
    if not config.load.warm_up:
        parser.error(f"{args.config}: load.warm_up is off; this measures what it leaves out")
    work = paths.home() / "bench" / "warm-up"
    t = time.monotonic()
    model = update_model(work)
    print(f"model: {model} ({time.monotonic() - t:.0f} s)", flush=True)
    generation = json.loads((model / "generation_config.json").read_text())
    # a Triton cache of its own: the sampler's kernel is compiled in this run, as on a fresh host
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-", dir=work)
    run = work / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    server = VllmServer(
        model, ["update"], config.serving, run / "vllm.log", owner=Owner(candidate="baseline")
    )
    began = time.monotonic()
    with server:
        start_s = round(time.monotonic() - began, 1)
        t = time.monotonic()
        load = run_load_test(server.base_url, "update", model, config.load, run / "load", 1)
        load_s = round(time.monotonic() - t, 1)
    report = read_report(run / "load" / "guidellm.json")
    every = parse_report(report, config.load.requests_per_level)
    windows = [
        (b.scheduler_metrics.request_start_time, b.scheduler_metrics.request_end_time)
        for b in report.benchmarks
    ]
    assert load.warm_up and len(every) == len(load.levels) + 1, (load, every)
    warm_up = row_of(every[0], windows[0])
    levels = [row_of(lv, w) for lv, w in zip(every[1:], windows[1:], strict=True)]
    top = levels[-1]
    ratio = warm_up["ttft_p95_ms"] / max(top["ttft_p95_ms"], 1)
    jit = [" ".join(m.groups()) for m in JIT.finditer((run / "vllm.log").read_text())]
    table = [["warm-up (left out)", *row_of(every[0]).values()]]
    table += [["measured", *row_of(lv).values()] for lv in every[1:]]
    head = ["level", "streams", "output tok/s", "TTFT p50 ms", "TTFT p95 ms", "ITL p95 ms"]
    print(tabulate(table, [*head, "errors"], tablefmt="github"))
    print(
        f"warm-up TTFT p95 / measured {top['concurrency']}-stream TTFT p95: {ratio:.1f}x "
        f"(same server, same run); vLLM's JIT warnings: {jit or 'none'}"
    )
    smi = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
    gpu = "no GPU"
    if shutil.which(smi[0]):
        gpu = subprocess.run(smi, capture_output=True, text=True, check=False).stdout.strip()
    from importlib.metadata import version

    from llm_release.serving.dtype import _runtime_versions

    row = {
        "bench": "gpu-warm-up",
        "date": f"{datetime.now(UTC):%Y-%m-%d}",
        "device": gpu,
        "vllm_version": _runtime_versions(paths.vllm_python())[0],
        "guidellm_version": version("guidellm"),
        "model": "SmolLM2-135M-Instruct, the demo's next revision (real weights)",
        "generation_config": {k: generation.get(k) for k in ("temperature", "top_p", "top_k")},
        "config": str(args.config.relative_to(ROOT)) if args.config.is_relative_to(ROOT) else "",
        "start_s": start_s,
        "loadtest_s": load_s,
        "warm_up": warm_up,
        "levels": levels,
        "warm_up_over_top_ttft_p95": round(ratio, 2),
        "jit_warnings": jit,
        "run_dir": str(run),
    }
    out = args.out or ROOT / "bench" / "results" / f"gpu-warm-up-{row['date']}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as fh:
        fh.write(json.dumps(row) + "\n")
    print(f"row appended to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
