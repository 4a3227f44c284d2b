"""What vLLM's prefix cache finds under traffic that shares a system prompt, on this CPU:
the tiny test model (SmolLM2's tokenizer, random weights) served by vLLM CPU with prefix
caching on and off, GuideLLM at concurrency 1 and 2 with random prompts and with a
512-token prefix on every request (``load.shared_prefix``). One JSON line per level:

    .venv/bin/python scripts/measure_prefix_cache.py > docs/prefix-cache-cpu-DATE.jsonl

A 135M-parameter model with random weights on 2 cores says what the cache finds (the hit
rate), not what it buys in latency: the TTFT figures of 8 requests are noise here."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from transformers import AutoTokenizer

from demo.demo_model import smollm2_gguf_path
from llm_release.config import LoadProfile, ServingConfig, SharedPrefix
from llm_release.hardware import detect
from llm_release.load.loadtest import run_load_test
from llm_release.serving.serve import VllmServer
from llm_release.serving.tiny_models import build_tiny_model, finish_tokenizer


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="prefix-cache-"))
    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    finish_tokenizer(tokenizer)
    tokenizer.save_pretrained(work / "tokenizer")
    model = build_tiny_model(work / "tiny", work / "tokenizer")
    cpu = detect().cpu.model_name
    for caching in (True, False):
        serving = ServingConfig(
            enforce_eager=True, max_model_len=1024, max_num_seqs=4, enable_prefix_caching=caching
        )
        with VllmServer(model, ["tiny"], serving, work / f"vllm-{caching}.log") as server:
            for traffic, prefix in (("random", None), ("shared-512", SharedPrefix(tokens=512))):
                profile = LoadProfile(
                    concurrencies=[1, 2],
                    requests_per_level=8,
                    prompt_tokens=16,
                    output_tokens=8,
                    shared_prefix=prefix,
                )
                result = run_load_test(
                    server.base_url, "tiny", model, profile, work / f"{caching}-{traffic}"
                )
                for level in result.levels:
                    row = {
                        "cpu": cpu,
                        "prefix_caching": caching,
                        "traffic": traffic,
                        "concurrency": level.concurrency,
                        "requests": level.requests,
                        "ttft_p50_ms": round(level.ttft_p50_ms, 1),
                        "ttft_p95_ms": round(level.ttft_p95_ms, 1),
                        "prefix_cache_hit_rate": level.prefix_cache_hit_rate,
                    }
                    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    sys.exit(main())
