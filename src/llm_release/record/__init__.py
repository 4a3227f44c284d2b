"""The durable release record: releases with their slots and states, decisions,
measurements, rollout steps with their analysis windows, and GPU claims, in one database
through SQLAlchemy 2 (``schema.py``), migrated by Alembic (``migrations/``) at first use
(``store.py``). An SQLite file under the project home by default; PostgreSQL by URL
(``LLM_RELEASE_DATABASE_URL``). The first start on a project home that has the old JSON
files imports them once (``legacy.py``).

This room sits below every other: it imports only the base modules (errors, settings,
paths), so the registry, the decision room and the serving room can all write to it.
"""
