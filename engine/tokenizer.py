# Tokenizer and chat template. Imports no torch: the API server tokenizes with this module.
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as _Backend

# Named special-token slots of an HF tokenizer_config.json, passed to chat templates.
_SPECIAL_SLOTS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class _GenerationTag(jinja2.ext.Extension):
    # HF templates may wrap assistant turns in {% generation %} to build training masks;
    # for serving the block just renders its body.
    tags = {"generation"}  # noqa: RUF012

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # Jinja's own tojson HTML-escapes; HF templates expect plain json.dumps.
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@lru_cache(maxsize=32)
def _compile(source: str) -> tuple[jinja2.Template, bool]:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source), _reads_content_parts(env.parse(source))


def _is_content(node: nodes.Node) -> bool:
    while isinstance(node, nodes.Filter):
        node = node.node
    return (
        (isinstance(node, nodes.Getattr) and node.attr == "content")
        or (isinstance(node, nodes.Getitem) and getattr(node.arg, "value", None) == "content")
        or (isinstance(node, nodes.Name) and node.name == "content")
    )


def _reads_content_parts(ast: nodes.Template) -> bool:
    # Does the template loop over message content or test whether it is a string? If not, it
    # expects strings, and list-of-parts content is flattened before rendering.
    for node in ast.find_all(nodes.For):
        if _is_content(node.iter):
            return True
    for node in ast.find_all(nodes.Test):
        if node.name in ("string", "iterable", "sequence", "mapping") and _is_content(node.node):
            return True
    return False


def _flatten_content(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for message in messages:
        message = dict(message)
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.get("type") != "text":
                    raise ValueError(f"unsupported content part type {part.get('type')!r}")
                texts.append(part["text"])
            message["content"] = "\n".join(texts)
        out.append(message)
    return out


class _ChatMixin:
    chat_template: str | dict[str, str] | None
    special_tokens: dict[str, str]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        raise NotImplementedError

    def get_chat_template(
        self, chat_template: str | None = None, tools: Sequence[Any] | None = None
    ) -> str:
        templates = self.chat_template
        if isinstance(templates, dict):
            if chat_template is not None:
                return templates.get(chat_template, chat_template)
            if tools and "tool_use" in templates:
                return templates["tool_use"]
            if "default" in templates:
                return templates["default"]
            raise ValueError(f"no default chat template among {sorted(templates)}")
        if chat_template is not None:
            return chat_template
        if templates is None:
            raise ValueError(
                "this model has no chat template (tokenizer_config.json has no 'chat_template' "
                "and there is no chat_template.jinja); send a plain completion prompt instead"
            )
        return templates

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tokenize: bool = False,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        chat_template: str | None = None,
        **template_kwargs: Any,
    ) -> str | list[int]:
        template, reads_parts = _compile(self.get_chat_template(chat_template, tools))
        msgs = [dict(m) for m in messages] if reads_parts else _flatten_content(messages)
        text = template.render(
            messages=msgs,
            tools=list(tools) if tools is not None else None,
            documents=list(documents) if documents is not None else None,
            add_generation_prompt=add_generation_prompt,
            **{**self.special_tokens, **template_kwargs},
        )
        # Templates write bos themselves; HF does not add special tokens a second time.
        return self.encode(text, add_special_tokens=False) if tokenize else text


def _token_str(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (int(value),)


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


# Texts at least this long are encoded without holding the interpreter lock (Tokenizer.encode).
_UNLOCKED_ENCODE_CHARS = 16384


class Tokenizer(_ChatMixin):
    def __init__(
        self,
        backend: Any,
        *,
        special_tokens: Mapping[str, str] | None = None,
        extra_eos_token_ids: Iterable[int] = (),
        chat_template: str | dict[str, str] | None = None,
        model_max_length: int | None = None,
    ) -> None:
        self._tok = backend
        self.special_tokens = dict(special_tokens or {})
        self.chat_template = chat_template
        self.model_max_length = model_max_length
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.bos_token_id = self._slot_id("bos_token")
        eos = self._slot_id("eos_token")
        self.eos_token_ids = tuple(
            dict.fromkeys(([] if eos is None else [eos]) + [*extra_eos_token_ids])
        )
        specials = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
        specials.update(i for s in _SPECIAL_SLOTS if (i := self._slot_id(s)) is not None)
        specials.update(self.eos_token_ids)
        self.all_special_ids = tuple(sorted(specials))

    def _slot_id(self, slot: str) -> int | None:
        token = self.special_tokens.get(slot)
        return None if token is None else self._tok.token_to_id(token)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        backend = _Backend.from_file(str(path / "tokenizer.json"))
        config = _read_json(path / "tokenizer_config.json")
        legacy_map = _read_json(path / "special_tokens_map.json")
        special = {}
        for slot in _SPECIAL_SLOTS:
            token = _token_str(config.get(slot, legacy_map.get(slot)))
            if token is not None:
                special[slot] = token
        eos_ids = _ids(_read_json(path / "generation_config.json").get("eos_token_id"))
        eos_ids += _ids(_read_json(path / "config.json").get("eos_token_id"))
        max_len = config.get("model_max_length")
        if not isinstance(max_len, int | float) or max_len > 1e12:  # HF's "no limit" is 1e30
            max_len = None
        return cls(
            backend,
            special_tokens=special,
            extra_eos_token_ids=eos_ids,
            chat_template=_load_chat_template(path, config),
            model_max_length=None if max_len is None else int(max_len),
        )

    @classmethod
    def for_model(cls, model: str | Path) -> Tokenizer | ByteTokenizer:
        if (Path(model) / "tokenizer.json").is_file():
            return cls.from_pretrained(model)
        return ByteTokenizer.for_model(model)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if len(text) < _UNLOCKED_ENCODE_CHARS:
            return self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        # tokenizers' single encode holds the interpreter lock throughout (about a second for
        # a megabyte), stalling every other thread of the process, an API's event loop
        # included; its batch encode releases it while the Rust code runs.
        return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    @cached_property
    def max_token_chars(self) -> int:
        """The most characters one token stands for (its vocabulary string, which is at least as
        long as its text): a text of n characters is at least n / this many tokens."""
        return max(map(len, self._tok.get_vocab(with_added_tokens=True)))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        # HF would also run clean_up_tokenization_spaces; transformers 5 skips it for BPE models,
        # which every family we serve is.
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def backend_json(self) -> str:
        """The tokenizers-library JSON of the vocabulary (grammar engines read it)."""
        return self._tok.to_str()

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)


def _load_chat_template(path: Path, config: Mapping[str, Any]) -> str | dict[str, str] | None:
    # Same precedence as transformers: chat_template.jinja (and additional_chat_templates/*.jinja)
    # over the entry in tokenizer_config.json, which may be a list of named templates.
    templates: dict[str, str] = {}
    if (path / "chat_template.jinja").is_file():
        templates["default"] = (path / "chat_template.jinja").read_text(encoding="utf-8")
    extra_dir = path / "additional_chat_templates"
    if extra_dir.is_dir():
        for f in sorted(extra_dir.glob("*.jinja")):
            templates[f.stem] = f.read_text(encoding="utf-8")
    if not templates:
        entry = config.get("chat_template")
        if isinstance(entry, list):
            templates = {t["name"]: t["template"] for t in entry}
        elif isinstance(entry, str):
            templates["default"] = entry
    if not templates:
        return None
    if list(templates) == ["default"]:
        return templates["default"]
    return templates


# A preset's ids beyond the byte range and its specials decode to a piece of printable text each,
# so a random-weight preset streams about one visible chunk per generated token, as a real
# checkpoint does (benchmark tools measure TTFT and inter-token latency from the text). The
# pieces are distinct, two or three characters long, as a real vocabulary's are: grammar
# engines walk the vocabulary by its strings, and 128k ids spelling the same 64 characters
# made each constrained row's mask ~10x the work of a real tokenizer's (benchmarks/grammar_host).
_VISIBLE = "etaoinshrdlucmfwypvbgkjqxz ETAOINSHRDLUCMFWYPVBGKJQXZ0123456789.,"  # 64 distinct
_PAIRS = len(_VISIBLE) ** 2
_DISTINCT_IDS = 256 + _PAIRS + _PAIRS * len(_VISIBLE)  # ids below this have distinct pieces


def _piece(token_id: int) -> str:
    """The text of an id past the bytes: the (id - 256)-th string of two, then three, of the
    _VISIBLE characters (distinct below _DISTINCT_IDS = 256 + 64² + 64³ = 266,496)."""
    k = token_id - 256
    n = len(_VISIBLE)
    if k < _PAIRS:
        return _VISIBLE[k // n] + _VISIBLE[k % n]
    k -= _PAIRS
    return _VISIBLE[k // (n * n) % n] + _VISIBLE[k // n % n] + _VISIBLE[k % n]


class ByteTokenizer(_ChatMixin):
    """Ids 0-255 are raw bytes, then a few specials; any other id decodes to a distinct piece of
    two or three printable characters (_piece), which encoding does not map back."""

    SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>")

    def __init__(
        self,
        vocab_size: int = 256 + len(SPECIALS),
        bos_token_id: int | None = None,
        eos_token_ids: Iterable[int] = (),
    ) -> None:
        bos_name, eos_name = self.SPECIALS[:2]
        eos_token_ids = tuple(eos_token_ids)
        self._name_to_id = {name: 256 + i for i, name in enumerate(self.SPECIALS)}
        # A preset's own bos/eos ids (e.g. 128000 for Llama 3) take over those names.
        if bos_token_id is not None:
            self._name_to_id[bos_name] = bos_token_id
        if eos_token_ids:
            self._name_to_id[eos_name] = eos_token_ids[0]
        self._id_to_name = {i: name for name, i in self._name_to_id.items()}
        self._split = re.compile("(" + "|".join(map(re.escape, self.SPECIALS)) + ")")
        self.vocab_size = max(vocab_size, *(i + 1 for i in self._id_to_name))
        self.bos_token_id = bos_token_id
        self.eos_token_ids = eos_token_ids
        self.all_special_ids = tuple(sorted(set(self._id_to_name) | set(eos_token_ids)))
        self._specials = frozenset(self.all_special_ids)
        self.special_tokens = {"bos_token": bos_name, "eos_token": eos_name}
        self.chat_template: str | dict[str, str] | None = CHATML_TEMPLATE
        self.model_max_length: int | None = None

    @classmethod
    def for_model(cls, model: str | Path) -> ByteTokenizer:
        from engine.models.config import resolve_model_config

        try:
            config = resolve_model_config(model)
        except (ValueError, OSError, KeyError):
            return cls()
        return cls(config.vocab_size, config.bos_token_id, config.eos_token_ids)

    @property
    def max_token_chars(self) -> int:
        return max(map(len, self._name_to_id))  # a special; any other character is 1+ bytes

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [self.bos_token_id] if add_special_tokens and self.bos_token_id is not None else []
        for piece in self._split.split(text):
            if piece in self._name_to_id:
                ids.append(self._name_to_id[piece])
            else:
                ids.extend(piece.encode("utf-8"))
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        # One byte string for the whole sequence, so decoding is as streaming-consistent as
        # a byte-level BPE decoder.
        buf = bytearray()
        for i in ids:
            if 0 <= i < 256:
                buf.append(i)
            elif i in self._specials:
                if not skip_special_tokens and i in self._id_to_name:
                    buf += self._id_to_name[i].encode()
            elif i >= 256:
                buf += _piece(i).encode()
        return buf.decode("utf-8", errors="replace")

    def id_to_token(self, token_id: int) -> str | None:
        if 0 <= token_id < 256:
            return f"<0x{token_id:02X}>"
        if token_id in self._specials or not 256 <= token_id < self.vocab_size:
            return self._id_to_name.get(token_id)
        return _piece(token_id)

    def token_to_id(self, token: str) -> int | None:
        if m := re.fullmatch(r"<0x([0-9A-F]{2})>", token):
            return int(m.group(1), 16)
        return self._name_to_id.get(token)

    def backend_json(self) -> str | None:
        """The vocabulary as a tokenizers-library JSON, so a grammar engine tokenizes in Rust
        (through a Python callback it would take the interpreter lock once per constrained row
        and step): a byte-level BPE without merges, which encodes text to its UTF-8 bytes as
        encode() does, every other id its piece, the specials as special added tokens. None
        when the pieces would repeat (a vocabulary past _DISTINCT_IDS) or a special
        shares an id with a byte (bos 1, eos 2): a JSON vocabulary cannot say both."""
        if self.vocab_size > _DISTINCT_IDS or min(self._specials) < 256:
            return None
        chars = _byte_level_chars()
        vocab = {chars[b]: b for b in range(256)}
        added = []
        for i in range(256, self.vocab_size):
            if i in self._specials:
                name = self._id_to_name.get(i, f"<|special_{i}|>")
                vocab[name] = i  # in the model's vocabulary too, or tokenizers renumbers it
                added.append({"id": i, "content": name, "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": True})  # fmt: skip
            else:
                vocab["".join(chars[b] for b in _piece(i).encode())] = i
        byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                      "use_regex": False}  # fmt: skip
        model = {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": False, "vocab": vocab, "merges": [],
        }  # fmt: skip
        return json.dumps({
            "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None,
            "decoder": byte_level, "model": model,
        })  # fmt: skip


@lru_cache(maxsize=1)
def _byte_level_chars() -> list[str]:
    """Byte-level BPE's alphabet: byte b → the printable character that stands for it in a
    vocabulary (printable Latin-1 bytes themselves, the rest shifted past U+0100 in order)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    shifted = (b for b in range(256) if b not in chars)
    for n, b in enumerate(shifted):
        chars[b] = chr(0x100 + n)
    return [chars[b] for b in range(256)]
