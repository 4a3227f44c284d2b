"""The record's tables, as SQLAlchemy 2 typed models: each mirrors a typed record the
pipeline keeps (``registry.Release``, ``RegistryState``, ``RolloutStatus``;
``decisions.Judgement``; a stored ``CandidateResult``; ``gpus.Claim``). Nested settings and
results are JSON columns; what a query or a lock needs is a column of its own.

A change of a table is a new Alembic revision in ``migrations/versions`` (never an edit of
a released one).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# The router's two slots; a release holds at most one, a slot at most one release.
SLOTS = ("stable", "canary")
# What a release is now: in a slot, or out of them for good.
RELEASE_STATES = ("stable", "canary", "replaced", "rolled back", "stopped")


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON, str: String(255)}


class RegistryRow(Base):
    """The one row of the registry (id 1): the router's port, the canary's weight, which
    release's walk ``rollout`` shows. Every change of the registry locks this row first
    (``SELECT ... FOR UPDATE``), so writers take turns as they did under the file lock."""

    __tablename__ = "registry"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    router_port: Mapped[int | None]
    canary_weight: Mapped[int] = mapped_column(Integer, default=0)
    rollout_release_id: Mapped[str | None] = mapped_column(
        ForeignKey("rollouts.release_id", ondelete="SET NULL")
    )


class ReleaseRow(Base):
    """A release (``registry.Release``) and its state; kept after it leaves its slot, so
    the record holds every release that ever served."""

    __tablename__ = "releases"

    release_id: Mapped[str] = mapped_column(primary_key=True)
    candidate: Mapped[str]
    scheme: Mapped[str]
    repo_id: Mapped[str]
    commit: Mapped[str]
    model_dir: Mapped[str] = mapped_column(Text)
    public_name: Mapped[str]
    port: Mapped[int]
    pid: Mapped[int] = mapped_column(BigInteger, default=0)
    pid_started: Mapped[float | None] = mapped_column(Float)
    container: Mapped[str | None]
    supervisor_port: Mapped[int | None]
    log_path: Mapped[str] = mapped_column(Text)
    run_dir: Mapped[str | None] = mapped_column(Text)
    serving: Mapped[dict[str, Any]]
    started_at: Mapped[str]
    origin: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(32))


class SlotRow(Base):
    """A router slot (``stable``, ``canary``) and the release in it (none: empty). The
    unique constraint keeps one release out of two slots at once."""

    __tablename__ = "slots"
    __table_args__ = (UniqueConstraint("release_id", name="uq_slots_release"),)

    name: Mapped[str] = mapped_column(String(16), primary_key=True)
    release_id: Mapped[str | None] = mapped_column(ForeignKey("releases.release_id"))


class HistoryRow(Base):
    """One event of the registry's history (``RegistryState.log``): a row each, not one
    growing file."""

    __tablename__ = "history"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[str]
    event: Mapped[str] = mapped_column(String(64))
    details: Mapped[dict[str, Any]]


class RolloutRow(Base):
    """Where a canary's walk stands (``registry.RolloutStatus``), one row per release."""

    __tablename__ = "rollouts"

    release_id: Mapped[str] = mapped_column(primary_key=True)
    steps: Mapped[list[Any]]
    weight: Mapped[int]
    state: Mapped[str] = mapped_column(String(32))
    last_window: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    reason: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[str]


class RolloutStepRow(Base):
    """A step of a walk: the canary's weight, when it was entered and how it ended."""

    __tablename__ = "rollout_steps"
    __table_args__ = (UniqueConstraint("release_id", "weight", name="uq_rollout_steps"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    release_id: Mapped[str] = mapped_column(ForeignKey("rollouts.release_id"))
    weight: Mapped[int]
    entered_at: Mapped[str]
    outcome: Mapped[str | None] = mapped_column(String(32))


class AnalysisWindowRow(Base):
    """One analysis window of a step (``rollout.WindowRecord``; the whole
    ``analysis.WindowVerdict`` in ``verdict_record``)."""

    __tablename__ = "analysis_windows"
    __table_args__ = (UniqueConstraint("step_id", "index", name="uq_analysis_windows"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    step_id: Mapped[int] = mapped_column(ForeignKey("rollout_steps.id"))
    index: Mapped[int]
    verdict: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text)
    started_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float] = mapped_column(Float)
    verdict_record: Mapped[dict[str, Any]]


class DecisionRow(Base):
    """A judgement (``decisions.Judgement``) under its decision-memory key."""

    __tablename__ = "decisions"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    repo_id: Mapped[str]
    commit: Mapped[str]
    verdict: Mapped[str] = mapped_column(String(32))
    summary: Mapped[str] = mapped_column(Text)
    run_id: Mapped[str]
    at: Mapped[str]
    approved_by: Mapped[str | None]


class MeasurementRow(Base):
    """A complete measurement (a ``CandidateResult``) under its fingerprint."""

    __tablename__ = "measurements"

    fingerprint: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[str]
    name: Mapped[str]
    scheme: Mapped[str]
    role: Mapped[str] = mapped_column(String(16))
    result: Mapped[dict[str, Any]]


class GpuClaimRow(Base):
    """Which GPUs a server holds (``gpus.Claim``)."""

    __tablename__ = "gpu_claims"

    holder: Mapped[str] = mapped_column(primary_key=True)
    gpus: Mapped[list[Any]]
    backend: Mapped[str] = mapped_column(String(16))
    pid: Mapped[int | None] = mapped_column(BigInteger)
    pid_started: Mapped[float | None] = mapped_column(Float)
    container: Mapped[str | None]
    # the part of each GPU's memory it holds (its gpu_memory_utilization): servers share a
    # GPU while their shares add up to at most gpus.SHARE_CAP
    share: Mapped[float] = mapped_column(Float, server_default="1.0")
    # the fleet host whose GPUs these are (settings().host_name; '': the one host): a host
    # reads, prunes and writes only its own claims in a shared record
    host: Mapped[str] = mapped_column(String(40), server_default="")


class ImportRow(Base):
    """A one-time import done (``json``: the old JSON files of a project home): what it
    read, so a second start imports nothing."""

    __tablename__ = "imports"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    at: Mapped[str]
    source: Mapped[str] = mapped_column(Text)
    counts: Mapped[dict[str, Any]]
