# Offline entry point: LLM(model, **engine_options).generate(prompts, sampling_params).
from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

from engine.config import EngineConfig
from engine.core.request import Priority
from engine.llm_engine import LLMEngine
from engine.outputs import CompletionOutput, RequestDelta
from engine.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    def __init__(self, model: str, **engine_options) -> None:
        self.engine = LLMEngine(EngineConfig(model=str(model), **engine_options))
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def close(self) -> None:
        """Stop the tensor-parallel follower processes (nothing to do with one rank)."""
        self.engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _prompt_ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        return [int(t) for t in prompt]

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        priority: Priority | str | Sequence[Priority | str] = Priority.INTERACTIVE,
    ) -> list[CompletionOutput]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        n = len(prompts)
        params = _broadcast(sampling_params or SamplingParams(), n, "sampling_params")
        priorities = _broadcast(priority, n, "priority")
        outputs: dict[str, CompletionOutput] = {}
        order = []
        for prompt, p, prio in zip(prompts, params, priorities):
            request_id = f"offline-{next(self._ids)}"
            ids = self._prompt_ids(prompt)
            if p.structured_output is not None:  # a bad grammar raises here (then it is cached)
                self.engine.grammars.check(p.structured_output)
            self.engine.add_request(request_id, ids, p, prio)
            output = CompletionOutput(
                request_id=request_id, prompt_token_ids=ids, num_prompt_tokens=len(ids)
            )
            if p.n > 1:
                output.choices = [
                    CompletionOutput(request_id, ids, num_prompt_tokens=len(ids))
                    for _ in range(p.n)
                ]
            outputs[request_id] = output
            order.append(request_id)
        pending = set(order)
        while pending:
            for delta in self.engine.step():
                if delta.request_id in outputs:
                    outputs[delta.request_id].apply(delta)
                    if delta.finished:
                        pending.discard(delta.request_id)
        return [outputs[i] for i in order]

    def reset_prefix_cache(self) -> int:
        """Forgets the cached prefixes (as vLLM's LLM.reset_prefix_cache); returns the blocks."""
        return self.engine.reset_prefix_cache()

    def stream(
        self, prompt: Prompt, sampling_params: SamplingParams | None = None
    ) -> Iterator[RequestDelta]:
        request_id = f"offline-{next(self._ids)}"
        self.engine.add_request(
            request_id, self._prompt_ids(prompt), sampling_params or SamplingParams()
        )
        try:
            while True:
                for delta in self.engine.step():
                    if delta.request_id == request_id:
                        yield delta
                        if delta.finished:
                            return
        finally:
            self.engine.abort(request_id)


def _broadcast(value, n: int, what: str) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{what} has {len(value)} entries for {n} prompts")
        return list(value)
    return [value] * n
