"""limits, admin keys, prices, usage records, daily rollups, worker busy time, finance views

Revision ID: 0002
Revises: 0001
Create Date: 2025-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)

VIEWS = {
    # Raw rows with the tenant's name and cost in currency units, for psql.
    "v_usage_records": """
        SELECT t.name AS tenant, u.*, u.cost_micros / 1e6 AS cost
        FROM usage_records u JOIN tenants t ON t.id = u.tenant_id
    """,
    # One invoice line per tenant × UTC month × model × class, from the raw rows.
    "v_monthly_bill": """
        SELECT t.name AS tenant,
               date_trunc('month', u.created_at AT TIME ZONE 'UTC')::date AS month,
               u.model, u.priority AS class,
               count(*) AS requests,
               sum(u.prompt_tokens - u.cached_tokens) AS input_tokens,
               sum(u.cached_tokens) AS cached_tokens,
               sum(u.completion_tokens) AS output_tokens,
               sum(u.input_cost_micros) AS input_cost_micros,
               sum(u.cached_input_cost_micros) AS cached_input_cost_micros,
               sum(u.output_cost_micros) AS output_cost_micros,
               sum(u.cost_micros) AS cost_micros
        FROM usage_records u JOIN tenants t ON t.id = u.tenant_id
        GROUP BY 1, 2, 3, 4
    """,
}


def upgrade() -> None:
    op.add_column(
        "api_keys", sa.Column("is_admin", sa.Boolean(), server_default="false", nullable=False)
    )
    op.create_table(
        "tenant_limits",
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("priority", sa.String(16), nullable=False),
        sa.Column("max_concurrency", sa.Integer(), nullable=True),
        sa.Column("tokens_per_minute", sa.BigInteger(), nullable=True),
        sa.Column("updated_at", TS, server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "priority", name=op.f("pk_tenant_limits")),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_tenant_limits_tenant_id_tenants")
        ),
        sa.CheckConstraint(
            "priority IN ('interactive', 'batch')", name=op.f("ck_tenant_limits_priority")
        ),
    )
    op.create_table(
        "prices",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("token_kind", sa.String(16), nullable=False),
        sa.Column("micros_per_mtok", sa.BigInteger(), nullable=False),
        sa.Column("effective_from", sa.Date(), nullable=False),
        sa.Column("created_at", TS, server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_prices")),
        sa.UniqueConstraint("model", "token_kind", "effective_from", name=op.f("uq_prices_model")),
        sa.CheckConstraint(
            "token_kind IN ('input', 'cached_input', 'output')", name=op.f("ck_prices_token_kind")
        ),
        sa.CheckConstraint("micros_per_mtok >= 0", name=op.f("ck_prices_non_negative")),
    )
    op.create_table(
        "usage_records",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("request_id", sa.String(100), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("key_id", sa.Uuid(), nullable=True),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("priority", sa.String(16), nullable=False),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("batch_id", sa.String(100), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("finish_reason", sa.String(16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("preemptions", sa.Integer(), nullable=False),
        sa.Column("queue_ms", sa.Float(), nullable=True),
        sa.Column("ttft_ms", sa.Float(), nullable=True),
        sa.Column("tpot_ms", sa.Float(), nullable=True),
        sa.Column("e2e_ms", sa.Float(), nullable=True),
        sa.Column("worker_id", sa.String(200), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("finished_at", TS, nullable=False),
        sa.Column("price_version", sa.Date(), nullable=True),
        sa.Column("input_cost_micros", sa.BigInteger(), nullable=False),
        sa.Column("cached_input_cost_micros", sa.BigInteger(), nullable=False),
        sa.Column("output_cost_micros", sa.BigInteger(), nullable=False),
        sa.Column("cost_micros", sa.BigInteger(), nullable=False),
        sa.Column("written_at", TS, server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_usage_records")),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_usage_records_tenant_id_tenants")
        ),
        sa.UniqueConstraint("request_id", name=op.f("uq_usage_records_request_id")),
    )
    op.create_index(
        "ix_usage_records_tenant_id_created_at", "usage_records", ["tenant_id", "created_at"]
    )
    op.create_table(
        "usage_daily",
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("priority", sa.String(16), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cached_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_micros", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", TS, server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint(
            "day", "tenant_id", "model", "priority", name=op.f("pk_usage_daily")
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_usage_daily_tenant_id_tenants")
        ),
    )
    op.create_table(
        "worker_busy",
        sa.Column("worker_id", sa.String(200), nullable=False),
        sa.Column("interval_start", TS, nullable=False),
        sa.Column("interval_s", sa.Integer(), nullable=False),
        sa.Column("busy_ms", sa.BigInteger(), nullable=False),
        sa.Column("num_steps", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("worker_id", "interval_start", name=op.f("pk_worker_busy")),
    )
    for name, sql in VIEWS.items():
        op.execute(f"CREATE VIEW {name} AS {sql}")


def downgrade() -> None:
    for name in reversed(VIEWS):
        op.execute(f"DROP VIEW {name}")
    op.drop_table("worker_busy")
    op.drop_table("usage_daily")
    op.drop_index("ix_usage_records_tenant_id_created_at", table_name="usage_records")
    op.drop_table("usage_records")
    op.drop_table("prices")
    op.drop_table("tenant_limits")
    op.drop_column("api_keys", "is_admin")
