"""Benchmark (GPU): what vLLM's batch-invariant mode (``VLLM_BATCH_INVARIANT=1``,
``ServingConfig.batch_invariant``) buys and costs on the project's own servers.

Per mode (``--modes``, default ``off,on``; ``off`` is the reference) and prefix caching
(``--prefix-caching``, default ``on,off``) one server is started by the project's
``VllmServer`` (eager, bf16, max_model_len 2048, gpu_memory_utilization 0.3, max_num_seqs
256), then:

  determinism  ``--prompts`` greedy chat requests, each alone, then all at once, then all at
               once in reversed order; a "flip" is a prompt whose batched answer differs from
               its alone answer. Then the server is started once more and asked the prompts
               alone again: a "restart flip" differs from the first server's (what the gates
               compare: the champion was measured by another server, in another run). The
               prompts are an eval set's items as the evaluation sends them (``--eval-set``,
               default manufacturing_kb: one system message shared by every item, so prefix
               caching decides whether a request's prefix was computed in its own prefill or
               in another's), with the evaluation's max_gen_toks; ``--eval-set ''``: the demo
               traffic prompts (no shared prefix beyond the chat template's)
  throughput   ``--requests`` completions at ``--concurrency`` streams, ~``--prompt-tokens``
               distinct prompt tokens and ``--output-tokens`` output tokens (ignore_eos)

Prints a table per mode (flips alone/batched and alone/reversed, output tok/s, tok/s over the
``off`` measured in the same run) and appends one JSON line per mode plus a summary line to
``--out`` (default bench/results/batch-invariance-<UTC date>.jsonl). After ``make setup`` on a
GPU host, with the demo's home in place (the model: the first folder with a config.json under
the home's models, ``baseline*``/``stable*`` first; else ``--model DIR``):

    .venv/bin/python bench/batch_invariance.py [--modes off,on] [--model DIR]

On a host without an NVIDIA GPU the project refuses ``on`` (one line) and only ``off`` runs.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tabulate import tabulate  # noqa: E402

from llm_release import hardware, paths, server_key  # noqa: E402
from llm_release.config import ServingConfig  # noqa: E402
from llm_release.errors import ConfigError  # noqa: E402
from llm_release.evaluation.evaluate import load_decoding  # noqa: E402
from llm_release.evaluation.items import traffic  # noqa: E402
from llm_release.load.traffic import load_prompts  # noqa: E402
from llm_release.serving import batch_invariance  # noqa: E402
from llm_release.serving.serve import Endpoint, Owner, VllmServer  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("off", "on")
WORDS = "the press brake spindle valve pump shift log torque belt crane alarm filter oil".split()
TABLE = (
    "mode prefix_caching invariant flips_batched flips_reversed flips_restart output_tok_s ratio_tok_s_vs_off"
).split()
GPU_NAMES = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
VLLM_VERSION = "import vllm; print(vllm.__version__)"  # its last line (vLLM logs on import)
HEADERS = (
    "mode",
    "prefix caching",
    "invariant",
    "flips batched",
    "flips reversed",
    "flips restart",
    "output tok/s",
)


def default_model() -> Path:
    """The first model folder of the home, one under a baseline*/stable* name first."""
    root = paths.models_dir()
    found = sorted(p.parent for p in root.glob("**/config.json"))
    top = [p for p in found if any(s.startswith(("baseline", "stable")) for s in p.parts)]
    if not found:
        raise SystemExit(f"batch_invariance: no folder with a config.json under {root}")
    return (top or found)[0]


def output_lines(cmd: list[str]) -> list[str]:
    """What ``cmd`` prints, line by line; nothing where it fails."""
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return run.stdout.strip().splitlines() if run.returncode == 0 else []


def post(ep: Endpoint, path: str, **body: object) -> dict:
    """A greedy request to the server, with the project's key."""
    payload = {"model": ep.served_name, "temperature": 0, **body}
    url = f"{ep.base_url}/v1/{path}"
    reply = requests.post(url, json=payload, headers=server_key.headers(), timeout=600)
    reply.raise_for_status()
    return reply.json()


Prompt = str | list[dict[str, str]]


def answer(ep: Endpoint, prompt: Prompt, max_tokens: int) -> str:
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    reply = post(ep, "chat/completions", messages=messages, max_tokens=max_tokens)
    return reply["choices"][0]["message"]["content"] or ""


def alone_answers(ep: Endpoint, prompts: list[Prompt], max_tokens: int) -> list[str]:
    """One at a time: each in a batch of one."""
    return [answer(ep, p, max_tokens) for p in prompts]


def determinism(ep: Endpoint, prompts: list[Prompt], max_tokens: int) -> dict:
    alone = alone_answers(ep, prompts, max_tokens)
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        batched = list(pool.map(lambda p: answer(ep, p, max_tokens), prompts))
        backwards = list(pool.map(lambda p: answer(ep, p, max_tokens), prompts[::-1]))[::-1]
    return {
        "flips_batched": sum(a != b for a, b in zip(alone, batched, strict=True)),
        "flips_reversed": sum(a != b for a, b in zip(alone, backwards, strict=True)),
        "alone": alone,
    }


def throughput(ep: Endpoint, args: argparse.Namespace) -> dict:
    def one(i: int) -> dict:
        rng = random.Random(i)  # other words from the first block on: no shared prefix
        prompt = f"Request {i}: " + " ".join(rng.choice(WORDS) for _ in range(args.prompt_tokens))
        body = {"prompt": prompt, "max_tokens": args.output_tokens, "ignore_eos": True}
        return post(ep, "completions", **body)["usage"]

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        usage = list(pool.map(one, range(args.requests)))
    wall = time.monotonic() - start
    out = sum(u["completion_tokens"] for u in usage)
    prompt_mean = sum(u["prompt_tokens"] for u in usage) / len(usage)
    return {
        "wall_s": round(wall, 2),
        "output_tokens": out,
        "output_tok_s": round(out / wall, 1),
        "prompt_tokens_mean": round(prompt_mean, 1),
    }


def run_mode(
    mode: str,
    caching: bool,
    model: Path,
    prompts: list[Prompt],
    args: argparse.Namespace,
    *,
    again: bool = False,
) -> dict:
    """One server of ``mode`` and prefix ``caching``: started, measured, stopped (whatever
    happens). ``again``: the second start, which only answers the prompts alone."""
    serving = ServingConfig(
        batch_invariant=mode,
        enable_prefix_caching=caching,
        enforce_eager=True,
        gpu_memory_utilization=0.3,
        max_model_len=2048,
        dtype="bfloat16",
        max_num_seqs=256,
    )
    name = f"bi-{mode}-pc-{'on' if caching else 'off'}"
    log_path = paths.home() / "bench" / "batch-invariance" / f"vllm-{name}{'-2' * again}.log"
    server = VllmServer(model, [name], serving, log_path, owner=Owner(candidate=name))
    started = time.monotonic()
    try:
        ep = server.start_healthy()
        invariant, why = batch_invariance.enabled(serving, server.gpus or None)
        startup_s = round(time.monotonic() - started, 1)
        row = {
            "mode": mode,
            "prefix_caching": "on" if caching else "off",
            "invariant": invariant,
            "why": why,
            "startup_s": startup_s,
        }
        if again:
            return row | {"alone": alone_answers(ep, prompts, args.max_tokens)}
        row |= determinism(ep, prompts, args.max_tokens) | throughput(ep, args)
        return row | {"log": str(log_path)}
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, help="default: the home's baseline/stable model")
    parser.add_argument(
        "--modes", default="off,on", help="comma-separated: off (the reference), on"
    )
    parser.add_argument(
        "--prefix-caching", default="on,off", help="comma-separated: on (vLLM's default), off"
    )
    parser.add_argument(
        "--eval-set", default="manufacturing_kb", help="determinism: its items ('': demo traffic)"
    )
    parser.add_argument("--prompts", type=int, default=80, help="determinism: prompts")
    parser.add_argument(
        "--max-tokens", type=int, help="determinism: answer tokens (default: max_gen_toks)"
    )
    parser.add_argument("--concurrency", type=int, default=100, help="throughput: streams")
    parser.add_argument("--requests", type=int, default=200, help="throughput: requests")
    parser.add_argument(
        "--prompt-tokens", type=int, default=512, help="throughput: prompt tokens, about"
    )
    parser.add_argument("--output-tokens", type=int, default=256, help="throughput: output tokens")
    parser.add_argument(
        "--out", type=Path, help="default: bench/results/batch-invariance-<date>.jsonl"
    )
    args = parser.parse_args(argv)
    modes = sorted(dict.fromkeys(m for m in args.modes.split(",") if m), key=lambda m: m != "off")
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes: a comma-separated list of {', '.join(MODES)}")
    caching = [c == "on" for c in dict.fromkeys(c for c in args.prefix_caching.split(",") if c)]
    if not caching or set(args.prefix_caching.split(",")) - {"on", "off"}:
        parser.error("--prefix-caching: a comma-separated list of on, off")
    if args.max_tokens is None:
        args.max_tokens = int(load_decoding()["max_gen_toks"])
    if min(args.prompts, args.max_tokens, args.concurrency, args.requests, args.output_tokens) < 1:
        parser.error("--prompts, --max-tokens, --concurrency, --requests, --output-tokens: >= 1")
    model = (args.model or default_model()).resolve()
    if not (model / "config.json").is_file():
        raise SystemExit(f"batch_invariance: {model} has no config.json")
    now = datetime.now(UTC)
    out = args.out or RESULTS / f"batch-invariance-{now:%Y-%m-%d}.jsonl"
    refused: dict[str, str] = {}
    for mode in modes:  # "on" where vLLM cannot: the project's one-line refusal, before any start
        try:
            batch_invariance.check(ServingConfig(batch_invariant=mode))
        except ConfigError as exc:
            refused[mode] = exc.one_line()
            print(f"batch_invariance: mode {mode} refused, not measured: {refused[mode]}")
    if args.eval_set:
        prompts: list[Prompt] = list(traffic(args.eval_set)[: args.prompts])
    else:  # cycled, with the round as a suffix, where --prompts asks for more
        base = load_prompts()
        prompts = [
            base[i % len(base)] + (f" ({i // len(base)})" * (i >= len(base)))
            for i in range(args.prompts)
        ]
    cpu = hardware.detect().cpu.model_name
    common = {
        "date": now.isoformat(timespec="seconds"),
        "device": ", ".join(output_lines(GPU_NAMES)) or f"no NVIDIA GPU ({cpu})",
        "vllm": (output_lines([str(paths.vllm_python()), "-c", VLLM_VERSION]) or ["unknown"])[-1],
        "model": str(model),
        "params": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    print(f"{common['device']}, vLLM {common['vllm']}, {model}", flush=True)
    rows: list[dict] = []
    out.parent.mkdir(parents=True, exist_ok=True)
    runs = [(m, c) for m in modes if m not in refused for c in caching]
    for mode, cache in runs:
        row = run_mode(mode, cache, model, prompts, args)
        second = run_mode(mode, cache, model, prompts, args, again=True)["alone"]
        row["flips_restart"] = sum(a != b for a, b in zip(row["alone"], second, strict=True))
        # the first row of the same prefix caching: "off" runs first where it is asked for
        ref = next((r for r in rows if r["prefix_caching"] == row["prefix_caching"]), row)
        ref = ref["output_tok_s"]
        row["ratio_tok_s_vs_off"] = round(row["output_tok_s"] / ref, 3) if "off" in modes else None
        rows.append(row)
        with out.open("a") as fh:  # line by line: a later mode's failure keeps this one
            fh.write(json.dumps(common | row) + "\n")
    summary = {f"{r['mode']}/pc-{r['prefix_caching']}": {k: r[k] for k in TABLE[2:]} for r in rows}
    with out.open("a") as fh:
        fh.write(json.dumps(common | {"summary": summary, "refused": refused}) + "\n")
    table = [[f"{r[k]}/{len(prompts)}" if "flips" in k else r.get(k) for k in TABLE] for r in rows]
    floats = ("", "", "", "", "", "", ".1f", ".3f")
    print(tabulate(table, [*HEADERS, "tok/s / off, same run"], floatfmt=floats, missingval="-"))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
