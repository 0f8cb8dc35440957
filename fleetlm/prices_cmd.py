# `fleetlm prices set MODEL --input X --cached-input Y --output Z [--from DAY]` (currency units
# per million tokens, stored exactly as integer micro-units) and `fleetlm prices list`. Prices
# are append-only; a usage row records the version it was priced with. MODEL '*' is the fallback.
from __future__ import annotations

import argparse
from datetime import UTC, date, datetime

from fleetlm.db_cmd import add_data_dir, session_for


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prices", help="per-model token prices (per million tokens)")
    cmds = p.add_subparsers(dest="prices_command", required=True, metavar="ACTION")
    s = cmds.add_parser("set", help="prices in force from a UTC day on")
    s.add_argument("model", help="served model name, or '*' for every other model")
    s.add_argument("--input", required=True, help="per million uncached prompt tokens")
    s.add_argument("--cached-input", required=True, help="per million cached prompt tokens")
    s.add_argument("--output", required=True, help="per million completion tokens")
    s.add_argument("--from", dest="effective", type=date.fromisoformat, default=None)
    s.set_defaults(func=set_)
    ls = cmds.add_parser("list")
    ls.set_defaults(func=list_)
    for parser in (s, ls):
        add_data_dir(parser)


def set_(args: argparse.Namespace) -> int:
    from metering.pricing import set_price, to_micros

    effective = args.effective or datetime.now(UTC).date()
    try:
        amounts = {
            "input": to_micros(args.input),
            "cached_input": to_micros(args.cached_input),
            "output": to_micros(args.output),
        }
    except (ValueError, ArithmeticError) as exc:
        raise SystemExit(f"fleetlm prices: {exc}") from None
    with session_for(args) as session:
        for kind, micros in amounts.items():
            set_price(session, args.model, kind, micros, effective)
    print(f"prices for {args.model} in force from {effective}")
    return 0


def list_(args: argparse.Namespace) -> int:
    from sqlalchemy import select

    from metering.models import Price
    from metering.pricing import format_micros

    with session_for(args) as session:
        rows = session.scalars(
            select(Price).order_by(Price.model, Price.effective_from, Price.token_kind)
        ).all()
        for r in rows:
            print(
                f"{r.model:<24} {r.effective_from}  {r.token_kind:<13}"
                f" {format_micros(r.micros_per_mtok)} per 1M tokens"
            )
    return 0
