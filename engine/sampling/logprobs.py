# Log-probabilities of sampled tokens (OpenAI's `logprobs` / `top_logprobs`): for the rows whose
# request asked, one log_softmax of the model's own logits (before temperature, bans or grammar
# masks, as vLLM reports them), the sampled token's value and the top k, batched on the device
# and brought to the host with one extra copy in steps that have such rows.
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.request import Request
from engine.sampling.sampler import HostCopy

MAX_LOGPROBS = 20  # OpenAI's top_logprobs bound


@dataclass(slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # the k most likely ids and their logprobs, best first
    # Their text (special tokens spelled out), filled by the engine before the delta leaves it.
    token: str = ""
    top_tokens: list[str] | None = None

    def decode(self, tokenizer) -> None:
        self.token = tokenizer.decode([self.token_id], skip_special_tokens=False)
        self.top_tokens = [tokenizer.decode([t], skip_special_tokens=False) for t, _ in self.top]


class StepLogprobs:
    """One step's logprob rows, from the logits to the requests' step_logprobs."""

    def __init__(self, logits: torch.Tensor, requests: list[Request]) -> None:
        # logits: [num_rows, vocab]; requests: per row (no drafts: such requests never draft).
        self.rows = [i for i, r in enumerate(requests) if r.params.logprobs is not None]
        self.requests = [requests[i] for i in self.rows]
        self.k = max(r.params.logprobs for r in self.requests)
        index = torch.tensor(self.rows, dtype=torch.int64)
        if logits.device.type == "cuda":
            index = index.pin_memory().to(logits.device, non_blocking=True)
        self.index = index
        # [n, vocab] float32, computed now: the grammar masks and bans change logits in place later
        self.logprobs = torch.log_softmax(logits.index_select(0, index).float(), dim=-1)
        self.host: HostCopy | None = None

    @classmethod
    def of(cls, logits: torch.Tensor, requests: list[Request]) -> StepLogprobs | None:
        if not any(r.params.logprobs is not None for r in requests):
            return None
        return cls(logits, requests)

    def start_copy(self, sampled: torch.Tensor) -> None:
        """sampled: [num_rows] int64 on the device. Queues [n, 1 + 2k] (the sampled token's
        logprob, the top k logprobs, the top k ids as floats: exact below 2**24) to the host."""
        chosen = self.logprobs.gather(1, sampled.index_select(0, self.index).unsqueeze(1))
        top_lp, top_ids = self.logprobs.topk(self.k, dim=-1)
        self.host = HostCopy.start(torch.cat((chosen, top_lp, top_ids.float()), dim=1))

    def record(self, sampled: list[int]) -> None:
        """Once the step is collected: each request's step_logprobs for its new token."""
        values = self.host.wait()
        k = self.k
        for row, request, v in zip(self.rows, self.requests, values):
            want = request.params.logprobs
            top = [(int(v[1 + k + j]), v[1 + j]) for j in range(want)]
            request.step_logprobs = TokenLogprob(sampled[row], v[0], top)


class PromptLogprobs:
    """One step's prompt logprobs (vLLM's `prompt_logprobs`, OpenAI's `echo` + `logprobs`): for
    the prompt chunks of requests that asked, the logprob of each next prompt token, from the
    hidden states the step computed anyway; recorded on request.prompt_logprobs at collect.
    Entry i is prompt token i + 1's (the first token has none). Such requests skip the prefix
    cache (engine/core/request_intake.py), so every prompt position is computed once."""

    def __init__(self, hidden_rows: list[int], targets: list[int], owners: list[Request]):
        self.hidden_rows = hidden_rows  # rows of the step's hidden states, one per entry
        self.targets = targets  # the prompt token each row predicts
        self.owners = owners  # the request of each row
        self.host: HostCopy | None = None
        self.k = 0

    @classmethod
    def plan(cls, requests: list[Request], num_new_tokens: list[int]) -> PromptLogprobs | None:
        """Before the forward: which hidden rows the step's prompt chunks need (host only)."""
        rows: list[int] = []
        targets: list[int] = []
        owners: list[Request] = []
        start = 0  # the request's first row in the packed batch (the batch builder's order)
        for r, n in zip(requests, num_new_tokens):
            recorded = r.prompt_logprobs
            if recorded is not None:
                first = r.num_computed_tokens
                # positions p predict token p + 1; a recompute (preemption) records nothing twice
                for p in range(max(first, len(recorded)), min(first + n, r.num_prompt_tokens - 1)):
                    rows.append(start + p - first)
                    targets.append(r.token_ids[p + 1])
                    owners.append(r)
            start += n
        return cls(rows, targets, owners) if rows else None

    def start(self, hidden: torch.Tensor, compute_logits) -> None:
        """hidden: [num_tokens, hidden] of the step. Queues [n, 1 + 2k] to the host, as
        StepLogprobs does for sampled tokens."""
        device = hidden.device
        rows = torch.tensor(self.hidden_rows, dtype=torch.int64, device=device)
        targets = torch.tensor(self.targets, dtype=torch.int64, device=device)
        logprobs = torch.log_softmax(compute_logits(hidden.index_select(0, rows)).float(), dim=-1)
        self.k = max(r.params.prompt_logprobs for r in self.owners)
        chosen = logprobs.gather(1, targets.unsqueeze(1))
        top_lp, top_ids = logprobs.topk(self.k, dim=-1)
        self.host = HostCopy.start(torch.cat((chosen, top_lp, top_ids.float()), dim=1))

    def record(self) -> None:
        values = self.host.wait()
        k = self.k
        for request, target, v in zip(self.owners, self.targets, values):
            want = request.params.prompt_logprobs
            top = [(int(v[1 + k + j]), v[1 + j]) for j in range(want)]
            request.prompt_logprobs.append(TokenLogprob(target, v[0], top))
