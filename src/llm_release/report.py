"""The release report: one markdown file and one JSON file per run, plus table rows."""

from __future__ import annotations

import json
from pathlib import Path

from .config import BASELINE
from .fileio import atomic_write_text
from .probe import ServingPlan
from .results import CandidateResult, Decision, EvalResult
from .select import paired
from .stats import bootstrap_mean_ci

DISAGREEMENTS_SHOWN = 3


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
                "verdict": "skipped"
                if r.status == "skipped"
                else "WINNER"
                if decision.winner == r.name
                else (
                    "stable"
                    if decision.stable == r.name
                    else ("pass" if verdict and verdict.eligible else "fail")
                ),
            }
        )
    return rows


def host_section(host: ServingPlan) -> list[str]:
    """Which CPU and runtime the figures come from, and what was skipped on them and why."""
    lines = [
        "## Host",
        "",
        f"- **Host:** {host.host.describe()}",
        f"- **Serving runtime:** vLLM {host.runtime.vllm}, torch {host.runtime.torch} "
        f"(kernels: {host.runtime.torch_cpu_capability})",
        f"- **Served dtype:** {host.served_dtype} — {host.dtype_reason}",
        f"- **Calibration dtype:** {host.calibration_dtype}",
        "",
    ]
    if host.schemes:
        lines += [
            "| candidate | scheme | on this host | probe | reason |",
            "|---|---|---|---|---|",
        ]
        for s in host.schemes:
            probe = "cached" if s.cached else f"{s.seconds:.0f} s"
            status = "SKIPPED" if s.status == "unsupported" else s.status
            lines.append(
                f"| {s.candidate} | {s.scheme} | {status} | {probe} | {s.reason.replace('|', '/')} |"
            )
        lines.append("")
    return lines


def render_markdown(
    *,
    title: str,
    source: dict,
    host: ServingPlan | None = None,
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
    if host is not None:
        lines += host_section(host)
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
    lines += quality_section(results)
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
    load_notes = [f"- {r.name}, {note}" for r in results if r.load for note in r.load.notes]
    if load_notes:
        lines += ["", "Levels that measured fewer requests than planned:", "", *load_notes]
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


def _slice_score(ev: EvalResult, metric: str, tag: str | None, confidence: float) -> str:
    values = [i.scores.get(metric, 0.0) for i in ev.items if tag is None or tag in i.tags]
    if not values:
        return "—"
    mean, low, high, _ = bootstrap_mean_ci(values, confidence=confidence)
    return f"{mean:.3f} [{low:.2f}, {high:.2f}] (n={len(values)})"


def quality_section(results: list[CandidateResult]) -> list[str]:
    """Per eval set and slice: every candidate's score with its interval, the paired
    difference versus the baseline, and items where a candidate and the baseline disagree."""
    baseline = next((r for r in results if r.name == BASELINE and r.evals), None)
    if baseline is None:
        return []
    others = [r for r in results if r.name != BASELINE and r.evals]
    lines = ["## Quality (per eval set and slice)", ""]
    for base_ev in baseline.evals:
        confidence = float(base_ev.gates.get("confidence", 0.95)) if base_ev.gates else 0.95
        critical = base_ev.gates.get("critical", True) if base_ev.gates else True
        lines += [
            f"### {base_ev.eval_set} (version {base_ev.version}, "
            f"{'critical' if critical else 'non-critical'}, decoding v"
            f"{base_ev.decoding.get('version')}, {confidence:.0%} intervals)",
            "",
        ]
        header = ["slice", "metric", "baseline"] + [r.name for r in others]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        tags = sorted({t for item in base_ev.items for t in item.tags})
        for tag in [None, *tags]:
            for metric in base_ev.metrics:
                row = [tag or "all", metric, _slice_score(base_ev, metric, tag, confidence)]
                for other in others:
                    ev = next((e for e in other.evals if e.eval_set == base_ev.eval_set), None)
                    if ev is None:
                        row.append("—")
                        continue
                    p = paired(
                        base_ev,
                        ev,
                        metric,
                        confidence=confidence,
                        tag=tag,
                        higher_is_better=ev.metrics[metric].higher_is_better,
                    )
                    row.append(
                        f"{p.cand_score:.3f}, drop {p.drop:+.3f} "
                        f"[{p.ci_low:+.2f}, {p.ci_high:+.2f}]"
                    )
                lines.append("| " + " | ".join(row) + " |")
        lines.append("")
        metric = next(iter(base_ev.metrics))
        base_items = {i.id: i for i in base_ev.items}
        for other in others:
            ev = next((e for e in other.evals if e.eval_set == base_ev.eval_set), None)
            if ev is None:
                continue
            disagree = [
                i
                for i in ev.items
                if i.id in base_items
                and i.scores.get(metric) != base_items[i.id].scores.get(metric)
            ]
            if not disagree:
                continue
            lines += [
                f"**{other.name} vs baseline on `{metric}`: {len(disagree)} items "
                f"disagree** (first {min(len(disagree), DISAGREEMENTS_SHOWN)}):",
                "",
                "| item | prompt | reference | baseline answer | candidate answer |",
                "|---|---|---|---|---|",
            ]
            for item in disagree[:DISAGREEMENTS_SHOWN]:
                base_item = base_items[item.id]
                cells = [
                    item.id,
                    item.prompt[-160:],
                    item.reference,
                    f"{base_item.answer} ({base_item.scores.get(metric):g})",
                    f"{item.answer} ({item.scores.get(metric):g})",
                ]
                lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
            lines.append("")
    return lines


def _cell(text: str) -> str:
    return str(text).replace("|", "/").replace("\n", " ")
