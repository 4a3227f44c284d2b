"""Judged commits are remembered: the nightly run does not judge the same thing twice.

A judgement is keyed by the commit, the release config (less what does not change the
verdict: the revision's name, the endpoint, credentials, ``force``) and the eval sets'
fingerprints. The same key seen again means the same question: ``model-update`` then exits
in seconds and says when and why. A changed config or eval set, or ``force``, asks again.

Judgements are kept in the release record's ``decisions`` table (``llm_release.record``),
one row per key; the old ``judgements/*.json`` files are imported once (``record/legacy.py``).
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import select

from llm_release import paths
from llm_release.config import ReleaseConfig
from llm_release.decision.measurements import eval_sets_fingerprint
from llm_release.evaluation.evaluate import load_decoding
from llm_release.record import store
from llm_release.record.schema import DecisionRow

# decisions.approved_by is a VARCHAR(255): a longer review comment is cut there (the run's
# report keeps it whole).
APPROVED_BY_CHARS = 255


class Judgement(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str
    repo_id: str
    commit: str
    verdict: str  # "deployed", "rejected", "review rejected"
    summary: str
    run_id: str
    at: str
    approved_by: str | None = Field(
        None, description="the reviewer's verdict and comment, when a review was asked"
    )


def judgement_key(config: ReleaseConfig, commit: str) -> str:
    settings = config.model_dump(
        mode="json",
        exclude={
            "force": True,
            "review": True,
            "source": {"revision", "endpoint", "credentials_block"},
        },
    )
    parts = {
        "commit": commit,
        "config": settings,
        "eval_sets": eval_sets_fingerprint(config.evaluation.eval_sets),
        "decoding": load_decoding(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _old_folder():
    """Where the judgements were files before the record (imported once)."""
    return paths.home() / "judgements"


def record(
    config: ReleaseConfig,
    commit: str,
    verdict: str,
    summary: str,
    run_id: str,
    approved_by: str | None = None,
) -> Judgement:
    """Remember the verdict on ``commit`` under its key; ``approved_by``: the review's
    verdict and comment (``Decision.reviewed``), when a person (or ``review.auto``) was
    asked."""
    if approved_by is not None and len(approved_by) > APPROVED_BY_CHARS:
        approved_by = approved_by[: APPROVED_BY_CHARS - 1] + "…"
    key = judgement_key(config, commit)
    judgement = Judgement(
        key=key,
        repo_id=config.source.repo_id,
        commit=commit,
        verdict=verdict,
        summary=summary,
        run_id=run_id,
        at=datetime.now(UTC).isoformat(timespec="seconds"),
        approved_by=approved_by,
    )
    # The same question judged again (force): the newest verdict stands.
    with store.transaction() as session:
        store.upsert(session, DecisionRow, judgement.model_dump())
    return judgement


def find(config: ReleaseConfig, commit: str) -> Judgement | None:
    key = judgement_key(config, commit)
    if store.missing() and not _old_folder().exists():
        return None  # nothing recorded, nothing to import: no record made
    with store.transaction(write=False) as session:
        return _judgement(session.get(DecisionRow, key))


def of_run(run_id: str, commit: str) -> Judgement | None:
    """The judgement run ``run_id`` made on ``commit`` (None: none recorded, or the same
    question judged again by a later run, whose verdict now stands under the key)."""
    if store.missing():
        return None
    with store.transaction(write=False) as session:
        row = session.scalars(
            select(DecisionRow).where(DecisionRow.run_id == run_id, DecisionRow.commit == commit)
        ).first()
        return _judgement(row)


def _judgement(row: DecisionRow | None) -> Judgement | None:
    """The row as a Judgement (None: no row, or one unreadable: the question is asked again
    rather than trusted)."""
    if row is None:
        return None
    try:
        return Judgement.model_validate(
            {field: getattr(row, field) for field in Judgement.model_fields}
        )
    except ValidationError:
        return None
