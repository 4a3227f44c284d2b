"""The release registry: which release is stable, which is the canary, and their servers.

A JSON file under the project home, written atomically and changed under an exclusive
file lock, so two runs can never put two canaries in front of users.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llm_release import paths
from llm_release.config import STORED, ServingConfig
from llm_release.errors import StateError
from llm_release.fileio import atomic_write_text, locked_json


class Release(BaseModel):
    model_config = ConfigDict(extra="forbid")

    release_id: str
    candidate: str
    scheme: str
    repo_id: str
    commit: str
    model_dir: str
    public_name: str
    port: int
    # The process backend's server: its pid and start time, together its identity (a pid
    # alone can be reused). The docker backend's: ``container`` (id), and pid 0.
    pid: int = 0
    pid_started: float | None = None
    container: str | None = None
    log_path: str
    run_dir: str | None = None
    serving: ServingConfig
    started_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat())


class RolloutStatus(BaseModel):
    """Where the canary's walk stands, for 'llm-release canary status'."""

    model_config = ConfigDict(extra="forbid")

    release_id: str
    steps: list[int]
    weight: int
    state: Literal[
        "warming up",
        "analysing",
        "awaiting approval",
        "promoted",
        "rolled back",
        "held",
        "overridden",
    ]
    last_window: dict | None = Field(
        None, description="the last analysis window: weight, verdict, reason, ended_at"
    )
    reason: str | None = None
    updated_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat())


class RegistryState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    router_port: int | None = None
    stable: Release | None = None
    canary: Release | None = None
    canary_weight: int = 0
    rollout: RolloutStatus | None = None
    history: list[dict] = Field(default_factory=list)

    def log(self, event: str, **details: object) -> None:
        self.history.append({"at": datetime.now(UTC).isoformat(), "event": event, **details})


def registry_path() -> Path:
    return paths.home() / "releases.json"


def load() -> RegistryState:
    path = registry_path()
    if not path.exists():
        return RegistryState()
    try:
        # Records the pipeline wrote: they load under the rules they were written with.
        return RegistryState.model_validate_json(path.read_bytes(), context=STORED)
    except (ValidationError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise StateError(
            f"the release registry {path} is corrupt ({first})",
            hint=f"'llm-release down' still stops the servers; then move {path.name} aside "
            "(the next release starts from no stable release) or restore it from a backup",
        ) from None


def save(state: RegistryState) -> None:
    atomic_write_text(registry_path(), json.dumps(state.model_dump(), indent=2) + "\n")


@contextlib.contextmanager
def locked() -> Iterator[RegistryState]:
    """Load the state under an exclusive lock; saved on a clean exit."""
    with locked_json(registry_path(), load) as state:
        yield state
