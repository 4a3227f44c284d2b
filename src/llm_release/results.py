"""Typed results passed between stages and written into the run folder."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from llm_release.config import ServingConfig, Speculation
from llm_release.sizing.vllm_report import KvCheck

# A measured candidate's CandidateResult, in its folder of the run (<run>/candidates/<name>/).
CANDIDATE_RESULT = "result.json"


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


# An eval set's gates (evaluation.evalsets reads them from task.yaml): typed here, with the
# results that carry them, so the rooms that judge results need not import evaluation.
class MetricGate(Record):
    min_score: float | None = Field(None, ge=0, le=1, description="lowest acceptable score")
    max_drop: float | None = Field(None, ge=0, le=1, description="largest drop vs baseline")


class SliceGate(MetricGate):
    tag: str
    metric: str


InconclusivePolicy = Literal["block", "pass", "review"]


class GateSpec(Record):
    """Gates of one eval set, after project defaults were applied."""

    critical: bool = True
    confidence: float = Field(0.95, gt=0.5, lt=1)
    on_inconclusive: InconclusivePolicy = Field(
        "review",
        description="what a drop gate whose interval straddles its margin does: block the "
        "candidate, pass it, or ask a human (review) in the Prefect UI",
    )
    metrics: dict[str, MetricGate] = Field(default_factory=dict)
    slices: list[SliceGate] = Field(default_factory=list)


class MetricScore(Record):
    value: float
    stderr: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    higher_is_better: bool = True


class ItemResult(Record):
    """One item's outcome, kept so candidates can be compared with the baseline item by item."""

    id: str
    tags: list[str] = Field(default_factory=list)
    scores: dict[str, float]
    prompt: str = ""
    reference: str = ""
    answer: str = ""


# An eval set's name and a metric's, as the evaluation writes them: a result read back from
# the record (anyone with its URL edits it) names no others, so no markup, escape or path
# reaches a report, a table header or a published model card through them.
EVAL_SET_NAME = r"^[a-z0-9][a-z0-9_-]{0,99}$"
METRIC_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


class EvalResult(Record):
    eval_set: str = Field(pattern=EVAL_SET_NAME)
    version: str | float | int | None = None
    sha256: str | None = Field(
        None, description="the set's fingerprint when evaluated (evalsets.fingerprint)"
    )
    num_items: int
    metrics: dict[str, MetricScore]
    decoding: dict[str, object] = Field(default_factory=dict)
    gates: GateSpec = Field(default_factory=GateSpec, description="the set's gates, as applied")
    items: list[ItemResult] = Field(default_factory=list)
    samples_path: str | None = None

    @field_validator("metrics")
    @classmethod
    def _metric_names(cls, metrics: dict[str, MetricScore]) -> dict[str, MetricScore]:
        bad = [name for name in metrics if not METRIC_NAME.fullmatch(name)]
        if bad:
            raise ValueError(f"metric name {ascii(bad[0])[:80]} is not a metric's name")
        return metrics


class LoadLevel(Record):
    concurrency: int
    requests: int
    requests_planned: int = Field(0, description="the profile's requests_per_level")
    time_limited: bool = Field(False, description="the level stopped at max_seconds_per_level")
    errors: int
    error_rate: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    itl_p50_ms: float
    itl_p95_ms: float
    output_tokens_per_s: float
    requests_per_s: float
    slo_attainment: float | None = Field(
        None,
        description="GuideLLM's share of requests that met every latency objective of the SLO "
        "it was given (errors count as missing it); None when it was given none",
    )
    goodput_rps: float | None = Field(
        None, description="GuideLLM's request goodput: requests/s that met the SLO"
    )
    prefix_cache_hit_rate: float | None = Field(
        None,
        description="the share of prompt tokens vLLM found in its prefix cache during the "
        "level (its vllm:prefix_cache_hits / queries counters); None when not read",
    )


class Slo(Record):
    ttft_p95_ms: float = Field(gt=0)
    itl_p95_ms: float = Field(gt=0)
    max_error_rate: float = Field(ge=0, le=1)

    def describe(self) -> str:
        return (
            f"TTFT p95 ≤ {self.ttft_p95_ms:.0f} ms, ITL p95 ≤ {self.itl_p95_ms:.0f} ms, "
            f"errors ≤ {self.max_error_rate:.1%}"
        )


class Goodput(Record):
    """The highest load level that met the SLO with every lower measured level meeting it
    too (0: not even the lowest), and the output tokens/s measured there."""

    concurrency: int = 0
    output_tokens_per_s: float = 0.0
    failures: dict[int, str] = Field(
        default_factory=dict, description="concurrency → why the level broke the SLO"
    )


class LoadResult(Record):
    levels: list[LoadLevel]
    report_path: str | None = None
    attempts: int = 1
    notes: list[str] = Field(default_factory=list)
    slo: Slo | None = Field(
        None, description="the SLO GuideLLM counted slo_attainment and goodput_rps against"
    )
    warm_up: int | None = Field(
        None, description="the concurrency of the unmeasured level run first (None: none)"
    )


class Setting(BaseModel):
    """One point of the tuning grid: the vLLM arguments that change under tuning."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_num_seqs: int = Field(ge=1)
    max_num_batched_tokens: int | None = Field(None, description="None: vLLM's default")
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float | None = Field(None, description="GPU only; None on CPU")
    speculation: Speculation | None = Field(None, description="None: no speculative decoding")

    def label(self) -> str:
        parts = [f"seqs={self.max_num_seqs}"]
        parts.append(f"batched={self.max_num_batched_tokens or 'default'}")
        parts.append(f"prefix={'on' if self.enable_prefix_caching else 'off'}")
        if self.gpu_memory_utilization is not None:
            parts.append(f"util={self.gpu_memory_utilization:g}")
        if self.speculation is not None:
            parts.append(f"spec={self.speculation.label()}")
        return " ".join(parts)


class Trial(Record):
    """One server-setting: started once, swept over load levels."""

    setting: Setting
    levels: list[LoadLevel] = Field(default_factory=list)
    failures: dict[int, str] = Field(
        default_factory=dict, description="concurrency → why the level broke the SLO"
    )
    goodput: int = Field(0, description="highest passing level with every lower measured one")
    goodput_tok_s: float = Field(0.0, description="output tokens/s at the goodput level")
    below: int | None = Field(
        None, description="raced and failed at this level: its goodput is lower (not measured)"
    )
    seconds: float = Field(0.0, description="server start and load levels")
    error: str | None = None
    again: bool = Field(
        False,
        description="a second start of a setting measured before: the best setting, to confirm "
        "a lead by output tokens/s alone",
    )
    answers_changed: str | None = Field(
        None,
        description="a setting with speculative decoding whose greedy answers differ from "
        "those without it (or could not be compared): never chosen",
    )


class Pruned(Record):
    setting: Setting
    reason: str


class TuneResult(Record):
    strategy: Literal["coordinate", "exhaustive"]
    slo: Slo
    levels: list[int]
    chosen: Setting | None
    chosen_goodput: int = 0
    chosen_goodput_tok_s: float = 0.0
    trials: list[Trial]
    pruned: list[Pruned] = Field(default_factory=list)
    grid_size: int
    seconds: float = Field(description="measurement time: server starts and load levels")
    levels_measured: int
    skipped: list[str] = Field(
        default_factory=list,
        description="steps the coordinate search did not take, and the failure that ruled them out",
    )

    def pareto(self) -> list[tuple[Setting, LoadLevel]]:
        """Measured (setting, level) points no other point beats on both output tokens/s
        (higher) and TTFT p95 (lower), by throughput."""
        points = [(t.setting, lv) for t in self.trials for lv in t.levels if lv.requests]
        front = [
            (s, lv)
            for s, lv in points
            if not any(
                o.output_tokens_per_s >= lv.output_tokens_per_s
                and o.ttft_p95_ms <= lv.ttft_p95_ms
                and (o.output_tokens_per_s, -o.ttft_p95_ms)
                != (lv.output_tokens_per_s, -lv.ttft_p95_ms)
                for _, o in points
            )
        ]
        return sorted(front, key=lambda p: p[1].output_tokens_per_s)


class CandidateResult(Record):
    name: str
    scheme: str
    role: Literal["champion", "baseline", "quantized"] = Field(
        "quantized",
        description="champion: the release serving users now; baseline: the new commit's "
        "unquantized model; quantized: built from the baseline",
    )
    release_id: str | None = Field(None, description="the champion's release id")
    fingerprint: str | None = Field(
        None, description="what the measurement depends on; equal fingerprints are comparable"
    )
    reused_from: str | None = Field(None, description="run id whose measurement was reused")
    model_dir: str | None = None
    size_bytes: int | None = None
    status: Literal["measured", "failed", "skipped"]
    error: str | None = Field(None, description="why it failed, or why it was skipped")
    stage_seconds: dict[str, float] = Field(default_factory=dict)
    evals: list[EvalResult] = Field(default_factory=list)
    load: LoadResult | None = None
    kv_check: KvCheck | None = Field(
        None, description="the planner's KV-cache figures next to what vLLM reported at start"
    )
    tuning: TuneResult | None = Field(
        None, description="the serving-settings search it was measured with (tune enabled)"
    )
    gpus: list[int] = Field(
        default_factory=list, description="the GPUs its server held (none on a CPU host)"
    )
    measured_on: str | None = Field(
        None, description="the fleet host that measured it (None: the release's own host)"
    )
    lost: list[str] = Field(
        default_factory=list,
        description="attempts lost with their host before it was measured (fleet faults)",
    )


Outcome = Literal["pass", "fail", "inconclusive"]


class GateVerdict(Record):
    gate: str
    outcome: Outcome
    passed: bool = Field(
        description="the outcome counts as a pass: 'pass', or 'inconclusive' under the "
        "set's on_inconclusive: pass"
    )
    value: float | None
    threshold: float | None
    detail: str
    blocking: bool = True
    ci_low: float | None = None
    ci_high: float | None = None
    reference: str | None = Field(None, description="what a drop was measured against")
    items: int | None = Field(None, description="items the comparison was made on")
    detectable_drop: float | None = Field(
        None, description="smallest drop these items can tell from none (stats.detectable_drop)"
    )
    policy: InconclusivePolicy | None = None
    warning: str | None = None
    flipped_worse: list[str] = Field(default_factory=list)
    flipped_better: list[str] = Field(default_factory=list)


class CandidateVerdict(Record):
    name: str
    eligible: bool
    gates: list[GateVerdict]
    rank_key: float | None = Field(
        None, description="output tokens/s at the goodput level (at the top level when 0)"
    )
    goodput: Goodput | None = Field(
        None, description="the highest load level within the gates' SLO: what ranks first"
    )
    needs_review: bool = Field(
        False, description="no gate failed, but a gate was inconclusive under 'review'"
    )
    role: str = "quantized"


class Decision(Record):
    winner: str | None = Field(description="the challenger that goes out as the canary")
    stable: str | None = Field(
        description="the champion's name, or on a first release the candidate made stable"
    )
    rule: str
    verdicts: list[CandidateVerdict]
    summary: str
    review: str | None = Field(
        None, description="the candidate a human must approve before it can go out"
    )
    reviewed: str | None = Field(None, description="the reviewer's verdict and comment")
    slo: Slo | None = Field(None, description="the SLO goodput was measured against")


# What the decision sends out (the release's stable and canary), handed to the canary room.
@dataclass
class DeployTarget:
    candidate: str
    scheme: str
    model_dir: Path
    repo_id: str
    commit: str
    serving: ServingConfig
    run_dir: Path | None = None
