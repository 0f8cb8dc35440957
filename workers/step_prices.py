# What work costs on this worker, in seconds of its step loop, for the two decisions that keep
# overload from turning into crawling streams: how many requests the engine may run at once and
# still hold the TPOT target (workers/intake_budget.py), and how long the work admitted and not
# yet started will take (published in the worker's stats for the API's admission,
# api/load_shedding.py).
#
# The model is engine/step_cost.py's (a fixed cost, decode rows and their context, prefill
# tokens and their attention pairs), fit here on whole loop turns rather than on the engine's
# step alone: a client waits for the turn, host work and the Redis round trip included (on a
# CPU worker the step is only ~60 % of it). It prices the model actually loaded, measured on the
# machine it runs on. Until it has seen enough steps nothing is priced (None): the worker then
# takes work by its seat and waiting-room limits alone, and admission falls back on the
# tokens-per-second rate (workers/load_report.py).
from __future__ import annotations

from engine.step_cost import StepCostModel, StepFeatures, chunk_pairs

# A fit every 32 turns over the last 1,024: a fresh worker is priced after a few seconds of
# work, and the prices follow a changing mix (longer contexts) within a minute.
WINDOW, MIN_SAMPLES, REFIT_EVERY = 1024, 32, 32


class StepPrices:
    def __init__(self, model: StepCostModel | None = None) -> None:
        self.model = model or StepCostModel(WINDOW, MIN_SAMPLES, REFIT_EVERY)

    @property
    def fitted(self) -> bool:
        return self.model.fitted

    def observe(self, features: StepFeatures | None, turn_s: float) -> None:
        if features is not None and (features.decodes or features.prefill_tokens):
            self.model.observe(features, turn_s)

    def decode_step_s(self, rows: int, context: int) -> float:
        """A decode-only turn of `rows` requests holding `context` tokens in all."""
        return self.model.predict(StepFeatures(rows, context, 0, 0.0))

    def prefill_s(self, tokens: int, computed: int = 0) -> float:
        """The extra turn time `tokens` prompt tokens (after `computed` cached or done ones)
        add, in one chunk beside whatever else the step carries."""
        if tokens <= 0:
            return 0.0
        w = self.model.weights
        return float(w[1] + w[4] * tokens + w[5] * chunk_pairs(tokens, computed))

    def max_rows(self, target_s: float, context_per_row: float, limit: int) -> int:
        """The largest running set (≤ limit) whose decode turn stays within target_s; never
        below 1, so a machine slower than the target still serves one stream at a time."""
        w = self.model.weights
        per_row = w[2] + w[3] * context_per_row
        spare = target_s - w[0]
        if per_row <= 0:
            return limit
        return max(1, min(limit, int(spare / per_row)))
