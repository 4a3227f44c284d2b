"""A writer that finds the SQLite record's write lock taken says so (issue 36, low: "a
locked record waits silently for up to an hour"), then goes on as soon as it is free, or
fails with SQLite's own "database is locked" past the limit."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from llm_release.record import store

WAITING = "waiting for the release record's write lock"


def holder(path) -> sqlite3.Connection:
    """Another command in the middle of a write: the database's write lock held."""
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    connection.execute("BEGIN IMMEDIATE")
    return connection


def test_a_waiting_writer_says_so_and_writes_once_the_lock_is_free(home, caplog):
    with store.transaction() as session:  # the record exists, migrated
        session.execute(text("SELECT 1"))
    other = holder(home / "record.db")
    threading.Timer(3.0, other.commit).start()
    caplog.set_level(logging.WARNING, logger="llm_release.record.store")
    started = time.monotonic()
    with store.transaction() as session:
        session.execute(text("SELECT 1"))
    waited = time.monotonic() - started
    other.close()
    assert 2.5 < waited < 15
    notices = [r.getMessage() for r in caplog.records if WAITING in r.getMessage()]
    assert len(notices) == 1, notices  # after FIRST_WAIT_S, and the next only after 30 s
    assert str(home / "record.db") in notices[0] and "at most" in notices[0]


def test_no_notice_when_the_lock_is_free(home, caplog):
    caplog.set_level(logging.WARNING, logger="llm_release.record.store")
    with store.transaction() as session:
        session.execute(text("SELECT 1"))
    assert not [r for r in caplog.records if WAITING in r.getMessage()]


def test_past_the_limit_the_wait_ends_in_sqlites_own_error(tmp_path, caplog):
    path = tmp_path / "record.db"
    other = holder(path)
    raw = sqlite3.connect(path, isolation_level=None)
    caplog.set_level(logging.WARNING, logger="llm_release.record.store")
    started = time.monotonic()
    got = store.begin_immediate(raw, str(path), limit_s=2.5, first_s=0.3, notice_s=1.0)
    assert got is False and time.monotonic() - started < 6
    assert len([r for r in caplog.records if WAITING in r.getMessage()]) >= 2
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        raw.execute("BEGIN IMMEDIATE")  # the caller's BEGIN: at once, SQLite's words
    other.rollback()
    assert store.begin_immediate(raw, str(path), limit_s=2.5) is True
    raw.rollback()


def test_the_engines_writer_past_the_limit_is_sqlalchemys_operational_error(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "SQLITE_BUSY_TIMEOUT_S", 1.0)
    monkeypatch.setattr(store.begin_immediate, "__defaults__", (1.0, 0.2, 30.0))
    path = tmp_path / "record.db"
    engine = store.create(f"sqlite:///{path}")
    other = holder(path)
    try:
        with pytest.raises(OperationalError, match="locked"), engine.begin() as connection:
            connection.execute(text("SELECT 1"))
    finally:
        other.close()
