# A per-step cost model fit from the engine's own steps (online, beside the start-up
# calibration's), and the prefill plan it gives: how many prefill tokens a step may carry beside
# its decodes so the step stays under a time target, and what each prompt is due regardless
# (PrefillPolicy.plan). A step's time is modelled as
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
from dataclasses import dataclass, field

import numpy as np

from engine.core.prefill_order import is_long_prompt
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
        # The start-up calibration's steps (calibrate()): in every fit, never displaced
        self._fixed_x = np.zeros((0, NUM_FEATURES))
        self._fixed_y = np.zeros(0)
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

    def calibrate(self, samples: list[tuple[StepFeatures, float]]) -> None:
        """Measured steps of chosen shapes (engine/runner/step_calibration.py), kept in every
        later fit beside the window: the served steps alone are the shapes the policy lets
        happen, and along the directions they leave open (a document's chunk the model has
        priced too high stays small, so its cost is never measured) the fit can settle
        anywhere. Fits at once."""
        good = [(f, s) for f, s in samples if math.isfinite(s) and s > 0]
        if len(good) < NUM_FEATURES:
            raise ValueError("need a measured step per feature at least")
        self._fixed_x = np.array([f.vector() for f, _ in good])
        self._fixed_y = np.array([s for _, s in good])
        self._fit()

    def _fit(self) -> None:
        n = min(self.num_observed, self.window)
        x = np.vstack([self._x[:n], self._fixed_x])
        y = np.concatenate([self._y[:n], self._fixed_y])
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
        return self.chunk_tokens_within(target_s - base, computed, limit)

    def chunk_seconds(self, tokens: int, computed: int) -> float:
        """A chunk's own part of a step: its tokens and causal pairs after `computed`."""
        w = self.weights
        return float(w[4] * tokens + w[5] * chunk_pairs(tokens, computed))

    def chunk_tokens_within(self, seconds: float, computed: int, limit: int) -> int:
        """The largest chunk p ≤ limit after `computed` tokens whose chunk_seconds ≤ seconds."""
        w = self.weights
        if w is None:
            return limit
        if seconds < 0:
            return 0
        if math.isinf(seconds):
            return limit
        # seconds ≥ w_tok·p + w_pair·p·(computed + (p + 1)/2): a quadratic in p.
        a = w[5] / 2
        b = w[4] + w[5] * (computed + 0.5)
        if a > 0:
            p = (-b + math.sqrt(b * b + 4 * a * seconds)) / (2 * a)
        elif b > 0:
            p = seconds / b
        else:
            return limit
        return max(0, min(limit, int(p)))


@dataclass(slots=True)
class PrefillPlan:
    """A step's prefill tokens: a prompt may take its own grant or what is left of the shared
    pool, the larger; what it takes comes out of the pool (a grant is a floor, not an extra).
    With a `model`, the pool is seconds and each prompt's share of it is priced at its own
    offset: a document's chunk after 20k computed tokens costs its attention over all of them,
    and a pool counted in tokens priced at the first prompt's offset let such chunks run steps
    past the target (on an H100 the 8B's mixed steps took 46 ms at the median against 30)."""

    pool: float  # tokens; seconds with a model
    grants: dict = field(default_factory=dict)  # Request -> its floor, pool or not
    paced: frozenset = frozenset()  # requests held to their grants, whatever the pool
    from_pool: dict = field(default_factory=dict)  # Request -> what it took of the pool
    model: StepCostModel | None = None

    @property
    def exhausted(self) -> bool:
        return self.pool <= 0

    def pool_tokens(self, computed: int) -> int:
        """The pool, in tokens of a chunk after `computed` ones."""
        if self.model is None:
            return int(self.pool)
        return self.model.chunk_tokens_within(self.pool, computed, 1 << 30)

    def cap(self, request, computed: int | None = None) -> int:
        """computed: the request's tokens before this chunk (its prefix-cache hits when it is
        being admitted); its num_computed_tokens by default."""
        if request in self.paced:
            return self.grants[request]
        computed = request.num_computed_tokens if computed is None else computed
        return max(self.grants.get(request, 0), self.pool_tokens(computed))

    def take(self, request, tokens: int) -> None:
        """After the chunk is scheduled, before the step: num_computed_tokens precedes it."""
        cost = float(tokens)
        if self.model is not None:
            cost = self.model.chunk_seconds(tokens, request.num_computed_tokens)
        taken = max(0.0, min(cost, self.pool))
        self.from_pool[request] = taken
        self.pool -= taken

    def give_back(self, request) -> None:
        """A preempted request's chunk: what it took of the pool is the pool's again."""
        self.pool += self.from_pool.pop(request, 0)


class PrefillPolicy:
    """The scheduler's prefill tokens per step while decodes run (plan()): a shared pool of as
    many as keep the predicted step under `step_time_target_s` (TPOT holds), and for each
    prompt a grant of its own:
    * a short prompt (under `ttft_prompt_tokens`): never less than its TTFT deadline needs,
      and the whole budget once it is interactive and has waited `ttft_guard_s`;
    * the long prompts (documents; no TTFT target), first come first served: the oldest one
      gets `long_prompt_share` of the GPU's time beside the decodes, the others a token a step.
    With step_time_target_s = inf (EngineConfig.pace_long_prompts) the pool has no bound and
    the short prompts take whole steps as without a policy; only the long ones keep to their
    grants.

    Why the deadline term (docs/serving.md#latency-aware-prefill): with a target alone, a
    model whose decode step already takes the target (the 70B in FP8 at ~80 running: 36-46 ms
    against 35) leaves 1 token a step for prompts. They then wait until the guard fires and go
    through in whole-budget steps: the bursts the target was meant to remove, plus TTFT lost
    waiting. Spreading each waiting prompt's remaining tokens over the steps left before its
    deadline forecasts the work instead: a prompt is never starved, and a step carries only
    the share the deadlines ask for.

    Why per prompt: the scheduler serves running prompts before it admits waiting ones, so a
    deadline share pooled over all of them went to a running long document first, and a short
    prompt waiting behind it got nothing (fleetlm/bench/schedule_sim.py on the 70B: batch prompts
    of 1.6k tokens waited seconds while a 27k-token document took their share).

    Why a share of time for documents, not a deadline by length: a 30k-token prompt costs a
    70B about 10 s of an H200 (its attention grows with the square of its length), 0.8 s an
    8B. A deadline at a fixed tokens per second asked the 70B for most of the GPU while one
    ran and two at once for all of it: steps of 0.5-0.8 s and TPOT p95 of 90 ms for every
    stream at 1 req/s of `seed` (simulated). A share bounds what documents take from the
    decodes whatever their length and number; their first token comes when their work at that
    share is done (sooner while the pool has room)."""

    def __init__(
        self,
        step_time_target_s: float,
        *,
        ttft_guard_s: float,
        ttft_prompt_tokens: int,
        ttft_target_s: float = 0.8,
        long_prompt_share: float = 0.25,
        model: StepCostModel | None = None,
    ) -> None:
        if ttft_target_s <= 0 or not 0 < long_prompt_share < 1:
            raise ValueError("need ttft_target_s > 0 and long_prompt_share in (0, 1)")
        self.step_time_target_s = step_time_target_s
        self.ttft_guard_s = ttft_guard_s
        self.ttft_prompt_tokens = ttft_prompt_tokens
        self.ttft_target_s = ttft_target_s
        self.long_prompt_share = long_prompt_share
        self.model = model or StepCostModel()

    def is_long(self, r) -> bool:
        return is_long_prompt(r, self.ttft_prompt_tokens)

    def deadline_share(self, r, step_s: float, now: float) -> int:
        """A short prompt's tokens this step so that it finishes by its TTFT deadline if each
        later step of `step_s` carries the same share: remaining / steps left (all when late)."""
        remaining = r.num_tokens - r.num_computed_tokens  # a resumed request's too
        if remaining <= 0:
            return 0
        deadline = (r.arrival_time or 0.0) + self.ttft_target_s
        steps_left = max(1.0, (deadline - now) / step_s)
        return math.ceil(remaining / steps_left)

    def is_guarded(self, r, now: float) -> bool:
        """A short interactive prompt that has waited past the guard: it may take the step's
        whole budget, while the others keep to their grants and the pool (a 12k-token
        document's chunk riding such a step made it 0.6 s on a 70B)."""
        return (
            r.priority is Priority.INTERACTIVE
            and not self.is_long(r)
            and r.arrival_time is not None
            and now - r.arrival_time > self.ttft_guard_s
        )

    def long_share_tokens(self, rows: int, context: int, computed: int, limit: int) -> int:
        """The oldest long prompt's grant beside `rows` decodes of `context` keys: the tokens
        whose time is `long_prompt_share` of the step's decode time and theirs. A step with a
        chunk runs eagerly whatever its size, so that cost is not the document's (counted, a
        model with a large one left documents a token a step, at that cost each)."""
        decode_s = self.model.predict(StepFeatures(rows, context, 0, 0.0))
        share = self.long_prompt_share
        long_s = decode_s * share / (1 - share)
        eager_s = float(self.model.weights[1])
        target = decode_s + eager_s + long_s
        return max(1, self.model.max_prefill_tokens(rows, context, computed, target, limit))

    def plan(self, decodes: list, prefills: list, budget: int, now: float) -> PrefillPlan:
        """decodes: running requests with one pending token; prefills: requests that would
        take prefill tokens this step (running ones first, then the waiting, in order)."""
        if not decodes or not prefills or not self.model.fitted:
            return PrefillPlan(budget)
        rows, context = len(decodes), sum(r.num_tokens for r in decodes)
        limit = budget - rows
        decode_s = self.model.predict(StepFeatures(rows, context, 0, 0.0))
        eager_s = float(self.model.weights[1])  # a step with any chunk pays it once
        pool_s = max(0.0, self.step_time_target_s - decode_s - eager_s)
        # A step's time, at least the target (a model whose decodes alone take longer steps
        # has fewer steps left before each deadline).
        step_s = max(self.step_time_target_s, decode_s)
        grants, longs = {}, []
        for r in prefills:
            if self.is_long(r):
                longs.append(r)
                grants[r] = 1  # at least a token a step: a queued document still moves
            elif self.is_guarded(r, now):
                grants[r] = budget
            else:  # at least one token, so prompts always move (slowly) under a tight target
                grants[r] = max(1, self.deadline_share(r, step_s, now))
        if longs:
            head = min(longs, key=lambda r: (r.priority.rank, r.arrival_time or 0.0))
            grants[head] = self.long_share_tokens(rows, context, head.num_computed_tokens, limit)
        # Without a target the pool is unbounded: the long prompts keep to their share.
        paced = frozenset(longs) if math.isinf(pool_s) else frozenset()
        return PrefillPlan(pool_s, grants, paced, model=self.model)

    def observe(self, features: StepFeatures | None, seconds: float) -> None:
        if features is not None:
            self.model.observe(features, seconds)
