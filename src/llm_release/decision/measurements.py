"""What a measurement depends on, and the store that lets the champion's be reused.

A candidate's scores and load figures are comparable with another run's only when nothing
they depend on changed: the artifact's bytes, the eval sets (version, task and data), the
decoding parameters, the evaluation and load settings, the serving settings, the library
and runtime versions, and the host. The fingerprint hashes all of these; the store keeps
every measured result under its fingerprint, so the release serving users (the champion)
is measured again only when one of them changed.

The store is the release record's ``measurements`` table (``llm_release.record``), one row
per fingerprint; the old ``measurements/*.json`` files are imported once
(``record/legacy.py``).
"""

from __future__ import annotations

import hashlib
import json
import re
from importlib.metadata import version
from pathlib import Path

from pydantic import BaseModel
from sqlalchemy import select

from llm_release import paths
from llm_release.config import EvalConfig, LoadProfile, ServingConfig
from llm_release.evaluation.evalsets import files_sha256, load_eval_set
from llm_release.evaluation.evaluate import load_decoding
from llm_release.fileio import sha256_file
from llm_release.quantization.quantize import _model_fingerprint
from llm_release.record import store
from llm_release.record.schema import MeasurementRow
from llm_release.results import CandidateResult
from llm_release.serving.probe import HostSupport


def eval_sets_fingerprint(names: list[str]) -> dict[str, dict]:
    """Per set: its version and the hashes of the files that define its items and prompts."""
    out = {}
    for name in names:
        eval_set = load_eval_set(name)
        out[name] = {
            "version": (eval_set.task.get("metadata") or {}).get("version"),
            "files": files_sha256(eval_set),
        }
    defaults = paths.eval_sets_dir() / "defaults.yaml"
    if defaults.exists():
        out["_defaults"] = {"files": {"defaults.yaml": sha256_file(defaults)}}
    return out


def _canonical(model: BaseModel, exclude: set[str] | None = None) -> dict:
    """The settings as they read back from a file: a default written as ``4`` for a float
    field is ``4.0`` once a release record is loaded, and a champion's settings come from
    its record (a missed reuse, seen when ``shm_size_gib`` got its default)."""
    again = type(model).model_validate_json(model.model_dump_json())
    return again.model_dump(mode="json", exclude=exclude)


def fingerprint(
    model_dir: Path,
    serving: ServingConfig,
    evaluation: EvalConfig,
    load: LoadProfile,
    host: HostSupport,
) -> str:
    parts = depends_on(model_dir, serving, evaluation, load, host)
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def depends_on(
    model_dir: Path,
    serving: ServingConfig,
    evaluation: EvalConfig,
    load: LoadProfile,
    host: HostSupport,
) -> dict:
    """What a measurement depends on, as the fingerprint hashes it."""
    parts = {
        "model": _model_fingerprint(Path(model_dir)),
        "eval_sets": eval_sets_fingerprint(evaluation.eval_sets),
        "decoding": load_decoding(),
        "evaluation": _canonical(evaluation),
        "load": _canonical(load),
        "serving": _canonical(serving, exclude={"startup_timeout_s"}),
        "libraries": {
            "lm_eval": version("lm_eval"),
            "guidellm": version("guidellm"),
            "vllm": host.runtime.vllm,
            "torch": host.runtime.torch,
        },
        "host": host.host.key(),
    }
    if host.host.cuda:
        # Answers asked one at a time and asked batched differ on a GPU: a champion measured
        # batched is measured again (EvalConfig.concurrency).
        parts["evaluation_in_flight"] = evaluation.concurrency(serving, gpu=True)
    if serving.backend == "docker":
        from llm_release.serving.backends.docker import host_settings

        # The operator's image, shared memory and IPC namespace (LLM_RELEASE_DOCKER_*).
        parts["docker"] = host_settings().model_dump()
    return parts


def _old_folder() -> Path:
    """Where the measurements were files before the record (imported once)."""
    return paths.home() / "measurements"


def save(result: CandidateResult, run_id: str) -> None:
    """Keep a complete measurement for later runs (a failed one is never reused)."""
    if result.status != "measured" or not result.fingerprint or result.reused_from:
        return
    # Measured again under the same fingerprint: the newest stands.
    with store.transaction() as session:
        store.upsert(
            session,
            MeasurementRow,
            {
                "fingerprint": result.fingerprint,
                "run_id": run_id,
                "name": result.name,
                "scheme": result.scheme,
                "role": result.role,
                "result": result.model_dump(mode="json"),
            },
        )


# A run's id as the flows make it (``20261205T183012Z-1a2b3c4d``, ``eval-…``): reused
# measurements name it in the report.
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def find(fp: str) -> tuple[CandidateResult, str] | None:
    """A stored measurement with this exact fingerprint, and the run that made it."""
    if store.missing() and not _old_folder().exists():
        return None  # nothing recorded, nothing to import: no record made
    with store.transaction(write=False) as session:
        row = session.get(MeasurementRow, fp)
        if row is None:
            return None
        stored, run_id = row.result, row.run_id
    try:
        result = CandidateResult.model_validate(stored)
    except (ValueError, TypeError):
        return None  # unreadable: measure again rather than trust it
    if result.fingerprint != fp or not RUN_ID.fullmatch(str(run_id)):
        return None  # a run id is the report's text: one the pipeline could not have made
    return result, str(run_id)


def of_run(run_id: str, name: str) -> CandidateResult | None:
    """The measurement run ``run_id`` made of candidate ``name`` (None: none recorded, or
    measured again under the same fingerprint by a later run, whose it is now)."""
    if store.missing():
        return None
    with store.transaction(write=False) as session:
        row = session.scalars(
            select(MeasurementRow)
            .where(MeasurementRow.run_id == run_id, MeasurementRow.name == name)
            .order_by(MeasurementRow.fingerprint)
        ).first()
        if row is None:
            return None
        stored = row.result
    try:
        return CandidateResult.model_validate(stored)
    except (ValueError, TypeError):
        return None
