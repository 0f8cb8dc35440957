# One `fleetlm` command; each subcommand lives in its own module and registers itself here.
# Modules are imported lazily so `fleetlm --help` and light subcommands never load torch.
from __future__ import annotations

import argparse
import importlib
import sys

# subcommand → module exposing `register(subparsers)`; the registered parser sets `func`.
SUBCOMMANDS = {
    "generate": "fleetlm.generate_cmd",
    "plan": "fleetlm.plan_cmd",
    "bench": "fleetlm.bench_cmd",
    "serve": "fleetlm.serve_cmd",
    "api": "fleetlm.api_cmd",
    "worker": "fleetlm.worker_cmd",
    "migrate": "fleetlm.migrate_cmd",
    "metering": "fleetlm.metering_cmd",
    "tenants": "fleetlm.tenants_cmd",
    "prices": "fleetlm.prices_cmd",
    "usage": "fleetlm.usage_cmd",
    "celery": "fleetlm.celery_cmd",
    "batches": "fleetlm.batches_cmd",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """All subcommands, or only `command`'s (its module's imports alone: `fleetlm bench` runs
    where the serving stack's database packages are not installed, e.g. a bare GPU box)."""
    parser = argparse.ArgumentParser(prog="fleetlm", description="Self-hosted LLM serving.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in SUBCOMMANDS.items():
        if command is None or name == command:
            importlib.import_module(module_name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    args = build_parser(command).parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
