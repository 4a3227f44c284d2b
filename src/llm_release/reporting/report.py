"""The release report: a typed ``ReleaseReport`` that renders its markdown and writes one
markdown file and one JSON file per run (plus every item's scores, side by side)."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from tabulate import tabulate

from llm_release.canary import rollout
from llm_release.canary.rollout import RolloutOutcome
from llm_release.config import BASELINE, ReleaseConfig
from llm_release.decision.select import floor_refusals, paired
from llm_release.evaluation.stats import bootstrap_mean_ci
from llm_release.fileio import atomic_write_text
from llm_release.registry import RegistryState
from llm_release.results import CandidateResult, CandidateVerdict, Decision, EvalResult, GateVerdict
from llm_release.serving.probe import HostSupport
from llm_release.sizing import CapacityPlan

DISAGREEMENTS_SHOWN = 3


class Origin(BaseModel):
    """The model a release judged: the revision asked for and the commit it resolved to."""

    model_config = ConfigDict(extra="forbid")

    repo_id: str
    revision: str
    commit: str


class Deployment(BaseModel):
    """What serves after the release: the load balancer, the stable release, the canary."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, serialize_by_alias=True)

    load_balancer: str = Field(alias="load balancer", description="the service's URL")
    stable: str | None = Field(description="the stable release's id")
    canary: str | None = Field(description="the canary's release id and weight ('… at 25%')")

    @classmethod
    def of(cls, state: RegistryState) -> Deployment:
        return cls(
            load_balancer=f"http://127.0.0.1:{state.router_port}",
            stable=state.stable.release_id if state.stable else None,
            canary=f"{state.canary.release_id} at {state.canary_weight}%" if state.canary else None,
        )


class ReleaseReport(BaseModel):
    """One release run, as ``report.json`` keeps it; ``to_markdown()`` is ``report.md``."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    source: Origin
    plan: CapacityPlan | None = Field(None, description="the sizing plan, from the repo's headers")
    config: ReleaseConfig
    host: HostSupport | None = None
    results: list[CandidateResult]
    decision: Decision
    stage_seconds: dict[str, float] = Field(default_factory=dict)
    deployment: Deployment | None = Field(None, description="None: nothing was deployed")
    canary: RolloutOutcome | None = None

    @property
    def title(self) -> str:
        return f"Release {self.run_id}: {self.source.repo_id}"

    @property
    def verdict(self) -> str:
        """deployed, rejected, review rejected; or the canary's end: promoted, rolled back."""
        if self.canary is not None and self.canary.status in ("promoted", "rolled back"):
            return self.canary.status
        if self.deployment is not None:
            return "deployed"
        return "review rejected" if self.decision.reviewed else "rejected"

    @property
    def summary(self) -> str:
        """The decision's summary, and how the canary ended when it ended."""
        if self.canary is not None and self.canary.status in ("promoted", "rolled back"):
            return f"{self.decision.summary}; canary {self.canary.status}: {self.canary.reason}"
        return self.decision.summary

    def to_json(self) -> str:
        return self.model_dump_json(indent=2) + "\n"

    def to_markdown(self) -> str:
        results, decision = self.results, self.decision
        lines = [f"# {self.title}", ""]
        lines += [
            f"- **Model:** `{self.source.repo_id}` revision `{self.source.revision}` "
            f"→ commit `{self.source.commit}`",
            f"- **Decision:** {decision.summary}",
        ]
        floors = floor_refusals(decision.verdicts)
        if floors:
            lines.append("- **Refused by floors (min_score):** " + "; ".join(floors))
        lines.append("")
        if self.host is not None:
            lines += host_section(self.host)
        lines += sizing_section(self.plan, results)
        rows = candidate_rows(results, decision)
        if rows:
            headers = list(dict.fromkeys(k for row in rows for k in row))
            table = [[row.get(h) for h in headers] for row in rows]
            lines += ["## Candidates", "", *_table(headers, table), ""]
        lines += tuning_section(results)
        lines += quality_section(results)
        lines += gates_section(decision, results)
        lines += load_section(results, decision)
        load_notes = [f"- {r.name}, {note}" for r in results if r.load for note in r.load.notes]
        if load_notes:
            lines += ["", "Levels that measured fewer requests than planned:", "", *load_notes]
        lines += ["", "## Rule", "", decision.rule, ""]
        failed = [r for r in results if r.status == "failed"]
        if failed:
            lines += ["## Failures", ""]
            for r in failed:
                lines += [f"### {r.name}", "", "```", (r.error or "")[-3000:], "```", ""]
        total = sum(self.stage_seconds.values()) or 1.0
        timings = [[k, f"{v:.1f}", f"{v / total:.0%}"] for k, v in self.stage_seconds.items()]
        lines += ["## Stage timings", "", *_table(["stage", "seconds", "share"], timings), ""]
        if self.deployment is not None:
            lines += ["## Deployment", ""]
            lines += [f"- **{k}:** {v}" for k, v in self.deployment.model_dump().items()]
            lines.append("")
        if self.canary is not None:
            lines += canary_section(self.canary)
        return "\n".join(lines)

    def write_files(self, run_dir: Path, markdown: str) -> dict[str, str]:
        """``report.md`` (``markdown``: this report's, with its plots), ``report.json`` and
        ``items.csv`` in ``run_dir``; their paths by kind."""
        report_md = run_dir / "report.md"
        report_json = run_dir / "report.json"
        atomic_write_text(report_md, markdown)
        atomic_write_text(report_json, self.to_json())
        files = {"markdown": str(report_md), "json": str(report_json)}
        # Per-item scores and answers of every contender side by side, for data scientists.
        table = items_table(self.results)
        if not table.empty:
            atomic_write_text(run_dir / "items.csv", table.to_csv(index=False))
            files["items"] = str(run_dir / "items.csv")
        return files


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "—" if value is None else format(value, spec)


def _table(headers: list[str], rows: list[list[object]]) -> list[str]:
    """A markdown (GitHub) table, its lines; a cell's pipes and line breaks cannot break
    its row."""
    cells = [["—" if c is None else _cell(c) for c in row] for row in rows]
    names = [_cell(h) for h in headers]  # built from eval-set and metric names too
    return tabulate(cells, names, tablefmt="github", disable_numparse=True).splitlines()


def candidate_rows(results: list[CandidateResult], decision: Decision) -> list[dict]:
    verdicts = {v.name: v for v in decision.verdicts}
    on_gpus = any(r.gpus for r in results)  # which GPUs each used, on a GPU host only
    rows = []
    for r in results:
        verdict = verdicts.get(r.name)
        top = (
            max(r.load.levels, key=lambda lv: lv.concurrency) if r.load and r.load.levels else None
        )
        worst_ttft = max((lv.ttft_p95_ms for lv in r.load.levels), default=None) if r.load else None
        scores = {f"{ev.eval_set}/{m}": s.value for ev in r.evals for m, s in ev.metrics.items()}
        if r.status == "skipped":
            label = "skipped"
        elif decision.winner == r.name:
            label = "WINNER"
        elif decision.stable == r.name:
            label = "stable" if r.role != "champion" else "champion (serving)"
        elif decision.review == r.name:
            label = "rejected by review" if decision.reviewed else "awaits review"
        elif verdict and verdict.eligible:
            label = "pass"
        elif verdict and verdict.needs_review:
            label = "inconclusive"
        else:
            label = "fail"
        rows.append(
            {
                "verdict": label,
                "candidate": r.name,
                "role": r.role,
                "scheme": r.scheme,
                "size_MB": round(r.size_bytes / 1e6, 1) if r.size_bytes else None,
                "status": r.status + (" (reused)" if r.reused_from else ""),
                **({"gpus": ",".join(map(str, r.gpus)) or None} if on_gpus else {}),
                **{k: round(v, 4) for k, v in scores.items()},
                "goodput_streams": verdict.goodput.concurrency
                if verdict and verdict.goodput
                else None,
                "ttft_p95_ms_worst": round(worst_ttft, 1) if worst_ttft is not None else None,
                "itl_p50_ms_top": round(top.itl_p50_ms, 1) if top else None,
                "output_tok_s_top": round(top.output_tokens_per_s, 1) if top else None,
                "error_rate_worst": max((lv.error_rate for lv in r.load.levels), default=None)
                if r.load
                else None,
            }
        )
    return rows


def sizing_section(plan: CapacityPlan | None, results: list[CandidateResult]) -> list[str]:
    """The planner before the download, and the planner next to vLLM for every server."""
    checks = [r for r in results if r.kv_check]
    if plan is None and not checks:
        return []
    lines = ["## Sizing", ""]
    if plan is not None:
        lines += [f"- **Plan (from the repo's headers, before the download):** {plan.verdict}"]
        # what the plan did not model, and on a host of a fleet which other hosts it fits
        # (host names are another host's words: inert)
        lines += [f"  - {_inline(note)}" for note in plan.notes]
        lines += [""]
    if checks:
        headers = ["candidate", "KV-cache tokens: planner", "vLLM", "error"]
        headers += ["max concurrency: planner", "vLLM"]
        rows = [
            [
                r.name,
                f"{k.planner_kv_cache_tokens:,}",
                f"{k.vllm_kv_cache_tokens:,}",
                f"{k.tokens_error:+.2%}",
                f"{k.planner_max_concurrency:.2f}",
                f"{k.vllm_max_concurrency:.2f}",
            ]
            for r in checks
            for k in [r.kv_check]
        ]
        lines += [*_table(headers, rows), ""]
    return lines


def tuning_section(results: list[CandidateResult]) -> list[str]:
    """The serving settings each candidate was tuned to and measured with."""
    tuned = [r for r in results if r.tuning is not None]
    if not tuned:
        return []
    slo = tuned[0].tuning.slo
    lines = [
        "## Tuned serving settings",
        "",
        f"Goodput: the highest concurrency at which TTFT p95 ≤ {slo.ttft_p95_ms:.0f} ms and "
        f"ITL p95 ≤ {slo.itl_p95_ms:.0f} ms with errors ≤ {slo.max_error_rate:.1%}.",
        "",
    ]
    headers = ["candidate", "chosen setting", "goodput (streams)", "output tok/s there"]
    headers += ["server starts", "of grid", "pruned", "levels", "seconds"]
    rows = [
        [
            r.name,
            t.chosen.label() if t.chosen else "none (untuned)",
            t.chosen_goodput,
            f"{t.chosen_goodput_tok_s:.1f}",
            len(t.trials),
            t.grid_size,
            len(t.pruned),
            t.levels_measured,
            f"{t.seconds:.0f}",
        ]
        for r in tuned
        for t in [r.tuning]
    ]
    lines += [*_table(headers, rows), ""]
    for r in tuned:
        for p in r.tuning.pruned:
            lines.append(f"- {r.name}: not started: {p.setting.label()} — {_cell(p.reason)}")
    lines.append("")
    return lines


def load_section(results: list[CandidateResult], decision: Decision) -> list[str]:
    """The load curve of every candidate, level by level, against the SLO: which level is
    its goodput (what ranks the challengers) and why each other level missed it."""
    verdicts = {v.name: v for v in decision.verdicts}
    lines = ["## Load test (per concurrency level)", ""]
    if decision.slo is not None:
        lines += [
            f"Goodput: the highest concurrency whose {decision.slo.describe()}, every lower "
            "level meeting it too; it ranks the challengers (then output tok/s there). "
            "SLO attainment and conforming req/s are GuideLLM's own (per request: TTFT and "
            "ITL within the SLO; an error counts as missing it).",
            "",
        ]
    warmed = sorted({r.load.warm_up for r in results if r.load and r.load.warm_up})
    if warmed:
        streams = " / ".join(str(c) for c in warmed)
        lines += [
            f"Before its levels each server ran one unmeasured level at {streams} streams "
            "(`load.warm_up`): a server's first requests pay one-time costs, such as kernels "
            "compiled on first use, that its users do not.",
            "",
        ]
    headers = ["candidate", "concurrency", "requests", "errors", "TTFT p50 ms", "TTFT p95 ms"]
    headers += ["ITL p50 ms", "ITL p95 ms", "output tok/s", "SLO attainment"]
    headers += ["conforming req/s", "prefix-cache hits", "SLO"]
    rows = []
    for r in results:
        good = verdicts[r.name].goodput if r.name in verdicts else None
        for lv in r.load.levels if r.load else []:
            if good is None:
                mark = "—"
            elif lv.concurrency in good.failures:
                mark = f"missed: {good.failures[lv.concurrency]}"
            elif lv.concurrency == good.concurrency:
                mark = "**goodput**"
            elif lv.concurrency < good.concurrency:
                mark = "met"
            else:
                mark = "met (above a missed level)"
            rows.append(
                [
                    r.name,
                    lv.concurrency,
                    lv.requests,
                    lv.errors,
                    f"{lv.ttft_p50_ms:.0f}",
                    f"{lv.ttft_p95_ms:.0f}",
                    f"{lv.itl_p50_ms:.1f}",
                    f"{lv.itl_p95_ms:.1f}",
                    f"{lv.output_tokens_per_s:.1f}",
                    _fmt(lv.slo_attainment, ".0%"),
                    _fmt(lv.goodput_rps, ".2f"),
                    _fmt(lv.prefix_cache_hit_rate, ".0%"),
                    mark,
                ]
            )
    return [*lines, *_table(headers, rows)]


def with_plots(markdown: str, plots: dict[str, Path], run_dir: Path) -> str:
    """``markdown`` with the plots embedded by relative links, before the rule section."""
    if not plots:
        return markdown
    lines = ["## Plots", ""]
    for caption, path in plots.items():
        rel = Path(path).relative_to(run_dir).as_posix()
        lines += [f"![{caption}]({rel})", ""]
    section = "\n".join(lines) + "\n"
    marker = "\n## Rule\n"
    if marker in markdown:
        head, tail = markdown.split(marker, 1)
        return head + "\n" + section + marker + tail
    return markdown.rstrip("\n") + "\n\n" + section


def host_section(host: HostSupport) -> list[str]:
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
        rows = [
            [
                s.candidate,
                s.scheme,
                "SKIPPED" if s.status == "unsupported" else s.status,
                "cached" if s.cached else f"{s.seconds:.0f} s",
                s.reason,
            ]
            for s in host.schemes
        ]
        lines += [*_table(["candidate", "scheme", "on this host", "probe", "reason"], rows), ""]
    return lines


def _interval(gate: GateVerdict) -> str:
    if gate.ci_low is None or gate.ci_high is None:
        return "—"
    return f"[{gate.ci_low:+.3f}, {gate.ci_high:+.3f}]"


def gate_rows(verdict: CandidateVerdict) -> list[str]:
    """The gates of ``verdict`` as a markdown table (its lines)."""
    headers = ["gate", "outcome", "compared with", "value", "interval", "threshold", "items"]
    headers += ["detectable drop", "detail"]
    rows = []
    for gate in verdict.gates:
        outcome = gate.outcome.upper() if gate.outcome != "pass" else "pass"
        if gate.outcome == "inconclusive" and gate.policy:
            outcome += f" → {gate.policy}"
        if not gate.blocking:
            outcome += " (reported only)"
        rows.append(
            [
                gate.gate,
                outcome,
                gate.reference or "—",
                _fmt(gate.value, ".4g"),
                _interval(gate),
                _fmt(gate.threshold, ".4g"),
                _fmt(gate.items, "d"),
                _fmt(gate.detectable_drop, ".3f"),
                gate.detail + (f" ⚠ {gate.warning}" if gate.warning else ""),
            ]
        )
    return _table(headers, rows)


def gates_section(decision: Decision, results: list[CandidateResult]) -> list[str]:
    lines = ["## Gates", ""]
    if decision.reviewed:
        lines += [f"**Review of {decision.review}:** {decision.reviewed}", ""]
    reused = [r for r in results if r.reused_from]
    for r in reused:
        lines += [
            f"*{r.name}: measurement reused from run {r.reused_from} (artifact, eval sets, "
            "decoding, settings, libraries and host unchanged).*",
            "",
        ]
    for r in results:
        if r.measured_on:
            lines += [f"*{r.name}: measured on fleet host {_inline(r.measured_on)}.*", ""]
        # a lost attempt's reason is a Prefect state message: another host's text
        lines += [f"*{r.name}: an attempt was lost: {_inline(why)}.*" for why in r.lost]
        lines += [""] if r.lost else []
    for verdict in decision.verdicts:
        if verdict.role == "champion":
            mark = "the release serving users now (reference)"
        elif verdict.eligible:
            mark = "eligible"
        elif verdict.needs_review:
            mark = "needs review"
        else:
            mark = "NOT eligible"
        lines += [f"### {verdict.name} — {mark}", "", *gate_rows(verdict), ""]
    return lines


def review_evidence(decision: Decision, results: list[CandidateResult]) -> str:
    """What a reviewer sees in the Prefect UI before approving or rejecting."""
    verdict = next(v for v in decision.verdicts if v.name == decision.review)
    result = next(r for r in results if r.name == decision.review)
    unsure = [g for g in verdict.gates if g.outcome == "inconclusive"]
    lines = [
        f"## Review: {verdict.name} ({result.scheme})",
        "",
        f"No gate failed, but {len(unsure)} could not decide: the interval of the drop "
        "straddles the margin. Approve to send it out as the canary; reject to deploy nothing.",
        "",
        *gate_rows(verdict),
        "",
    ]
    return "\n".join(lines)


def items_table(results: list[CandidateResult]):
    """Every item's score per metric, every contender side by side (a pandas DataFrame)."""
    import pandas as pd

    rows = [
        {
            "eval_set": ev.eval_set,
            "item": item.id,
            "tags": ",".join(item.tags),
            "metric": metric,
            "candidate": r.name,
            "score": score,
            "answer": item.answer,
        }
        for r in results
        for ev in r.evals
        for item in ev.items
        for metric, score in item.scores.items()
    ]
    if not rows:
        return pd.DataFrame()
    long = pd.DataFrame(rows)
    index = ["eval_set", "item", "tags", "metric"]
    wide = long.pivot_table(index=index, columns="candidate", values="score", aggfunc="first")
    answers = long.pivot_table(index=index, columns="candidate", values="answer", aggfunc="first")
    order = [r.name for r in results if r.name in wide.columns]
    answers = answers[[c for c in order if c in answers.columns]]
    answers.columns = [f"answer:{c}" for c in answers.columns]
    return wide[order].join(answers).reset_index()


def canary_section(canary: RolloutOutcome) -> list[str]:
    """The canary's walk: each window's checks, canary versus stable, and the decision."""
    lines = [
        "## Canary rollout",
        "",
        f"- **Outcome:** {canary.status} — {canary.reason}",
        f"- **Highest weight served:** {canary.reached_weight}%",
    ]
    lines += [
        f"- **Answer ({a.by}):** {'approve' if a.approve else 'reject'} — {a.note}"
        for a in canary.answers
    ]
    if canary.traffic is not None:
        t = canary.traffic
        lines.append(
            f"- **Demo traffic:** {t.sent} requests, {t.failed} failed, "
            f"p95 {_fmt(t.latency_p95_s, '.2f')} s"
        )
    lines += ["", rollout.evidence_markdown(canary.windows)]
    return lines


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
        confidence, critical = base_ev.gates.confidence, base_ev.gates.critical
        lines += [
            f"### {base_ev.eval_set} (version {base_ev.version}, "
            f"{'critical' if critical else 'non-critical'}, decoding v"
            f"{base_ev.decoding.get('version')}, {confidence:.0%} intervals)",
            "",
        ]
        header = ["slice", "metric", "baseline"] + [r.name for r in others]
        rows = []
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
                rows.append(row)
        lines += [*_table(header, rows), ""]
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
            ]
            rows = [
                [
                    item.id,
                    item.prompt[-160:],
                    item.reference,
                    f"{base_items[item.id].answer} ({base_items[item.id].scores.get(metric):g})",
                    f"{item.answer} ({item.scores.get(metric):g})",
                ]
                for item in disagree[:DISAGREEMENTS_SHOWN]
            ]
            headers = ["item", "prompt", "reference", "baseline answer", "candidate answer"]
            lines += [*_table(headers, rows), ""]
    return lines


# no "|": _cell has already made every pipe a "/"
MARKDOWN_ACTIVE = re.compile(r"([\\`*_\[\]()<>#!~])")
INLINE_CHARS = 300


def _inline(text: object) -> str:
    """Text from elsewhere inside a line of Markdown: one line of printable characters, at
    most INLINE_CHARS of them, with every character Markdown acts on escaped, so no link,
    image, HTML tag or emphasis of its own reaches the report."""
    flat = _cell(str(text).replace("\r", " "))
    if len(flat) > INLINE_CHARS:
        flat = flat[: INLINE_CHARS - 1] + "…"
    return MARKDOWN_ACTIVE.sub(r"\\\1", flat)


def _cell(text: object) -> str:
    """One table cell: its pipes and line breaks cannot break the row, and no control
    character (a terminal escape in a name read from the record) reaches the report raw."""
    text = str(text).replace("|", "/").replace("\n", " ")
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode() for ch in text)
