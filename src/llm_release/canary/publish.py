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

from llm_release import paths, registry
from llm_release.errors import PublishError
from llm_release.fileio import folder_sha256
from llm_release.hub.acquire import MANIFEST_SUFFIX
from llm_release.hub.publish import Lineage, Published, PublishTarget, publish, publish_target
from llm_release.quantization.quantize import RECORD
from llm_release.registry import Origin, Release, recorded_run_dir
from llm_release.results import CANDIDATE_RESULT, CandidateResult, EvalResult

logger = logging.getLogger(__name__)


def winner_evals(release: Release) -> list[EvalResult]:
    """The release's eval results as measured in its run; [] when none can be read."""
    run_dir = recorded_run_dir(release)
    if run_dir is None:
        return []
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


def _manifest_files(model_dir: Path) -> dict[str, str]:
    """An upstream folder's files as its download verified them (the hub's manifest)."""
    try:
        manifest = json.loads(model_dir.with_name(model_dir.name + MANIFEST_SUFFIX).read_text())
        entries = manifest["files"]
    except (OSError, ValueError, TypeError, KeyError):
        return {}
    if not isinstance(entries, list):
        return {}
    return {
        str(f["path"]): str(f["sha256"])
        for f in entries
        if isinstance(f, dict) and isinstance(f.get("path"), str) and f.get("sha256")
    }


def origin_of(model_dir: Path, scheme: str, *, hash_missing: bool = False) -> Origin:
    """Where ``model_dir`` came from: its quantization record (recipe, calibration set and
    fingerprint, cache key, the artifact's file hashes) or, for an upstream folder, the
    file hashes its download verified. ``hash_missing``: hash the folder's files when
    neither lists them (at deploy: once, before the folder can go away)."""
    model_dir = Path(model_dir)
    record: dict = {}
    try:
        record = json.loads((model_dir / RECORD).read_text())
    except (OSError, ValueError):
        pass
    if not isinstance(record, dict):
        record = {}
    recipe = record.get("candidate") if isinstance(record.get("candidate"), dict) else {}
    recipe = {k: v for k, v in recipe.items() if k not in ("name", "extra_serving_args")}
    files = record.get("files") if isinstance(record.get("files"), dict) else None
    files = files or _manifest_files(model_dir)
    if not files and hash_missing and model_dir.is_dir():
        files = folder_sha256(model_dir, skip=(RECORD,))
    try:
        return Origin(
            recipe=recipe,
            calibration_set=recipe.get("calibration_set") if scheme == "W4A16_AWQ" else None,
            calibration_sha256=record.get("calibration_sha256"),
            cache_key=record.get("cache_key"),
            files=files or {},
        )
    except ValidationError as exc:  # a folder's record the pipeline did not write
        logger.warning("%s: its quantization record is not the pipeline's: %s", model_dir, exc)
        try:
            return Origin(recipe=recipe)
        except ValidationError:  # the recipe itself is not one the pipeline wrote
            return Origin()


def lineage_of(release: Release) -> Lineage:
    """The release's lineage: upstream repo and commit, and its origin as recorded at deploy
    (an older release: from its folder's quantization record, when the folder has one)."""
    folder = paths.own_model_folder(release.model_dir)  # the record's path: confined
    origin = release.origin or (origin_of(folder, release.scheme) if folder else Origin())
    return Lineage(
        upstream_repo=release.repo_id,
        upstream_commit=release.commit,
        release_id=release.release_id,
        candidate=release.candidate,
        scheme=release.scheme,
        run_id=run_dir.name if (run_dir := registry.recorded_run_dir(release)) else None,
        recipe=origin.recipe,
        calibration_set=origin.calibration_set,
        calibration_sha256=origin.calibration_sha256,
        cache_key=origin.cache_key,
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
    # The record names the folder: only one of the project's own model folders goes up,
    # checked before any request reaches the hub (the upload replaces the repo's files).
    model_dir = registry.recorded_model_dir(
        release, f"release {release.release_id}", error=PublishError
    )
    published = publish(
        model_dir,
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
