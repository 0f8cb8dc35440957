# The forecast: what an engine running at measured efficiencies serves under the targets.
#
# The floor (serving.py) lets a prompt's FLOPs ride inside the decode step's weight read, so a
# max() hides them. An engine cannot: a step that carries a prompt chunk lasts as long as its
# decodes plus the chunk's matmuls. The GPU's second is shared, not overlapped. At an arrival
# rate r (req/s) with mean output o:
#   prefill  each request costs P = its uncached tokens' FLOPs (linear 2·params·n, causal
#            attention over the cached prefix) over the achievable matmul rate;
#   decode   with T the mean time per step, Little's law keeps B = r·o·T sequences running, and
#            a step costs D(B) = (weights + the KV actually read) / (bandwidth × efficiency);
#   balance  D(B)/T + r·E[P] = 1, i.e. T = D(r·o·T) / (1 − r·E[P]).
# TPOT p95: a request's tokens share their steps with the prompt chunks that land during its
# life, so a short request that meets a long document pays for it over few tokens. TTFT p95:
# the step in flight plus the prompt's own step, both long while a document is prefilled.
# The forecast is the largest r that meets both targets and fits the KV pool.
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from fleetlm.capacity.deployment import Deployment
from fleetlm.capacity.roofline import attention_flops_per_pair, causal_pairs, forward_floor
from fleetlm.capacity.workloads import Workload

SQRT2 = math.sqrt(2.0)


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """How close the engine gets to the ceilings. Defaults from docs/benchmarks.md (8B, H200):
    decode steps at ~75 % of their bandwidth floor (`nano` at 73-77 % of its roofline); a prompt
    chunk inside a step of decodes at ~70 % of the measured matmul ceiling (a 512-token chunk
    added 17.7 ms to 136 decodes for ~12 ms of matmuls; prefill-only steps reach 93-96 %);
    prefill attention at ~50 % (a document's chunk after a long cached prefix: 49 %)."""

    decode_efficiency: float = 0.75
    prefill_efficiency: float = 0.70
    prefill_attention_efficiency: float = 0.50
    step_overhead_s: float = 0.0  # per decode step, beyond bytes / bandwidth
    shared_prefix_decode: bool = False  # a shared prefix's KV read once per step, not per row
    chunk_tokens: int = 2048  # a long prompt's slice per step (EngineConfig.long_prefill_chunk)
    # Long prompts prefilled at a bounded share of every step (issue 35's step-cost rule)
    # instead of slice after slice: their work still counts, but it no longer lands on a few
    # requests' lives as a lump, nor holds short prompts behind a long step.
    paced_long_prompts: bool = False

    def __post_init__(self) -> None:
        for name in ("decode_efficiency", "prefill_efficiency", "prefill_attention_efficiency"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in (0, 1]")
        if self.step_overhead_s < 0 or self.chunk_tokens < 1:
            raise ValueError("step_overhead_s must be >= 0 and chunk_tokens >= 1")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ForecastPoint:
    rate_req_s: float
    output_tok_s: float
    prompt_tok_s: float  # uncached prompt tokens prefilled per second
    running: float  # sequences decoding at once (Little's law)
    decode_step_s: float  # a step without prompt chunks at that batch
    prefill_s: float  # mean GPU time per request's prefill
    prefill_share: float  # of the GPU's time
    tpot_mean_s: float
    tpot_p95_s: float
    ttft_p95_s: float
    kv_tokens_used: float
    violated: str | None  # the first target missed at this rate, None if all are met

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Forecast:
    profile: EngineProfile
    best: ForecastPoint | None  # None: no rate meets the targets
    limited_by: str

    @property
    def output_tok_s(self) -> float:
        return self.best.output_tok_s if self.best else 0.0

    @property
    def rate_req_s(self) -> float:
        return self.best.rate_req_s if self.best else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile.to_dict(),
            "rate_req_s": self.rate_req_s,
            "output_tok_s": self.output_tok_s,
            "limited_by": self.limited_by,
            "best": self.best.to_dict() if self.best else None,
        }


def prefill_seconds(dep: Deployment, new: float, cached: float, profile: EngineProfile) -> float:
    # Compute only: in a served step the chunk rides in the decodes' weight read. Attention
    # runs at the 16-bit rate whatever the weights are stored in.
    linear = 2.0 * (dep.layer_params * new + dep.lm_head_params)
    attention = attention_flops_per_pair(dep) * causal_pairs(new, cached)
    attention_peak = dep.gpu.peak_flops("bf16") * dep.num_gpus
    return linear / (dep.peak_flops * profile.prefill_efficiency) + attention / (
        attention_peak * profile.prefill_attention_efficiency
    )


def running_context_tokens(wl: Workload) -> float:
    # A running sequence seen at a random moment: its prompt plus half its output, where the
    # output is length-biased (long outputs run longer): E[in] + E[o²] / (2·E[o]).
    outs = wl.output_mix()
    second = sum(w * o * o for w, o in outs)
    return wl.mean_input_tokens + second / (2 * wl.mean_output_tokens)


def decode_step_seconds(
    dep: Deployment, wl: Workload, batch: float, profile: EngineProfile
) -> float:
    ctx, cached = running_context_tokens(wl), wl.cached_input_tokens
    read = batch * ctx
    if profile.shared_prefix_decode:  # each shared prefix once per step, each tail per row
        read = batch * (ctx - cached) + min(batch, wl.shared_prefixes) * cached
    floor = forward_floor(
        dep,
        tokens=batch,
        logit_tokens=batch,
        attention_pairs=batch * ctx,
        kv_read_tokens=read,
        kv_write_tokens=batch,
    )
    return profile.step_overhead_s + floor.seconds / profile.decode_efficiency


def _mean_step(dep: Deployment, wl: Workload, rate: float, rho: float, p: EngineProfile):
    # Smallest T with T·(1 − ρ) = D(r·o·T). D is convex in the batch (sums of maxima of linear
    # terms), so h(T) = T(1 − ρ) − D(r·o·T) is concave and Newton from h(T0) ≤ 0 climbs to the
    # first root; a non-positive slope there means the batch outgrows the step: no root.
    ro = rate * wl.mean_output_tokens
    t = decode_step_seconds(dep, wl, 0.0, p) / (1 - rho)
    for _ in range(100):
        batch = ro * t
        d = decode_step_seconds(dep, wl, batch, p)
        h = t * (1 - rho) - d
        if h >= -1e-12 * t:
            return t
        slope = (1 - rho) - ro * (decode_step_seconds(dep, wl, batch + 1, p) - d)
        if slope <= 0:
            return None
        t -= h / slope
    return t


Priced = list[tuple[float, float, float, float]]  # (share, uncached, cached, prefill seconds)


def _by_length(wl: Workload, priced: Priced) -> tuple[Priced, Priced]:
    # The prompts the TTFT target covers (chat turns) and the longer ones (documents).
    limit = wl.ttft_prompt_tokens
    return [x for x in priced if x[1] + x[2] <= limit], [x for x in priced if x[1] + x[2] > limit]


def _tpot_p95(wl: Workload, rate: float, t: float, rho: float, short, long) -> float:
    # A request of o tokens lives τ ≈ o·T. The prefill landing in that window is compound
    # Poisson, stretched by 1/(1 − ρ) (the time it adds admits more prefill); its TPOT is
    # T + (that work − its mean) / ((1 − ρ)·o). Short prompts arrive many per window: normal.
    # Long ones (documents) are few and large: a Poisson count of one moment-matched size
    # (same mean and variance), since a normal would smear a rare jump into a wide tail.
    short_var = rate * sum(w * s * s for w, _, _, s in short)  # per second of window
    long_w = sum(w for w, _, _, _ in long)
    long_rate = rate * long_w
    long_mean = sum(w * s for w, _, _, s in long) / max(long_w, 1e-300)
    long_second = sum(w * s * s for w, _, _, s in long) / max(long_w, 1e-300)
    jump = long_second / long_mean if long else 0.0
    jumps_per_s = long_rate * long_mean / jump if long else 0.0
    classes = []  # (weight, o, Poisson mean of jumps in the window, sd of the short part)
    for w, o in wl.output_mix():
        window = o * t
        classes.append((w, o, jumps_per_s * window, math.sqrt(short_var * window)))

    def above(x: float) -> float:  # P(TPOT > x) over requests
        total = 0.0
        for w, o, lam, sd in classes:
            scale = (1 - rho) * o
            pk = math.exp(-lam)
            for k in range(int(lam + 8 * math.sqrt(lam) + 8)):
                excess = (x - t) * scale - (k - lam) * jump  # seconds of window
                tail = 0.5 * math.erfc(excess / (sd * SQRT2)) if sd else float(excess < 0)
                total += w * pk * tail
                pk *= lam / (k + 1)
        return total

    lo, hi = t, t + 1.0
    while above(hi) > 0.05:
        hi += hi - t
    for _ in range(32):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if above(mid) > 0.05 else (lo, mid)
    return hi


def _ttft_p95(dep, wl, rate, t, short, long, profile: EngineProfile) -> float:
    # Prompts under the target's length are scheduled first, so they wait for the step in
    # flight and then run in the next one. While a long prompt is being prefilled (a share
    # ρ_long of the time) every step carries one of its chunks: a step of S = (decodes +
    # chunk) / (1 − the short prompts arriving meanwhile). Otherwise a step is the mean T
    # plus the prompt's own prefill. Either way TTFT = residual + step = step·(1 + U), U
    # uniform; the p95 is taken over the mixture of the two states.
    short_w = sum(w for w, _, _, _ in short)
    own = sum(w * s for w, _, _, s in short) / short_w if short_w else 0.0
    rho_long, big = 0.0, 0.0
    if long and not profile.paced_long_prompts:
        long_w = sum(w for w, _, _, _ in long)
        mean_long = sum(w * n for w, n, _, _ in long) / long_w
        chunk = min(profile.chunk_tokens, mean_long)
        # A chunk attends to the cached prefix plus, on average, half of the prompt before it.
        cached = wl.cached_input_tokens + mean_long / 2
        slice_s = prefill_seconds(dep, chunk, cached, profile)
        arriving = min(0.9, rate * short_w * own)
        big = (decode_step_seconds(dep, wl, rate * wl.mean_output_tokens * t, profile)
               + slice_s) / (1 - arriving)  # fmt: skip
        steps = sum(w * math.ceil(n / profile.chunk_tokens) for w, n, _, _ in long)
        rho_long = min(1.0, rate * steps * big)

    def above(x: float) -> float:  # P(TTFT > x)
        p_big = min(1.0, max(0.0, 2 - x / big)) if big else 0.0
        p_norm = min(1.0, max(0.0, 2 - (x - own) / t))
        return rho_long * p_big + (1 - rho_long) * p_norm

    lo, hi = 0.0, 2 * max(big, t + own) + 1e-9
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if above(mid) > 0.05 else (lo, mid)
    return hi


def forecast_at(
    dep: Deployment, wl: Workload, rate: float, kv_tokens: float, profile: EngineProfile
) -> ForecastPoint:
    if rate <= 0:
        raise ValueError("rate must be positive")
    priced = [(w, n, c, prefill_seconds(dep, n, c, profile)) for w, n, c in wl.prompt_mix()]
    mean_p = sum(w * s for w, _, _, s in priced)
    rho = rate * mean_p
    t = _mean_step(dep, wl, rate, rho, profile) if rho < 1 else None
    out = wl.mean_output_tokens
    if t is None:
        inf = math.inf
        return ForecastPoint(rate, rate * out, rate * wl.new_input_tokens, inf, inf, mean_p,
                             min(rho, 1.0), inf, inf, inf, inf, "throughput")  # fmt: skip
    batch = rate * out * t
    short, long = _by_length(wl, priced)
    paced = profile.paced_long_prompts
    tpot_p95 = _tpot_p95(wl, rate, t, rho, short, [] if paced else long)
    ttft_p95 = _ttft_p95(dep, wl, rate, t, short, long, profile)
    held = running_context_tokens(wl) - wl.cached_input_tokens
    kv_used = batch * held + min(batch, wl.shared_prefixes) * wl.cached_input_tokens
    violated = (
        "TPOT target" if tpot_p95 > wl.tpot_target_s
        else "TTFT target" if ttft_p95 > wl.ttft_target_s
        else "KV capacity" if kv_used > kv_tokens
        else None
    )  # fmt: skip
    return ForecastPoint(
        rate_req_s=rate,
        output_tok_s=rate * out,
        prompt_tok_s=rate * wl.new_input_tokens,
        running=batch,
        decode_step_s=decode_step_seconds(dep, wl, batch, profile),
        prefill_s=mean_p,
        prefill_share=rho,
        tpot_mean_s=t,
        tpot_p95_s=tpot_p95,
        ttft_p95_s=ttft_p95,
        kv_tokens_used=kv_used,
        violated=violated,
    )


def forecast(
    dep: Deployment, wl: Workload, kv_tokens: float, profile: EngineProfile | None = None
) -> Forecast:
    """The highest arrival rate that meets the workload's targets, to 0.1 % of the rate."""
    profile = profile or EngineProfile()
    mean_p = sum(w * prefill_seconds(dep, n, c, profile) for w, n, c in wl.prompt_mix())
    # Saturation: each request needs E[P] of prefill and o steps' worth of its row's share of
    # a step, at least D(1) − D(0) each (D is convex), so r < 1 / (E[P] + o·(D(1) − D(0))).
    per_row = decode_step_seconds(dep, wl, 1, profile) - decode_step_seconds(dep, wl, 0, profile)
    hi = 1.0 / (mean_p + wl.mean_output_tokens * per_row)
    first = forecast_at(dep, wl, hi * 1e-4, kv_tokens, profile)
    if first.violated:
        return Forecast(profile, None, f"{first.violated} missed at the lowest load")
    best, limited_by = first, "throughput"
    lo = first.rate_req_s
    while hi - lo > 1e-3 * lo:
        mid = (lo + hi) / 2
        point = forecast_at(dep, wl, mid, kv_tokens, profile)
        if point.violated is None:
            lo, best = mid, point
        else:
            hi, limited_by = mid, point.violated
    return Forecast(profile, best, limited_by)
