# Request fields that the OpenAI API or vLLM defines and fleetlm does not implement. The rule
# (docs/serving.md#request-fields): nothing a client sends is silently dropped.
#   - an unknown top-level field is a 400 naming it (the schemas forbid extras);
#   - a field listed here is accepted only at a value that asks for nothing beyond what fleetlm
#     does anyway (bad_words: [], use_beam_search: false, ...);
#     any other value is a 400 naming the field.
# So a client that sends such a field at its default (some SDKs and load tools always do) works,
# and one that relies on it being honoured learns that it is not. Each field's type says exactly
# those values (a const, an empty list, null), so the OpenAPI document allows nothing that is
# refused; the check before the type gives the message that names the field.
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

# name → the values that ask for nothing (compared with ==).
NO_OP_VALUES: dict[str, tuple[Any, ...]] = {
    # OpenAI, chat
    "functions": (None, []),
    "function_call": (None, "none"),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "verbosity": (None,),
    "web_search_options": (None,),
    "store": (None, False),  # fleetlm keeps no completions for later retrieval
    # vLLM, both endpoints
    "use_beam_search": (None, False),
    "prompt_logprobs": (None, 0),
    "bad_words": (None, []),
    # vLLM, chat (the template is always rendered with a generation prompt)
    "echo": (None, False),
    "add_generation_prompt": (None, True),
    "continue_final_message": (None, False),
    "chat_template": (None,),
    "chat_template_kwargs": (None, {}),
}


# The types that admit exactly NO_OP_VALUES (null is added where the field is declared).
EmptyList = Annotated[list[Any], Field(max_length=0)]
EmptyObject = Annotated[dict[str, Any], Field(max_length=0)]
TextOnly = Annotated[list[Literal["text"]], Field(min_length=1, max_length=1)]


def _same(value: Any, allowed: Any) -> bool:
    """JSON equality: a boolean is never a number (0 is not false), 0.0 is the integer 0."""
    if isinstance(value, bool) or isinstance(allowed, bool):
        return type(value) is type(allowed) and value == allowed
    return value == allowed


def check_no_op(value: Any, name: str) -> Any:
    allowed = NO_OP_VALUES[name]
    if not any(_same(value, v) for v in allowed):
        shown = " or ".join(repr(v) for v in allowed if v is not None)
        hint = f"omit it or send {shown}" if shown else "omit it or send null"
        raise ValueError(f"{name} is not supported by this server; {hint}")
    return value


def _check(value: Any, info: ValidationInfo) -> Any:
    return check_no_op(value, info.field_name)


class NoOpFields(BaseModel):
    """Both endpoints."""

    model_config = ConfigDict(extra="forbid")

    use_beam_search: Literal[False] | None = None
    prompt_logprobs: Literal[0] | None = None
    bad_words: EmptyList | None = None

    _no_op = field_validator(
        "use_beam_search",
        "prompt_logprobs",
        "bad_words",
        mode="before",
    )(_check)


class ChatNoOpFields(NoOpFields):
    functions: EmptyList | None = None
    function_call: Literal["none"] | None = None
    modalities: TextOnly | None = None
    audio: None = None
    prediction: None = None
    reasoning_effort: None = None
    verbosity: None = None
    web_search_options: None = None
    store: Literal[False] | None = None
    echo: Literal[False] | None = None
    add_generation_prompt: Literal[True] | None = None
    continue_final_message: Literal[False] | None = None
    chat_template: None = None
    chat_template_kwargs: EmptyObject | None = None
    # Hints with no effect to honour: the prefix cache works without a routing key (per
    # tenant); like `user`, an end-user id.
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    _chat_no_op = field_validator(
        "functions",
        "function_call",
        "modalities",
        "audio",
        "prediction",
        "reasoning_effort",
        "verbosity",
        "web_search_options",
        "store",
        "echo",
        "add_generation_prompt",
        "continue_final_message",
        "chat_template",
        "chat_template_kwargs",
        mode="before",
    )(_check)
