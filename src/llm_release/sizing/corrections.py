"""The planner's per-vLLM-version correction of its non-KV memory estimate.

On a GPU the planner gives the KV cache ``memory × utilization − weights − overhead``, and
the overhead (activation peak of a profiling step, CUDA graphs, NCCL/cuBLAS workspaces) is
an estimate from the model's widths (``planner.estimate_overhead_bytes``). Each start the
pipeline makes records the planner next to vLLM (``sizing.kv_check``); from those the
overhead vLLM really left is ``planner overhead + planner KV memory − vLLM's KV memory``
(the budget and the weights are the same on both sides). Per vLLM version the store keeps
these records, and later plans multiply the estimate by the median ratio observed/estimated
— a factor, not bytes, so a correction learned on one model carries to another of a
different size. On a CPU the KV space is set explicitly (VLLM_CPU_KVCACHE_SPACE): there
is no non-KV term to correct; CPU records are kept for the report but teach nothing.

Store: ``<project home>/planner/corrections.json``.
"""

from __future__ import annotations

import json
import logging
import statistics
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llm_release import paths
from llm_release.fileio import atomic_write_text
from llm_release.sizing import PlanRequest
from llm_release.sizing.vllm_report import KvCheck

log = logging.getLogger(__name__)

MAX_RECORDS = 50  # per version: the latest starts; older ones describe older settings
# The estimate a record's ratio was taken against: a ratio learned on one estimate does not
# correct another. 1: the fitted activation terms (before 2026-12-06); 2: sizing/profile.py.
ESTIMATOR = 2
FACTOR_RANGE = (0.25, 4.0)  # a ratio outside it is a broken record, not a correction


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OverheadRecord(Record):
    model: str
    device: str
    estimated_bytes: int = Field(description="the planner's own estimate, uncorrected")
    observed_bytes: int | None = Field(description="what vLLM left for non-KV; None on CPU")
    tokens_error: float = Field(description="(planner − vLLM) / vLLM KV-cache tokens")
    estimator: int = Field(1, description="ESTIMATOR when it was recorded (absent: 1)")


class Store(Record):
    versions: dict[str, list[OverheadRecord]] = Field(default_factory=dict)


class Correction(Record):
    vllm_version: str
    factor: float
    records: int

    def describe(self) -> str:
        return (
            f"non-KV overhead estimate × {self.factor:.3f}, learned from {self.records} "
            f"recorded vLLM {self.vllm_version} start(s)"
        )


def store_path() -> Path:
    return paths.home() / "planner" / "corrections.json"


def normalize_version(version: str | None) -> str | None:
    """'0.32.0+cpu' and 'v0.32.0' are 0.32.0: the local build tag does not change sizing."""
    if not version:
        return None
    return version.strip().lstrip("v").split("+", 1)[0] or None


def runtime_vllm_version() -> str | None:
    """The serving runtime's vLLM version from its package metadata (no interpreter start)."""
    site = paths.vllm_python().parent.parent / "lib"
    for dist in sorted(site.glob("python*/site-packages/vllm*.dist-info")):
        name, _, version = dist.name.removesuffix(".dist-info").rpartition("-")
        if name in ("vllm", "vllm_cpu"):
            return normalize_version(version)
    return None


def load(path: Path | None = None) -> Store:
    path = path or store_path()
    try:
        return Store.model_validate_json(path.read_text())
    except FileNotFoundError:
        return Store()
    except (ValidationError, ValueError, OSError) as exc:
        # A damaged store loses the correction, never the release.
        log.warning("planner corrections %s unreadable (%s): starting afresh", path, exc)
        return Store()


def observed_overhead(check: KvCheck) -> int | None:
    """The non-KV memory vLLM left on one GPU, from the check's figures; None on CPU or
    when a figure is missing."""
    if check.device != "gpu" or check.planner_overhead_bytes is None:
        return None
    planner_kv = check.planner_kv_memory_bytes
    if not planner_kv:
        return None
    if check.vllm_kv_memory_bytes is not None:
        vllm_kv = check.vllm_kv_memory_bytes
    elif check.planner_kv_cache_tokens:
        vllm_kv = planner_kv * check.vllm_kv_cache_tokens / check.planner_kv_cache_tokens
    else:
        return None
    return int(check.planner_overhead_bytes + planner_kv - vllm_kv)


def record(check: KvCheck, model: str, path: Path | None = None) -> OverheadRecord | None:
    """Keep one start's check under its vLLM version; None when the log named no version."""
    version = normalize_version(check.vllm_version)
    if version is None or check.planner_overhead_bytes is None:
        return None
    path = path or store_path()
    store = load(path)
    entry = OverheadRecord(
        model=model,
        device=check.device,
        estimated_bytes=check.planner_overhead_bytes,
        observed_bytes=observed_overhead(check),
        tokens_error=check.tokens_error,
        estimator=ESTIMATOR,
    )
    store.versions[version] = (store.versions.get(version, []) + [entry])[-MAX_RECORDS:]
    atomic_write_text(path, store.model_dump_json(indent=2) + "\n")
    return entry


def learned(version: str | None, path: Path | None = None) -> Correction | None:
    """The factor for ``version``: the median of observed / estimated over its GPU starts
    recorded against today's estimate (ESTIMATOR)."""
    version = normalize_version(version)
    if version is None:
        return None
    ratios = [
        r.observed_bytes / r.estimated_bytes
        for r in load(path).versions.get(version, [])
        if r.estimator == ESTIMATOR
        and r.observed_bytes is not None
        and r.estimated_bytes > 0
        and r.observed_bytes > 0
    ]
    ratios = [x for x in ratios if FACTOR_RANGE[0] <= x <= FACTOR_RANGE[1]]
    if not ratios:
        return None
    return Correction(
        vllm_version=version, factor=round(statistics.median(ratios), 4), records=len(ratios)
    )


def apply(request: PlanRequest, version: str | None, path: Path | None = None) -> PlanRequest:
    """``request`` with the learned factor for ``version`` and the version itself (whose
    CUDA-graph rule the planner follows); unchanged on CPU, where there is no non-KV term,
    or when an explicit overhead was given."""
    if request.device != "gpu" or request.non_kv_overhead_gib is not None:
        return request
    request = request.model_copy(
        update={"vllm_version": normalize_version(version) or request.vllm_version}
    )
    correction = learned(version, path)
    if correction is None:
        note = f"no learned correction for vLLM {normalize_version(version) or '?'} yet"
        return request.model_copy(update={"overhead_note": note})
    return request.model_copy(
        update={"non_kv_overhead_factor": correction.factor, "overhead_note": correction.describe()}
    )


def dump(path: Path | None = None) -> str:
    return json.dumps(load(path).model_dump(mode="json"), indent=2)
