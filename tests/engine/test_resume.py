# Resuming a request from the output tokens another engine produced (what a worker does when
# the worker streaming a request dies): the continuation is token for token, and text for text,
# what the uninterrupted run produced, for greedy and for seeded sampling.
import pytest

from engine import LLMEngine, SamplingParams
from engine.config import EngineConfig

PROMPT = list(range(3, 40))


def _engine() -> LLMEngine:
    return LLMEngine(EngineConfig(model="tiny", device="cpu", num_kv_blocks=64))


def _run(engine: LLMEngine, request_id: str, params: SamplingParams, resume=()) -> tuple:
    engine.add_request(request_id, PROMPT, params, output_token_ids=resume)
    tokens, text, usage = [], "", None
    while engine.has_unfinished():
        for d in engine.step():
            if d.request_id == request_id:
                tokens += d.new_token_ids
                text += d.new_text
                usage = d.usage
    return tokens, text, usage


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=1.0, top_k=20, seed=7, max_tokens=24, ignore_eos=True),
    ],
    ids=["greedy", "seeded-top-p", "seeded-top-k"],
)
def test_a_resumed_request_continues_the_uninterrupted_run(params):
    first = _engine()
    tokens, _, usage = _run(first, "whole", params)
    assert len(tokens) == 24 and usage.completion_tokens == 24
    # Another engine (another worker): the prompt plus what was already streamed.
    other = _engine()
    for cut in (1, 9, 23):
        rest, _, rest_usage = _run(other, f"resumed-{cut}", params, tokens[:cut])
        assert rest == tokens[cut:], f"resumed at {cut}"
        assert rest_usage.completion_tokens == 24 and rest_usage.prompt_tokens == len(PROMPT)


def test_the_resumed_text_is_the_rest_of_the_streamed_text():
    # The text a client already has came from deltas; the resumed run's deltas complete it.
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    engine = _engine()
    engine.add_request("whole", PROMPT, params)
    deltas = []
    while engine.has_unfinished():
        deltas += [d for d in engine.step() if d.request_id == "whole"]
    text = "".join(d.new_text for d in deltas)
    for cut in (3, 11, 20):
        sent = [t for d in deltas[:cut] for t in d.new_token_ids]
        sent_text = "".join(d.new_text for d in deltas[:cut])
        _, rest_text, _ = _run(_engine(), "resumed", params, sent)
        assert sent_text + rest_text == text


def test_resume_needs_room_for_one_more_token():
    engine = _engine()
    with pytest.raises(ValueError, match="resume"):
        engine.add_request("r", PROMPT, SamplingParams(max_tokens=2), output_token_ids=[5, 6])


def test_a_request_ending_at_its_first_token_leaves_its_prompt_in_the_prefix_cache():
    engine = _engine()
    prompt = list(range(1, 100))  # 6 full blocks of 16
    one = SamplingParams(temperature=0.0, max_tokens=1)
    cached = []
    for i in range(3):
        engine.add_request(f"r{i}", prompt, one)
        while engine.has_unfinished():
            for d in engine.step():
                if d.finished:
                    cached.append(d.usage.cached_tokens)
    assert cached == [0, 96, 96]
