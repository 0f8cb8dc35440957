# Grammars for constrained decoding, with llguidance (a Rust Earley parser over the tokenizer's
# byte strings): a StructuredOutput becomes an llguidance grammar, is checked and compiled once
# per distinct spec (cached), and each constrained request gets its own matcher (a copy of the
# compiled one) that says which tokens may come next. Torch-free: the API checks grammars with
# this module too (service/prepare.py), so a bad schema is a 400 before it reaches a worker.
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

import llguidance
from llguidance import LLMatcher, LLTokenizer
from llguidance.gbnf_to_lark import gbnf_to_lark

from engine.sampling_params import StructuredOutput

# JSON output without optional whitespace: a model (a random-weight one above all) could
# otherwise spend its whole budget on spaces and newlines between tokens of the structure.
_JSON_OPTIONS = {"whitespace_flexible": False}


def grammar_source(spec: StructuredOutput) -> str:
    """The llguidance grammar (its JSON or Lark form) for a spec. Raises ValueError for a spec
    that is not even well-formed (a schema that is not JSON, choices that are not strings)."""
    if spec.kind == "json_object":
        return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=_JSON_OPTIONS)
    if spec.kind == "json_schema":
        try:
            schema = json.loads(spec.spec)
        except ValueError as exc:
            raise ValueError(f"the JSON schema is not valid JSON: {exc}") from None
        if not isinstance(schema, dict | bool):
            raise ValueError("a JSON schema must be an object or a boolean")
        try:
            return LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)
        except Exception as exc:  # llguidance raises its own errors for schemas it rejects
            raise ValueError(f"the JSON schema is not supported: {exc}") from None
    if spec.kind == "regex":
        return LLMatcher.grammar_from_regex(spec.spec)
    if spec.kind == "choice":
        try:
            choices = json.loads(spec.spec)
        except ValueError:
            choices = None
        if not isinstance(choices, list):
            raise ValueError("choices must be a JSON list of strings")
        if not choices or not all(isinstance(c, str) and c for c in choices):
            raise ValueError("choices must be a non-empty list of non-empty strings")
        # Lark string literals are JSON string literals (ensure_ascii off: no \u escapes).
        alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
        return LLMatcher.grammar_from_lark(f"start: {alternatives}")
    source = spec.spec
    if "::=" in source:  # GBNF (llama.cpp, xgrammar's EBNF) → Lark
        try:
            source = gbnf_to_lark(source)
        except Exception as exc:
            raise ValueError(f"the grammar is not valid GBNF: {exc}") from None
    return LLMatcher.grammar_from_lark(source)


class _ByteTokens:
    """llguidance's TokenizerWrapper protocol for engine.tokenizer.ByteTokenizer (presets with
    dummy weights): each id's bytes are what the tokenizer decodes it to."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        self._tok = tokenizer
        self.eos_token_id = eos_token_ids[0] if eos_token_ids else None
        self.bos_token_id = tokenizer.bos_token_id
        self.special_token_ids = list(tokenizer.all_special_ids)
        special = set(self.special_token_ids)
        self.tokens = [
            b"" if i in special else tokenizer.decode([i]).encode() for i in range(vocab_size)
        ]
        self.is_tokenizer_wrapper = True

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tok.encode(text, add_special_tokens=False)


def ll_tokenizer(tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...]) -> LLTokenizer:
    """The tokenizer as llguidance sees it: every id below the model's vocabulary size (ids the
    tokenizer does not have are never allowed), the model's end-of-sequence ids."""
    eos = list(eos_token_ids) or None
    backend_json = getattr(tokenizer, "backend_json", None)
    source = backend_json() if backend_json is not None else None
    if source is not None:  # tokenized in Rust (a Python tokenizer is called once per mask)
        return LLTokenizer(source, n_vocab=vocab_size, eos_token=eos)
    wrapper = _ByteTokens(tokenizer, vocab_size, eos_token_ids)
    return LLTokenizer(llguidance.TokenizerWrapper(wrapper), n_vocab=vocab_size, eos_token=eos)


class GrammarCompiler:
    """Checks and compiles grammars for one tokenizer; the compiled matchers are cached (LRU)
    by spec. Thread-safe: the engine compiles on a worker thread, the API in its threadpool."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_token_ids: tuple[int, ...],
        cache_size: int = 256,
    ) -> None:
        self._source = (tokenizer, vocab_size, tuple(eos_token_ids))
        self._tokenizer: LLTokenizer | None = None  # built on first use (~1 s for 128k ids)
        self.cache_size = cache_size
        self._compiled: OrderedDict[StructuredOutput, LLMatcher] = OrderedDict()
        self._lock = threading.Lock()
        self.num_compiled = 0  # cache misses (tests and metrics read it)

    @property
    def tokenizer(self) -> LLTokenizer:
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = ll_tokenizer(*self._source)
            return self._tokenizer

    def check(self, spec: StructuredOutput) -> None:
        """Raises ValueError with llguidance's reason when the spec cannot be compiled."""
        self.matcher(spec)

    def matcher(self, spec: StructuredOutput) -> LLMatcher:
        """A fresh matcher at the start of the spec's grammar. Raises ValueError."""
        with self._lock:
            compiled = self._compiled.get(spec)
            if compiled is not None:
                self._compiled.move_to_end(spec)
                return compiled.deep_copy()
        compiled = self._compile(spec)  # outside the lock: other specs compile meanwhile
        with self._lock:
            self._compiled[spec] = compiled
            while len(self._compiled) > self.cache_size:
                self._compiled.popitem(last=False)
            return compiled.deep_copy()

    def _compile(self, spec: StructuredOutput) -> LLMatcher:
        source = grammar_source(spec)
        tokenizer = self.tokenizer
        try:
            error = LLMatcher.validate_grammar(source, tokenizer)
            matcher = None if error else LLMatcher(tokenizer, source)
        except Exception as exc:  # whatever llguidance raises, the spec is what it rejects
            error = str(exc) or type(exc).__name__
        if not error and matcher.is_error():
            error = matcher.get_error()
        if error:
            raise ValueError(f"the {spec.kind} grammar cannot be compiled: {error}")
        self.num_compiled += 1
        return matcher
