"""Benchmark: no request lost through the load balancer while a canary's weight changes.

The project's HAProxy (through promote: deploy, set_canary_weight, promote, rollback) in
front of real vLLM CPU servers of the tiny test model, and the demo traffic
(llm_release.load.traffic: the openai client, which retries nothing itself) at concurrency 16,
``--requests`` requests a run with short answers. Three runs, one after the other:

  A  weights fixed (stable 95 / canary 5): the baseline
  A50 weights fixed at 50 / 50: the same servers, the split B and C spend time in (on a
     2-core host two busy vLLM processes share the cores, and that alone moves the p95)
  B  the canary goes 5 -> 25 -> 50 -> 100 (set_canary_weight at 20% and 40% of the
     requests, promote at 60%: the old stable drains and stops while traffic runs)
  C  a new canary at 5, stepped to 50 at 20%, rolled back at 50% (drained, then stopped)
  A1 weights fixed again, now on the one server left (B and C end on one server, A ran on
     two: on a 2-core host one vLLM alone answers faster than two sharing the cores)

For each run it prints sent, failed, p50/p95 latency and how many requests HAProxy had to
send again (retries, redispatches), then the p95 ratios B/A and C/A; the raw results, with
the p95 of each phase of a run (before, during and after each change), go to
bench/results/canary_reliability-<cpu>.json. Client, HAProxy and the vLLM servers share
this machine's cores: the ratios, not the absolute figures, are the result.

    .venv/bin/python bench/canary_reliability.py [--requests 2000] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from llm_release import paths  # noqa: E402
from llm_release.canary import promote
from llm_release.canary.router import Router  # noqa: E402
from llm_release.config import ServingConfig  # noqa: E402
from llm_release.hardware import detect  # noqa: E402
from llm_release.load.traffic import Traffic  # noqa: E402

PUBLIC_NAME = "tiny"
RESULTS = Path(__file__).resolve().parent / "results"


def tiny_model(scratch: Path) -> Path:
    """The tests' tiny random-weight Llama with SmolLM2's tokenizer (tests/conftest.py)."""
    from transformers import AutoTokenizer

    from demo.demo_model import smollm2_gguf_path
    from llm_release.serving.tiny_models import build_tiny_model, finish_tokenizer

    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    finish_tokenizer(tokenizer)
    tokenizer.save_pretrained(scratch / "tokenizer")
    return build_tiny_model(scratch / "models" / "tiny", scratch / "tokenizer")


def resent(router: Router) -> int:
    """HAProxy's count of requests it sent again (retries + redispatches), both slots."""
    return sum(int(r["wretr"] or 0) + int(r["wredis"] or 0) for r in router.stats().values())


def warm_up(port: int, max_tokens: int) -> None:
    """The first requests of a fresh vLLM server pay one-off costs: pay them outside the
    measured runs, on each server directly (through the router a 5% canary would get 2)."""
    Traffic(
        f"http://127.0.0.1:{port}", PUBLIC_NAME, rate_rps=1000, duration_s=120, concurrency=4,
        max_tokens=max_tokens, max_requests=40,
    ).run()  # fmt: skip


def phases(samples: list, timeline: list[dict]) -> list[dict]:
    """p95 and failures of the requests sent in each stretch: before, during and after
    each change (a change lasts from its call until it returned, a drain included)."""
    cuts = [(0.0, "before any change")]
    for event in timeline:
        cuts += [(event["at_s"], f"during {event['event']}"), (event["end_s"], "after")]
    stretches = []
    for index, (start, label) in enumerate(cuts):
        end = cuts[index + 1][0] if index + 1 < len(cuts) else float("inf")
        picked = [s for s in samples if start <= s[0] < end]
        ok = [latency for _, latency, kind in picked if kind is None]
        if not picked:
            continue
        stretches.append(
            {
                "phase": label if label != "after" else f"after {cuts[index - 1][1][7:]}",
                "from_s": round(start, 2),
                "requests": len(picked),
                "failed": len(picked) - len(ok),
                "p50_s": round(float(np.percentile(ok, 50)), 3) if ok else None,
                "p95_s": round(float(np.percentile(ok, 95)), 3) if ok else None,
            }
        )
    return stretches


def run(
    name: str,
    args: argparse.Namespace,
    router: Router,
    events: list[tuple[float, str, callable]],
) -> dict:
    """One run of ``args.requests`` requests; ``events`` fire at fractions of them answered."""
    before = resent(router)
    load_before = os.getloadavg()[0]
    traffic = Traffic(
        router.url,
        PUBLIC_NAME,
        rate_rps=1000,  # closed loop: the concurrency, not the rate, is the bound
        duration_s=3600,
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        max_requests=args.requests,
        seed=args.seed,
        timeout_s=120,
        api_key=router.api_key,
    )
    timeline = []
    with traffic:
        started = time.monotonic()
        for fraction, label, action in events:
            while traffic.running() and traffic.answered() < fraction * args.requests:
                time.sleep(0.05)
            answered, at = traffic.answered(), time.monotonic() - started
            action()
            end = time.monotonic() - started
            timeline.append(
                {
                    "event": label,
                    "at_s": round(at, 2),
                    "end_s": round(end, 2),
                    "took_s": round(end - at, 2),
                    "answered_before": answered,
                }
            )
            print(f"  {name}: {label} at {at:.1f} s, took {end - at:.2f} s", flush=True)
        traffic.wait()
        report = traffic.stop()
    result = report.model_dump() | {"resent_by_haproxy": resent(router) - before}
    result["events"] = timeline
    result["phases"] = phases(traffic.samples(), timeline)
    # Other work on the host moves the figures: its 1-minute load, before and after.
    result["loadavg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    for stretch in result["phases"] if timeline else []:
        print(
            f"    {stretch['phase']:<60} {stretch['requests']:>5} requests, "
            f"{stretch['failed']} failed, p95 {stretch['p95_s']} s",
            flush=True,
        )
    print(
        f"{name}: sent {report.sent}, failed {report.failed}, p50 {report.latency_p50_s:.3f} s, "
        f"p95 {report.latency_p95_s:.3f} s, {report.achieved_rate_rps:.1f} req/s, "
        f"{report.duration_s:.0f} s; resent by HAProxy {result['resent_by_haproxy']}; "
        f"load {result['loadavg_1m'][0]:.1f} -> {result['loadavg_1m'][1]:.1f}"
        + (f"; errors {report.errors}" if report.errors else ""),
        flush=True,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-dir", type=Path, help="default: build the tiny test model")
    parser.add_argument("--output", type=Path, help="default: bench/results/…-<cpu>.json")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="llmr-bench-", dir="/tmp"))  # short: HAProxy socket
    os.environ["LLM_RELEASE_HOME"] = str(scratch)
    host = detect()
    print(f"host: {host.describe()}; home {scratch}", flush=True)
    model_dir = args.model_dir or tiny_model(scratch)
    serving = ServingConfig(
        enforce_eager=True, max_model_len=512, max_num_seqs=args.concurrency
    )  # fmt: skip

    def target(name: str) -> promote.DeployTarget:
        return promote.DeployTarget(name, "none", model_dir, "tests/tiny-llama", "0" * 40, serving)

    startup = {}
    results: dict = {}
    try:
        t = time.monotonic()
        state = promote.deploy(
            target("first"), target("second"), public_name=PUBLIC_NAME, canary_weight=5
        )
        startup["stable+canary"] = round(time.monotonic() - t, 1)
        router = promote.router_for(state)
        print(f"two vLLM servers and HAProxy up in {startup['stable+canary']} s", flush=True)
        for release in (state.stable, state.canary):
            warm_up(release.port, args.max_tokens)

        results["A"] = run("A", args, router, [])
        promote.set_canary_weight(50)
        results["A50"] = run("A50", args, router, [])
        promote.set_canary_weight(5)
        results["B"] = run(
            "B",
            args,
            router,
            [
                (0.2, "canary 25%", lambda: promote.set_canary_weight(25)),
                (0.4, "canary 50%", lambda: promote.set_canary_weight(50)),
                (0.6, "promote (canary 100%, old stable drained and stopped)", promote.promote),
            ],
        )
        t = time.monotonic()
        state = promote.deploy(None, target("third"), public_name=PUBLIC_NAME, canary_weight=5)
        startup["canary for C"] = round(time.monotonic() - t, 1)
        warm_up(state.canary.port, args.max_tokens)
        results["C"] = run(
            "C",
            args,
            router,
            [
                (0.2, "canary 50%", lambda: promote.set_canary_weight(50)),
                (0.5, "rollback (canary drained and stopped)", promote.rollback),
            ],
        )
        results["A1"] = run("A1", args, router, [])
    finally:
        promote.down()

    ratios = {
        f"{run_}/{base}": round(results[run_]["latency_p95_s"] / results[base]["latency_p95_s"], 3)
        for base in ("A", "A50", "A1")
        for run_ in ("B", "C")
    }
    failed = sum(r["failed"] for r in results.values())
    from llm_release.serving.probe import _runtime_versions

    vllm_version, torch_version = _runtime_versions(paths.vllm_python())
    haproxy = subprocess.run(["haproxy", "-v"], capture_output=True, text=True).stdout
    payload = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": host.describe(),
        "cpu": host.cpu.model_dump(),
        "vllm": vllm_version,
        "torch": torch_version,
        "haproxy": haproxy.splitlines()[0] if haproxy else "unknown",
        "model": "tiny random-weight Llama (llm_release.serving.tiny_models.build_tiny_model)",
        "serving": serving.model_dump(),
        "requests_per_run": args.requests,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "startup_s": startup,
        "runs": results,
        "p95_ratio": ratios,
        "failed_total": failed,
    }
    slug = re.sub(r"[^a-z0-9]+", "-", f"{host.cpu.model_name} {host.cpu.isa}".lower()).strip("-")
    output = args.output or RESULTS / f"canary_reliability-{slug}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"results: {output}")
    print(
        f"failed requests: {failed} of {sum(r['sent'] for r in results.values())}; "
        f"p95 ratio B/A {ratios['B/A']:.2f}, C/A {ratios['C/A']:.2f} "
        f"(against the 50/50 baseline A50: B/A50 {ratios['B/A50']:.2f}, "
        f"C/A50 {ratios['C/A50']:.2f}; against one server, A1: B/A1 {ratios['B/A1']:.2f}, "
        f"C/A1 {ratios['C/A1']:.2f})"
    )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
