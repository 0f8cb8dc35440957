# The API process never imports torch (it tokenizes with engine.tokenizer), and the CLI's
# serving subcommands stay light to import.
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import sys
import api.main, fleetlm.cli
from service.settings import Settings
from engine.tokenizer import Tokenizer
app = api.main.create_app(Settings(), "redis://127.0.0.1:1/0", "postgresql://u@127.0.0.1:1/db")
Tokenizer.for_model("tiny").apply_chat_template([{"role": "user", "content": "hi"}])
Settings().resolved_max_model_len()
fleetlm.cli.build_parser()
heavy = sorted(m for m in ("torch", "triton", "engine.llm_engine") if m in sys.modules)
assert not heavy, heavy
"""


def test_api_and_cli_do_not_import_torch():
    subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, check=True, timeout=60)


BENCH_ALONE = """
import sys
import fleetlm.cli
parser = fleetlm.cli.build_parser("bench")
parser.parse_args(["bench", "engine", "--workload", "seed"])
loaded = sorted(m for m in ("sqlalchemy", "redis", "celery", "fastapi") if m in sys.modules)
assert not loaded, loaded
"""


def test_bench_subcommand_needs_no_serving_packages():
    # `fleetlm bench` on a GPU box that has torch but not the database / queue packages.
    subprocess.run([sys.executable, "-c", BENCH_ALONE], cwd=ROOT, check=True, timeout=60)
