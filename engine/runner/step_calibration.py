# Start-up calibration of the latency-aware prefill's step-cost model (engine/core/step_cost.py):
# synthetic steps of chosen shapes, run the way serving runs them (decode-only steps from the
# CUDA graphs, steps with a prompt chunk from the graph pieces or eagerly) and timed on the
# device, go into the model as steps it keeps in every later fit (StepCostModel.calibrate).
#
# Why: fit only online, the model sees the steps the policy lets happen. Simulated on the 70B
# (fleetlm/bench/schedule_sim.py), the online fit priced a long document's causal attention ~8x
# its cost (its pairs and its tokens rise together in short prompts' chunks): the document's
# share bought 5 tokens a step, so its cost was never measured at a size that would correct it.
# The shapes (engine/core/calibration_shapes.py) vary each feature on its own.
#
# The steps are the kernel warm-up's kind (engine/runner/kernel_warmup.py): padding slots, so
# nothing is written to the KV pool, and block tables over the pool, read only, before any
# request owns them; each row reads blocks of its own (sharing them, the rows read the keys
# from L2: on an H100 the 8B's key was priced at 20 ns against 45 ns served). Under tensor
# parallelism every rank runs each step (broadcast first).
from __future__ import annotations

import time

import torch

from engine.core.calibration_shapes import calibration_shapes, shape_features
from engine.core.step_cost import StepCostModel
from engine.runner.kernel_warmup import WarmupStep, pack

REPEATS = 2  # each shape's time: the faster of two runs


@torch.inference_mode()
def calibrate_step_costs(runner, model: StepCostModel) -> dict:
    """Time every calibration shape on `runner` and calibrate `model` with them. Returns what
    it ran and how long it took."""
    t0 = time.perf_counter()
    cfg = runner.config
    shapes = calibration_shapes(cfg.max_num_batched_tokens, runner.max_model_len,
                                cfg.max_num_seqs)  # fmt: skip
    cuda = runner.device.type == "cuda"
    samples = []
    for rows, context, chunks in shapes:
        splits = runner.batch_builder.decode_splits([context] * rows) if rows else None
        step = WarmupStep(rows, splits, chunks)
        packed = pack(step, runner.block_size, runner.num_blocks, runner.max_model_len,
                      decode_context=context, distinct_tables=True)  # fmt: skip
        best = float("inf")
        for _ in range(REPEATS):
            if runner.tp.size > 1:
                runner.tp.broadcast(packed.for_followers())
            batch = runner.batch_builder.to_device(packed)
            if cuda:
                torch.cuda.synchronize(runner.device)
            start = time.perf_counter()
            logits = runner._logits(batch)
            logits.argmax(dim=-1)  # the step's sampling, at its cheapest
            if cuda:
                torch.cuda.synchronize(runner.device)
            best = min(best, time.perf_counter() - start)
        samples.append((shape_features(rows, context, chunks), best))
    model.calibrate(samples)
    # samples: [(StepFeatures, seconds)], for other models of the same steps (the worker's
    # prices of its turns, workers/gpu/step_prices.py)
    return {"steps": len(samples), "seconds": time.perf_counter() - t0,
            "weights": [float(w) for w in model.weights], "samples": samples}  # fmt: skip
