# Batched sampling on the logits' device: greedy, temperature, top-k, top-p, per-request seeds,
# min_tokens masking. One tensor of token ids comes out; the caller does the single
# device-to-host copy per step.
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.request import Request
from engine.sampling.logit_adjust import LogitAdjust


@dataclass(slots=True)
class SamplingBatch:
    temperature: torch.Tensor  # [num_rows] float32, 0 for greedy rows
    top_k: torch.Tensor  # [num_rows] int64, vocab size when disabled
    top_p: torch.Tensor  # [num_rows] float32
    all_greedy: bool
    needs_top_k: bool
    needs_top_p: bool
    generators: list[torch.Generator | None]  # per row; None → the shared generator
    # (row, token) pairs to mask to -inf (EOS and stop ids before min_tokens is reached)
    banned_rows: list[int]
    banned_tokens: list[int]
    adjust: LogitAdjust | None = None  # logit_bias and penalties (engine/sampling/logit_adjust.py)
    min_p: torch.Tensor | None = None  # [num_rows] float32 when some row sets min_p

    @classmethod
    def from_requests(
        cls,
        requests: list[Request],
        vocab_size: int,
        device: torch.device,
        eos_ids: tuple[int, ...],
        num_prior_tokens: list[int] | None = None,
    ) -> SamplingBatch:
        # `requests` is per row; a request verifying drafts has one row per position, and
        # num_prior_tokens[row] says how many of its output tokens precede that row's token.
        temps, top_ks, top_ps, gens = [], [], [], []
        banned_rows: list[int] = []
        banned_tokens: list[int] = []
        for row, r in enumerate(requests):
            p = r.params
            greedy = p.greedy
            temps.append(0.0 if greedy else p.temperature)
            top_ks.append(p.top_k if p.top_k > 0 else vocab_size)
            top_ps.append(p.top_p)
            gens.append(None if greedy else r.generator)
            prior = num_prior_tokens[row] if num_prior_tokens is not None else 0
            if r.num_output_tokens + prior < p.min_tokens:
                ids = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_ids))
                ids = [t for t in ids if 0 <= t < vocab_size]
                banned_rows += [row] * len(ids)
                banned_tokens += ids
        all_greedy = all(t == 0.0 for t in temps)
        min_ps = [r.params.min_p for r in requests]
        needs_min_p = not all_greedy and any(min_ps)
        if all_greedy:  # argmax needs no per-row tensors: skip the copies entirely
            temps, top_ks, top_ps = [], [], []
        return cls(
            temperature=_to_device(temps, torch.float32, device),
            top_k=_to_device(top_ks, torch.int64, device),
            top_p=_to_device(top_ps, torch.float32, device),
            all_greedy=all_greedy,
            needs_top_k=any(k < vocab_size for k in top_ks),
            needs_top_p=any(p < 1.0 for p in top_ps),
            generators=gens,
            banned_rows=banned_rows,
            banned_tokens=banned_tokens,
            adjust=LogitAdjust.from_requests(requests, vocab_size, device),
            min_p=_to_device(min_ps, torch.float32, device) if needs_min_p else None,
        )


@dataclass(slots=True)
class HostCopy:
    """A device tensor on its way to the host: `wait()` blocks (with the GIL released) until
    the copy, and everything queued before it on the stream, is done."""

    host: torch.Tensor | None = None
    event: torch.cuda.Event | None = None
    values: list | None = None  # already on the host (CPU tensors, synchronous paths)
    # The tensor being copied, still on its device: overlapped scheduling feeds the next step's
    # input ids from it before the copy is waited for (engine/runner/overlap.py).
    device_values: torch.Tensor | None = None
    # engine.sampling.logprobs.StepLogprobs when some row asked for logprobs (collect() records
    # them).
    logprobs: object = None
    prompt_logprobs: object = None  # engine.sampling.logprobs.PromptLogprobs, likewise

    @classmethod
    def start(cls, t: torch.Tensor) -> HostCopy:
        if t.device.type != "cuda":
            return cls(values=t.tolist(), device_values=t)
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return cls(host, event, device_values=t)

    def done(self) -> bool:
        """True once wait() would not block."""
        return self.values is not None or self.event.query()

    def wait(self) -> list:
        if self.values is None:
            self.event.synchronize()
            self.values = self.host.tolist()
        return self.values


def to_host_list(t: torch.Tensor) -> list:
    """t.tolist(), waiting on an event (the wait releases the GIL)."""
    return HostCopy.start(t).wait()


def _to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return t
    # Pinned, so the copy is truly asynchronous and never waits behind the forward pass.
    return t.pin_memory().to(device, non_blocking=True)


def sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """logits: [num_rows, vocab] → token ids [num_rows] int64. Greedy rows take the argmax in
    the logits' own dtype (the same index as in float32: the upcast is exact); the rest sample
    in float32."""
    if not batch.all_greedy:
        logits = logits.float()
    if batch.adjust is not None:
        logits = batch.adjust.apply(logits)
    if batch.banned_rows:
        logits[batch.banned_rows, batch.banned_tokens] = float("-inf")
    greedy_tokens = logits.argmax(dim=-1)
    if batch.all_greedy:
        return greedy_tokens
    temps = batch.temperature
    probs = target_probs(logits, batch)
    # Exponential race: argmax(p / E) with E ~ Exp(1) draws from p. Each seeded row draws its
    # noise from its own generator, so its tokens do not depend on the rest of the batch.
    noise = torch.empty_like(probs).exponential_()
    for row, gen in enumerate(batch.generators):
        if gen is not None:
            noise[row].exponential_(generator=gen)
    sampled = (probs / noise).argmax(dim=-1)
    return torch.where(temps > 0, sampled, greedy_tokens)


def target_probs(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """The distribution a non-greedy row samples from: temperature, top-k, top-p applied.
    logits: [num_rows, vocab] (bans already applied) → probs [num_rows, vocab] float32."""
    temps = batch.temperature
    scaled = logits / torch.where(temps > 0, temps, 1.0).unsqueeze(1)
    if batch.needs_top_k or batch.needs_top_p:
        scaled = _mask_top_k_top_p(scaled, batch)
    probs = torch.softmax(scaled, dim=-1)
    if batch.min_p is not None:  # drop what is below min_p x the row's top probability
        floor = batch.min_p.unsqueeze(1) * probs.max(dim=-1, keepdim=True).values
        probs = probs.masked_fill(probs < floor, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def _mask_top_k_top_p(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
    drop = ranks >= batch.top_k.unsqueeze(1)
    if batch.needs_top_p:
        probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
        # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass
        # strictly before it already reaches top_p (the top token always survives).
        mass_before = probs.cumsum(dim=-1) - probs
        drop |= mass_before >= batch.top_p.unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)
