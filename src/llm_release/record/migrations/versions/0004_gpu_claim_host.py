"""a GPU claim's host: the fleet host whose GPUs it holds

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-05 22:00:00

A record shared by several hosts (PostgreSQL) holds every host's claims; each host reads,
prunes and writes only its own (``LLM_RELEASE_HOST_NAME``), so host B never drops host A's
live claims as processes it cannot see. Claims recorded before it belong to the one host
without a name: ''.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gpu_claims") as batch:
        batch.add_column(sa.Column("host", sa.String(40), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("gpu_claims") as batch:
        batch.drop_column("host")
