"""The record's schema and its migrations agree: the newest revision is ``store.HEAD`` (the
fast path that opens a current record without Alembic), and a database migrated to it has
exactly the tables and columns of ``schema.py`` (Alembic's autogenerate finds nothing to do)."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from llm_release.record import store
from llm_release.record.schema import Base


def test_head_is_the_newest_revision():
    assert ScriptDirectory.from_config(store.alembic_config()).get_current_head() == store.HEAD


def test_the_migrated_database_is_the_schema(tmp_path):
    engine = store.create(f"sqlite:///{tmp_path / 'record.db'}")
    store.migrate(engine, home=tmp_path)
    with engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
        assert connection.exec_driver_sql("SELECT name FROM slots ORDER BY name").all() == [
            ("canary",),
            ("stable",),
        ]


def test_a_record_of_a_newer_version_is_refused_in_one_line_and_down_still_runs(
    tmp_path, monkeypatch, capsys
):
    """issue 36: a record at an unknown migration made every command fail with
    "unexpected CommandError", and 'down' then stopped nothing."""
    import pytest

    from llm_release.cli import main
    from llm_release.errors import StateError

    home = tmp_path / "home"
    monkeypatch.setenv("LLM_RELEASE_HOME", str(home))
    monkeypatch.delenv("LLM_RELEASE_DATABASE_URL", raising=False)
    url = store.database_url()
    engine = store.create(url)
    store.migrate(engine, home=home)
    with engine.begin() as connection:
        connection.exec_driver_sql("UPDATE alembic_version SET version_num = '0099'")
    store._engines.clear()
    with pytest.raises(StateError) as refused:
        store.migrate(store.create(url), home=home)
    assert "schema revision '0099'" in refused.value.message
    assert "does not know" in refused.value.message
    assert main(["down"]) == 1
    out, err = capsys.readouterr()
    assert out.startswith("stopped: ")
    assert len(err.strip().splitlines()) == 1 and "schema revision '0099'" in err, err
    store._engines.clear()


def test_a_record_its_group_or_others_could_read_is_made_private_and_logged(
    tmp_path, monkeypatch, caplog
):
    """A record.db made world-readable (an older version, a copy by hand) is made 0600 with
    its WAL at the next open, and the log says so (issue 36, low)."""
    import os
    import stat

    from llm_release import registry

    monkeypatch.setenv("LLM_RELEASE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LLM_RELEASE_DATABASE_URL", raising=False)
    registry.save(registry.RegistryState(router_port=18080))
    db = tmp_path / "home" / "record.db"
    wal = tmp_path / "home" / "record.db-wal"
    wal.write_bytes(b"")
    os.chmod(db, 0o644)
    os.chmod(wal, 0o666)
    monkeypatch.setattr(store, "_engines", {})  # the next process, which opens it anew
    with caplog.at_level("WARNING"):
        assert registry.load().router_port == 18080
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert not wal.exists() or stat.S_IMODE(wal.stat().st_mode) == 0o600  # gone at close
    assert "record.db was mode 0644" in caplog.text
    assert "record.db-wal was mode 0666" in caplog.text and "made 0600" in caplog.text


def test_the_sqlite_record_and_its_wal_are_private_whatever_the_umask(tmp_path, monkeypatch):
    """record.db holds the registry, judgements and measurements: 0600, as are the WAL and
    shared-memory files SQLite makes beside it (they take the database file's mode)."""
    import os
    import stat

    from llm_release import registry

    monkeypatch.setenv("LLM_RELEASE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LLM_RELEASE_DATABASE_URL", raising=False)
    old = os.umask(0o022)
    try:
        registry.save(registry.RegistryState(router_port=18080))
        with store.transaction() as session:  # held open: the WAL and -shm exist now
            session.execute(store.text("SELECT 1"))
            made = sorted((tmp_path / "home").glob("record.db*"))
            modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in made}
    finally:
        os.umask(old)
    assert {"record.db", "record.db-wal", "record.db-shm"} <= set(modes), modes
    assert set(modes.values()) == {0o600}, modes
    assert registry.load().router_port == 18080
