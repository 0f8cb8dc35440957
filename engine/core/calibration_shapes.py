# The shapes of the step-cost model's start-up calibration (engine/runner/step_calibration.py
# times them on the device; fleetlm/bench/schedule_sim.py prices them with a model of one): each
# feature of engine/core/step_cost.py varied on its own, the decode rows at three contexts, a
# chunk's tokens with and without a long cached prefix (its attention pairs), with and without
# decodes beside it. Torch-free.
from __future__ import annotations

from engine.core.step_cost import StepFeatures, chunk_pairs

DECODE_ROWS = (1, 16, 64, 128, 256)
DECODE_CONTEXTS = (512, 2048, 8192)
# (query tokens, cached tokens before them) beside MIXED_ROWS decodes of MIXED_CONTEXT keys
CHUNKS = ((64, 0), (256, 1024), (1024, 0), (2048, 0), (512, 8192), (1024, 16384))
MIXED_ROWS, MIXED_CONTEXT = 16, 2048


def calibration_shapes(
    max_tokens: int, max_model_len: int, max_num_seqs: int
) -> list[tuple[int, int, tuple[tuple[int, int], ...]]]:
    """(decode rows, their context, prompt chunks) of every calibration step that can happen
    under these limits: decodes alone at each row count and context, each chunk beside
    MIXED_ROWS decodes and alone, and a short chunk beside the most rows. Under small limits
    (a test model's 1k context, a 256-token step) the contexts and chunks shrink in proportion,
    rather than drop out: filtered, a 1k-context engine kept one context, its rows and context
    then moved together and the fit could not tell them apart (an H100 run, 2026-12-05)."""
    context_scale = min(1.0, max_model_len / DECODE_CONTEXTS[-1])
    contexts = [max(16, int(c * context_scale)) for c in DECODE_CONTEXTS]
    longest = max(q + p for q, p in CHUNKS)
    widest = max(q for q, _ in CHUNKS)
    chunk_scale = max(0.0, min(1.0, max_model_len / longest, (max_tokens - MIXED_ROWS) / widest))
    chunks = [(max(1, int(q * chunk_scale)), int(p * chunk_scale)) for q, p in CHUNKS]
    mixed_context = contexts[1]
    shapes = [(min(n, max_num_seqs), c, ()) for n in DECODE_ROWS for c in contexts]
    shapes += [(MIXED_ROWS, mixed_context, (chunk,)) for chunk in chunks]
    shapes += [(0, 0, (chunk,)) for chunk in chunks[2:4]]
    shapes.append((max_num_seqs, mixed_context, tuple(chunks[1:2])))
    return [
        (n, c, chunks) for n, c, chunks in dict.fromkeys(shapes)
        if 0 < n + sum(q for q, _ in chunks) <= max_tokens and n <= max_num_seqs
        and c <= max_model_len and all(q + p <= max_model_len for q, p in chunks)
    ]  # fmt: skip


def shape_features(rows: int, context: int, chunks) -> StepFeatures:
    """The StepFeatures the scheduler would give such a step (scheduler._features)."""
    tokens = sum(q for q, _ in chunks)
    pairs = sum(chunk_pairs(q, p) for q, p in chunks)
    return StepFeatures(rows, rows * context, tokens, pairs)
