"""Benchmark (GPU): one contender's measurement in the GPU demo, eager against CUDA graphs.

The GPU demo (configs/demo-gpu.json) measures each contender by starting vLLM, evaluating the
shipped eval sets one item at a time (``EvalConfig.concurrency`` on a GPU) and load-testing
it. Eager decoding of its 135M model is bound by the host's CPU (about 1 s an item on an
H100, 2026-12-06), while torch.compile and graph capture cost every start more. This measures
both sides on the demo's own settings, through the project's own code (``VllmServer``,
``run_evaluation``, ``run_load_test``), per mode (``--modes``, default ``eager,graphs``; the
first is the reference):

  start       VllmServer started until healthy (``graphs`` first in a fresh cache compiles)
  evaluate    the config's eval sets, one item at a time as the measure stage asks on a GPU
  loadtest    the config's load profile (10 / 50 / 100 streams, 100 requests of 512 + 256)

The model is the demo's (SmolLM2-135M-Instruct, real weights converted from the GGUF the demo
ships; ``--model DIR`` for another). Prints a table and the ratio of each mode's total to the
reference's, and appends one JSON line per mode to ``--out``:

    .venv/bin/python bench/gpu_demo_graphs.py [--modes eager,graphs] [--config configs/demo-gpu.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

MODES = ("eager", "graphs")


def demo_model(work: Path) -> Path:
    """The demo's model as the demo builds it (converted once under ``work``)."""
    from demo.demo_model import convert_smollm2

    out = work / "smollm2-135m-instruct"
    if not (out / "config.json").exists():
        convert_smollm2(out)
    return out


def measure(mode: str, model: Path, config, work: Path) -> dict:
    from llm_release.errors import ReleaseError
    from llm_release.evaluation.evaluate import run_evaluation
    from llm_release.load.loadtest import run_load_test
    from llm_release.serving.serve import Owner, VllmServer

    serving = config.serving.model_copy(update={"enforce_eager": mode == "eager"})
    run = work / mode
    run.mkdir(parents=True, exist_ok=True)
    server = VllmServer(
        model, [f"demo-{mode}"], serving, run / "vllm.log", owner=Owner(candidate=mode)
    )
    row: dict = {"mode": mode, "enforce_eager": serving.enforce_eager}
    began = time.monotonic()
    try:
        ep = server.start_healthy()
        row["start_s"] = round(time.monotonic() - began, 1)
        row["max_num_seqs"] = server.serving.max_num_seqs
        t = time.monotonic()
        results = run_evaluation(
            ep.base_url,
            ep.served_name,
            config.evaluation.eval_sets,
            run / "eval",
            num_concurrent=config.evaluation.concurrency(server.serving, gpu=True),
            limit=config.evaluation.limit,
        )
        row["evaluate_s"] = round(time.monotonic() - t, 1)
        row["items"] = sum(r.num_items for r in results)
        row["scores"] = {
            f"{r.eval_set}/{k}": round(m.value, 4) for r in results for k, m in r.metrics.items()
        }
        t = time.monotonic()
        load = run_load_test(ep.base_url, ep.served_name, model, config.load, run / "load", 1)
        row["loadtest_s"] = round(time.monotonic() - t, 1)
        row["load"] = [
            {
                "concurrency": lv.concurrency,
                "output_tok_s": round(lv.output_tokens_per_s, 1),
                "ttft_p95_ms": round(lv.ttft_p95_ms),
                "itl_p95_ms": round(lv.itl_p95_ms, 2),
                "errors": lv.errors,
            }
            for lv in load.levels
        ]
        row["healthy"] = True
    except ReleaseError as exc:
        row["healthy"] = False
        row["error"] = str(exc).splitlines()[0][:600]
    finally:
        server.stop()
    row["total_s"] = round(time.monotonic() - began, 1)
    return row


def summary(rows: list[dict]) -> list[str]:
    from tabulate import tabulate

    ref = rows[0]
    table = [
        [
            r["mode"],
            r.get("start_s"),
            r.get("evaluate_s"),
            r.get("loadtest_s"),
            r["total_s"],
            f"{r['total_s'] / ref['total_s']:.2f}x" if r.get("healthy") else r.get("error"),
        ]
        for r in rows
    ]
    head = ["mode", "start s", "evaluate s", "loadtest s", "total s", f"total / {ref['mode']}"]
    return tabulate(table, head, tablefmt="github").splitlines()


def main(argv: list[str] | None = None) -> int:
    from llm_release import paths
    from llm_release.config import ReleaseConfig

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "demo-gpu.json")
    parser.add_argument("--model", type=Path, help="default: the demo's model, converted")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown or not modes:
        parser.error(f"--modes: choose from {', '.join(MODES)} (got {args.modes!r})")
    config = ReleaseConfig.model_validate(
        {"source": {"repo_id": "HuggingFaceTB/SmolLM2-135M-Instruct"}}
        | json.loads(args.config.read_text())
    )
    work = paths.home() / "bench" / "demo-graphs"
    model = args.model or demo_model(work)
    out = args.out or ROOT / "bench" / "results" / (
        f"gpu-demo-graphs-{datetime.now(UTC):%Y-%m-%d}.jsonl"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for mode in modes:
        row = measure(mode, model, config, work)
        rows.append(row)
        with out.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    for line in summary(rows):
        print(line)
    return 0 if all(r.get("healthy") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
