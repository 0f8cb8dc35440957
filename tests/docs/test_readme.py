# The README runs as written, in order, from a fresh clone: its blocks (tests/docs/readme_blocks.py)
# run in a copy of the repository root whose entries link to this one's (a .venv built, no
# .fleetlm), the background block (`make serve`) in a terminal of its own, the rest one command at
# a time in one shell that keeps its variables, as a person's second terminal would. Two things
# differ from a person's run: the port (a free one; the commands' `:8000` is rewritten to it) and
# the environment, which keeps none of this session's FLEETLM_*, REDIS_URL, DATABASE_URL,
# XDG_RUNTIME_DIR or activated .venv. A command passes when it exits 0, prints something where
# the README shows output, and prints JSON with the sample's keys and no "error" where the sample
# is JSON. At the end the serve console must have said "ready", carry no warnings and no periodic
# lines, and stop on Ctrl-C.
from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docs.readme_blocks import Block, Command, readme_blocks
from tests.e2e.conftest import free_port
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = readme_blocks(ROOT / "README.md")
COMMAND_TIMEOUT_S = 600.0  # the first is `until /ready`: a whole `fleetlm serve` start-up
SWEEP_S = 5.0  # Settings.batch_sweep_s: the console stays quiet over two of them
NOT_LINKED = {".fleetlm", ".git", ".pytest_cache", ".ruff_cache"}


@dataclass
class Ran:
    rc: int
    out: str
    err: str


class Shell:
    """One bash that reads commands from a pipe and keeps its variables between them."""

    def __init__(self, cwd: Path, env: dict[str, str], scratch: Path) -> None:
        self.scratch = scratch
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)

    def run(self, command: str, timeout_s: float, serving: Callable[[], bool] | None = None) -> Ran:
        """Runs one command; fails early once `serving` says the server it waits on is gone."""
        tag = uuid.uuid4().hex
        out, err = self.scratch / f"{tag}.out", self.scratch / f"{tag}.err"
        # Braces, not a subshell: `source` and `KEY=$(...)` must outlive the command.
        self.proc.stdin.write(f"{{ {command}\n}} </dev/null >{out} 2>{err}\necho {tag} $?\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise AssertionError(f"no end in {timeout_s:.0f}s: {command}") from None
                if serving is not None and not serving():
                    raise AssertionError(f"the server exited while running: {command}") from None
                continue
            if line.startswith(tag):
                return Ran(int(line.split()[1]), out.read_text(), err.read_text())

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@dataclass
class Session:
    clone: Path
    env: dict[str, str]
    port: int
    shell: Shell
    console: Path
    serve: subprocess.Popen | None = None
    ready_at: float | None = None

    def serving(self) -> bool:
        return self.serve is None or self.serve.poll() is None

    def as_here(self, text: str) -> str:
        return text.replace(":8000", f":{self.port}")

    def console_text(self) -> str:
        return self.console.read_text(errors="replace")


def fresh_clone(root: Path) -> Path:
    clone = root / "fleetlm"
    clone.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in NOT_LINKED:
            (clone / entry.name).symlink_to(entry)
    return clone


def clean_env(port: int) -> dict[str, str]:
    venv_bin = str(ROOT / ".venv" / "bin")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("FLEETLM_")
        and k not in ("REDIS_URL", "DATABASE_URL", "XDG_RUNTIME_DIR", "VIRTUAL_ENV", "PYTHONPATH")
    }
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env["FLEETLM_PORT"] = str(port)
    return env


@pytest.fixture(scope="module")
def session():
    # Not under pytest's basetemp: see tests/conftest.py (pgserver's user must reach it).
    root = Path(tempfile.mkdtemp(prefix="fleetlm-readme-"))
    clone = fresh_clone(root)
    port = free_port()
    env = clean_env(port)
    stale = subprocess.run(["make", "-q", ".venv/.installed"], cwd=clone, env=env)
    if stale.returncode != 0:
        pytest.fail("the .venv is older than pyproject.toml: run `make install` first")
    scratch = root / "scratch"
    scratch.mkdir()
    s = Session(clone, env, port, Shell(clone, env, scratch), root / "serve-console.log")
    s.console.touch()
    try:
        yield s
    finally:
        s.shell.close()
        if s.serve is not None and s.serve.poll() is None:
            os.killpg(s.serve.pid, signal.SIGKILL)
            s.serve.wait()
        shutil.rmtree(root, ignore_errors=True)


def check(command: Command, ran: Ran) -> list[str]:
    """What is wrong with a command's run, judged against the sample under it."""
    problems = []
    if ran.rc != 0:
        problems.append(f"exit status {ran.rc}")
    if command.sample.strip() and not (ran.out.strip() or ran.err.strip()):
        problems.append("no output where the README shows some")
    out = ran.out.strip()
    first = out.splitlines()[0] if out else ""  # a block may print several results, a line each
    if first.startswith("{"):
        try:
            body = json.loads(first)
        except json.JSONDecodeError:
            problems.append("output that starts like JSON but is not")
        else:
            if isinstance(body, dict) and "error" in body:
                problems.append(f"an error: {body['error']}")
    missing = [k for k in re.findall(r'"(\w+)":', command.sample) if f'"{k}":' not in out]
    if missing:
        problems.append(f"keys the sample shows are missing: {sorted(set(missing))}")
    return problems


def run_block(s: Session, block: Block) -> None:
    for command in block.commands():
        text = s.as_here(command.text)
        if block.lang == "python":
            text = f"python - <<'__README_PY__'\n{text}\n__README_PY__"
        ran = s.shell.run(text, COMMAND_TIMEOUT_S, s.serving)
        problems = check(command, ran)
        assigned = re.match(r"(\w+)=\$\(", command.text)
        if assigned and not s.shell.run(f'printf %s "${assigned[1]}"', 30).out:
            problems.append(f"${assigned[1]} is empty")
        if problems:
            raise AssertionError(
                f"{block.name}: `{command.text}`: {'; '.join(problems)}\n"
                f"stdout: {ran.out[-3000:]}\nstderr: {ran.err[-3000:]}\n"
                f"serve console: {s.console_text()[-3000:]}"
            )
        if "/ready" in command.text:
            s.ready_at = time.monotonic()


def start_background(s: Session, block: Block) -> None:
    assert s.serve is None, "one background block: the server"
    script = "\n".join(s.as_here(c.text) for c in block.commands())
    with open(s.console, "ab") as console:
        s.serve = subprocess.Popen(
            ["bash", "-c", script],
            cwd=s.clone,
            env=s.env,
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: Ctrl-C reaches all of it
        )


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_block(session: Session, block: Block) -> None:
    if block.mode == "skip":
        pytest.skip(f"{block.name}: {block.reason}")
    if block.mode == "background":
        start_background(session, block)
    else:
        run_block(session, block)


def test_opt_outs_stay_rare() -> None:
    skipped = [b for b in BLOCKS if b.mode == "skip"]
    assert len(skipped) <= 3, f"more README blocks opt out than run: {[b.name for b in skipped]}"
    assert any(b.mode == "run" and "/ready" in b.body for b in BLOCKS), "the tour waits on /ready"


def test_serve_console_is_quiet_and_stops_on_ctrl_c(session: Session) -> None:
    """Run last: the console of `make serve` after the whole tour."""
    assert session.serve is not None and session.ready_at is not None, "the tour did not run"
    # Idle for two sweep periods at least (the tour itself usually took longer).
    wait_until(lambda: time.monotonic() - session.ready_at > 2 * SWEEP_S + 1, 30, "two sweeps")
    console = session.console_text()
    for line in ("fleetlm: API up", "fleetlm: Celery worker and beat up", "fleetlm: ready: 1"):
        assert line in console, f"no {line!r} line:\n{console[-4000:]}"
    # No warning but an API event-loop stall (api/loop_watch.py): that one reports what this
    # machine did to the process (a busy 2-core machine may hold it for a second), not the
    # settings or the code, and is an operator's to see where it happens.
    warnings = [
        line for line in console.splitlines()
        if ("Warning" in line or "WARNING" in line) and "event loop stalled" not in line
    ]  # fmt: skip
    assert not warnings, console[-4000:]
    assert "sweep" not in console, f"periodic lines at the default level:\n{console[-4000:]}"
    os.killpg(session.serve.pid, signal.SIGINT)  # Ctrl-C in its terminal
    wait_until(lambda: session.serve.poll() is not None, 120, "make serve to stop on Ctrl-C")
    assert "fleetlm: stopped" in session.console_text(), session.console_text()[-4000:]
