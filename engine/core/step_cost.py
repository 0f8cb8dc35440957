# A per-step cost model fit online from the engine's own steps, and the prefill allowance it
# gives: how many prefill tokens a step may carry beside its decodes so the step stays under a
# time target. A step's time is modelled as
#
#   t ≈ w_fixed + w_eager·[prefill > 0] + w_row·decodes + w_ctx·decode_context
#       + w_tok·prefill_tokens + w_pair·prefill_pairs
#
#   decodes         rows with one query token
#   decode_context  Σ context of those rows (the KV every decode reads)
#   prefill_tokens  query tokens of the other rows (chunks of prompts)
#   prefill_pairs   Σ over prefill rows of chunk × (computed + chunk / 2): causal attention work
#   [prefill > 0]   a step with a prefill chunk runs eagerly (no CUDA graph): launch overhead
#
# The weights are a least-squares fit over the last `window` steps, refit every `refit_every`
# steps and kept non-negative (a negative weight would promise free work). Each refit after the
# first is anchored at the last weights, as if PRIOR_STEPS more steps had measured each feature
# at full scale: directions the window does not identify keep their last value instead of
# landing anywhere. A running set that sits at its 256 seats for a minute makes the fixed cost
# and a row's cost collinear; unanchored, successive refits of an 8B on an H200 split them so
# differently that the TPOT rule's seats (workers/gpu/step_prices.py) swung 90-256 within a
# second, and the requests admitted for the seats it had a moment before waited 2 s for one.
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from engine.core.request import Priority

NUM_FEATURES = 6
PRIOR_STEPS = 64  # the last fit's weight in each refit, in steps (windows hold 1,024-2,048)


@dataclass(frozen=True, slots=True)
class StepFeatures:
    decodes: int
    decode_context: int
    prefill_tokens: int
    prefill_pairs: float

    def vector(self) -> np.ndarray:
        return np.array(
            [1.0, float(self.prefill_tokens > 0), self.decodes, self.decode_context,
             self.prefill_tokens, self.prefill_pairs],
            dtype=np.float64,
        )  # fmt: skip


def chunk_pairs(chunk: int, computed: int) -> float:
    """Causal attention pairs of a prefill chunk of `chunk` tokens after `computed` ones."""
    return chunk * (computed + (chunk + 1) / 2)


class StepCostModel:
    def __init__(self, window: int = 2048, min_samples: int = 64, refit_every: int = 64) -> None:
        if min_samples < NUM_FEATURES or window < min_samples or refit_every < 1:
            raise ValueError("need window >= min_samples >= the number of features")
        self.window = window
        self.min_samples = min_samples
        self.refit_every = refit_every
        self._x = np.zeros((window, NUM_FEATURES))
        self._y = np.zeros(window)
        self.num_observed = 0
        self.weights: np.ndarray | None = None  # [NUM_FEATURES], None until fitted

    @property
    def fitted(self) -> bool:
        return self.weights is not None

    def observe(self, features: StepFeatures, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds <= 0:
            return
        slot = self.num_observed % self.window
        self._x[slot] = features.vector()
        self._y[slot] = seconds
        self.num_observed += 1
        n = self.num_observed
        if n >= self.min_samples and (self.weights is None or n % self.refit_every == 0):
            self._fit()

    def _fit(self) -> None:
        n = min(self.num_observed, self.window)
        x, y = self._x[:n], self._y[:n]
        # Columns that never vary carry no information (e.g. no prefill seen yet): fit the rest.
        active = [0] + [j for j in range(1, NUM_FEATURES) if np.ptp(x[:, j]) > 0]
        prior = self.weights
        weights = np.zeros(NUM_FEATURES)
        for _ in range(NUM_FEATURES):  # drop negative weights and refit: a small NNLS
            scale = np.maximum(np.abs(x[:, active]).max(axis=0), 1e-12)
            a, b = x[:, active] / scale, y
            if prior is not None:  # in scaled units: each feature at 1 in PRIOR_STEPS steps
                root = math.sqrt(PRIOR_STEPS)
                a = np.vstack([a, root * np.eye(len(active))])
                b = np.concatenate([y, root * prior[active] * scale])
            solved, *_ = np.linalg.lstsq(a, b, rcond=None)
            solved = solved / scale
            negative = [a for a, w in zip(active, solved) if w < 0 and a != 0]
            if not negative:
                weights[active] = solved
                break
            active = [a for a in active if a not in negative]
        weights[0] = max(weights[0], 0.0)
        self.weights = weights

    def predict(self, features: StepFeatures) -> float:
        if self.weights is None:
            raise RuntimeError("the model is not fitted yet")
        return float(features.vector() @ self.weights)

    def max_prefill_tokens(
        self, decodes: int, decode_context: int, computed: int, target_s: float, limit: int
    ) -> int:
        """The largest chunk p ≤ limit (after `computed` tokens of its prompt) for which the
        predicted step time stays ≤ target_s; 0 when even p = 1 would not."""
        w = self.weights
        if w is None:
            return limit
        base = w[0] + w[1] + w[2] * decodes + w[3] * decode_context
        # target ≥ base + w_tok·p + w_pair·p·(computed + (p + 1)/2): a quadratic in p.
        a = w[5] / 2
        b = w[4] + w[5] * (computed + 0.5)
        c = base - target_s
        if c > 0:
            return 0
        if a > 0:
            p = (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)
        elif b > 0:
            p = -c / b
        else:
            return limit
        return max(0, min(limit, int(p)))


class PrefillPolicy:
    """The scheduler's prefill allowance per step: while decodes run, as many prefill tokens as
    keep the predicted step under `step_time_target_s` (TPOT holds), and never fewer than the
    waiting prompt work needs to meet its deadlines (TTFT holds); a short interactive prompt
    that has waited `ttft_guard_s` still gets the whole budget, for itself alone (guarded()).

    Why the deadline term (docs/serving.md#latency-aware-prefill): with a target alone, a
    model whose decode step already takes the target (the 70B in FP8 at ~80 running: 36-46 ms
    against 35) leaves 1 token a step for prompts. They then wait until the guard fires and go
    through in whole-budget steps: the bursts the target was meant to remove, plus TTFT lost
    waiting. Spreading each waiting prompt's remaining tokens over the steps left before its
    deadline forecasts the work instead: a prompt is never starved, and a step carries only
    the share the deadlines ask for."""

    def __init__(
        self,
        step_time_target_s: float,
        *,
        ttft_guard_s: float,
        ttft_prompt_tokens: int,
        ttft_target_s: float = 0.8,
        long_prompt_tokens_per_s: float = 4000.0,
        model: StepCostModel | None = None,
    ) -> None:
        if ttft_target_s <= 0 or long_prompt_tokens_per_s <= 0:
            raise ValueError("ttft_target_s and long_prompt_tokens_per_s must be positive")
        self.step_time_target_s = step_time_target_s
        self.ttft_guard_s = ttft_guard_s
        self.ttft_prompt_tokens = ttft_prompt_tokens
        self.ttft_target_s = ttft_target_s
        self.long_prompt_tokens_per_s = long_prompt_tokens_per_s
        self.model = model or StepCostModel()

    def deadline_s(self, r) -> float:
        """When r's first token is due: the TTFT target for a short interactive prompt; for a
        long one (or a batch one) its length at `long_prompt_tokens_per_s`, at least that."""
        if r.priority is Priority.INTERACTIVE and r.num_prompt_tokens < self.ttft_prompt_tokens:
            budget = self.ttft_target_s
        else:
            budget = max(self.ttft_target_s, r.num_prompt_tokens / self.long_prompt_tokens_per_s)
        return (r.arrival_time or 0.0) + budget

    def deadline_tokens(self, prefills: list, step_s: float, now: float) -> int:
        """Prefill tokens this step so that every prompt in `prefills` finishes by its deadline
        if each later step of `step_s` carries the same share: Σ remaining / steps left."""
        need = 0.0
        for r in prefills:
            remaining = r.num_prompt_tokens - r.num_computed_tokens
            if remaining <= 0:
                continue
            steps_left = max(1.0, (self.deadline_s(r) - now) / step_s)
            need += remaining / steps_left
        return math.ceil(need)

    def guarded(self, prefills: list, now: float) -> set:
        """The short interactive prompts among `prefills` that have waited past the guard: each
        may take the step's whole budget for itself, while the others keep to allowance()'s
        share (a 12k-token document's chunk riding such a step made it 0.6 s on a 70B)."""
        return {
            r
            for r in prefills
            if r.priority is Priority.INTERACTIVE
            and r.num_prompt_tokens < self.ttft_prompt_tokens
            and r.arrival_time is not None
            and now - r.arrival_time > self.ttft_guard_s
        }

    def allowance(self, decodes: list, prefills: list, budget: int, now: float) -> int:
        """decodes: running requests with one pending token; prefills: requests that would
        take prefill tokens this step (running ones first, then the waiting, in order). The
        prefill tokens of the step for every prompt but the guarded() ones."""
        if not decodes or not prefills or not self.model.fitted:
            return budget
        context = sum(r.num_tokens for r in decodes)
        first = prefills[0].num_computed_tokens
        allowed = self.model.max_prefill_tokens(
            len(decodes), context, first, self.step_time_target_s, budget - len(decodes)
        )
        # A step's time, at least the target (a model whose decodes alone take longer steps
        # has fewer steps left before each deadline).
        step_s = max(
            self.step_time_target_s,
            self.model.predict(StepFeatures(len(decodes), context, 0, 0.0)),
        )
        needed = self.deadline_tokens(prefills, step_s, now)
        # At least one token, so prompts always move (slowly) even under a tight target.
        return max(1, min(budget - len(decodes), max(allowed, needed)))

    def observe(self, features: StepFeatures | None, seconds: float) -> None:
        if features is not None:
            self.model.observe(features, seconds)
