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
