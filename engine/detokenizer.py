# Streaming detokenization with stop strings. Imports no torch.
#
# Each step decodes a small window of tokens: ids[prefix:] against ids[prefix:read], where
# `read` is the last token boundary at which everything has been committed and `prefix` the one
# before it. The window's first tokens are left context, so leading spaces and byte merges come
# out as they do when the whole sequence is decoded at once. One exception keeps the work per
# step bounded: a U+FFFD still pending after _MAX_HELD_TOKENS tokens is committed as is, so
# invalid bytes separated by many skipped tokens may render differently from a one-shot decode.
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from engine.stop_matcher import StopMatcher

_FFFD = "\ufffd"
_PROMPT_CONTEXT = 5  # prompt tokens kept as left context for the first output tokens
_HELD_TOKENS = 4  # tokens held behind a trailing U+FFFD before looking for a clean split
_MAX_HELD_TOKENS = 8  # then the U+FFFD is committed as is, bounding the work per step
_SILENT_TOKENS = 16  # tokens that decode to nothing (skipped specials) before the window moves on
_TRIM_AT = 4096


class _Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: _Decoder,
        prompt_token_ids: Sequence[int],
        *,
        stop: Sequence[str] = (),
        skip_special_tokens: bool = True,
        include_stop_str_in_output: bool = False,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._stops = StopMatcher(stop)
        self._include_stop = include_stop_str_in_output

        context = list(prompt_token_ids[-_PROMPT_CONTEXT:]) if prompt_token_ids else []
        context_text = self._decode(context)
        if context_text.endswith(_FFFD):
            # The prompt may end inside a character; output must not complete it.
            context, context_text = [], ""
        self._ids = context
        self._prefix = 0
        self._read = len(context)
        self._prefix_len = len(context_text)
        self._held = ""  # decoded text not yet released: it may be the start of a stop string
        self._chunks: list[str] = []
        self._done = False
        self.stop_reason: str | None = None

    @property
    def text(self) -> str:
        if len(self._chunks) > 1:
            self._chunks = ["".join(self._chunks)]
        return self._chunks[0] if self._chunks else ""

    @property
    def finished(self) -> bool:
        return self._done

    def update(self, new_token_ids: Sequence[int]) -> str:
        if self._done or not new_token_ids:
            return ""
        self._ids.extend(new_token_ids)
        return self._release(self._advance(), final=False)

    def flush(self) -> str:
        if self._done:
            return ""
        tail = self._decode(self._ids[self._prefix :])[self._prefix_len :]
        out = self._release(tail, final=True)
        self._done = True
        return out

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special) if ids else ""

    def _advance(self) -> str:
        ids = self._ids
        text = self._decode(ids[self._prefix :])
        # Only a U+FFFD in the not-yet-committed part can still become a character; one that
        # was committed earlier must not hold the window (that made every later step rescan).
        if not text[self._prefix_len :].endswith(_FFFD):
            if len(text) > self._prefix_len or len(ids) - self._read > _SILENT_TOKENS:
                return self._commit(len(ids), text)
            return ""
        held = len(ids) - self._read
        if held <= _HELD_TOKENS:
            return ""
        if held > _MAX_HELD_TOKENS:
            # No character spans this many tokens: what is held is invalid bytes for good.
            return self._commit(len(ids), text)
        # A U+FFFD that outlives several tokens is most likely an invalid byte rather than a
        # character still being assembled (a random-weight model can repeat 0xFF forever).
        # Commit up to the last token boundary that splits the text cleanly: decoding both
        # sides separately gives the same text, so later tokens cannot change the left side.
        for j in range(len(ids) - 1, self._read, -1):
            head = self._decode(ids[self._prefix : j])
            tail = self._decode(ids[j:])
            if tail and head + tail == text:
                return self._commit(j, head)
        return ""

    def _commit(self, end: int, text: str) -> str:
        new_text = text[self._prefix_len :]
        self._prefix, self._read = self._read, end
        self._prefix_len = len(self._decode(self._ids[self._prefix : end]))
        if self._prefix >= _TRIM_AT:
            del self._ids[: self._prefix]
            self._read -= self._prefix
            self._prefix = 0
        return new_text

    def _release(self, new_text: str, *, final: bool) -> str:
        if not self._stops.stops:
            out = new_text
        else:
            # The held text is the matcher's partial match: a stop that completes in the new text
            # starts inside the held text or the new text, never in text released earlier. Which
            # stop wins does not depend on how the text was split into tokens (StopMatcher.feed).
            buf = self._held + new_text
            hit = self._stops.feed(new_text)
            if hit is not None:
                end_in_new, stop = hit
                end = len(self._held) + end_in_new
                self.stop_reason = stop
                self._done = True
                out = buf[:end] if self._include_stop else buf[: end - len(stop)]
                self._held = ""
            else:
                keep = 0 if final else self._stops.partial_len
                out, self._held = buf[: len(buf) - keep], buf[len(buf) - keep :]
        if out:
            self._chunks.append(out)
        return out
