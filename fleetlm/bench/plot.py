# The sweep's picture: interactive TTFT p95 and TPOT p95 against the offered rate, one line per
# backend (served, bare engine), the targets drawn in and each goodput marked.
from __future__ import annotations

from pathlib import Path


def plot_sweeps(sweeps: dict[str, dict], targets, path: Path, title: str) -> bool:
    """Writes a PNG; False (and nothing written) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (ax_ttft, ax_tpot) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, sweep in sweeps.items():
        runs = sweep["runs"]
        rates = [r["rate"] for r in runs]
        inter = [r["report"]["interactive"] for r in runs]
        ttft = [x["ttft_short_prompts_s"]["p95"] for x in inter]
        tpot = [1e3 * x["tpot_s"]["p95"] for x in inter]
        ax_ttft.plot(rates, ttft, marker="o", label=name)
        ax_tpot.plot(rates, tpot, marker="o", label=name)
        if sweep["goodput_rate"]:
            for ax in (ax_ttft, ax_tpot):
                ax.axvline(sweep["goodput_rate"], linestyle=":", alpha=0.6)
    ax_ttft.axhline(targets.ttft_s, color="red", linestyle="--", label="target")
    ax_tpot.axhline(1e3 * targets.tpot_s, color="red", linestyle="--", label="target")
    ax_ttft.set(
        xlabel="offered rate (req/s)",
        ylabel="s",
        title=f"interactive TTFT p95 (prompts < {targets.ttft_max_prompt_tokens})",
    )
    ax_tpot.set(xlabel="offered rate (req/s)", ylabel="ms", title="interactive TPOT p95")
    for ax in (ax_ttft, ax_tpot):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
