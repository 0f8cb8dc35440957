# Request fields shared by /v1/chat/completions and /v1/completions: OpenAI's plus vLLM's extra
# sampling parameters. Unknown fields are a 400, and fields that fleetlm knows but does not
# implement are accepted only at values that ask for nothing (service/schemas/noop_fields.py).
# Types are strict where OpenAI's API is: "8" or true is not a max_tokens, "yes" not a stream.
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from engine.priority import Priority
from engine.sampling_params import SamplingParams
from service.errors import invalid_param
from service.schemas.fields import (
    AsInteger,
    Metadata,
    NonEmptyStr,
    NonNegativeInt,
    PositiveInt,
    checked,
)
from service.schemas.noop_fields import NoOpFields
from service.schemas.structured import StructuredFields

MAX_STOP = 4
# OpenAI's limit on top_logprobs (engine/sampling/logprobs.py); each stop string's length is
# the max_stop_chars setting.
MAX_LOGPROBS = 20

Stop = NonEmptyStr | Annotated[list[NonEmptyStr], Field(max_length=MAX_STOP)]


def tier_priority(service_tier: str | None) -> Priority:
    """OpenAI's service_tier as a priority: "flex" is batch, anything else interactive. The
    only reading of service_tier (the HTTP request here, batch lines in workers/)."""
    return Priority.BATCH if service_tier == "flex" else Priority.INTERACTIVE


def priority_tier(priority: Priority) -> str:
    """What a chat response reports as its service_tier: "flex" for batch, else "default"."""
    return "flex" if priority is Priority.BATCH else "default"


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool = False  # a last chunk with the usage and no choices
    continuous_usage_stats: bool = False  # vLLM's: every chunk carries the usage so far
    # OpenAI's padding field, never added here: only false (the type says so).
    include_obfuscation: Literal[False] = False

    @field_validator("include_obfuscation", mode="before")
    @classmethod
    def _obfuscation(cls, v: Any) -> Any:
        if v is not False:
            raise ValueError("include_obfuscation is not supported; omit it or send false")
        return v


class SamplingRequest(StructuredFields, NoOpFields):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = checked("Only with `stream: true`.")
    max_tokens: PositiveInt | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    stop: Stop | None = None
    seed: Annotated[int, Field(ge=0, lt=2**63), AsInteger] | None = None
    # Choices (each its own index; the bound is the max_n setting, service/prepare.py).
    n: Annotated[int, Field(ge=1), AsInteger] = checked(
        "At most the max_n setting (the document's maximum); completions: not above best_of, "
        "and above 1 only with max_tokens of at least 1.",
        1,
    )
    user: str | None = None
    metadata: Metadata | None = None
    service_tier: str | None = None  # "flex" → the batch priority; anything else → interactive
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    # token id (as a string, OpenAI's form) -> bias added to its logit
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100, allow_inf_nan=False)]] | None = (
        checked("Keys are token ids of the model's vocabulary.")
    )
    # Completions: how many top logprobs per token (0: the sampled token's alone); chat
    # overrides it with a bool and `top_logprobs`.
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS), AsInteger] | None = None
    # vLLM's extras
    top_k: Annotated[int, Field(ge=-1), AsInteger] | None = Field(
        None, description="-1 or 0: disabled."
    )
    min_p: float | None = Field(None, ge=0.0, le=1.0, allow_inf_nan=False)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0, allow_inf_nan=False)
    min_tokens: NonNegativeInt = checked(
        "At most max_tokens, and at most what the model's context leaves after the prompt.", 0
    )
    ignore_eos: bool = False
    stop_token_ids: list[NonNegativeInt] | None = checked("Token ids of the model's vocabulary.")
    skip_special_tokens: bool = True  # False: special tokens (the template's) appear in the text
    include_stop_str_in_output: bool = False  # True: the text ends with the stop string matched
    # Only slow (Python) tokenizers put spaces between special tokens; fleetlm's tokenizer is a
    # fast one, where vLLM ignores this too, so both values give the same text.
    spaces_between_special_tokens: bool = True

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> list[str]:
        return [v] if isinstance(v, str) else list(v or [])

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, v: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if v is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed when stream is true")
        return v

    @property
    def priority(self) -> Priority:
        return tier_priority(self.service_tier)

    @property
    def response_service_tier(self) -> str:
        return priority_tier(self.priority)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)

    def asked_max_tokens(self) -> int | None:
        """max_tokens as the client sent it (None: the rest of the context). Preparation
        resolves it once (engine.sampling_params.resolve_max_tokens) and passes the integer to
        .sampling()."""
        return self.max_tokens

    def check_max_tokens(self) -> None:
        """The bounds on max_tokens a field type cannot state (none here)."""

    def requested_logprobs(self) -> int | None:
        return self.logprobs

    def check_n(self, max_n: int) -> None:
        """`n` against the max_n setting (and, for completions, the fields it conflicts with)."""
        if self.n > max_n:
            raise invalid_param("n", f"n must be at most {max_n}, got {self.n}")

    def bias_by_id(self) -> dict[int, float] | None:
        if not self.logit_bias:
            return None
        try:
            return {int(k): v for k, v in self.logit_bias.items()}
        except ValueError:
            raise invalid_param("logit_bias", "logit_bias keys must be token ids") from None

    def engine_prompt_logprobs(self) -> int | None:
        return None

    def sampling(self, max_tokens: int) -> SamplingParams:
        """The engine's sampling params, as the queue message carries them to the worker;
        `max_tokens` resolved. The fields above bound every value SamplingParams checks."""
        if self.min_tokens > max_tokens:
            raise invalid_param("min_tokens", "min_tokens must not exceed max_tokens")
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            seed=self.seed,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            stop=list(self.stop or []),
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            structured_output=structured[1] if (structured := self.structured_output()) else None,
            logprobs=self.requested_logprobs(),
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            min_p=self.min_p or 0.0,
            logit_bias=self.bias_by_id(),
            prompt_logprobs=self.engine_prompt_logprobs(),
            n=self.n,
        )
