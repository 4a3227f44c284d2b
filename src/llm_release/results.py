"""Typed results passed between stages and written into the run folder."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .vllm_report import KvCheck


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


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


class EvalResult(Record):
    eval_set: str
    version: str | float | int | None = None
    num_items: int
    metrics: dict[str, MetricScore]
    decoding: dict[str, object] = Field(default_factory=dict)
    gates: dict = Field(default_factory=dict, description="the set's gate spec, as applied")
    items: list[ItemResult] = Field(default_factory=list)
    samples_path: str | None = None


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


class LoadResult(Record):
    levels: list[LoadLevel]
    report_path: str | None = None
    attempts: int = 1
    notes: list[str] = Field(default_factory=list)


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
    policy: Literal["block", "pass", "review"] | None = None
    warning: str | None = None
    flipped_worse: list[str] = Field(default_factory=list)
    flipped_better: list[str] = Field(default_factory=list)


class CandidateVerdict(Record):
    name: str
    eligible: bool
    gates: list[GateVerdict]
    rank_key: float | None = None
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
