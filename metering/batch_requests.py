# A batch's lines (batch_requests rows) as the batch pump reads and writes them. Services never
# commit; the pump's transaction does.
from __future__ import annotations

import secrets
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from metering.batch_input import InputLine
from metering.batch_models import Batch, BatchRequest


@dataclass(frozen=True, slots=True)
class StateTotals:
    """One state's lines and the tokens they used."""

    lines: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


def add_lines(session: Session, batch: Batch, lines: list[InputLine]) -> None:
    session.add_all(
        BatchRequest(
            batch_id=batch.id,
            line_no=line.line_no,
            custom_id=line.custom_id,
            request_id=f"batch_req_{secrets.token_hex(12)}",
            body=line.body,
            state="pending",
        )
        for line in lines
    )


def lines_in_state(
    session: Session, batch: Batch, state: str, limit: int | None = None
) -> list[BatchRequest]:
    """In input order; at most `limit`."""
    query = (
        select(BatchRequest)
        .where(BatchRequest.batch_id == batch.id, BatchRequest.state == state)
        .order_by(BatchRequest.line_no)
    )
    return list(session.scalars(query.limit(limit) if limit else query))


def count_in_state(session: Session, batch: Batch, state: str) -> int:
    return session.scalar(
        select(func.count())
        .select_from(BatchRequest)
        .where(BatchRequest.batch_id == batch.id, BatchRequest.state == state)
    )


def totals_by_state(session: Session, batch: Batch) -> dict[str, StateTotals]:
    rows = session.execute(
        select(
            BatchRequest.state,
            func.count(),
            func.coalesce(func.sum(BatchRequest.prompt_tokens), 0),
            func.coalesce(func.sum(BatchRequest.cached_tokens), 0),
            func.coalesce(func.sum(BatchRequest.completion_tokens), 0),
        )
        .where(BatchRequest.batch_id == batch.id)
        .group_by(BatchRequest.state)
    ).all()
    return {state: StateTotals(*sums) for state, *sums in rows}


def all_lines(session: Session, batch: Batch) -> list[BatchRequest]:
    """Every line, in input order."""
    query = select(BatchRequest).where(BatchRequest.batch_id == batch.id)
    return list(session.scalars(query.order_by(BatchRequest.line_no)))
