"""The release registry: which release is stable, which is the canary, and their servers.

Kept in the release record (``llm_release.record``: SQLite under the project home, or
PostgreSQL by ``LLM_RELEASE_DATABASE_URL``), changed in one transaction that first locks
the registry's row, so two runs — two processes, or two hosts on one PostgreSQL — can never
put two canaries in front of users. The old ``releases.json`` is imported once, at the
record's first start on a project home (``record/legacy.py``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sqlalchemy.orm import Session

from llm_release import paths, safety
from llm_release.config import MAX_REVISION, REPO_ID, STORED, ServingConfig
from llm_release.errors import ReleaseError, StateError
from llm_release.record import store
from llm_release.record.state import read_releases, read_state, write_state

log = logging.getLogger(__name__)

# Linux's largest pid (/proc/sys/kernel/pid_max can be raised to 2**22, no further).
PID_MAX = 2**22

_RESTORE_HINT = (
    "the record was edited, or its database is another project home's: restore the record "
    "from a backup, or point LLM_RELEASE_DATABASE_URL at this home's own record"
)


# A file of a served folder as the pipeline records it (no control character, backtick,
# pipe or angle bracket: the name goes into a model card's markdown table).
_FILE_NAME = re.compile(r"[^\x00-\x1f\x7f`|<>]{1,1000}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_RECIPE_BYTES = 64 * 1024


class Origin(BaseModel):
    """Where a release's served folder came from, recorded when it is deployed, so the
    record answers it after the worker's disk is gone: the quantization record's recipe,
    calibration set and fingerprint and cache key (none for an upstream folder), and each
    file of the folder with its SHA-256 (``canary.publish.origin_of``)."""

    model_config = ConfigDict(extra="forbid")

    recipe: dict = Field(default_factory=dict, description="the candidate's quantization recipe")
    # Each of these is written into a published model card's text: read back from a record
    # anyone with access to its database can edit, it is held to what the pipeline writes
    # (a set name, SHA-256 hex digests, relative file names), never markdown or newlines.
    calibration_set: str | None = Field(None, pattern=f"^{safety.SET_NAME.pattern}$", max_length=64)
    calibration_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    cache_key: str | None = Field(
        None, pattern=r"^[0-9a-f]{64}$", description="the quantization's content hash"
    )
    files: dict[str, str] = Field(
        default_factory=dict, description="each file of the served folder -> its SHA-256"
    )

    @field_validator("recipe")
    @classmethod
    def _recipe(cls, value: dict) -> dict:
        """The recipe reaches the published card's metadata: bounded as the pipeline's own
        are (a few hundred bytes; a recipe of megabytes is a probe, not a recipe)."""
        size = len(json.dumps(value, default=str))
        if size > MAX_RECIPE_BYTES:
            raise ValueError(f"recipe: {size:,} bytes as JSON; at most {MAX_RECIPE_BYTES:,}")
        return value

    @field_validator("files")
    @classmethod
    def _files(cls, value: dict[str, str]) -> dict[str, str]:
        for name, digest in value.items():
            parts = name.split("/")
            if (
                not _FILE_NAME.fullmatch(name)
                or name.startswith("/")
                or any(part in ("", ".", "..") for part in parts)
            ):
                raise ValueError(f"files: {name[:80]!r} is not a relative file name")
            if not _SHA256.fullmatch(digest):
                raise ValueError(f"files: the digest of {name[:80]!r} is not a SHA-256")
        return value


class Release(BaseModel):
    model_config = ConfigDict(extra="forbid")

    release_id: str
    candidate: str
    # What the pipeline writes (FP8_DYNAMIC, W4A16_AWQ, "unquantized (bfloat16)"): it goes
    # into a published card's text.
    scheme: str = Field(pattern=r"^[A-Za-z0-9_]{1,32}( \([a-z0-9]{1,16}\))?$")
    repo_id: str = Field(pattern=f"^{REPO_ID}$", max_length=MAX_REVISION)
    commit: str = Field(pattern=f"^{safety.COMMIT.pattern}$")
    model_dir: str
    public_name: str
    # Every port the pipeline records is one a server picked above 1023 (a record naming a
    # privileged one was written by hand).
    port: int = Field(ge=1024, le=65535)
    # The process backend's server: its pid and start time, together its identity (a pid
    # alone can be reused; kill() reads a negative one as a process group, -1 as every
    # process). The docker backend's: ``container`` (its id), and pid 0.
    pid: int = Field(0, ge=0, le=PID_MAX)
    pid_started: float | None = Field(None, ge=0)
    container: str | None = Field(None, pattern=r"^[0-9a-f]{12,64}$")
    # The process backend's supervisor (then ``pid`` is the supervisor's, which restarts
    # vLLM when it dies): the port of its /metrics. None: an unsupervised server.
    supervisor_port: int | None = Field(None, ge=1024, le=65535)
    log_path: str
    run_dir: str | None = None
    serving: ServingConfig
    started_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat())
    origin: Origin | None = Field(
        None, description="where the folder came from (None: deployed before it was recorded)"
    )

    @field_validator("release_id", "public_name", "candidate")
    @classmethod
    def _served_name(cls, value: str, info) -> str:
        # Each becomes a name after vLLM's --served-model-name, read back from a record
        # anyone with access to its database can edit: the run form's rule, records included
        # (the pipeline never wrote another).
        try:
            return safety.served_name(value, info.field_name)
        except safety.UnsafeNameError as exc:
            raise ValueError(exc.message) from None


def recorded_model_dir(release: Release, what: str, error: type[ReleaseError] = StateError) -> Path:
    """``release.model_dir`` resolved, when it is one of the project's own model folders
    (``paths.model_roots``: downloads and quantized candidates), links and '..' followed;
    ``error`` in one line otherwise. The record is input: anyone who can edit its database
    could name any folder of the worker, which a restart would serve and a publish upload."""
    real = paths.own_model_folder(release.model_dir)
    if real is None:
        roots = " or ".join(str(root) for root in paths.model_roots())
        raise error(
            f"{what} model_dir {release.model_dir[:300]!r} is outside the project's model "
            f"folders ({roots})",
            hint=_RESTORE_HINT,
        )
    return real


def recorded_log_path(release: Release, what: str, error: type[ReleaseError] = StateError) -> Path:
    """``release.log_path`` when it is the release's own log file in the project's servers
    folder (``<home>/servers/<role>-<release_id>.log``, where the pipeline writes every
    one: another release's log would name that release's supervisor and processes), and no
    link, FIFO or device sits there; ``error`` in one line otherwise. A stop copies a container's log
    into it, a restart appends to it, status reads the supervisor's state beside it."""
    path = Path(release.log_path)
    servers = Path(os.path.realpath(paths.servers_dir()))
    if (
        not path.is_absolute()
        or path.suffix != ".log"
        or Path(os.path.realpath(path.parent)) != servers
    ):
        raise error(
            f"{what} log_path {release.log_path[:300]!r} is not a log of {servers}",
            hint=_RESTORE_HINT,
        )
    if path.name not in {f"{role}-{release.release_id}.log" for role in ("stable", "canary")}:
        # another release's log: its supervisor's spec and state, and so its processes
        raise error(
            f"{what} log_path {release.log_path[:300]!r} is not release {release.release_id}'s "
            f"log (stable-{release.release_id}.log or canary-{release.release_id}.log)",
            hint=_RESTORE_HINT,
        )
    real = servers / path.name
    if real.is_symlink() or (real.exists() and not real.is_file()):
        raise error(
            f"{what} log_path {release.log_path[:300]!r} is a link or not a regular file",
            hint=_RESTORE_HINT,
        )
    return real


def recorded_run_dir(release: Release) -> Path | None:
    """``release.run_dir`` when it is a run's folder of this home (``paths.runs_dir``); None
    when the release has none or the record names a folder elsewhere (logged: its report is
    then not read, and nothing of it is published)."""
    if not release.run_dir:
        return None
    real = paths.own_run_folder(release.run_dir)
    if real is None:
        log.warning(
            "the record's run_dir for %s, %r, is not a run folder of %s: its report is not read",
            release.release_id,
            release.run_dir[:300],
            paths.runs_dir(),
        )
    return real


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

    router_port: int | None = Field(None, ge=1024, le=65535)
    stable: Release | None = None
    canary: Release | None = None
    canary_weight: int = Field(0, ge=0, le=100)
    rollout: RolloutStatus | None = None
    history: list[dict] = Field(default_factory=list)

    def log(self, event: str, **details: object) -> None:
        self.history.append({"at": datetime.now(UTC).isoformat(), "event": event, **details})


def registry_path() -> Path:
    """The registry's old JSON file: imported into the record once (its first start on this
    home), then left as it was."""
    return paths.home() / "releases.json"


def _first_error(exc: ValidationError) -> str:
    """The first thing wrong, in one line: which field and why."""
    errors = exc.errors(include_url=False)
    if not errors:
        return type(exc).__name__
    error = errors[0]
    loc = [str(part) for part in error.get("loc", ())]
    where = ".".join(loc) or "its row"
    message = " ".join(str(error.get("msg", "")).removeprefix("Value error, ").split())
    if loc and message.startswith(loc[-1] + " "):  # a message that names its field itself
        return f"{where}{message[len(loc[-1]) :]}"[:400]
    return f"{where}: {message}"[:400]


def _state(stored: dict) -> RegistryState:
    try:
        # Records the pipeline wrote: they load under the rules they were written with.
        return RegistryState.model_validate(stored, context=STORED)
    except ValidationError as exc:
        first = _first_error(exc)
        where = store.shown(store.database_url())
        raise StateError(
            f"the release registry in the record {where} is corrupt ({first})",
            hint="'llm-release down' still stops the servers; then fix the registry's rows "
            "(docs/record.md) or restore the record from a backup",
        ) from None


def load() -> RegistryState:
    """The registry as last committed (a read never waits for a writer)."""
    if store.missing() and not registry_path().exists():
        return RegistryState()  # nothing recorded, nothing to import: no record made
    with store.transaction(write=False) as session:
        return _state(read_state(session))


def releases() -> list[tuple[Release, str]]:
    """Every release that ever served, oldest first, with its state now."""
    if store.missing() and not registry_path().exists():
        return []
    with store.transaction(write=False) as session:
        rows = read_releases(session)
    out = []
    for raw, state in rows:
        try:
            out.append((Release.model_validate(raw, context=STORED), state))
        except ValidationError as exc:
            first = _first_error(exc)
            raise StateError(
                f"release {raw.get('release_id')!r} in the record is corrupt ({first})",
                hint="fix its row (docs/record.md) or restore the record from a backup",
            ) from None
    return out


def save(state: RegistryState) -> None:
    with store.transaction() as session:
        store.lock_registry(session)
        write_state(session, state.model_dump(mode="json"))


@contextlib.contextmanager
def locked() -> Iterator[RegistryState]:
    """Load the state with the registry's row locked (a second writer waits); saved on a
    clean exit, left as it was when the block raises."""
    with locked_session() as (state, _session):
        yield state


@contextlib.contextmanager
def locked_session() -> Iterator[tuple[RegistryState, Session]]:
    """``locked()``, with its transaction's session: rows the caller writes there (a walk's
    steps and windows, ``record/walks.py``) commit with the state, or not at all."""
    with store.transaction() as session:
        store.lock_registry(session)
        state = _state(read_state(session))
        yield state, session
        write_state(session, state.model_dump(mode="json"))
