# The offline engine's public names, imported lazily: `engine.tokenizer` must stay importable
# without torch (the API tokenizes with it), so nothing here imports torch eagerly.
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.llm import LLM
    from engine.llm_engine import LLMEngine
    from engine.outputs import CompletionOutput, RequestDelta
    from engine.priority import Priority
    from engine.sampling_params import SamplingParams

_LAZY = {
    "LLM": "engine.llm",
    "LLMEngine": "engine.llm_engine",
    "EngineConfig": "engine.config",
    "SamplingParams": "engine.sampling_params",
    "Priority": "engine.priority",
    "CompletionOutput": "engine.outputs",
    "RequestDelta": "engine.outputs",
}

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineConfig",
    "LLMEngine",
    "Priority",
    "RequestDelta",
    "SamplingParams",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
