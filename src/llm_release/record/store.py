"""The record's database: which one (``LLM_RELEASE_DATABASE_URL``, else an SQLite file
under the project home), brought to the newest schema at first use in a process (Alembic,
``migrations/``) with the one-time import of the old JSON files in the same transaction,
and transactions that serialize writers in the database itself.

Writers take turns by row locks: ``lock_registry`` reads the registry's row with
``SELECT ... FOR UPDATE`` on PostgreSQL, so a second writer (a second promote, say) waits
for the first to commit and then sees what it wrote. SQLite has no row locks: every
transaction there begins with ``BEGIN IMMEDIATE`` (the database's write lock), which
serializes the same way on one host.
A writer that dies mid-transaction leaves nothing: the database rolls it back.

SQLite has one write lock for the whole file: a writer opened while this thread already
holds one (a GPU claimed while a deploy holds the registry) would wait for itself, so it
joins the open transaction in a SAVEPOINT instead. On PostgreSQL it is a transaction of
its own, committed at once (the GPU ledger's lock is not held for the deploy's minutes).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from llm_release import paths
from llm_release.errors import StateError
from llm_release.record import legacy
from llm_release.record.schema import (
    Base,
    GpuClaimRow,
    ImportRow,
    RegistryRow,
    ReleaseRow,
    SlotRow,
)
from llm_release.settings import settings

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).with_name("migrations")
# The newest revision in migrations/versions (a test checks it against Alembic's head): a
# record already there, with its import done, opens without loading Alembic at all.
HEAD = "0004"
# pg_advisory_xact_lock's key: two processes starting on a new database migrate in turn.
MIGRATION_LOCK = 0x11E_2E1E
# A writer waits for the one before it as long as it holds the write lock: a deploy holds
# it while its servers start (minutes), as it held the registry's file lock before.
SQLITE_BUSY_TIMEOUT_S = 3600.0

# A writer that finds the lock taken says so at once and then every WAIT_NOTICE_S, naming
# the record and how long it may still wait (it waited in silence before).
FIRST_WAIT_S = 2.0
# PostgreSQL's SQLSTATE for a lock_timeout that ran out (lock_not_available)
LOCK_NOT_AVAILABLE = "55P03"
WAIT_NOTICE_S = 30.0

_engines: dict[tuple[int, str], Engine] = {}
# The writing transaction open in this context, and its thread (SQLite's nested writers
# join it; a context copied into another thread, as a task runner does, never does).
_writing: ContextVar[tuple[int, Session] | None] = ContextVar("record_writing", default=None)


def database_url() -> str:
    """The record's URL: the setting, else ``sqlite:///<home>/record.db``."""
    secret = settings().database_url
    if secret is not None:
        return secret.get_secret_value()
    return f"sqlite:///{paths.home() / 'record.db'}"


def missing() -> bool:
    """The record is an SQLite file not made yet: a read may answer "nothing recorded"
    without making it (a command that only looks creates no database)."""
    url = make_url(database_url())
    return (
        url.get_backend_name() == "sqlite"
        and bool(url.database)
        and not Path(url.database).exists()
    )


def shown(url: str) -> str:
    """The URL as logs and errors show it: the password masked."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<an unparsable URL>"


def _hint(where: str) -> str:
    return (
        f"check that the database of LLM_RELEASE_DATABASE_URL ({where}) runs and "
        "this user may create tables there, or unset it (an SQLite file under the project home)"
    )


def alembic_config(connection=None):
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def _private_file(path: Path) -> None:
    """Make the SQLite file ``path`` (mode 0600, whatever the umask) before SQLite does: the
    record holds the registry, judgements and measurements, and SQLite gives its WAL and
    shared-memory files the database file's mode. An existing file of this user's that its
    group or others may open (made by an older version, or by hand) is made 0600 with its
    WAL and shared-memory files, and the log says so; another user's is left as it is."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        _tighten(path)
        return
    os.close(fd)


def _tighten(path: Path) -> None:
    for each in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            info = each.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and info.st_mode & 0o077:
            os.chmod(each, 0o600)
            log.warning(
                "%s was mode %04o (its group or others could read the record): made 0600",
                each,
                stat.S_IMODE(info.st_mode),
            )


def create(url: str) -> Engine:
    """An engine for ``url``; SQLite's transactions take the write lock at their start."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StateError(
            "LLM_RELEASE_DATABASE_URL is not a database URL",
            hint="e.g. postgresql+psycopg://user:password@host/llm_release, or unset it",
        ) from None
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            _private_file(Path(parsed.database))
        # No pool: a connection per transaction (cheap for a file), so an engine per
        # project home (tests make hundreds) keeps no file open.
        engine = create_engine(
            url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S}, poolclass=NullPool
        )

        @event.listens_for(engine, "connect")
        def _connect(dbapi_connection, _record) -> None:
            dbapi_connection.isolation_level = None  # SQLAlchemy's BEGIN, not the driver's
            dbapi_connection.execute("PRAGMA foreign_keys=ON")
            dbapi_connection.execute("PRAGMA journal_mode=WAL")

        where = parsed.database or ":memory:"

        @event.listens_for(engine, "begin")
        def _begin(connection) -> None:
            mode = connection.get_execution_options().get("sqlite_begin", "IMMEDIATE")
            if mode != "IMMEDIATE" or not begin_immediate(
                connection.connection.driver_connection, where
            ):
                connection.exec_driver_sql(f"BEGIN {mode}")

        return engine
    return create_engine(url, pool_pre_ping=True)


def begin_immediate(
    raw: sqlite3.Connection,
    where: str,
    limit_s: float = SQLITE_BUSY_TIMEOUT_S,
    first_s: float = FIRST_WAIT_S,
    notice_s: float = WAIT_NOTICE_S,
) -> bool:
    """``BEGIN IMMEDIATE`` on the raw SQLite connection: the database's write lock, waited
    for up to ``limit_s`` as before, but in steps, with a warning after ``first_s`` and
    then every ``notice_s`` (a deploy holds the lock while its servers start: minutes).
    False past ``limit_s``, the busy timeout left at 1 ms: the caller's own BEGIN then
    fails at once with SQLite's "database is locked", as SQLAlchemy reports it."""
    started = time.monotonic()
    step_s = first_s
    told_at: float | None = None
    while True:
        left = limit_s - (time.monotonic() - started)
        if left <= 0:
            raw.execute("PRAGMA busy_timeout = 1")
            return False
        raw.execute(f"PRAGMA busy_timeout = {max(1, int(min(step_s, left) * 1000))}")
        try:
            raw.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc):
                raise
        else:
            raw.execute(f"PRAGMA busy_timeout = {int(limit_s * 1000)}")
            return True
        waited = time.monotonic() - started
        if told_at is None or waited - told_at >= notice_s:
            log.warning(
                "waiting for the release record's write lock (%s): another llm-release "
                "command is writing it (a deploy holds it while its servers start); "
                "waited %.0f s, at most %.0f s more",
                where,
                waited,
                max(0.0, limit_s - waited),
            )
            told_at = waited
        step_s = min(notice_s, 5.0)


def known_revisions() -> set[str]:
    """The schema revisions this version of the project has migrations for."""
    from alembic.script import ScriptDirectory

    return {rev.revision for rev in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def _current(engine: Engine) -> bool:
    """The record is at ``HEAD`` and its one-time import is done (a read, no lock). A record
    at a revision this version does not know (a newer llm-release wrote it) is refused."""
    with engine.connect().execution_options(sqlite_begin="DEFERRED") as connection:
        if not inspect(connection).has_table("alembic_version"):
            return False
        version = connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
        if version not in (None, HEAD) and str(version) not in known_revisions():
            where = engine.url.render_as_string(hide_password=True)
            raise StateError(
                f"the release record {where} is at schema revision {str(version)[:40]!r}, "
                f"which this llm-release does not know (it knows up to {HEAD}; a newer "
                "version wrote it)",
                hint="run the llm-release that wrote it, or upgrade this one; never downgrade "
                "a record by hand",
            )
        if version != HEAD:
            return False
        done = connection.execute(
            select(ImportRow.name).where(ImportRow.name.in_(legacy.IMPORTS))
        ).scalars()
        return set(done) == set(legacy.IMPORTS)


def migrate(engine: Engine, home: Path | None = None) -> None:
    """The newest schema, then the one-time import of ``home``'s JSON files (the project
    home by default; each store's files once, ``legacy.IMPORTS``): one transaction, one
    process at a time."""
    from alembic.util import CommandError as AlembicError

    where = engine.url.render_as_string(hide_password=True)
    try:
        if _current(engine):
            return
        from alembic import command

        with engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
            command.upgrade(alembic_config(connection), "head")
            with Session(bind=connection) as session:
                legacy.import_home(session, home or paths.home(), where)
                session.flush()
    except (SQLAlchemyError, AlembicError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise StateError(
            f"the release record {where} could not be opened or migrated ({first})",
            hint=_hint(where),
        ) from None


def engine() -> Engine:
    """This process's engine for the configured record, migrated at its first use."""
    url = database_url()
    key = (os.getpid(), url)  # a forked child opens its own connections
    if key not in _engines:
        new = create(url)
        migrate(new)
        _engines[key] = new
    return _engines[key]


@contextlib.contextmanager
def transaction(*, write: bool = True) -> Iterator[Session]:
    """A session in one transaction: committed on a clean exit, rolled back when the block
    raises (or the process dies: the database drops what was not committed). A read
    (``write=False``) on SQLite reads the last committed state without waiting for a
    writer (WAL); on PostgreSQL a read never waits for a row lock anyway.

    A writer opened inside another writer of this thread on SQLite joins it (a SAVEPOINT:
    the block's changes commit with the outer transaction, a block that raises undoes only
    its own); the database's one write lock would otherwise make it wait for itself."""
    current = engine()
    thread, outer = _writing.get() or (None, None)
    if (
        write
        and outer is not None
        and thread == threading.get_ident()
        and outer.bind is current
        and current.dialect.name == "sqlite"
    ):
        with outer.begin_nested():
            yield outer
        return
    with Session(current, expire_on_commit=False) as session, session.begin():
        if not write:
            session.connection(execution_options={"sqlite_begin": "DEFERRED"})
            yield session
            return
        token = _writing.set((threading.get_ident(), session))
        try:
            yield session
        finally:
            _writing.reset(token)


def upsert(session: Session, row_type: type[Base], values: dict[str, Any]) -> None:
    """Insert a row, or update the one with its key (``INSERT ... ON CONFLICT DO UPDATE``,
    one statement: two writers of one key never collide). Columns not in ``values`` keep
    what the row had."""
    table = row_type.__table__
    keys = [c.name for c in table.primary_key.columns]
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    statement = dialect.insert(table).values(**values)
    changed = {k: statement.excluded[k] for k in values if k not in keys}
    session.execute(statement.on_conflict_do_update(index_elements=keys, set_=changed))


def lock_registry(session: Session) -> RegistryRow:
    """The registry's row, locked to the end of the transaction (writers take turns)."""
    statement = select(RegistryRow).where(RegistryRow.id == 1).with_for_update()
    if session.get_bind().dialect.name == "postgresql":
        _wait_saying_so(session, lambda: session.execute(statement), "the registry's row")
    return session.execute(statement).scalar_one()


def _wait_saying_so(
    session: Session,
    take: Callable[[], object],
    what: str,
    limit_s: float = SQLITE_BUSY_TIMEOUT_S,
    first_s: float = FIRST_WAIT_S,
    notice_s: float = WAIT_NOTICE_S,
) -> None:
    """PostgreSQL: ``take`` a lock as SQLite's writers do (``begin_immediate``): in steps
    of ``lock_timeout`` inside a savepoint, a warning after ``first_s`` and then every
    ``notice_s``, at most ``limit_s`` (a row lock waits for ever by default). The lock is
    held, to the end of the transaction, when this returns."""
    started = time.monotonic()
    step_s = first_s
    told_at: float | None = None
    while True:
        left = limit_s - (time.monotonic() - started)
        try:
            with session.begin_nested():
                timeout_ms = max(1, int(min(step_s, max(left, 0.001)) * 1000))
                session.execute(text(f"SET LOCAL lock_timeout = {timeout_ms}"))
                take()
            session.execute(text("SET LOCAL lock_timeout = 0"))
            return
        except OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE or left <= 0:
                raise
        waited = time.monotonic() - started
        if told_at is None or waited - told_at >= notice_s:
            where = session.get_bind().url.render_as_string(hide_password=True)
            log.warning(
                "waiting for the release record's lock on %s (%s): another llm-release "
                "command is writing it (a deploy holds it while its servers start); "
                "waited %.0f s, at most %.0f s more",
                what,
                where,
                waited,
                max(0.0, limit_s - waited),
            )
            told_at = waited
        step_s = min(notice_s, 5.0)


def lock_gpu_claims(session: Session) -> list[GpuClaimRow]:
    """Every GPU claim, the ledger locked to the end of the transaction: claimers take
    turns, and the second sees what the first claimed. PostgreSQL: the table in EXCLUSIVE
    mode (a new claim is an insert, which a row lock could not keep out; readers do not
    wait). SQLite: the transaction's ``BEGIN IMMEDIATE`` holds the database already."""
    if session.get_bind().dialect.name == "postgresql":
        lock = text(f"LOCK TABLE {GpuClaimRow.__tablename__} IN EXCLUSIVE MODE")
        _wait_saying_so(session, lambda: session.execute(lock), "the GPU ledger")
    return list(session.execute(select(GpuClaimRow).order_by(GpuClaimRow.holder)).scalars())


def slots(session: Session) -> dict[str, ReleaseRow | None]:
    """Each slot's release (None: empty)."""
    rows = session.execute(select(SlotRow)).scalars().all()
    return {r.name: session.get(ReleaseRow, r.release_id) if r.release_id else None for r in rows}
