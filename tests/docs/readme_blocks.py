# The README's code blocks, as tests/docs/test_readme.py runs them. A ```console block is shell:
# each `$ ` line is a command (a line ending in `\` continues it), the lines after it up to the
# next `$ ` are its sample output. A ```python block is run whole with the shell's `python`.
# Other blocks (```text, bare ```) are never run. The line just above a block may say how:
#
#   <!-- readme-test: background (why) -->   run it in a terminal of its own (`make serve`)
#   <!-- readme-test: skip (why) -->         never run it; the test lists it as skipped, with why
#
# Keep skips rare: a block that needs a feature not built yet, or minutes of a GPU.
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

RUNNABLE = ("console", "python")
MARKER = re.compile(r"<!--\s*readme-test:\s*(\w+)\s*(?:\((.*)\))?\s*-->")
MODES = ("run", "skip", "background")


@dataclass(frozen=True)
class Command:
    text: str  # what the shell runs, continuation lines included
    sample: str  # the output shown under it (a sample: never compared verbatim)


@dataclass(frozen=True)
class Block:
    line: int  # 1-based, of the opening fence
    lang: str
    body: str
    mode: str = "run"
    reason: str = ""

    @property
    def name(self) -> str:
        return f"README.md:{self.line}"

    def commands(self) -> list[Command]:
        if self.lang != "console":
            return [Command(self.body, "")]
        commands: list[Command] = []
        text: list[str] = []
        sample: list[str] = []
        for line in self.body.splitlines():
            if text and text[-1].endswith("\\") and not sample:
                text.append(line)
            elif line.startswith("$ "):
                if text:
                    commands.append(Command("\n".join(text), "\n".join(sample)))
                text, sample = [line[2:]], []
            elif text:
                sample.append(line)
            elif line.strip():
                raise ValueError(f"{self.name}: a console line before any `$ ` command: {line}")
        if text:
            commands.append(Command("\n".join(text), "\n".join(sample)))
        return commands


def readme_blocks(path: Path) -> list[Block]:
    """Every runnable block of the file, in order, with its mode."""
    blocks: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.fullmatch(above.strip())
        mode, reason = (marker.group(1), marker.group(2) or "") if marker else ("run", "")
        if mode not in MODES:
            raise ValueError(f"README.md:{i + 1}: unknown readme-test mode {mode!r}")
        if marker and not reason:
            raise ValueError(f"README.md:{i + 1}: a readme-test marker says why, in parentheses")
        lang = fence.group(1)
        if lang in RUNNABLE:
            blocks.append(Block(i + 1, lang, "\n".join(lines[i + 1 : end]), mode, reason))
        elif marker:
            raise ValueError(f"README.md:{i + 1}: a readme-test marker on a block never run")
        i = end + 1
    return blocks
