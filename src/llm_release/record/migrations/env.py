"""Alembic's environment for the record: run by ``store.migrate`` on the connection it
passes (``config.attributes["connection"]``), inside that connection's transaction."""

from __future__ import annotations

from alembic import context

from llm_release.record.schema import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    # SQLite changes a table by copying it (ALTER TABLE is limited there).
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
