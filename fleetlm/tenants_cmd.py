# `fleetlm tenants create|list|limits|keys|create-key|revoke-key`: tenant administration against
# the configured Postgres or a running `fleetlm serve`'s embedded one (--data-dir). A key is
# printed once, at creation; only its hash is stored. The key goes alone to stdout, so
# `KEY=$(fleetlm tenants create acme)` captures it, and the note about it to stderr.
from __future__ import annotations

import argparse
import json
import sys

from fleetlm.db_cmd import add_data_dir, session_for

LIMIT_FLAGS = (  # flag, priority, field
    ("max_concurrency", "interactive", "max_concurrency"),
    ("tpm", "interactive", "tokens_per_minute"),
    ("batch_max_concurrency", "batch", "max_concurrency"),
    ("batch_tpm", "batch", "tokens_per_minute"),
)


def _limit_value(text: str) -> int | None:
    if text in ("none", "unlimited"):
        return None
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("a limit is >= 0, or 'none'")
    return value


def _add_limit_flags(p: argparse.ArgumentParser) -> None:
    for flag, cls, field in LIMIT_FLAGS:
        what = "concurrent sequences" if field == "max_concurrency" else "tokens per minute"
        p.add_argument(
            "--" + flag.replace("_", "-"),
            type=_limit_value,
            default=argparse.SUPPRESS,
            help=f"{cls} {what} (a number, or 'none' for unlimited)",
        )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tenants", help="create tenants, set limits, manage API keys")
    cmds = p.add_subparsers(dest="tenants_command", required=True, metavar="ACTION")

    c = cmds.add_parser("create", help="create a tenant and print its API key (once)")
    c.add_argument("name")
    c.add_argument("--admin", action="store_true", help="the key may use admin endpoints")
    c.add_argument("--json", action="store_true", help='print {"tenant": ..., "api_key": ...}')
    _add_limit_flags(c)
    c.set_defaults(func=create)

    ls = cmds.add_parser("list", help="tenants and their active key counts")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=list_)

    lim = cmds.add_parser("limits", help="show a tenant's limits, or set them with flags")
    lim.add_argument("name", nargs="?", help="default: every tenant (show only)")
    lim.add_argument("--json", action="store_true")
    _add_limit_flags(lim)
    lim.set_defaults(func=limits)

    k = cmds.add_parser("keys", help="a tenant's keys (prefixes, never the keys)")
    k.add_argument("name")
    k.set_defaults(func=keys)

    ck = cmds.add_parser("create-key", help="another key for a tenant (printed once)")
    ck.add_argument("name")
    ck.add_argument("--admin", action="store_true")
    ck.add_argument("--json", action="store_true")
    ck.set_defaults(func=create_key)

    r = cmds.add_parser("revoke-key", help="revoke a key by its visible prefix (flm-xxxxxx)")
    r.add_argument("prefix")
    r.set_defaults(func=revoke)

    for parser in (c, ls, lim, k, ck, r):
        add_data_dir(parser)


def _apply_limits(session, tenant, args: argparse.Namespace) -> bool:
    from metering.tenants import set_limits

    given = False
    for flag, cls, field in LIMIT_FLAGS:
        if hasattr(args, flag):
            set_limits(session, tenant, cls, **{field: getattr(args, flag)})
            given = True
    return given


def _print_key(tenant: str, key: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"tenant": tenant, "api_key": key}))
    else:
        note = "store it now: it is not shown again (only its hash is kept)"
        # The note first: on a terminal the two read in order.
        print(f"tenant {tenant}: a new API key; {note}", file=sys.stderr, flush=True)
        print(key, flush=True)


def create(args: argparse.Namespace) -> int:
    from metering.tenants import TenantError, create_tenant

    try:
        with session_for(args) as session:
            tenant, key = create_tenant(session, args.name, admin=args.admin)
            _apply_limits(session, tenant, args)
    except TenantError as exc:
        raise SystemExit(f"fleetlm tenants: {exc}") from None
    _print_key(args.name, key, args.json)
    return 0


def create_key(args: argparse.Namespace) -> int:
    from metering.keys import create_api_key
    from metering.tenants import TenantError, tenant_by_name

    try:
        with session_for(args) as session:
            key = create_api_key(session, tenant_by_name(session, args.name), admin=args.admin)
    except TenantError as exc:
        raise SystemExit(f"fleetlm tenants: {exc}") from None
    _print_key(args.name, key, args.json)
    return 0


def list_(args: argparse.Namespace) -> int:
    from metering.tenants import list_tenants

    with session_for(args) as session:
        rows = list_tenants(session)
    if args.json:
        print(json.dumps(rows))
    else:
        print(f"{'tenant':<24} {'active keys':>11}  created")
        for r in rows:
            print(f"{r['tenant']:<24} {r['active_keys']:>11}  {r['created_at']}")
    return 0


def limits(args: argparse.Namespace) -> int:
    from metering.tenants import TenantError, list_limits, tenant_by_name

    try:
        with session_for(args) as session:
            if args.name is not None:
                _apply_limits(session, tenant_by_name(session, args.name), args)
            rows = list_limits(session, args.name)
    except TenantError as exc:
        raise SystemExit(f"fleetlm tenants: {exc}") from None
    if args.json:
        print(json.dumps([_row(r) for r in rows]))
        return 0
    print(f"{'tenant':<24} {'priority':<12} {'max concurrency':>15} {'tokens/min':>12}")
    for r in rows:
        conc = "-" if r.max_concurrency is None else r.max_concurrency
        tpm = "-" if r.tokens_per_minute is None else r.tokens_per_minute
        print(f"{r.tenant:<24} {r.priority:<12} {conc!s:>15} {tpm!s:>12}")
    return 0


def _row(r) -> dict:
    return {f: getattr(r, f) for f in r.__slots__}


def keys(args: argparse.Namespace) -> int:
    from metering.tenants import TenantError, list_keys

    try:
        with session_for(args) as session:
            rows = list_keys(session, args.name)
    except TenantError as exc:
        raise SystemExit(f"fleetlm tenants: {exc}") from None
    for k in rows:
        state = f"revoked {k.revoked_at:%Y-%m-%d}" if k.revoked_at else "active"
        used = f"{k.last_used_at:%Y-%m-%d %H:%M}" if k.last_used_at else "never"
        admin = " admin" if k.is_admin else ""
        print(f"{k.prefix}…  {state:<18} last used {used}{admin}")
    return 0


def revoke(args: argparse.Namespace) -> int:
    from metering.tenants import revoke_key
    from service.embedded import resolve_urls
    from service.redis_clients import UNREACHABLE, sync_redis
    from service.revocations import push_revoked
    from service.settings import Settings

    with session_for(args) as session:
        hashes = revoke_key(session, args.prefix)
    if not hashes:
        raise SystemExit(f"fleetlm tenants: no active key with prefix {args.prefix!r}")
    settings = Settings()
    try:
        redis_url = settings.redis_url or resolve_urls(settings, args.data_dir)[0]
        push_revoked(sync_redis(redis_url, settings), hashes)
    except (*UNREACHABLE, SystemExit) as exc:
        print(
            f"revoked {len(hashes)} key(s) in the database, but could not tell the API processes "
            f"through Redis ({exc}): they refuse it within FLEETLM_API_KEY_CACHE_S "
            f"({settings.api_key_cache_s:g} s) while Postgres answers, and may accept it from "
            f"their caches for up to FLEETLM_API_KEY_STALE_S ({settings.api_key_stale_s:g} s) "
            "while it does not",
            file=sys.stderr,
        )
        return 1
    print(f"revoked {len(hashes)} key(s); every API process refuses it from now on")
    return 0
