"""a GPU claim's share: the part of each of its GPUs' memory the server holds

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-04 18:30:00

Servers whose gpu_memory_utilization adds up to at most ``gpus.SHARE_CAP`` share a GPU (the
stable release, its canary and a measured candidate on a one-GPU host). Claims recorded
before it held whole GPUs: 1.0.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gpu_claims") as batch:
        batch.add_column(sa.Column("share", sa.Float(), nullable=False, server_default="1.0"))


def downgrade() -> None:
    with op.batch_alter_table("gpu_claims") as batch:
        batch.drop_column("share")
