"""Benchmark: evaluation with concurrent requests versus one at a time, same endpoint.

Builds a 120-item eval set (the manufacturing_kb items, three times over with fresh ids)
in a scratch folder, starts one vLLM server (max-num-seqs 8, the demo's), and times
run_evaluation at the pipeline's default concurrency for that server (its max-num-seqs)
and at a reference (default 4, the old fixed default; 1 for one at a time). Both runs are
measured here, in one process, so machine noise hits both. The last line is the speed-up.

    .venv/bin/python bench/eval_concurrency.py [--model-dir DIR] [--concurrency N] [--reference 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from llm_release import paths  # noqa: E402
from llm_release.config import EvalConfig, ServingConfig  # noqa: E402
from llm_release.evaluation.evaluate import run_evaluation  # noqa: E402
from llm_release.serving.serve import VllmServer  # noqa: E402

REPEATS = 3


def build_set(root: Path) -> str:
    shutil.copytree(paths.eval_sets_dir(), root)
    source = root / "manufacturing_kb"
    target = root / "bench_kb"
    shutil.copytree(source, target)
    rows = [json.loads(line) for line in (source / "data.jsonl").read_text().splitlines()]
    items = [dict(row, id=f"{row['id']}-r{r}") for r in range(REPEATS) for row in rows]
    (target / "data.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    task = target / "task.yaml"
    task.write_text(task.read_text().replace("task: manufacturing_kb", "task: bench_kb"))
    return "bench_kb"


def default_model(scratch: Path) -> Path:
    demo = paths.home() / "build" / "smollm2-135m-instruct"
    if (demo / "config.json").exists():
        return demo
    from transformers import AutoTokenizer

    from demo.demo_model import smollm2_gguf_path
    from llm_release.serving.tiny_models import build_tiny_model, finish_tokenizer

    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    finish_tokenizer(tokenizer)
    tokenizer.save_pretrained(scratch / "tokenizer")
    return build_tiny_model(scratch / "tiny", scratch / "tokenizer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", type=Path)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--concurrency", type=int, help="default: the pipeline's for this server")
    parser.add_argument("--reference", type=int, default=4)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-eval-"))
    name = build_set(scratch / "eval_sets")
    os.environ["LLM_RELEASE_EVAL_SETS"] = str(scratch / "eval_sets")
    model_dir = args.model_dir or default_model(scratch)
    serving = ServingConfig(enforce_eager=True, max_model_len=2048, max_num_seqs=args.max_num_seqs)
    args.concurrency = args.concurrency or EvalConfig().concurrency(serving)
    timings = {}
    with VllmServer(model_dir, ["bench"], serving, scratch / "vllm.log") as server:
        # Warm-up so neither timed run pays for the first requests' one-off costs.
        run_evaluation(
            server.base_url,
            "bench",
            [name],
            scratch / "warm",
            limit=8,
            num_concurrent=args.concurrency,
        )
        for concurrency in (args.reference, args.concurrency):
            started = time.monotonic()
            (result,) = run_evaluation(
                server.base_url,
                "bench",
                [name],
                scratch / f"c{concurrency}",
                num_concurrent=concurrency,
            )
            timings[concurrency] = time.monotonic() - started
            print(
                f"concurrency {concurrency}: {result.num_items} items in "
                f"{timings[concurrency]:.1f} s "
                f"(numeric_match {result.metrics['numeric_match'].value:.3f})",
                flush=True,
            )
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"model: {model_dir}")
    print(
        f"eval speed-up at concurrency {args.concurrency} vs {args.reference}: "
        f"{timings[args.reference] / timings[args.concurrency]:.2f}x"
    )


if __name__ == "__main__":
    main()
