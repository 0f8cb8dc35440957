# Graph pieces (engine/runner/piecewise_graphs.py) on a CPU runner, run eagerly through their static
# buffers, recording the token count of every step that went through them.
from engine.runner.piecewise_graphs import PiecewiseGraphs


def attach_counting_pieces(runner, max_tokens: int, bucket_step: int) -> list[int]:
    """Give `runner` graph pieces; returns the list each pieces.run appends its token count to."""
    pieces = PiecewiseGraphs(
        runner.model, runner.kv_caches, runner.cos_sin, device=runner.device,
        dtype=runner.dtype, max_tokens=max_tokens, bucket_step=bucket_step,
    )  # fmt: skip
    runs: list[int] = []
    run = pieces.run
    pieces.run = lambda batch: runs.append(batch.input_ids.shape[0]) or run(batch)
    runner.piecewise = pieces
    return runs
