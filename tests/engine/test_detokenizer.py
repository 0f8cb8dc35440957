from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from engine.detokenizer import IncrementalDetokenizer
from engine.tokenizer import ByteTokenizer, Tokenizer
from tests.tokenizer_fixture import write_test_tokenizer

TEXT = (
    "The café near 東京 served crème brûlée 🙂👍 at 09:45. def f(x): return x ** 2\n"
    "Prices: 19.99, -7 and 100%! Привет, мир. 🇫🇷 flags take several code points."
)


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    d = tmp_path_factory.mktemp("tok")
    write_test_tokenizer(d)
    return Tokenizer.from_pretrained(d)


@pytest.fixture(scope="module")
def byte_tok() -> ByteTokenizer:
    return ByteTokenizer()


def stream(detok: IncrementalDetokenizer, ids: Sequence[int], chunk: int = 1) -> list[str]:
    return [detok.update(list(ids[i : i + chunk])) for i in range(0, len(ids), chunk)]


def reference_stop(text: str, stops: Sequence[str]) -> tuple[str, str | None]:
    # Grow the text one character at a time; the first stop to appear wins.
    for end in range(1, len(text) + 1):
        hits = [(end - len(s), s) for s in stops if text[:end].endswith(s)]
        if hits:
            start, stop = min(hits)
            return text[:start], stop
    return text, None


def test_plain_stream_matches_decode(tok: Tokenizer) -> None:
    prompt = tok.encode("Tell me something:")
    ids = tok.encode(TEXT, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, prompt)
    pieces = stream(detok, ids)
    assert "".join(pieces) + detok.flush() == TEXT
    assert detok.text == TEXT
    assert not any("\ufffd" in p for p in pieces)
    assert detok.stop_reason is None


def test_prompt_does_not_leak_and_leading_space_kept(tok: Tokenizer) -> None:
    prompt = tok.encode("Hello")
    ids = tok.encode(" world", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, prompt)
    assert "".join(stream(detok, ids)) + detok.flush() == " world"


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("chunk", [1, 3])
def test_join_invariant_random_bpe_ids(tok: Tokenizer, skip: bool, chunk: int) -> None:
    rng = random.Random(1 + chunk + skip)
    for _ in range(300):
        prompt = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(0, 8))]
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(0, 50))]
        detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
        out = "".join(stream(detok, ids, chunk)) + detok.flush()
        assert out == tok.decode(ids, skip_special_tokens=skip), (prompt, ids)
        assert detok.text == out


@pytest.mark.parametrize("skip", [True, False])
def test_join_invariant_random_bytes(byte_tok: ByteTokenizer, skip: bool) -> None:
    rng = random.Random(7 + skip)
    # Mostly pieces of multi-byte characters and invalid bytes, plus ASCII and specials.
    pool = [0xE6, 0x97, 0xA5, 0xF0, 0x9F, 0x99, 0x82, 0xC3, 0xA9, 0xFF, 0xC0, 0x80, 65, 32]
    for _ in range(500):
        prompt = [rng.choice(pool) for _ in range(rng.randint(0, 6))]
        ids = [
            rng.choice(pool) if rng.random() < 0.8 else rng.randrange(byte_tok.vocab_size + 3)
            for _ in range(rng.randint(0, 60))
        ]
        detok = IncrementalDetokenizer(byte_tok, prompt, skip_special_tokens=skip)
        out = "".join(stream(detok, ids, rng.choice([1, 1, 2, 5]))) + detok.flush()
        assert out == byte_tok.decode(ids, skip_special_tokens=skip), (prompt, ids)


def test_multibyte_characters_wait_for_their_last_byte(byte_tok: ByteTokenizer) -> None:
    detok = IncrementalDetokenizer(byte_tok, [])
    assert stream(detok, list("a🙂".encode())) == ["a", "", "", "", "🙂"]
    assert stream(detok, list("é".encode())) == ["", "é"]


def test_prompt_ending_mid_character(byte_tok: ByteTokenizer) -> None:
    # The output's continuation bytes must not be glued onto the prompt's lead byte.
    detok = IncrementalDetokenizer(byte_tok, [0x61, 0xE6])
    out = "".join(stream(detok, [0x97, 0xA5, 0x62])) + detok.flush()
    assert out == byte_tok.decode([0x97, 0xA5, 0x62]) == "\ufffd\ufffdb"


def test_flush_emits_incomplete_character(byte_tok: ByteTokenizer) -> None:
    detok = IncrementalDetokenizer(byte_tok, [])
    assert stream(detok, [0x6F, 0x6B, 0xE6, 0x97]) == ["o", "k", "", ""]
    assert detok.flush() == "\ufffd"
    assert detok.text == "ok\ufffd"
    assert detok.update([0x41]) == "" and detok.flush() == ""


def test_invalid_bytes_do_not_stall_the_stream(byte_tok: ByteTokenizer) -> None:
    # A random model may repeat an invalid byte forever; text must keep flowing.
    detok = IncrementalDetokenizer(byte_tok, [])
    pieces = stream(detok, [0xFF] * 100)
    assert sum(len(p) for p in pieces) >= 90
    assert "".join(pieces) + detok.flush() == "\ufffd" * 100


@pytest.mark.parametrize("chunk", [1, 2, 100])
def test_stop_across_tokens_is_never_emitted(byte_tok: ByteTokenizer, chunk: int) -> None:
    ids = byte_tok.encode("Hello STOP world", add_special_tokens=False)
    detok = IncrementalDetokenizer(byte_tok, [], stop=["STOP"])
    pieces = stream(detok, ids, chunk)
    assert "".join(pieces) == "Hello "
    assert all("S" not in p for p in pieces)
    assert detok.stop_reason == "STOP"
    assert detok.update([65]) == "" and detok.flush() == ""
    assert detok.text == "Hello "


def test_include_stop_str_in_output(byte_tok: ByteTokenizer) -> None:
    ids = byte_tok.encode("Hello STOP world", add_special_tokens=False)
    detok = IncrementalDetokenizer(byte_tok, [], stop=["STOP"], include_stop_str_in_output=True)
    assert "".join(stream(detok, ids)) == "Hello STOP"
    assert detok.stop_reason == "STOP"


def test_stop_inside_one_token(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT, add_special_tokens=False)
    pieces = [tok.decode([i]) for i in ids]
    piece = next(p for k, p in enumerate(pieces) if len(p.strip()) >= 3 and k > 3)
    stop = piece.strip()[1:-1]
    expected, reason = reference_stop(TEXT, [stop])
    assert reason == stop
    detok = IncrementalDetokenizer(tok, [], stop=[stop])
    out = "".join(stream(detok, ids)) + detok.flush()
    assert out == expected and detok.stop_reason == stop


def test_stop_strings_on_bpe_text(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT, add_special_tokens=False)
    for stops in (["brûlée"], ["🙂"], ["x ** 2\nPri"], ["Привет", "served"], ["東京 s"]):
        expected, reason = reference_stop(TEXT, stops)
        for chunk in (1, 4):
            detok = IncrementalDetokenizer(tok, tok.encode("prompt"), stop=stops)
            out = "".join(stream(detok, ids, chunk)) + detok.flush()
            assert (out, detok.stop_reason) == (expected, reason), stops


def test_first_completed_stop_wins(byte_tok: ByteTokenizer) -> None:
    cases = [
        ("hello world", ["world", "lo w"], "hel", "lo w"),
        ("xabcd", ["bc", "abc"], "x", "abc"),  # same end: the longer one
        ("xabcd", ["cd", "ab"], "x", "ab"),
    ]
    for text, stops, expected, reason in cases:
        ids = list(text.encode())
        for chunk in (1, 2, len(ids)):
            detok = IncrementalDetokenizer(byte_tok, [], stop=stops)
            assert "".join(stream(detok, ids, chunk)) == expected
            assert detok.stop_reason == reason


def test_held_prefix_released_when_not_a_stop(byte_tok: ByteTokenizer) -> None:
    detok = IncrementalDetokenizer(byte_tok, [], stop=["STOP"])
    assert stream(detok, list(b"aST")) == ["a", "", ""]
    assert detok.update([ord("A")]) == "STA"
    assert stream(detok, list(b"S")) == [""]
    assert detok.flush() == "S"
    assert detok.text == "aSTAS" and detok.stop_reason is None


def test_random_stops_match_reference(byte_tok: ByteTokenizer) -> None:
    rng = random.Random(3)
    for _ in range(400):
        text = "".join(rng.choice("ab cé") for _ in range(rng.randint(0, 40)))
        stops = ["".join(rng.choice("ab cé") for _ in range(rng.randint(1, 4))) for _ in range(3)]
        expected, reason = reference_stop(text, stops)
        ids = list(text.encode())
        detok = IncrementalDetokenizer(byte_tok, [], stop=stops)
        out = "".join(stream(detok, ids, rng.choice([1, 2, 3, 7]))) + detok.flush()
        assert (out, detok.stop_reason) == (expected, reason), (text, stops)


class CountingTokenizer:
    def __init__(self, inner) -> None:
        self.inner = inner
        self.longest = 0

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        self.longest = max(self.longest, len(ids))
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)


@pytest.mark.parametrize("which", ["bpe", "bytes", "invalid", "specials"])
def test_decode_window_stays_small(tok: Tokenizer, byte_tok: ByteTokenizer, which: str) -> None:
    if which == "bpe":
        inner, ids = tok, tok.encode(TEXT * 40, add_special_tokens=False)
    elif which == "bytes":
        inner, ids = byte_tok, list((TEXT * 20).encode())
    elif which == "invalid":
        inner, ids = byte_tok, [0xFF] * 3000
    else:
        inner, ids = tok, [tok.token_to_id("<|im_end|>")] * 3000
    counting = CountingTokenizer(inner)
    detok = IncrementalDetokenizer(counting, list(range(100)), stop=["never appears", "\n\n"])
    out = "".join(stream(detok, ids)) + detok.flush()
    assert out == inner.decode(ids)
    assert counting.longest <= 40
