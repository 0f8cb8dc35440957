"""usage_records: speculative-decoding draft tokens proposed and accepted per request

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for name in ("spec_proposed_tokens", "spec_accepted_tokens"):
        op.add_column(
            "usage_records",
            sa.Column(name, sa.Integer(), nullable=False, server_default=sa.text("0")),
        )


def downgrade() -> None:
    for name in ("spec_accepted_tokens", "spec_proposed_tokens"):
        op.drop_column("usage_records", name)
