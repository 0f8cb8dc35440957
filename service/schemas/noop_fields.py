# Request fields that the OpenAI API or vLLM defines and fleetlm does not implement. The rule
# (docs/serving.md#request-fields): nothing a client sends is silently dropped.
#   - an unknown top-level field is a 400 naming it (the schemas forbid extras);
#   - a field listed here is accepted only at a value that asks for nothing beyond what fleetlm
#     does anyway (bad_words: [], use_beam_search: false, ...);
#     any other value is a 400 naming the field.
# So a client that sends such a field at its default (some SDKs and load tools always do) works,
# and one that relies on it being honoured learns that it is not.
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

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


def check_no_op(value: Any, name: str) -> Any:
    allowed = NO_OP_VALUES[name]
    if value not in allowed:
        shown = " or ".join(repr(v) for v in allowed if v is not None)
        hint = f"omit it or send {shown}" if shown else "omit it or send null"
        raise ValueError(f"{name} is not supported by this server; {hint}")
    return value


def _check(value: Any, info: ValidationInfo) -> Any:
    return check_no_op(value, info.field_name)


class NoOpFields(BaseModel):
    """Both endpoints."""

    model_config = ConfigDict(extra="forbid")

    use_beam_search: Any = None
    prompt_logprobs: Any = None
    bad_words: Any = None

    _no_op = field_validator(
        "use_beam_search",
        "prompt_logprobs",
        "bad_words",
    )(_check)


class ChatNoOpFields(NoOpFields):
    functions: Any = None
    function_call: Any = None
    modalities: Any = None
    audio: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    store: Any = None
    echo: Any = None
    add_generation_prompt: Any = None
    continue_final_message: Any = None
    chat_template: Any = None
    chat_template_kwargs: Any = None
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
    )(_check)
