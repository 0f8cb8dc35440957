# Per-request sampling knobs. Torch-free: the worker builds these from queue messages.
from __future__ import annotations

from dataclasses import dataclass, field

MAX_STOP_STRINGS = 16


def resolve_max_tokens(max_tokens: int | None, num_prompt: int, max_model_len: int) -> int:
    """The one reading of "max_tokens None: the rest of the context". Applied once, where a
    request is built (service/prepare.py for the API and batch lines, the engine's intake for
    offline callers); everything after carries the integer."""
    return max_model_len - num_prompt if max_tokens is None else max_tokens


# What a constrained request's output must match (engine/grammar.py compiles it):
#   "json_schema": spec is a JSON schema (its JSON text); "json_object": any JSON object (spec "");
#   "regex": a regular expression; "choice": one of the strings of a JSON list;
#   "grammar": a Lark grammar (llguidance's dialect; GBNF is converted).
STRUCTURED_KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")


@dataclass(slots=True, frozen=True)
class StructuredOutput:
    kind: str
    spec: str = ""

    def __post_init__(self) -> None:
        if self.kind not in STRUCTURED_KINDS:
            raise ValueError(f"structured output kind must be one of {STRUCTURED_KINDS}")
        if self.kind != "json_object" and not self.spec:
            raise ValueError(f"a {self.kind} structured output needs a non-empty spec")


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 1.0  # 0 → greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 → disabled
    seed: int | None = None
    max_tokens: int | None = 16  # None → up to the model's context (resolve_max_tokens)
    min_tokens: int = 0  # EOS and stop_token_ids are masked until this many tokens exist
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    detokenize: bool = True  # False: token ids only (no text, no stop strings), as benchmarks do
    # Speculative decoding for this request: None → the engine's default (on when the engine has
    # a proposer), False → never, True → whenever the engine has a proposer.
    speculative: bool | None = None
    # Constrained decoding: every sampled token keeps the output a prefix of this grammar's
    # language. A dict (the queue message's form) is converted. Such a request never drafts.
    structured_output: StructuredOutput | None = None
    # Log-probabilities of each sampled token and of the `logprobs` most likely (0-20) ones;
    # None: none. Such a request never drafts (verification reports no logprobs).
    logprobs: int | None = None
    # Log-probabilities of the prompt's tokens (each given the ones before it) and the top
    # `prompt_logprobs` (0-20) at each position; None: none. Such a request skips the prefix
    # cache: every prompt position must be computed.
    prompt_logprobs: int | None = None
    # OpenAI's penalties (-2..2: subtracted from a token's logit once if it appeared in the
    # output / per time it did), vLLM's repetition_penalty (> 0; 1 off: a logit of a token seen
    # in the prompt or output is divided by it when positive, multiplied when negative), min_p
    # (0-1: tokens below min_p x the top token's probability are dropped), logit_bias (token id
    # -> -100..100 added to its logit).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    logit_bias: dict[int, float] | None = None
    # Choices to generate from the one prompt (OpenAI's `n`): the engine runs n copies that
    # share the prompt's KV blocks (engine/core/request_group.py); copy i samples with seed + i.
    n: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.structured_output, dict):
            self.structured_output = StructuredOutput(**self.structured_output)
        if self.structured_output is not None:
            self.speculative = False  # drafts are not checked against the grammar
        if self.uses_history or self.logit_bias or self.min_p:
            self.speculative = False  # verification applies none of these to draft rows
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                if not 0 <= value <= 20:
                    raise ValueError(f"{name} must be in [0, 20], got {value}")
                self.speculative = False
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = [int(t) for t in self.stop_token_ids]
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == -1:
            self.top_k = 0
        if self.top_k < 0:
            raise ValueError(f"top_k must be -1, 0 (disabled) or positive, got {self.top_k}")
        if self.max_tokens == 0 and self.prompt_logprobs is None:
            raise ValueError("max_tokens 0 (score the prompt only) needs prompt_logprobs")
        if self.max_tokens is not None and self.max_tokens < 0:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError("min_tokens must not exceed max_tokens")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings need detokenize=True")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.logit_bias:
            self.logit_bias = {int(t): float(b) for t, b in self.logit_bias.items()}
            if any(not -100.0 <= b <= 100.0 for b in self.logit_bias.values()):
                raise ValueError("logit_bias values must be in [-100, 100]")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ValueError("seed must be in [0, 2**63)")
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}")
        if self.n > 1 and self.max_tokens == 0:
            raise ValueError("n > 1 needs max_tokens of at least 1 (max_tokens 0 samples nothing)")

    @property
    def uses_history(self) -> bool:
        """Whether sampling reads the tokens so far (the penalties)."""
        return bool(self.presence_penalty or self.frequency_penalty) or (
            self.repetition_penalty != 1.0
        )

    @property
    def needs_plain_step(self) -> bool:
        """Whether its row must be sampled by the plain sampler: speculative verification
        reports no logprobs and applies no penalty, bias or min_p."""
        return (
            self.logprobs is not None
            or self.uses_history
            or bool(self.logit_bias)
            or self.min_p > 0
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1
