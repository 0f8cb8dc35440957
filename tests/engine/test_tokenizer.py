from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import jinja2
import pytest
import transformers

from engine.tokenizer import ByteTokenizer, Tokenizer
from tests.tokenizer_fixture import BOS, EOS, IM_END, IM_START, write_test_tokenizer

TEXTS = [
    "",
    "Hello world",
    "  leading and trailing spaces  ",
    "The café served crème brûlée; naïve résumé.",
    "東京と日本の天気 🙂👍🚀 🇫🇷",
    "def f(x):\n    return x ** 2  # squares\n\n\ttabs",
    "Numbers 3.14159, 1e-5, -42, 100% and $25.4",
    f"{IM_START}user\nhi there{IM_END}\n{IM_START}assistant\n",
    f"{BOS}text with{EOS} specials inside",
    "unseen words: zyxwvut qqqq ÆØÅ ß",
]

LLAMA3_STYLE = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}
{{- 'Today Date: ' + date_string + '\\n\\n' }}
{{- system_message }}
{{- '<|eot_id|>' }}
{%- for message in messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/...') }}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
    {{- message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

QWEN_STYLE = """{%- set ns = namespace(turns=0) %}
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- elif messages[0].role != 'system' %}
    {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' and tools %}{% continue %}{% endif %}
    {%- set ns.turns = ns.turns + 1 %}
    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

PARTS_AWARE = """{% for message in messages %}<|im_start|>{{ message['role'] }}
{% if message['content'] is string %}{{ message['content'] }}{% else %}
{% for part in message['content'] %}{% if part['type'] == 'text' %}[{{ part['text'] }}]{% endif %}
{% endfor %}{% endif %}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

MESSAGES = [
    {"role": "system", "content": "  You are terse.  "},
    {"role": "user", "content": "What is the capital of 日本?"},
    {"role": "assistant", "content": "Tokyo 🗼"},
    {"role": "user", "content": "And of France?"},
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Météo for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tok")
    write_test_tokenizer(d)
    return d


@pytest.fixture(scope="module")
def ours(tok_dir: Path) -> Tokenizer:
    return Tokenizer.from_pretrained(tok_dir)


@pytest.fixture(scope="module")
def hf(tok_dir: Path):
    return transformers.AutoTokenizer.from_pretrained(tok_dir)


def test_fixture_is_fast_deterministic_and_sized(tmp_path: Path) -> None:
    t0 = time.perf_counter()
    write_test_tokenizer(tmp_path / "a")
    assert time.perf_counter() - t0 < 2.0
    write_test_tokenizer(tmp_path / "b")
    a = (tmp_path / "a" / "tokenizer.json").read_text()
    assert a == (tmp_path / "b" / "tokenizer.json").read_text()
    assert Tokenizer.from_pretrained(tmp_path / "a").vocab_size == 512
    write_test_tokenizer(tmp_path / "c", vocab_size=300)
    assert Tokenizer.from_pretrained(tmp_path / "c").vocab_size <= 300
    with pytest.raises(ValueError):
        write_test_tokenizer(tmp_path / "d", vocab_size=200)


def test_special_ids(ours: Tokenizer, hf) -> None:
    assert ours.bos_token_id == hf.bos_token_id == ours.token_to_id(BOS)
    assert ours.eos_token_ids == (hf.eos_token_id,)
    assert set(hf.all_special_ids) <= set(ours.all_special_ids)
    assert ours.token_to_id(IM_END) in ours.all_special_ids
    assert ours.id_to_token(ours.bos_token_id) == BOS
    assert ours.vocab_size == len(hf)
    assert ours.model_max_length == 4096


def test_eos_ids_union_of_configs(tmp_path: Path) -> None:
    write_test_tokenizer(tmp_path)
    tok = Tokenizer.from_pretrained(tmp_path)
    eos, im_end = tok.token_to_id(EOS), tok.token_to_id(IM_END)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [im_end, eos]}))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert Tokenizer.from_pretrained(tmp_path).eos_token_ids == (eos, im_end, 7)


@pytest.mark.parametrize("add_special", [True, False])
def test_encode_matches_hf(ours: Tokenizer, hf, add_special: bool) -> None:
    for text in TEXTS:
        assert ours.encode(text, add_special_tokens=add_special) == hf.encode(
            text, add_special_tokens=add_special
        ), text
    assert ours.encode("hi")[0] == ours.bos_token_id


@pytest.mark.parametrize("skip", [True, False])
def test_decode_matches_hf(ours: Tokenizer, hf, skip: bool) -> None:
    for text in TEXTS:
        ids = ours.encode(text)
        assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(
            ids, skip_special_tokens=skip
        )
    rng = random.Random(0)
    for _ in range(200):
        ids = [rng.randrange(ours.vocab_size) for _ in range(rng.randint(0, 30))]
        assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(
            ids, skip_special_tokens=skip
        )


def test_decode_ignores_ids_beyond_vocab(ours: Tokenizer) -> None:
    ids = ours.encode("Hello", add_special_tokens=False)
    assert ours.decode([*ids, ours.vocab_size + 5]) == "Hello"


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_fixture_chat_template_matches_hf(ours: Tokenizer, hf, add_generation_prompt: bool) -> None:
    msgs = [m for m in MESSAGES if m["role"] != "system"]
    text = ours.apply_chat_template(msgs, add_generation_prompt=add_generation_prompt)
    assert text == hf.apply_chat_template(
        msgs, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    ids = ours.apply_chat_template(msgs, add_generation_prompt=add_generation_prompt, tokenize=True)
    expected = hf.apply_chat_template(
        msgs, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
    )
    assert ids == list(expected)
    # bos comes from the template text only, never added a second time.
    assert ids.count(ours.bos_token_id) == 1 and ids[0] == ours.bos_token_id


@pytest.mark.parametrize("template", [LLAMA3_STYLE, QWEN_STYLE], ids=["llama3", "qwen"])
@pytest.mark.parametrize("with_tools", [False, True])
def test_foreign_templates_match_hf(ours: Tokenizer, hf, template: str, with_tools: bool) -> None:
    tools = TOOLS if with_tools else None
    for msgs in (MESSAGES, MESSAGES[1:2]):
        for gen in (True, False):
            kw = {"add_generation_prompt": gen, "chat_template": template, "tools": tools}
            assert ours.apply_chat_template(msgs, **kw) == hf.apply_chat_template(
                msgs, tokenize=False, **kw
            )


def test_template_kwargs_and_raise_exception(ours: Tokenizer, hf) -> None:
    kw = {"chat_template": LLAMA3_STYLE, "date_string": "01 Jan 2030"}
    text = ours.apply_chat_template(MESSAGES, **kw)
    assert "Today Date: 01 Jan 2030" in text
    assert text == hf.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True, **kw
    )
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(jinja2.TemplateError, match="alternate"):
        ours.apply_chat_template(bad, chat_template=LLAMA3_STYLE)


def test_content_parts(ours: Tokenizer, hf) -> None:
    parts = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
        }
    ]
    # A template that expects strings sees the parts joined.
    joined = [{"role": "user", "content": "one\ntwo"}]
    assert ours.apply_chat_template(parts) == ours.apply_chat_template(joined)
    # A template that handles parts itself gets them as they are, like HF.
    assert ours.apply_chat_template(parts, chat_template=PARTS_AWARE) == hf.apply_chat_template(
        parts, chat_template=PARTS_AWARE, tokenize=False, add_generation_prompt=True
    )
    with pytest.raises(ValueError, match="image_url"):
        ours.apply_chat_template([{"role": "user", "content": [{"type": "image_url"}]}])


def test_generation_tag(ours: Tokenizer) -> None:
    template = (
        "{% for m in messages %}{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}"
    )
    assert ours.apply_chat_template(MESSAGES[1:3], chat_template=template) == (
        "What is the capital of 日本?Tokyo 🗼"
    )


def test_missing_chat_template(tmp_path: Path) -> None:
    write_test_tokenizer(tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = Tokenizer.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template(MESSAGES)
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert (
        Tokenizer.from_pretrained(tmp_path).apply_chat_template(MESSAGES) == MESSAGES[0]["content"]
    )


def test_named_templates(tmp_path: Path) -> None:
    write_test_tokenizer(tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = [
        {"name": "default", "template": "D{{ messages | length }}"},
        {"name": "tool_use", "template": "T{{ tools | length }}"},
    ]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = Tokenizer.from_pretrained(tmp_path)
    assert tok.apply_chat_template(MESSAGES) == "D4"
    assert tok.apply_chat_template(MESSAGES, tools=TOOLS) == "T1"
    assert tok.apply_chat_template(MESSAGES, chat_template="tool_use", tools=[]) == "T0"


def test_for_model(tok_dir: Path) -> None:
    assert isinstance(Tokenizer.for_model(tok_dir), Tokenizer)
    assert isinstance(Tokenizer.for_model(str(tok_dir)), Tokenizer)
    tiny = Tokenizer.for_model("tiny")
    assert isinstance(tiny, ByteTokenizer)
    assert tiny.vocab_size == 8192 and tiny.eos_token_ids == () and tiny.bos_token_id is None
    llama = Tokenizer.for_model("llama-3.1-8b")
    assert llama.bos_token_id == 128000 and llama.eos_token_ids == (128001, 128008, 128009)
    assert llama.vocab_size == 128256
    assert llama.encode("hi") == [128000, ord("h"), ord("i")]
    assert isinstance(Tokenizer.for_model("no-such-model"), ByteTokenizer)


def test_byte_tokenizer() -> None:
    tok = Tokenizer.for_model("llama-3.1-8b")
    text = "héllo 🙂"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == list(text.encode())
    assert tok.decode(ids) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=True)
    assert chat[0] == tok.token_to_id(IM_START) and tok.token_to_id(IM_END) in chat
    assert tok.decode(chat) == "user\nhi\nassistant\n"
    assert tok.decode(chat, skip_special_tokens=False) == tok.apply_chat_template(
        [{"role": "user", "content": "hi"}]
    )
    # Ids beyond the bytes (a random model samples anything) decode to a distinct visible piece
    # each, so a preset streams text; specials (an EOS id here) are skipped.
    visible = tok.decode([127000])
    assert len(visible) in (2, 3) and visible.isprintable()
    pieces = [tok.id_to_token(i) for i in range(256, 128000)]
    assert len(set(pieces)) == len(pieces)  # as distinct as a real vocabulary's strings
    assert tok.decode([104, 128009, 127000, 105]) == "h" + visible + "i"
    assert tok.decode(list(range(256, 4096))).isprintable()
    assert tok.decode([128000, 104], skip_special_tokens=False) == BOS + "h"
    assert tok.decode([0xE6, 0x97]) == "\ufffd"
    assert tok.id_to_token(65) == "<0x41>" and tok.token_to_id("<0x41>") == 65
    assert tok.id_to_token(127000) == visible and tok.id_to_token(128009) is None
    assert tok.id_to_token(tok.vocab_size) is None


def test_imports_without_torch() -> None:
    code = (
        "import sys\n"
        "from engine.tokenizer import Tokenizer\n"
        "import engine.detokenizer\n"
        "Tokenizer.for_model('tiny')\n"
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


def test_a_long_text_is_encoded_without_holding_the_interpreter_lock():
    # An API process tokenises in its threadpool: a long prompt must not stop its event loop
    # (the main thread here) for the whole encode, as tokenizers' single encode does.
    import threading

    shipped = Path(__file__).resolve().parents[2] / "models" / "fleetlm-tiny-chat"
    tok = Tokenizer.from_pretrained(shipped)
    text = "hello world, " * 150_000  # ~2 MB: on the order of a second to encode
    started, done = threading.Event(), threading.Event()
    result: list = []

    def encode():
        started.set()
        result.append(tok.encode(text))
        done.set()

    thread = threading.Thread(target=encode)
    thread.start()
    started.wait()
    turns = 0
    while not done.is_set():
        time.sleep(0.001)
        turns += 1
    thread.join()
    assert result[0] == tok._tok.encode(text).ids  # the same tokens either way
    assert turns >= 20, f"the main thread ran {turns} times during the encode"


def test_byte_tokenizer_backend_json_is_the_same_vocabulary() -> None:
    # What grammar engines tokenize with in Rust (engine/grammar.py): the same ids for text and
    # specials, the same bytes for every id past the byte range.
    from tokenizers import Tokenizer as Backend

    tok = Tokenizer.for_model("llama-3.1-8b")
    backend = Backend.from_str(tok.backend_json())
    assert backend.get_vocab_size() == tok.vocab_size
    for text in ["héllo 🙂", '{"a": [1, 2]}\n\t', f"{IM_START}user\nhi{IM_END}{BOS}", "  x  "]:
        ids = tok.encode(text, add_special_tokens=False)
        assert backend.encode(text, add_special_tokens=False).ids == ids
        assert backend.decode(ids, skip_special_tokens=False) == tok.decode(ids, False)
    for i in [*range(256, 4400, 7), *range(127990, 128256)]:
        assert backend.decode([i]) == tok.decode([i]), i
    # A special that is also a byte's id (bos 1) cannot be said in a JSON vocabulary.
    assert ByteTokenizer(32000, 1, (2,)).backend_json() is None
