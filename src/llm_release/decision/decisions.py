"""Judged commits are remembered: the nightly run does not judge the same thing twice.

A judgement is keyed by the commit, the release config (less what does not change the
verdict: the revision's name, the endpoint, credentials, ``force``) and the eval sets'
fingerprints. The same key seen again means the same question: ``model-update`` then exits
in seconds and says when and why. A changed config or eval set, or ``force``, asks again.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict

from llm_release import paths
from llm_release.config import ReleaseConfig
from llm_release.decision.measurements import eval_sets_fingerprint
from llm_release.evaluation.evaluate import load_decoding
from llm_release.fileio import atomic_write_json


class Judgement(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str
    repo_id: str
    commit: str
    verdict: str  # "deployed", "rejected", "review rejected"
    summary: str
    run_id: str
    at: str


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


def _path(key: str):
    return paths.home() / "judgements" / f"{key[:32]}.json"


def record(
    config: ReleaseConfig, commit: str, verdict: str, summary: str, run_id: str
) -> Judgement:
    key = judgement_key(config, commit)
    judgement = Judgement(
        key=key,
        repo_id=config.source.repo_id,
        commit=commit,
        verdict=verdict,
        summary=summary,
        run_id=run_id,
        at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    atomic_write_json(_path(key), judgement.model_dump())
    return judgement


def find(config: ReleaseConfig, commit: str) -> Judgement | None:
    key = judgement_key(config, commit)
    try:
        judgement = Judgement.model_validate_json(_path(key).read_text())
    except (OSError, ValueError):
        return None
    return judgement if judgement.key == key else None
