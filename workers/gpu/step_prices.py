# What work costs on this worker, in seconds of its step loop, for the two decisions that keep
# overload from turning into crawling streams: how many requests the engine may run at once and
# still hold the TPOT target (workers/gpu/intake_budget.py), and how long the work admitted and not
# yet started will take (published in the worker's stats for the API's admission,
# api/load_shedding.py).
#
# The model is engine/core/step_cost.py's (a fixed cost, decode rows and their context, prefill
# tokens and their attention pairs), fit here on whole loop turns rather than on the engine's
# step alone: a client waits for the turn, host work and the Redis round trip included (on a
# CPU worker the step is only ~60 % of it). It prices the model actually loaded, measured on the
# machine it runs on. Until it has seen enough steps nothing is priced (None): the worker then
# takes work by its seat and waiting-room limits alone, and admission falls back on the
# tokens-per-second rate (workers/gpu/load_report.py).
from __future__ import annotations

import math

from engine.core.step_cost import StepCostModel, StepFeatures, chunk_pairs

# A fit every 16 turns over the last 1,024: a fresh worker is priced after its first second or
# two of work. The long window keeps the shape (what a row, a context token, a prompt token add)
# identified even while the running set sits at one size for a long time; the level follows the
# machine within a few dozen turns through `scale`, the recent ratio of measured to predicted
# turns (a CPU shared with the API slows down under overload): admission's predictions are only
# as good as that.
WINDOW, MIN_SAMPLES, REFIT_EVERY = 1024, 32, 16
SCALE_ALPHA = 0.05  # weight of the newest turn in `scale`
# The seats (max_rows) take their level from the measured over the predicted seconds of the last
# few seconds of turns instead: `scale` follows each turn type's own error, and while the seats
# are full the worker takes nothing, so its turns are all decodes, which the fit under-predicted
# on the H200's 8B by some 15 %: `scale` rose 0.98 -> 1.11 within 0.7 s, the seats fell 232 -> 188,
# and the fewer seats kept the prompts (and the turns the fit over-predicts) out. Over seconds
# the turns are the mix the seats hold in steady state.
SEAT_LEVEL_TAU_S = 3.0
# A decode row costs at least this share of the fixed turn: a fit that found rows free (the
# running set never varied) must not promise an unbounded running set.
MIN_ROW_SHARE = 1 / 256


class StepPrices:
    def __init__(self, model: StepCostModel | None = None) -> None:
        self.model = model or StepCostModel(WINDOW, MIN_SAMPLES, REFIT_EVERY)
        self.scale = 1.0  # measured / predicted turn time, recently
        # seconds of turns measured and predicted, each turn's decaying over SEAT_LEVEL_TAU_S
        self._seat_measured = self._seat_predicted = 0.0

    @property
    def fitted(self) -> bool:
        return self.model.fitted

    def observe(self, features: StepFeatures | None, turn_s: float) -> None:
        if features is None or not (features.decodes or features.prefill_tokens):
            return
        if self.model.fitted:
            predicted = self.model.predict(features)
            if predicted > 0:
                ratio = min(5.0, max(0.2, turn_s / predicted))
                self.scale += SCALE_ALPHA * (ratio - self.scale)
                decay = math.exp(-turn_s / SEAT_LEVEL_TAU_S)
                self._seat_measured = self._seat_measured * decay + turn_s
                self._seat_predicted = self._seat_predicted * decay + predicted
        self.model.observe(features, turn_s)

    @property
    def seat_scale(self) -> float:
        """Measured / predicted seconds of the last few seconds of turns (1 before any)."""
        if self._seat_predicted <= 0:
            return 1.0
        return min(5.0, max(0.2, self._seat_measured / self._seat_predicted))

    def decode_step_s(self, rows: int, context: int, *, seats: bool = False) -> float:
        """A decode-only turn of `rows` requests holding `context` tokens in all (at the seats'
        level with `seats`)."""
        scale = self.seat_scale if seats else self.scale
        return scale * self.model.predict(StepFeatures(rows, context, 0, 0.0))

    def prefill_s(self, tokens: int, computed: int = 0, *, seats: bool = False) -> float:
        """The extra turn time `tokens` prompt tokens (after `computed` cached or done ones)
        add, in one chunk beside whatever else the step carries."""
        if tokens <= 0:
            return 0.0
        w, scale = self.model.weights, self.seat_scale if seats else self.scale
        return scale * float(w[1] + w[4] * tokens + w[5] * chunk_pairs(tokens, computed))

    def prefill_step_s(self, rows: int, context: int) -> float:
        """A turn that carries a prompt chunk beside `rows` decodes holding `context` tokens,
        less the chunk's own tokens: what every prefill-carrying turn costs whatever its chunk
        (the decodes riding it, the fixed and eager parts)."""
        w = self.model.weights
        base = self.model.predict(StepFeatures(rows, context, 0, 0.0))
        return self.scale * (base + float(w[1]))

    def prefill_token_weights(self) -> tuple[float, float]:
        """(seconds per prompt token, seconds per causal attention pair): a prompt's tokens
        cost `tokens × first + chunk_pairs(...) × second` on top of its turns' bases."""
        w = self.model.weights
        return self.scale * float(w[4]), self.scale * float(w[5])

    def max_rows(
        self, target_s: float, context_per_row: float, limit: int, extra_per_row: float = 0.0
    ) -> int:
        """The largest running set (≤ limit) whose turn stays within target_s at the seats'
        level, a row costing its decode and `extra_per_row` seconds more (its share of the
        prompts the turns carry, priced with seats=True); never below 1, so a machine slower
        than the target still serves one stream at a time."""
        w, scale = self.model.weights, self.seat_scale
        fixed = scale * w[0]
        per_row = scale * max(w[2] + w[3] * context_per_row, MIN_ROW_SHARE * w[0])
        per_row += extra_per_row
        if per_row <= 0:
            return limit
        return max(1, min(limit, int((target_s - fixed) / per_row)))
