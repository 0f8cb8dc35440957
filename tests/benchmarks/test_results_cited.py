# benchmarks/results/ keeps only what is cited: every file's name appears in the docs (today's
# figures in docs/benchmarks.md, their history in docs/benchmarks-log.md), the README or a
# benchmark script or job. A result nobody cites is removed (git keeps it). Names are matched
# whole, so a glob such as `nano_8b_h200_run16_*.json` does not count: spell the files out.
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
CURRENT_FIGURES_MAX_LINES = 400


def citing_text() -> str:
    sources = [
        *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "README.md",
        *sorted((ROOT / "benchmarks").rglob("*.py")),
        *sorted((ROOT / "benchmarks" / "jobs").glob("*.sh")),
    ]
    return "\n".join(path.read_text(encoding="utf-8") for path in sources)


def test_every_result_file_is_cited():
    text = citing_text()
    uncited = sorted(
        str(path.relative_to(RESULTS))
        for path in RESULTS.rglob("*")
        if path.is_file() and path.name not in text
    )
    assert not uncited, f"cite these in docs/benchmarks*.md or git rm them: {uncited}"


def test_current_figures_stay_one_page():
    lines = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8").count("\n")
    assert lines <= CURRENT_FIGURES_MAX_LINES, (
        f"docs/benchmarks.md has {lines} lines: move superseded figures to docs/benchmarks-log.md"
    )
