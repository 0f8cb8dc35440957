# Constrained decoding in the engine: random-weight models, whose output is noise unless the
# grammar shapes it, must produce outputs that parse and validate against every kind of spec,
# sampled and greedy, plain and with overlapped scheduling; a spec llguidance cannot compile is
# a ValueError before anything runs; the device mask equals a per-token reference.
from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from engine import LLM, SamplingParams
from engine.core.request import Priority, Request
from engine.sampling.grammar_mask import GrammarMasks
from engine.sampling_params import StructuredOutput
from tests.hf_models import build_hf_model

pytestmark = pytest.mark.timeout(600)

TINY_CHAT = "models/fleetlm-tiny-chat"

# Bounded everywhere (lengths, items, enums): a random model never closes an open string on its
# own, so only bounds let every output finish within max_tokens.
SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tier": {"enum": ["free", "pro", "team"]},
        },
        "required": ["name", "age", "tier"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4},
            "owner": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1, "maximum": 999},
                    "admin": {"type": "boolean"},
                },
                "required": ["id", "admin"],
                "additionalProperties": False,
            },
        },
        "required": ["tags", "owner"],
        "additionalProperties": False,
    },
    {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "x": {"type": "integer", "minimum": -50, "maximum": 50},
                "ok": {"type": "boolean"},
            },
            "required": ["x", "ok"],
            "additionalProperties": False,
        },
        "minItems": 1,
        "maxItems": 3,
    },
]


def _json_schema(schema: dict) -> StructuredOutput:
    return StructuredOutput("json_schema", json.dumps(schema))


@pytest.fixture(scope="module")
def random_llama(tmp_path_factory) -> LLM:
    directory = tmp_path_factory.mktemp("hf-llama-structured")
    build_hf_model(directory, "llama")
    return LLM(str(directory), dtype="float32", device="cpu", num_kv_blocks=256)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_random_weights_follow_each_schema(random_llama, temperature):
    prompts, params = [], []
    for i, schema in enumerate(SCHEMAS * 3):
        prompts.append([5 + i, 17, 33 + i])
        params.append(
            SamplingParams(
                temperature=temperature, seed=i, max_tokens=300,
                structured_output=_json_schema(schema),
            )
        )  # fmt: skip
    outputs = random_llama.generate(prompts, params)
    for out, p in zip(outputs, params):
        assert out.finish_reason == "stop", (out.finish_reason, out.text)
        jsonschema.validate(json.loads(out.text), json.loads(p.structured_output.spec))


def test_unconstrained_neighbours_are_untouched(random_llama):
    plain = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    alone = random_llama.generate([[7, 8, 9]], plain)[0].token_ids
    mixed = random_llama.generate(
        [[7, 8, 9], [7, 8, 9]],
        [plain, SamplingParams(temperature=0.0, max_tokens=100,
                               structured_output=StructuredOutput("json_object"))],
    )  # fmt: skip
    assert mixed[0].token_ids == alone
    assert isinstance(json.loads(mixed[1].text), dict)


@pytest.mark.parametrize("overlap", [False, True])
def test_regex_choice_and_grammar_on_a_dummy_preset(overlap):
    # "tiny": dummy weights and the byte tokenizer (engine/grammar.py's _ByteTokens).
    llm = LLM("tiny", device="cpu", num_kv_blocks=64, overlap_scheduling=overlap)
    specs = [
        StructuredOutput("regex", r"[0-9]{3}-[a-z]{2,4}"),
        StructuredOutput("choice", json.dumps(["positive", "negative", 'say "neutral"'])),
        StructuredOutput("grammar", 'start: "(" num ("," num)? ("," num)? ")"\nnum: /[1-9][0-9]?/'),
        StructuredOutput("grammar", 'root ::= "ab" [xyz] [xyz]? "!"'),  # GBNF
        StructuredOutput("json_object"),
    ]
    params = [
        SamplingParams(temperature=1.0, seed=i, max_tokens=120, structured_output=s)
        for i, s in enumerate(specs)
    ]
    outs = llm.generate([[65, 66, 67]] * len(specs), params)
    texts = [o.text for o in outs]
    assert all(o.finish_reason == "stop" for o in outs), texts
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", texts[0]), texts[0]
    assert texts[1] in ("positive", "negative", 'say "neutral"')
    assert re.fullmatch(r"\([1-9][0-9]?(,[1-9][0-9]?){0,2}\)", texts[2]), texts[2]
    assert re.fullmatch(r"ab[xyz]{1,2}!", texts[3]), texts[3]
    assert isinstance(json.loads(texts[4]), dict)


def test_shipped_model_answers_in_json():
    llm = LLM(TINY_CHAT, device="cpu", num_kv_blocks=128)
    prompt = llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Describe json.dumps as JSON."}],
        add_generation_prompt=True,
        tokenize=True,
    )
    schema = SCHEMAS[0]
    out = llm.generate(
        prompt,
        SamplingParams(temperature=0.7, seed=1, max_tokens=200,
                       structured_output=_json_schema(schema)),
    )[0]  # fmt: skip
    assert out.finish_reason == "stop", out.text
    jsonschema.validate(json.loads(out.text), schema)


def test_grammars_compile_once_per_spec(random_llama):
    compiler = random_llama.engine.grammars
    spec = _json_schema({"type": "object", "properties": {"k": {"type": "boolean"}}})
    before = compiler.num_compiled
    params = SamplingParams(temperature=1.0, max_tokens=40, structured_output=spec)
    random_llama.generate([[3, 4]] * 4, [params] * 4)
    random_llama.generate([[5, 6]], params)
    assert compiler.num_compiled == before + 1


@pytest.mark.parametrize(
    "spec",
    [
        StructuredOutput("json_schema", "{not json"),
        StructuredOutput("json_schema", json.dumps({"$ref": "#/definitions/missing"})),
        StructuredOutput("regex", "(["),
        StructuredOutput("grammar", "start: ???"),
        StructuredOutput("choice", "[]"),
    ],
)
def test_a_spec_that_cannot_compile_is_a_value_error(random_llama, spec):
    with pytest.raises(ValueError):
        random_llama.generate([[1, 2]], SamplingParams(structured_output=spec))
    assert not random_llama.engine.has_unfinished()


def test_a_failed_compile_in_the_engine_ends_the_request_as_an_error(random_llama):
    engine = random_llama.engine
    bad = SamplingParams(structured_output=StructuredOutput("regex", "(["))
    engine.add_request("bad-grammar", [1, 2, 3], bad)  # no synchronous check on this path
    deltas = []
    while engine.has_unfinished():
        deltas += engine.step()
    (delta,) = [d for d in deltas if d.request_id == "bad-grammar"]
    assert delta.finished and delta.finish_reason == "error"
    assert "regex" in delta.error


def test_structured_output_accepts_its_queue_message_form():
    p = SamplingParams(structured_output={"kind": "regex", "spec": "a+"})
    assert p.structured_output == StructuredOutput("regex", "a+")
    assert p.speculative is False  # drafts are not checked against the grammar
    with pytest.raises(ValueError):
        StructuredOutput("yaml", "x")


def test_device_mask_matches_a_per_token_reference():
    vocab = 77  # not a multiple of 32: the last word is partial
    masks = GrammarMasks(vocab, torch.device("cpu"), eos_token_ids=(3,))
    torch.manual_seed(0)
    words = torch.randint(-(2**31), 2**31 - 1, (2, masks.words), dtype=torch.int32)
    logits = torch.randn(4, vocab)
    expected = logits.clone()
    for slot, row in enumerate((1, 3)):
        for t in range(vocab):
            if not (int(words[slot, t // 32]) >> (t % 32)) & 1:
                expected[row, t] = float("-inf")
    masks.apply(logits, (torch.tensor([1, 3]), words))
    assert torch.equal(logits, expected)


def test_masks_of_leading_rows_need_no_row_ids():
    # Every sampling row constrained: no row ids, the masks apply to rows 0..n-1; with a plain
    # row first, the same masks go to rows 1..n through (cached) row ids; a request that has
    # consumed tokens is caught up once, and its mask is the grammar's next step.
    from engine.grammar import GrammarCompiler
    from engine.sampling.grammar_mask import GrammarState
    from engine.tokenizer import ByteTokenizer

    tokenizer = ByteTokenizer(300)
    compiler = GrammarCompiler(tokenizer, 300, (257,))
    spec = StructuredOutput("regex", "ab[xy]")
    requests = []
    for i in range(2):
        r = Request(f"r{i}", [1, 2], SamplingParams(), Priority.INTERACTIVE, 8)
        r.grammar = GrammarState(compiler.matcher(spec))
        requests.append(r)
    requests[1].token_ids += [ord("a"), ord("b")]
    plain = Request("p", [1, 2], SamplingParams(), Priority.INTERACTIVE, 8)
    masks = GrammarMasks(300, torch.device("cpu"), eos_token_ids=(257,))
    row_ids, words = masks.fill(requests)
    assert row_ids is None and requests[1].grammar.num_consumed == 2
    logits = torch.zeros(3, 300)
    masks.apply(logits, (row_ids, words))

    def allowed(row: int) -> set[str]:  # (ids past the bytes decode to characters too)
        return {tokenizer.decode([i]) for i in torch.isfinite(logits[row]).nonzero().flatten()}

    assert allowed(0) == {"a"} and allowed(1) == {"x", "y"}
    assert torch.isfinite(logits[2]).all()
    for _ in range(2):
        row_ids, again = masks.fill([plain, *requests])
        assert row_ids.tolist() == [1, 2] and torch.equal(again, words)
    assert masks.fill([plain, *requests])[0] is row_ids  # the same rows: the same tensor


def test_requests_without_grammar_fill_nothing():
    masks = GrammarMasks(64, torch.device("cpu"), eos_token_ids=(0,))
    r = Request("r", [1, 2], SamplingParams(), Priority.INTERACTIVE, 8)
    assert masks.fill([r, r]) is None


def test_overlapped_constrained_steps_match_plain_without_syncing(tmp_path):
    # Overlapped, a constrained row's mask is filled after the next forward pass is queued, from
    # the previous step's tokens read ahead of their commit: the same tokens as the plain
    # engine, and no step waits for the previous one to be committed first.
    build_hf_model(tmp_path, "llama")
    prompts, params = [], []
    for i, schema in enumerate(SCHEMAS * 2):
        prompts.append([5 + i, 17, 33 + i])
        params.append(
            SamplingParams(temperature=1.0, seed=i, max_tokens=300,
                           structured_output=_json_schema(schema))
        )  # fmt: skip
    prompts.append([7, 8, 9])
    params.append(SamplingParams(temperature=1.0, seed=99, max_tokens=40, ignore_eos=True))
    outputs = {}
    for overlap in (False, True):
        llm = LLM(str(tmp_path), dtype="float32", device="cpu", num_kv_blocks=256,
                  overlap_scheduling=overlap)  # fmt: skip
        outputs[overlap] = [(o.token_ids, o.finish_reason) for o in llm.generate(prompts, params)]
        if overlap:
            assert llm.engine.overlap.num_synced == 0
            assert llm.engine.overlap.num_overlapped > 20
    assert outputs[True] == outputs[False]
    assert all(reason == "stop" for _, reason in outputs[True][:-1])
