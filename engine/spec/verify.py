# Verification of draft tokens: the target scored every position of a request's
# [last token, d_1 .. d_k] in one pass, giving k + 1 rows of logits; row i is the target's
# distribution p_i for the token after d_1 .. d_i. The output is the longest accepted draft
# prefix plus one token from the target (the correction at the first rejection, or a bonus
# token after all k), so every step emits between 1 and k + 1 tokens.
#
# Greedy rows: accept d_i iff d_i == argmax p_i; the correction / bonus is argmax p_i. Output
# is token-for-token what plain greedy decoding gives.
# Sampled rows (standard speculative sampling, Leviathan et al. / Chen et al.): accept d_i with
# probability min(1, p_i(d_i) / q_i(d_i)); on rejection draw from normalize(max(0, p_i - q_i)).
# Each emitted token is then distributed exactly as p_i. A proposer that gives no q (n-gram
# lookup, corrupted drafts) is treated as a point mass q = δ(d_i): accept with p_i(d_i), else
# draw from p_i with d_i removed. That is exact for any way of choosing d_i that does not look
# at the target's random draws.
from __future__ import annotations

import torch

from engine.core.request import Request
from engine.sampling.sampler import SamplingBatch, target_probs, to_host_list


def rejection_sample(
    probs: torch.Tensor,  # [num_rows, vocab] target distribution p per row
    draft_tokens: torch.Tensor,  # [num_rows] int64, the draft scored at the row; -1: bonus row
    draft_probs: torch.Tensor | None,  # [num_rows, vocab] q per row; None: point masses
    generators: list[torch.Generator | None],  # per row; None → the default generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (accepted [num_rows] bool, fallback [num_rows] int64): whether each draft row
    accepts its draft, and the token emitted if it does not (for bonus rows: a draw from p)."""
    is_draft = draft_tokens >= 0
    x = draft_tokens.clamp(min=0).unsqueeze(1)  # [num_rows, 1]
    p_x = probs.gather(1, x).squeeze(1)
    if draft_probs is None:
        q_x = torch.ones_like(p_x)
        residual = probs.scatter(1, x, 0.0)  # max(0, p - δ(x)) = p without x
    else:
        q_x = draft_probs.gather(1, x).squeeze(1)
        residual = (probs - draft_probs).clamp(min=0.0)
    residual = torch.where(is_draft.unsqueeze(1), residual, probs)
    # p <= q everywhere means p == q: rejection has probability 0 up to rounding; if rounding
    # rejects anyway, draw from p rather than from an all-zero row.
    empty = residual.sum(dim=1, keepdim=True) <= 0
    residual = torch.where(empty, probs, residual)
    uniform = torch.rand(probs.shape[0], device=probs.device)
    noise = torch.empty_like(probs).exponential_()
    for row, gen in enumerate(generators):
        if gen is not None:  # a seeded row draws only from its own generator
            uniform[row : row + 1].uniform_(generator=gen)
            noise[row].exponential_(generator=gen)
    accepted = is_draft & (uniform * q_x < p_x)  # u < p/q without dividing by q
    fallback = (residual / noise).argmax(dim=-1)  # exponential race: a draw ∝ residual
    return accepted, fallback


def verify(
    logits: torch.Tensor,  # [num_rows, vocab] float32: 1 + len(drafts) rows per request
    requests: list[Request],
    vocab_size: int,
    eos_ids: tuple[int, ...],
) -> list[list[int]]:
    """Per request, the tokens to append: accepted drafts + one target token."""
    device = logits.device
    drafts: list[int] = []
    for r in requests:
        drafts += r.spec_token_ids
        drafts.append(-1)
    # Greedy rows past min_tokens need no per-row sampling state (the common case: skip
    # building it, ~1.5 µs per row on the host).
    batch = None
    if not all(r.params.greedy and r.num_output_tokens >= r.params.min_tokens for r in requests):
        row_requests: list[Request] = []
        prior: list[int] = []
        for r in requests:
            d = len(r.spec_token_ids)
            row_requests += [r] * (d + 1)
            prior += range(d + 1)
        batch = SamplingBatch.from_requests(row_requests, vocab_size, device, eos_ids, prior)
        if batch.banned_rows:
            logits[batch.banned_rows, batch.banned_tokens] = float("-inf")
    draft_tokens = torch.tensor(drafts, dtype=torch.int64)
    if device.type == "cuda":
        draft_tokens = draft_tokens.pin_memory().to(device, non_blocking=True)
    greedy = logits.argmax(dim=-1)
    accepted = greedy == draft_tokens
    fallback = greedy
    if batch is not None and not batch.all_greedy:
        probs = target_probs(logits, batch)
        q = _dense_draft_probs(requests, draft_tokens, probs)
        s_accepted, s_fallback = rejection_sample(probs, draft_tokens, q, batch.generators)
        sampled_row = batch.temperature > 0
        accepted = torch.where(sampled_row, s_accepted, accepted)
        fallback = torch.where(sampled_row, s_fallback, fallback)
    flags, tokens = to_host_list(torch.stack((accepted.long(), fallback)))  # the one D2H copy
    out: list[list[int]] = []
    row = 0
    for r in requests:
        emitted: list[int] = []
        for i, draft in enumerate(r.spec_token_ids):
            if not flags[row + i]:
                emitted.append(tokens[row + i])
                break
            emitted.append(draft)
        else:
            emitted.append(tokens[row + len(r.spec_token_ids)])
        out.append(emitted)
        row += len(r.spec_token_ids) + 1
    return out


def _dense_draft_probs(
    requests: list[Request], draft_tokens: torch.Tensor, probs: torch.Tensor
) -> torch.Tensor | None:
    """q for every row when some request brought a draft distribution, else None. Rows of
    requests without one get point masses; bonus rows get zeros (unused)."""
    if all(r.spec_draft_probs is None for r in requests):
        return None
    q = torch.zeros_like(probs)
    is_draft = draft_tokens >= 0
    q[is_draft, draft_tokens[is_draft]] = 1.0
    row = 0
    for r in requests:
        d = len(r.spec_token_ids)
        if r.spec_draft_probs is not None and d:
            q[row : row + d] = r.spec_draft_probs[:d]
        row += d + 1
    return q
