"""Benchmark: the measure stage one after another against side by side (issue 27).

The release flow's own measure stage (flows.release.measure_contenders: real vLLM servers,
lm-eval, GuideLLM, the host slots of a temporary Prefect server, the GPU ledger) runs the
same contenders twice: with one host slot (one after another) and with ``--slots`` (one per
GPU by default: side by side on disjoint GPUs). It prints both wall times, their ratio
(the goal on 4 GPUs: <= 0.45), the GPUs each contender held, and the winner each run's
decision picks with the default gates — it must be the same. The raw results go to
bench/results/side_by_side-<host>.json.

    .venv/bin/python bench/side_by_side.py --contender base=DIR --contender fp8=DIR ...
        [--slots N] [--gpu] [--levels 10,50,100] [--requests 200] [--limit 20]

The first contender is the baseline, the others quantized candidates built from it. On a
CPU host the servers share the cores: the ratio says nothing about a GPU host there (run
it on the multi-GPU kind with --gpu); the run proves the script and the scheduling.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from prefect import flow  # noqa: E402

from flows.release import measure_contenders  # noqa: E402
from llm_release.config import (  # noqa: E402
    EvalConfig,
    Gates,
    LoadProfile,
    ReleaseConfig,
    ServingConfig,
    SourceConfig,
)
from llm_release.decision.contenders import Contender  # noqa: E402
from llm_release.decision.select import decide  # noqa: E402
from llm_release.hardware import detect  # noqa: E402
from llm_release.hub.acquire import Acquired  # noqa: E402
from llm_release.serving import gpus  # noqa: E402
from llm_release.serving.probe import check_host_support  # noqa: E402
from tasks.slots import set_host_limit  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--contender",
        action="append",
        metavar="NAME=DIR",
        help="repeat; default: the tests' tiny model three times (base, copy-a, copy-b)",
    )
    parser.add_argument("--slots", type=int, help="side-by-side slots (default: the GPUs)")
    parser.add_argument("--gpu", action="store_true", help="GPU serving settings")
    parser.add_argument("--levels", default="1", help="GuideLLM concurrencies")
    parser.add_argument("--requests", type=int, default=8, help="requests per level")
    parser.add_argument("--limit", type=int, default=5, help="eval items per set")
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--tensor-parallel-size", default="1", help="a number or auto")
    parser.add_argument("--out", type=Path, default=Path("/tmp/side-by-side"))
    return parser.parse_args()


def contenders(args: argparse.Namespace, serving: ServingConfig) -> list[Contender]:
    found = []
    for i, spec in enumerate(args.contender):
        name, _, folder = spec.partition("=")
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,40}", name) or not folder:
            sys.exit(f"--contender {spec!r}: NAME=DIR with a lower-case name")
        found.append(
            Contender(
                name=name,
                role="baseline" if i == 0 else "quantized",
                scheme="none" if i == 0 else name,
                serving=serving,
                model_dir=Path(folder).resolve(),
            )
        )
    return found


def run_once(slots: int, planned, config, host, out: Path) -> dict:
    model_dir = planned[0].model_dir
    acquired = Acquired(model_dir, model_dir / "manifest.json", "0" * 40, "bench/m", 0, True)

    @flow(name=f"measure-{slots}-slots")
    def measure_all():
        set_host_limit(slots)
        return measure_contenders(planned, acquired, config, host, f"bench-{slots}", out, "bench")

    started = time.monotonic()
    results = measure_all()
    wall = time.monotonic() - started
    decision = decide(results, config.gates)
    return {
        "slots": slots,
        "wall_s": round(wall, 1),
        "winner": decision.winner,
        "summary": decision.summary,
        "contenders": {
            r.name: {
                "status": r.status,
                "gpus": r.gpus,
                "error": (r.error or "")[:300] or None,
                "stage_seconds": r.stage_seconds,
                "scores": {
                    f"{e.eval_set}/{m}": s.value for e in r.evals for m, s in e.metrics.items()
                },
                "output_tok_s": [lv.output_tokens_per_s for lv in r.load.levels] if r.load else [],
            }
            for r in results
        },
    }


def main() -> None:
    args = parse_args()
    from prefect.testing.utilities import prefect_test_harness

    tp = args.tensor_parallel_size
    serving = ServingConfig(
        max_model_len=args.max_model_len,
        tensor_parallel_size=tp if tp == "auto" else int(tp),
        enforce_eager=not args.gpu,
        gpu_memory_utilization=0.9,
    )
    if not args.contender:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from canary_reliability import tiny_model

        tiny = tiny_model(args.out / "scratch")
        args.contender = [f"{n}={tiny}" for n in ("base", "copy-a", "copy-b")]
    planned = contenders(args, serving)
    host_gpus = gpus.host_gpus()
    slots = args.slots or max(2, len(host_gpus))
    config = ReleaseConfig(
        source=SourceConfig(repo_id="bench/m"),
        serving=serving,
        evaluation=EvalConfig(limit=args.limit),
        load=LoadProfile(
            concurrencies=[int(c) for c in args.levels.split(",")],
            requests_per_level=args.requests,
        ),
        gates=Gates(),
    )
    host = check_host_support(planned[0].model_dir, [], serving, detect())
    runs = []
    with prefect_test_harness(server_startup_timeout=180):
        for n in (1, slots):
            print(f"measure stage with {n} host slot(s) ...", flush=True)
            runs.append(run_once(n, planned, config, host, args.out / f"slots-{n}"))
            print(f"  {runs[-1]['wall_s']} s, winner {runs[-1]['winner']}", flush=True)
    one, side = runs
    ratio = side["wall_s"] / one["wall_s"]
    print(f"one after another {one['wall_s']} s; side by side ({slots} slots) {side['wall_s']} s")
    print(
        f"ratio {ratio:.2f} (goal on 4 GPUs: <= 0.45); winner the same: "
        f"{one['winner'] == side['winner']} ({one['winner']} / {side['winner']})"
    )
    for name, c in side["contenders"].items():
        print(f"  {name}: GPUs {c['gpus'] or 'none'}, {c['status']}")
    RESULTS.mkdir(exist_ok=True)
    host_key = re.sub(r"[^a-z0-9]+", "-", detect().describe().lower()).strip("-")[:60]
    path = RESULTS / f"side_by_side-{host_key}.json"
    record = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": detect().describe(),
        "host_gpus": host_gpus,
        "args": {k: str(v) for k, v in vars(args).items()},
        "ratio": round(ratio, 3),
        "same_winner": one["winner"] == side["winner"],
        "runs": runs,
    }
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"raw results: {path}")


if __name__ == "__main__":
    main()
