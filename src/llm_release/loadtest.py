"""Load test: GuideLLM against a candidate endpoint, one concurrency level at a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .config import LoadProfile
from .errors import LoadTestError
from .results import LoadLevel, LoadResult


def build_command(
    base_url: str, served_name: str, tokenizer_dir: Path, profile: LoadProfile, output_path: Path
) -> list[str]:
    streams = ",".join(str(c) for c in profile.concurrencies)
    return [
        sys.executable,
        "-m",
        "guidellm",
        "run",
        "--backend",
        f"kind=openai_http,target={base_url},model={served_name}",
        "--tokenizer",
        f"kind=hf_auto,model={tokenizer_dir}",
        "--data",
        f"kind=synthetic_text,prompt_tokens={profile.prompt_tokens},"
        f"output_tokens={profile.output_tokens}",
        "--profile",
        f"kind=concurrent,streams={profile.concurrencies[0]}",
        "--override",
        "profile.streams",
        streams,
        "--constraint",
        f"kind=max_requests,count={profile.requests_per_level}",
        "--constraint",
        f"kind=max_duration,seconds={profile.max_seconds_per_level}",
        "--output",
        f"kind=json,path={output_path}",
    ]


def _stat(metric: dict, key: str, field: str = "successful") -> float:
    block = metric.get(field) or {}
    if key in ("mean", "median"):
        return float(block.get(key) or 0.0)
    return float((block.get("percentiles") or {}).get(key) or 0.0)


def parse_report(report: dict) -> list[LoadLevel]:
    levels = []
    for bench in report.get("benchmarks", []):
        strategy = bench["config"]["strategy"]
        metrics = bench["metrics"]
        totals = metrics["request_totals"]
        done = int(totals.get("successful", 0))
        errors = int(totals.get("errored", 0)) + int(totals.get("incomplete", 0))
        total = max(done + errors, 1)
        levels.append(
            LoadLevel(
                concurrency=int(strategy.get("streams") or strategy.get("max_concurrency") or 0),
                requests=done + errors,
                errors=errors,
                error_rate=errors / total,
                ttft_p50_ms=_stat(metrics["time_to_first_token_ms"], "p50"),
                ttft_p95_ms=_stat(metrics["time_to_first_token_ms"], "p95"),
                itl_p50_ms=_stat(metrics["inter_token_latency_ms"], "p50"),
                itl_p95_ms=_stat(metrics["inter_token_latency_ms"], "p95"),
                output_tokens_per_s=_stat(metrics["output_tokens_per_second"], "mean", "total"),
                requests_per_s=_stat(metrics["requests_per_second"], "mean", "total"),
            )
        )
    return levels


def run_load_test(
    base_url: str, served_name: str, tokenizer_dir: Path, profile: LoadProfile, out_dir: Path
) -> LoadResult:
    out_dir.mkdir(parents=True, exist_ok=True)
    report_path = out_dir / "guidellm.json"
    log_path = out_dir / "guidellm.log"
    cmd = build_command(base_url, served_name, tokenizer_dir, profile, report_path)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    budget = profile.max_seconds_per_level * len(profile.concurrencies) + 120
    with log_path.open("wb") as log:
        try:
            proc = subprocess.run(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=budget,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            raise LoadTestError(f"GuideLLM ran longer than {budget:.0f}s; see {log_path}") from exc
    if proc.returncode != 0 or not report_path.exists():
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
        raise LoadTestError(f"GuideLLM exited with {proc.returncode}; log tail:\n{tail}")
    levels = parse_report(json.loads(report_path.read_text()))
    if not levels:
        raise LoadTestError(f"GuideLLM wrote no benchmark into {report_path}")
    return LoadResult(levels=levels, report_path=str(report_path))
