"""v_monthly_bill: the column `class` is `priority`, the name used everywhere else

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute('ALTER TABLE v_monthly_bill RENAME COLUMN "class" TO priority')


def downgrade() -> None:
    op.execute('ALTER TABLE v_monthly_bill RENAME COLUMN priority TO "class"')
