# Prices and cost arithmetic, all in integers: a price is micro-units (1e-6 of the currency) per
# million tokens; a request's cost per token kind is rounded half-up to a whole micro-unit.
from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from decimal import Decimal

from sqlalchemy import select
from sqlalchemy.orm import Session

from metering.models import Price

MICROS_PER_UNIT = 1_000_000
TOKENS_PER_PRICE = 1_000_000  # prices are per million tokens
TOKEN_KINDS = ("input", "cached_input", "output")
ANY_MODEL = "*"  # fallback price list for models without their own


@dataclass(frozen=True, slots=True)
class PriceSet:
    version: date | None  # the latest effective_from among the prices used; None: unpriced
    input: int = 0  # micro-units per million tokens
    cached_input: int = 0
    output: int = 0


@dataclass(frozen=True, slots=True)
class Cost:
    input: int  # micro-units, uncached prompt tokens
    cached_input: int
    output: int

    @property
    def total(self) -> int:
        return self.input + self.cached_input + self.output


def token_cost(num_tokens: int, micros_per_mtok: int) -> int:
    """Round half-up, in integers: (n × price + 500_000) // 1_000_000."""
    return (num_tokens * micros_per_mtok + TOKENS_PER_PRICE // 2) // TOKENS_PER_PRICE


def price_request(prompt: int, cached: int, completion: int, prices: PriceSet) -> Cost:
    # cached tokens are part of the prompt; they are billed at the cached rate instead
    return Cost(
        input=token_cost(prompt - cached, prices.input),
        cached_input=token_cost(cached, prices.cached_input),
        output=token_cost(completion, prices.output),
    )


def to_micros(amount: str | Decimal) -> int:
    """'0.15' (currency units) → 150000, exactly; rejects sub-micro precision."""
    micros = Decimal(amount) * MICROS_PER_UNIT
    if micros != micros.to_integral_value() or micros < 0:
        raise ValueError(f"{amount}: a price is a non-negative amount with at most 6 decimals")
    return int(micros)


def format_micros(micros: int) -> str:
    sign = "-" if micros < 0 else ""
    units, rest = divmod(abs(micros), MICROS_PER_UNIT)
    return f"{sign}{units}.{rest:06d}"


def prices_in_force(session: Session, model: str, day: date) -> PriceSet:
    """Per kind, the newest price effective on `day`; the model's own list wins over '*'."""
    rows = session.execute(
        select(Price.model, Price.token_kind, Price.micros_per_mtok, Price.effective_from)
        .where(Price.model.in_((model, ANY_MODEL)), Price.effective_from <= day)
        .order_by(Price.effective_from.desc())
    ).all()
    for candidate in (model, ANY_MODEL):
        chosen: dict[str, tuple[int, date]] = {}
        for row_model, kind, micros, effective in rows:
            if row_model == candidate and kind not in chosen:
                chosen[kind] = (micros, effective)
        if chosen:
            return PriceSet(
                version=max(e for _, e in chosen.values()),
                **{k: m for k, (m, _) in chosen.items()},
            )
    return PriceSet(version=None)


def set_price(session: Session, model: str, kind: str, micros_per_mtok: int, effective: date):
    if kind not in TOKEN_KINDS:
        raise ValueError(f"token kind must be one of {TOKEN_KINDS}")
    price = Price(
        model=model, token_kind=kind, micros_per_mtok=micros_per_mtok, effective_from=effective
    )
    session.add(price)
    session.flush()
    return price
