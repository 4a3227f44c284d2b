"""a release's origin: its folder's recipe, calibration fingerprint, cache key and file hashes

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03 08:20:00

Recorded when a release is deployed (``registry.Origin``), so the lineage no longer reads
the worker's disk. Releases recorded before it keep NULL (their lineage reads the folder's
quantization record while it is there, and says what is missing when it is not).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("releases") as batch:
        batch.add_column(sa.Column("origin", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("releases") as batch:
        batch.drop_column("origin")
