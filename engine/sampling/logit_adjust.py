# What a request's own knobs do to its logits before sampling: logit_bias, vLLM's
# repetition_penalty, OpenAI's presence and frequency penalties. Built per step for the rows
# that ask (the host lists their (row, token) pairs once), applied batched on the device:
# one scatter for the biases, one count matrix for the penalised rows.
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.request import Request


@dataclass(slots=True)
class LogitAdjust:
    bias_index: tuple[torch.Tensor, torch.Tensor] | None  # (rows, tokens) [num_biases] int64
    bias_values: torch.Tensor | None  # [num_biases] float32
    penalised: torch.Tensor | None  # [m] int64: the rows with a penalty
    seen_output: tuple[torch.Tensor, torch.Tensor] | None  # (penalised slot, token), repeats kept
    seen_prompt: tuple[torch.Tensor, torch.Tensor] | None  # likewise for the prompt (repetition)
    presence: torch.Tensor | None  # [m, 1] float32
    frequency: torch.Tensor | None  # [m, 1]
    repetition: torch.Tensor | None  # [m, 1]

    @classmethod
    def from_requests(
        cls, requests: list[Request], vocab_size: int, device: torch.device
    ) -> LogitAdjust | None:
        """`requests` per row; None when no row asks (the common case: one pass, no tensors)."""
        bias_rows: list[int] = []
        bias_tokens: list[int] = []
        bias_values: list[float] = []
        penalised: list[Request] = []
        rows: list[int] = []
        for row, r in enumerate(requests):
            p = r.params
            if p.logit_bias:
                for token, value in p.logit_bias.items():
                    bias_rows.append(row)
                    bias_tokens.append(token)
                    bias_values.append(value)
            if p.uses_history:
                penalised.append(r)
                rows.append(row)
        if not bias_rows and not penalised:
            return None

        def put(values: list, dtype: torch.dtype) -> torch.Tensor:
            t = torch.tensor(values, dtype=dtype)
            return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t

        out_slots: list[int] = []
        out_tokens: list[int] = []
        prompt_slots: list[int] = []
        prompt_tokens: list[int] = []
        for slot, r in enumerate(penalised):
            output = r.output_token_ids  # (constrained to committed tokens: overlap.py syncs)
            out_slots += [slot] * len(output)
            out_tokens += output
            if r.params.repetition_penalty != 1.0:
                prompt = set(r.token_ids[: r.num_prompt_tokens])
                prompt_slots += [slot] * len(prompt)
                prompt_tokens += prompt
        has_bias = bool(bias_rows)
        return cls(
            bias_index=(put(bias_rows, torch.int64), put(bias_tokens, torch.int64))
            if has_bias
            else None,
            bias_values=put(bias_values, torch.float32) if has_bias else None,
            penalised=put(rows, torch.int64) if rows else None,
            seen_output=(put(out_slots, torch.int64), put(out_tokens, torch.int64)),
            seen_prompt=(put(prompt_slots, torch.int64), put(prompt_tokens, torch.int64)),
            presence=put([[r.params.presence_penalty] for r in penalised], torch.float32),
            frequency=put([[r.params.frequency_penalty] for r in penalised], torch.float32),
            repetition=put([[r.params.repetition_penalty] for r in penalised], torch.float32),
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [num_rows, vocab] → float32 logits with the biases and penalties applied."""
        logits = logits.float()
        if self.bias_index is not None:
            logits.index_put_(self.bias_index, self.bias_values, accumulate=True)
        if self.penalised is not None:
            rows = logits.index_select(0, self.penalised)  # [m, vocab]
            counts = torch.zeros_like(rows)
            counts.index_put_(self.seen_output, torch.ones_like(self.seen_output[1],
                              dtype=rows.dtype), accumulate=True)  # fmt: skip
            seen = counts > 0
            seen[self.seen_prompt] = True
            # repetition first (vLLM's order): shrink a seen token's logit towards less likely
            rp = self.repetition
            rows = torch.where(seen, torch.where(rows > 0, rows / rp, rows * rp), rows)
            rows = rows - self.frequency * counts - self.presence * (counts > 0).float()
            logits.index_copy_(0, self.penalised, rows)
        return logits
