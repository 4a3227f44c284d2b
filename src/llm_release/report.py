"""The release report: one markdown file and one JSON file per run, plus table rows."""

from __future__ import annotations

import json
from pathlib import Path

from .fileio import atomic_write_text
from .results import CandidateResult, Decision


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "—" if value is None else format(value, spec)


def candidate_rows(results: list[CandidateResult], decision: Decision) -> list[dict]:
    verdicts = {v.name: v for v in decision.verdicts}
    rows = []
    for r in results:
        verdict = verdicts.get(r.name)
        top = (
            max(r.load.levels, key=lambda lv: lv.concurrency) if r.load and r.load.levels else None
        )
        worst_ttft = max((lv.ttft_p95_ms for lv in r.load.levels), default=None) if r.load else None
        scores = {f"{ev.eval_set}/{m}": s.value for ev in r.evals for m, s in ev.metrics.items()}
        rows.append(
            {
                "candidate": r.name,
                "scheme": r.scheme,
                "size_MB": round(r.size_bytes / 1e6, 1) if r.size_bytes else None,
                "status": r.status,
                **{k: round(v, 4) for k, v in scores.items()},
                "ttft_p95_ms_worst": round(worst_ttft, 1) if worst_ttft is not None else None,
                "itl_p50_ms_top": round(top.itl_p50_ms, 1) if top else None,
                "output_tok_s_top": round(top.output_tokens_per_s, 1) if top else None,
                "error_rate_worst": max((lv.error_rate for lv in r.load.levels), default=None)
                if r.load
                else None,
                "eligible": bool(verdict and verdict.eligible),
                "verdict": "WINNER"
                if decision.winner == r.name
                else (
                    "stable"
                    if decision.stable == r.name
                    else ("pass" if verdict and verdict.eligible else "fail")
                ),
            }
        )
    return rows


def render_markdown(
    *,
    title: str,
    source: dict,
    results: list[CandidateResult],
    decision: Decision,
    stage_seconds: dict[str, float],
    deployment: dict | None,
) -> str:
    lines = [f"# {title}", ""]
    lines += [
        f"- **Model:** `{source['repo_id']}` revision `{source['revision']}` "
        f"→ commit `{source['commit']}`",
        f"- **Decision:** {decision.summary}",
        "",
    ]
    rows = candidate_rows(results, decision)
    if rows:
        headers = list(dict.fromkeys(k for row in rows for k in row))
        lines += [
            "## Candidates",
            "",
            "| " + " | ".join(headers) + " |",
            "|" + "---|" * len(headers),
        ]
        for row in rows:
            lines.append("| " + " | ".join(str(row.get(h, "—")) for h in headers) + " |")
        lines.append("")
    lines += ["## Gates", ""]
    for verdict in decision.verdicts:
        mark = "eligible" if verdict.eligible else "NOT eligible"
        lines += [
            f"### {verdict.name} — {mark}",
            "",
            "| gate | verdict | value | threshold | detail |",
            "|---|---|---|---|---|",
        ]
        for gate in verdict.gates:
            lines.append(
                f"| {gate.gate} | {'pass' if gate.passed else 'FAIL'} | "
                f"{_fmt(gate.value, '.4g')} | {_fmt(gate.threshold, '.4g')} | "
                f"{gate.detail.replace('|', '/')} |"
            )
        lines.append("")
    lines += [
        "## Load test (per concurrency level)",
        "",
        "| candidate | concurrency | requests | errors | TTFT p50 ms | TTFT p95 ms | "
        "ITL p50 ms | output tok/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for lv in r.load.levels if r.load else []:
            lines.append(
                f"| {r.name} | {lv.concurrency} | {lv.requests} | {lv.errors} | "
                f"{lv.ttft_p50_ms:.0f} | {lv.ttft_p95_ms:.0f} | {lv.itl_p50_ms:.1f} | "
                f"{lv.output_tokens_per_s:.1f} |"
            )
    lines += ["", "## Rule", "", decision.rule, ""]
    failed = [r for r in results if r.status == "failed"]
    if failed:
        lines += ["## Failures", ""]
        for r in failed:
            lines += [f"### {r.name}", "", "```", (r.error or "")[-3000:], "```", ""]
    lines += ["## Stage timings", "", "| stage | seconds | share |", "|---|---|---|"]
    total = sum(stage_seconds.values()) or 1.0
    for stage, seconds in stage_seconds.items():
        lines.append(f"| {stage} | {seconds:.1f} | {seconds / total:.0%} |")
    lines.append("")
    if deployment:
        lines += ["## Deployment", ""]
        lines += [f"- **{k}:** {v}" for k, v in deployment.items()]
        lines.append("")
    return "\n".join(lines)


def write_run_files(run_dir: Path, markdown: str, payload: dict) -> dict[str, str]:
    report_md = run_dir / "report.md"
    report_json = run_dir / "report.json"
    atomic_write_text(report_md, markdown)
    atomic_write_text(report_json, json.dumps(payload, indent=2, default=str) + "\n")
    return {"markdown": str(report_md), "json": str(report_json)}
