# Stop conditions through the whole engine with a real BPE tokenizer.
import pytest

from engine import LLM, EngineConfig, SamplingParams
from tests.hf_models import build_hf_model

PROMPT = "The scheduler admits a request when"


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    directory = tmp_path_factory.mktemp("stops")
    build_hf_model(directory, "llama", seed=3)
    return LLM(str(directory), device="cpu", num_kv_blocks=128)


def test_stop_string_across_token_boundary_is_never_emitted(llm):
    base = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0]
    pieces = [llm.tokenizer.decode([t]) for t in base.token_ids]
    # A stop string made of the end of one token's text and the start of the next one's.
    k = next(
        i for i in range(5, len(pieces) - 1) if len(pieces[i]) >= 2 and len(pieces[i + 1]) >= 2
    )
    stop = pieces[k][-2:] + pieces[k + 1][:2]
    assert stop in base.text
    streamed = []
    for delta in llm.stream(
        PROMPT, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop])
    ):
        streamed.append(delta.new_text)
    final = delta
    text = "".join(streamed)
    assert final.finish_reason == "stop"
    assert text == base.text[: base.text.index(stop)]
    assert stop not in text


def test_include_stop_str_in_output(llm):
    base = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
    stop = base.text[10:14]
    out = llm.generate(
        PROMPT, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop],
                               include_stop_str_in_output=True),
    )[0]  # fmt: skip
    assert out.finish_reason == "stop"
    assert out.text == base.text[: base.text.index(stop) + len(stop)]


def test_stop_token_ids_and_max_tokens(llm):
    base = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0]
    assert base.finish_reason == "length" and len(base.token_ids) == 20
    target = base.token_ids[6]
    first = base.token_ids.index(target)
    out = llm.generate(
        PROMPT,
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop_token_ids=[target]),
    )[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == base.token_ids[: first + 1]


def test_text_is_the_decoded_tokens(llm):
    out = llm.generate(
        PROMPT, SamplingParams(temperature=0.9, seed=5, max_tokens=30, ignore_eos=True)
    )[0]
    assert out.text == llm.tokenizer.decode(out.token_ids)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_size": 12},
        {"num_kv_blocks": 0},
        {"gpu_memory_utilization": 1.5},
        {"max_num_batched_tokens": 0},
        {"max_num_seqs": 0},
        {"dtype": "int8"},
    ],
)
def test_invalid_engine_config_is_rejected(kwargs):
    with pytest.raises(ValueError):
        EngineConfig(model="tiny", **kwargs)
