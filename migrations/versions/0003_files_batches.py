"""files (bytes in Postgres), batches and their per-line requests

Revision ID: 0003
Revises: 0002
Create Date: 2025-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
STAGES = (
    "in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled",
)  # fmt: skip


def upgrade() -> None:
    op.create_table(
        "files",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("tenant_id", sa.Uuid, sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("filename", sa.String(500), nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("content", sa.LargeBinary, nullable=False),
        sa.Column("created_at", TS, server_default=sa.func.now(), nullable=False),
        sa.Column("deleted_at", TS),
    )
    op.create_index("ix_files_tenant_id", "files", ["tenant_id"])
    zero = sa.text("0")
    op.create_table(
        "batches",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("tenant_id", sa.Uuid, sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("key_id", sa.Uuid, nullable=False),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("input_file_id", sa.String(64), nullable=False),
        sa.Column("completion_window", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("metadata", sa.JSON),
        sa.Column("errors", sa.JSON),
        sa.Column("output_file_id", sa.String(64)),
        sa.Column("error_file_id", sa.String(64)),
        *(
            sa.Column(name, sa.Integer, server_default=zero, nullable=False)
            for name in ("total", "completed", "failed")
        ),
        *(
            sa.Column(name, sa.BigInteger, server_default=zero, nullable=False)
            for name in ("input_tokens", "cached_tokens", "output_tokens")
        ),
        sa.Column("expiring", sa.Boolean, server_default=sa.false(), nullable=False),
        sa.Column("pump_token", sa.String(32)),
        sa.Column("pumped_at", TS),
        sa.Column("created_at", TS, server_default=sa.func.now(), nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        *(sa.Column(f"{name}_at", TS) for name in STAGES),
    )
    op.create_index("ix_batches_status", "batches", ["status"])
    op.create_index("ix_batches_tenant_id_created_at", "batches", ["tenant_id", "created_at"])
    op.create_table(
        "batch_requests",
        sa.Column("batch_id", sa.String(64), sa.ForeignKey("batches.id"), primary_key=True),
        sa.Column("line_no", sa.Integer, primary_key=True),
        sa.Column("custom_id", sa.String(500), nullable=False),
        sa.Column("request_id", sa.String(100), nullable=False),
        sa.Column("body", sa.JSON, nullable=False),
        sa.Column("state", sa.String(16), server_default="pending", nullable=False),
        sa.Column("entry_id", sa.String(32)),
        sa.Column("status_code", sa.Integer),
        sa.Column("response", sa.JSON),
        sa.Column("error", sa.JSON),
        *(
            sa.Column(name, sa.Integer, server_default=zero, nullable=False)
            for name in ("prompt_tokens", "cached_tokens", "completion_tokens")
        ),
        sa.Column("note", sa.Text),
        sa.UniqueConstraint("request_id", name=op.f("uq_batch_requests_request_id")),
    )
    op.create_index("ix_batch_requests_batch_id_state", "batch_requests", ["batch_id", "state"])


def downgrade() -> None:
    op.drop_table("batch_requests")
    op.drop_table("batches")
    op.drop_table("files")
