"""Publish the release that reached 100%: its quantized folder, its evidence and lineage.

The evidence comes from the typed records the release already has: the run's
``report.json`` (a release whose canary was promoted later, from the UI or the CLI) or the
winner's own measurement beside its samples (``<run>/candidates/<name>/result.json``,
written when it was measured, so a walk that promotes inside the release run has it too);
the recipe, quantization cache key and calibration fingerprint come from the candidate's
quantization record. ``hub.publish`` builds the card and uploads.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from llm_release import registry
from llm_release.hub.publish import Lineage, Published, PublishTarget, publish, publish_target
from llm_release.quantization.quantize import RECORD
from llm_release.registry import Release
from llm_release.results import CANDIDATE_RESULT, CandidateResult, EvalResult

logger = logging.getLogger(__name__)


def winner_evals(release: Release) -> list[EvalResult]:
    """The release's eval results as measured in its run; [] when none can be read."""
    if not release.run_dir:
        return []
    run_dir = Path(release.run_dir)
    try:
        report = json.loads((run_dir / "report.json").read_text())
        for raw in report.get("results", []):
            if raw.get("name") == release.candidate:
                return CandidateResult.model_validate(raw).evals
    except (OSError, ValueError, AttributeError, ValidationError):
        pass
    try:
        path = run_dir / "candidates" / release.candidate / CANDIDATE_RESULT
        return CandidateResult.model_validate_json(path.read_text()).evals
    except (OSError, ValueError, ValidationError):
        return []


def lineage_of(release: Release) -> Lineage:
    """The release's lineage: upstream repo and commit, and from the quantization record
    (when the folder has one) the recipe, cache key and calibration fingerprint."""
    record: dict = {}
    try:
        record = json.loads((Path(release.model_dir) / RECORD).read_text())
    except (OSError, ValueError):
        pass
    recipe = record.get("candidate") or {}
    recipe = {k: v for k, v in recipe.items() if k not in ("name", "extra_serving_args")}
    return Lineage(
        upstream_repo=release.repo_id,
        upstream_commit=release.commit,
        release_id=release.release_id,
        candidate=release.candidate,
        scheme=release.scheme,
        run_id=Path(release.run_dir).name if release.run_dir else None,
        recipe=recipe,
        calibration_set=recipe.get("calibration_set") if release.scheme == "W4A16_AWQ" else None,
        calibration_sha256=record.get("calibration_sha256"),
        cache_key=record.get("cache_key"),
    )


def publish_release(
    release: Release,
    target: PublishTarget | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> Published | None:
    """Publish ``release`` to ``target`` (default: the operator's publish settings); None
    when no publish target is configured. The quantization record stays off the hub (it
    names local paths and the host); its lineage is in the card."""
    target = target or publish_target()
    if target is None:
        return None
    published = publish(
        Path(release.model_dir),
        lineage_of(release),
        winner_evals(release),
        target,
        exclude=(RECORD,),
        progress=progress,
    )
    # the record's lineage: which hub revision this release is (llm-release history)
    with registry.locked() as state:
        state.log(
            "publish",
            release=release.release_id,
            repo=published.repo_id,
            commit=published.commit,
            endpoint=published.endpoint,
        )
    return published
