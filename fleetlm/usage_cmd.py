# `fleetlm usage --tenant T --from D --to D [--group-by day,model,priority] [--csv | --json]`:
# invoice lines from the raw usage rows, with the prices recorded on each row applied and cached
# input priced separately. --to is exclusive (UTC days).
from __future__ import annotations

import argparse
import json
from datetime import UTC, date, datetime, timedelta

from fleetlm.db_cmd import add_data_dir, session_for


def _groups(text: str) -> tuple[str, ...]:
    from metering.reports import GROUPS

    groups = tuple(g.strip() for g in text.split(",") if g.strip())
    bad = [g for g in groups if g not in GROUPS]
    if bad:
        raise argparse.ArgumentTypeError(f"group by one of {', '.join(GROUPS)}")
    return groups


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("usage", help="usage and cost per tenant (finance reports)")
    today = datetime.now(UTC).date()
    p.add_argument("--tenant", default=None, help="tenant name (default: every tenant)")
    p.add_argument("--from", dest="start", type=date.fromisoformat, default=today.replace(day=1))
    p.add_argument("--to", dest="end", type=date.fromisoformat, default=today + timedelta(days=1))
    p.add_argument("--group-by", type=_groups, default=("day",), help="day,model,priority,tenant")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true")
    fmt.add_argument("--json", action="store_true")
    add_data_dir(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from metering.pricing import format_micros
    from metering.reports import METRICS, to_csv, usage_lines
    from metering.tenants import TenantError, tenant_by_name

    groups = args.group_by
    if args.tenant is None and "tenant" not in groups:
        groups = ("tenant", *groups)
    try:
        with session_for(args) as session:
            tenant_id = tenant_by_name(session, args.tenant).id if args.tenant else None
            lines = usage_lines(
                session, start=args.start, end=args.end, group_by=groups, tenant_id=tenant_id
            )
    except TenantError as exc:
        raise SystemExit(f"fleetlm usage: {exc}") from None
    if args.json:
        print(json.dumps({"group_by": list(groups), "lines": lines}))
        return 0
    if args.csv:
        print(to_csv(lines, groups), end="")
        return 0
    head = [*groups, "requests", "input", "cached", "output", "input $", "cached $", "output $"]
    print("  ".join(f"{h:>12}" for h in [*head, "total"]))
    for line in lines:
        cells = [str(line[g]) for g in groups]
        cells += [
            str(line[m])
            for m in ("requests", "prompt_tokens", "cached_tokens", "completion_tokens")
        ]
        cells[len(groups) + 1] = str(line["prompt_tokens"] - line["cached_tokens"])
        cells += [format_micros(line[m]) for m in METRICS[4:]]
        print("  ".join(f"{c:>12}" for c in cells))
    total = sum(line["cost_micros"] for line in lines)
    print(f"total {format_micros(total)} over {sum(line['requests'] for line in lines)} requests")
    return 0
