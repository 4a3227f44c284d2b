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
