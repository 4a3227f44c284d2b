"""Benchmark: the tuner (coordinate descent, racing, early stops) against an exhaustive
sweep of the same grid, on the demo model (SmolLM2-135M-Instruct, bf16).

The demo model, not the tiny test model: the tiny random-weight model meets any SLO at any
level on this CPU, so every setting ties and the comparison says nothing; SmolLM2 breaks a
3 s TTFT p95 within a few concurrent streams when vLLM queues (measured: max-num-seqs 4 at
8 streams, TTFT p95 3.9 s, load average 12).

Both strategies run through ``tune.tune_candidate`` (real vLLM CPU, one server per setting,
GuideLLM one level at a time). Prints both side by side: chosen setting, its goodput (both
from the exhaustive sweep's own measurement of it, so run-to-run noise does not enter the
ratio, and the tuner's own figure), measurement time (server starts + load levels) and the
ratios the issue asks for: goodput ≥ 0.95 × the exhaustive best, time ≤ 1/3 of exhaustive.
Raw results: bench/results/tune_goodput-<cpu>.json.

    .venv/bin/python bench/tune_goodput.py [--model-dir DIR] [--ttft-slo-s 3] [--output FILE]

A server start costs ~85 s on 2 loaded cores, a level ~20 s: the grid is small (4 settings,
3 levels) to keep the whole bench near 15 minutes.

On a GPU (``--gpu``: compiled and graph-captured servers, ``gpu_memory_utilization`` in the
grid, vLLM's own defaults measured beside the tuner as the strategy ``defaults``) each
strategy can run in a call of its own (``--strategies``): the results file accumulates them,
and the ratios are printed once both the tuner and the exhaustive sweep are in it:

    python bench/tune_goodput.py --gpu --model-dir M --seqs 64,256,1024 --batched 2048,8192 \
        --levels 10,25,50,75,100 --requests 100 --ttft-slo-s 0.4 --itl-slo-ms 6 \
        --strategies defaults,coordinate --output OUT.json

(``--extra-args '--load-format dummy'`` for a config-only folder needs the operator's
``LLM_RELEASE_ALLOW_SERVING_FLAGS=--load-format``, as any release would.)

The serving levers of issue 38 are dimensions too: ``--prefix-caching on,off`` and
``--speculation none,ngram:3:4`` (``ngram:K[:LOOKUP_MAX]`` or ``mtp:K``), measured under
traffic that shares a prefix (``--shared-prefix TOKENS:SHARE:DISTINCT``, GuideLLM's
prefix buckets) or under an eval set's own prompts (``--prompts-from manufacturing_kb``).
Every trial's levels are printed (TTFT and ITL p95, output tok/s, the prefix-cache hit rate
vLLM counted) with the greedy-answer check of each setting with speculation:

    python bench/tune_goodput.py --seqs 256 --prefix-caching on,off \
        --shared-prefix 1024:0.9:4 --strategies exhaustive --output OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tabulate import tabulate  # noqa: E402

from llm_release import paths  # noqa: E402
from llm_release.config import (  # noqa: E402
    Gates,
    LoadProfile,
    ServingConfig,
    SharedPrefix,
    Speculation,
    TuneConfig,
)
from llm_release.fileio import atomic_write_text  # noqa: E402
from llm_release.hardware import detect  # noqa: E402
from llm_release.results import Setting  # noqa: E402
from llm_release.serving.serve import VllmServer  # noqa: E402
from llm_release.serving.tune import tune_candidate  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def loadavg() -> float:
    return os.getloadavg()[0]


# vLLM 0.26's own defaults on a GPU of 70 GiB or more, as an OpenAI server
# (arg_utils.get_batch_defaults): what "doing nothing" serves with
VLLM_GPU_DEFAULTS = {"max_num_seqs": [1024], "max_num_batched_tokens": [None], "gmu": [0.9]}
STRATEGIES = ("coordinate", "exhaustive", "defaults")


def _ints(text: str) -> list[int | None]:
    """'2048,8192,default' -> [2048, 8192, None] (default: vLLM's own value)."""
    return [None if v == "default" else int(v) for v in text.split(",") if v]


def _switches(text: str) -> list[bool]:
    """'on,off' -> [True, False]."""
    known = {"on": True, "off": False}
    values = [v for v in text.split(",") if v]
    bad = [v for v in values if v not in known]
    if bad or not values:
        raise argparse.ArgumentTypeError(f"say on and/or off, not {text!r}")
    return [known[v] for v in values]


def _speculations(text: str) -> list[Speculation | None]:
    """'none,ngram:3:4,mtp:1' -> [None, ngram 3 tokens lookup ≤ 4, mtp 1 token]."""
    out: list[Speculation | None] = []
    for item in (v for v in text.split(",") if v):
        if item == "none":
            out.append(None)
            continue
        method, *numbers = item.split(":")
        try:
            fields = {"method": method, "num_speculative_tokens": int(numbers[0])}
            if len(numbers) > 1:
                fields["prompt_lookup_max"] = int(numbers[1])
            if len(numbers) > 2:
                raise ValueError("too many numbers")
            out.append(Speculation(**fields))
        except (IndexError, ValueError) as exc:
            raise argparse.ArgumentTypeError(
                f"{item!r}: write none, ngram:K[:LOOKUP_MAX] or mtp:K ({exc})"
            ) from None
    return out


def _shared_prefix(text: str) -> SharedPrefix | None:
    """'1024:0.9:4' -> 1,024 tokens on 90% of the requests, 4 different prefixes."""
    if not text:
        return None
    try:
        tokens, share, distinct = text.split(":")
        return SharedPrefix(tokens=int(tokens), share=float(share), distinct=int(distinct))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"write TOKENS:SHARE:DISTINCT, not {text!r} ({exc})"
        ) from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--model-dir", type=Path, help="default: the demo model under the project home"
    )
    parser.add_argument("--seqs", default="2,4,8,16", help="max-num-seqs grid")
    parser.add_argument("--batched", default="default", help="max-num-batched-tokens grid")
    parser.add_argument("--gmu", default="0.9", help="gpu_memory_utilization grid (GPU only)")
    parser.add_argument("--levels", default="2,4,8", help="concurrency levels")
    parser.add_argument("--requests", type=int, default=8, help="requests per level")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--ttft-slo-s", type=float, default=3.0)
    parser.add_argument("--itl-slo-ms", type=float, default=250.0)
    parser.add_argument("--gpu", action="store_true", help="compiled GPU servers (not eager)")
    parser.add_argument(
        "--extra-args", default="", help="more vLLM flags, e.g. '--load-format dummy'"
    )
    parser.add_argument(
        "--prefix-caching", type=_switches, default=[True], help="on, off or on,off"
    )
    parser.add_argument(
        "--speculation",
        type=_speculations,
        default=[None],
        help="none (always tried), ngram:K[:LOOKUP_MAX], mtp:K; comma-separated",
    )
    parser.add_argument(
        "--shared-prefix",
        type=_shared_prefix,
        default=None,
        help="TOKENS:SHARE:DISTINCT: synthetic prompts behind shared prefixes",
    )
    parser.add_argument(
        "--prompts-from", default=None, help="an eval set whose items' prompts are sent"
    )
    parser.add_argument("--strategies", default="coordinate,exhaustive")
    parser.add_argument(
        "--skip-warmup",
        action="store_true",
        help="no untimed first start (a later call on a machine whose caches are warm)",
    )
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    args.strategies = [s for s in args.strategies.split(",") if s]
    unknown = set(args.strategies) - set(STRATEGIES)
    if unknown:
        parser.error(f"unknown strategies {sorted(unknown)}: choose from {', '.join(STRATEGIES)}")
    return args


def setup(args: argparse.Namespace, host) -> tuple[ServingConfig, LoadProfile, Gates]:
    """The serving settings, load and SLO every strategy of one bench run shares."""
    serving = ServingConfig(
        max_model_len=args.max_model_len,
        dtype="bfloat16" if args.gpu or host.cpu.native_bf16 else "float32",
        # CPU: eager, no torch.compile per start; GPU: compiled and graph-captured, as served
        enforce_eager=not args.gpu,
        gpu_memory_utilization=0.9,
        startup_timeout_s=900 if args.gpu else 600,
        probe_schemes=False,
        extra_args=args.extra_args.split(),
    )
    load = LoadProfile(
        concurrencies=[int(c) for c in args.levels.split(",")],
        requests_per_level=args.requests,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        shared_prefix=args.shared_prefix,
        prompts_from=args.prompts_from,
    )
    return serving, load, Gates(ttft_p95_slo_s=args.ttft_slo_s)


def tune_config(args: argparse.Namespace, strategy: str) -> TuneConfig:
    """The grid of one strategy: the bench's grid, or vLLM's defaults as one point."""
    grid = (
        VLLM_GPU_DEFAULTS
        if strategy == "defaults"
        else {
            "max_num_seqs": _ints(args.seqs),
            "max_num_batched_tokens": _ints(args.batched),
            "gmu": [float(u) for u in args.gmu.split(",")],
        }
    )
    return TuneConfig(
        enabled=True,
        strategy="coordinate" if strategy == "coordinate" else "exhaustive",
        max_num_seqs=grid["max_num_seqs"],
        max_num_batched_tokens=grid["max_num_batched_tokens"],
        gpu_memory_utilization=grid["gmu"],
        enable_prefix_caching=[True] if strategy == "defaults" else args.prefix_caching,
        # none is always tried (the serving settings' own speculation, none here)
        speculation=[] if strategy == "defaults" else [v for v in args.speculation if v],
        itl_p95_slo_ms=args.itl_slo_ms,
        max_settings=20,
    )


def ratios(runs: dict) -> dict:
    """The tuner's choice against the exhaustive sweep's best, both as the exhaustive sweep
    measured them (run-to-run noise stays out), and the time ratio; {} until both ran."""
    if "coordinate" not in runs or "exhaustive" not in runs:
        return {}
    tuned, full = runs["coordinate"]["result"], runs["exhaustive"]["result"]
    by_label = {json.dumps(t["setting"], sort_keys=True): t for t in full["trials"]}
    again = by_label.get(json.dumps(tuned["chosen"], sort_keys=True))
    best = max(full["trials"], key=lambda t: (t["goodput"], t["goodput_tok_s"]))
    return {
        "ratio_goodput_concurrency": round(
            (again["goodput"] / best["goodput"]) if again and best["goodput"] else 0.0, 3
        ),
        "ratio_goodput_tok_s": round(
            (again["goodput_tok_s"] / best["goodput_tok_s"])
            if again and best["goodput_tok_s"]
            else 0.0,
            3,
        ),
        "ratio_time": round(tuned["seconds"] / full["seconds"] if full["seconds"] else 0.0, 3),
    }


def trial_rows(result: dict) -> list[tuple]:
    """One row a measured level of every trial (a results file's ``result``)."""
    rows = []
    for trial in result["trials"]:
        s = trial["setting"]
        # the batch budget and utilization too: a seqs x batched grid has rows that differ there
        label = Setting.model_validate(s).label() + (" (again)" if trial["again"] else "")
        for level in trial["levels"]:
            hit = level.get("prefix_cache_hit_rate")
            rows.append(
                (
                    label,
                    level["concurrency"],
                    level["ttft_p95_ms"],
                    level["itl_p95_ms"],
                    level["output_tokens_per_s"],
                    "—" if hit is None else f"{hit:.0%}",
                    trial["goodput"],
                    trial["answers_changed"] or ("same" if s["speculation"] else ""),
                )
            )
        if trial["error"]:
            rows.append((label, "—", "", "", "", "", 0, trial["error"]))
    return rows


def main() -> None:
    args = parse_args()
    if args.model_dir is None:
        found = sorted((paths.models_dir() / "HuggingFaceTB--SmolLM2-135M-Instruct").glob("*/"))
        if not found:
            raise SystemExit(
                "no demo model under the project home: run 'make demo' or pass --model-dir"
            )
        args.model_dir = found[-1]
    os.environ.setdefault("LLM_RELEASE_HOME", tempfile.mkdtemp(prefix="llmr-tb-", dir="/tmp"))
    host = detect()
    serving, load, gates = setup(args, host)
    slug = re.sub(r"[^a-z0-9]+", "-", f"{host.cpu.model_name} {host.cpu.isa}".lower()).strip("-")
    output = args.output or RESULTS / f"tune_goodput-{slug}.json"
    # servers' logs beside those of the same results file only (two runs with different
    # levers under one home would otherwise share setting folders)
    out = Path(os.environ["LLM_RELEASE_HOME"]) / "bench-tune" / output.stem
    # a results file of this bench accumulates the strategies of separate calls
    payload = json.loads(output.read_text()) if output.exists() else {"runs": {}}
    # Warm-up, not timed: the first vLLM start after other work reads the runtime from a
    # cold page cache (measured: the same setting started in 196 s first, 99 s later), which
    # would bill whichever strategy runs first.
    if not args.skip_warmup:
        warm = time.monotonic()
        with VllmServer(args.model_dir, ["bench"], serving, out / "warmup" / "vllm.log"):
            pass
        print(f"warm-up start: {time.monotonic() - warm:.0f} s (not counted)", flush=True)
    runs = payload["runs"]
    for strategy in args.strategies:
        load_before, wall = loadavg(), time.monotonic()
        result, _ = tune_candidate(
            tune_config(args, strategy),
            model_dir=args.model_dir,
            tokenizer_dir=args.model_dir,
            served_names=["bench"],
            serving=serving,
            load=load,
            gates=gates,
            host=host,
            out_dir=out / strategy,
        )
        runs[strategy] = {
            "result": result.model_dump(mode="json"),
            "wall_s": round(time.monotonic() - wall, 1),
            "loadavg_1m_before": load_before,
            "loadavg_1m_after": loadavg(),
        }
        print(
            f"{strategy}: {result.chosen.label() if result.chosen else None} goodput "
            f"{result.chosen_goodput} ({result.chosen_goodput_tok_s:.1f} output tok/s) in "
            f"{result.seconds:.0f} s, {len(result.trials)} starts, {result.levels_measured} levels",
            flush=True,
        )
        for note in result.skipped:
            print(f"  {note}", flush=True)
        payload |= {
            "model": str(args.model_dir),
            "cpu": host.cpu.model_dump(),
            "gpu": host.cuda,
            "serving": serving.model_dump(mode="json"),
            "load": load.model_dump(mode="json"),
            "slo": result.slo.model_dump(mode="json"),
            "grid": {
                "max_num_seqs": args.seqs,
                "batched": args.batched,
                "gmu": args.gmu,
                "prefix_caching": args.prefix_caching,
                "speculation": [v.label() if v else "none" for v in args.speculation],
            },
            "runs": runs,
            "date": time.strftime("%Y-%m-%d"),
        }
        payload |= ratios(runs)
        atomic_write_text(output, json.dumps(payload, indent=2, default=str) + "\n")
    for name, run in runs.items():
        print(f"\n{name}: every measured level")
        print(
            tabulate(
                trial_rows(run["result"]),
                headers=[
                    "setting",
                    "streams",
                    "TTFT p95 ms",
                    "ITL p95 ms",
                    "output tok/s",
                    "prefix hits",
                    "goodput",
                    "greedy answers",
                ],
                floatfmt=".1f",
            )
        )
    table = [
        (
            name,
            run["result"]["chosen"],
            run["result"]["chosen_goodput"],
            run["result"]["chosen_goodput_tok_s"],
            run["result"]["seconds"],
            len(run["result"]["trials"]),
            run["result"]["levels_measured"],
        )
        for name, run in runs.items()
    ]
    print(
        tabulate(
            table,
            headers=[
                "strategy",
                "chosen",
                "goodput",
                "output tok/s there",
                "measurement s",
                "server starts",
                "levels",
            ],
        )
    )
    found = ratios(runs)
    if found:
        print(
            f"\ngoodput of the tuner's choice / exhaustive best (both from the exhaustive "
            f"sweep): {found['ratio_goodput_concurrency']:.3f} in concurrency, "
            f"{found['ratio_goodput_tok_s']:.3f} in output tokens/s there (target ≥ 0.95)"
        )
        print(f"tuner time / exhaustive time: {found['ratio_time']:.3f} (target ≤ 0.333)")
    print(f"results: {output}")


if __name__ == "__main__":
    main()
