# The order of prompt chunks inside a step's token budget (scheduler.py, "Within a step's
# budget"), through the real engine on the `tiny` preset (random weights, CPU). A budget of 64
# tokens and a "long" threshold of 100 tokens stand in for 8,192 and 4,000.
import pytest

from engine import LLMEngine, SamplingParams
from engine.config import EngineConfig

LONG = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
BUDGET = 64


def _engine(**options) -> LLMEngine:
    options.setdefault("num_kv_blocks", 128)
    options.setdefault("max_num_batched_tokens", BUDGET)
    options.setdefault("ttft_prompt_tokens", 100)
    options.setdefault("enable_prefix_caching", False)
    return LLMEngine(EngineConfig(model="tiny", device="cpu", **options))


def _request(engine: LLMEngine, request_id: str):
    return engine.scheduler.requests.get(request_id)


def _steps_to_first_token(engine: LLMEngine, request_id: str, limit: int = 100) -> int:
    for n in range(1, limit + 1):
        for d in engine.step():
            if d.request_id == request_id and d.new_token_ids:
                return n
    raise AssertionError(f"{request_id} got no token in {limit} steps")


def _drain(engine: LLMEngine) -> dict[str, str]:
    finished = {}
    for _ in range(10_000):
        if not engine.has_unfinished():
            return finished
        for d in engine.step():
            if d.finished:
                finished[d.request_id] = d.finish_reason
    raise AssertionError("engine did not drain")


@pytest.mark.parametrize("short_first", [True, False])
def test_a_short_prompt_does_not_wait_for_a_long_documents_prefill(short_first):
    engine = _engine(short_prefill_first=short_first)
    engine.add_request("doc", list(range(600)), LONG, "interactive")  # ten budgets of prefill
    engine.step()
    doc = _request(engine, "doc")
    assert doc.num_computed_tokens == BUDGET
    engine.add_request("chat", list(range(1000, 1020)), LONG, "batch")  # 20 tokens, batch class
    steps = _steps_to_first_token(engine, "chat")
    if short_first:
        # Admitted and prefilled in the very next step, beside a smaller chunk of the document
        # (which still moves: at least its floor of an eighth of the budget).
        assert steps == 1
        assert doc.num_computed_tokens == 2 * BUDGET - 20
    else:
        # The document holds the whole budget until its prompt is done.
        assert steps >= 9
        assert doc.num_computed_tokens == 600
    assert _drain(engine) == {"doc": "length", "chat": "length"}
    assert engine.stats().num_free_blocks == engine.stats().num_total_blocks


def test_waiting_short_prompts_are_admitted_before_an_earlier_long_one():
    engine = _engine()
    engine.add_request("doc", list(range(600)), LONG)
    engine.add_request("chat-a", list(range(1000, 1020)), LONG)
    engine.add_request("chat-b", list(range(2000, 2030)), LONG)
    deltas = {d.request_id for d in engine.step() if d.new_token_ids}
    assert deltas == {"chat-a", "chat-b"}  # both prompts done in the first step
    assert _request(engine, "doc").num_computed_tokens == BUDGET - 50  # the rest of the budget
    assert _drain(engine) == {"doc": "length", "chat-a": "length", "chat-b": "length"}


def test_the_long_prompt_keeps_its_floor_under_a_stream_of_short_ones():
    engine = _engine()
    engine.add_request("doc", list(range(600)), LONG)
    engine.step()
    floor = BUDGET // 8
    for n in range(6):  # more short prompt tokens every step than the budget holds
        for k in range(3):
            first = 3000 + 100 * (3 * n + k)
            engine.add_request(f"chat-{n}-{k}", list(range(first, first + 30)), LONG)
        before = _request(engine, "doc").num_computed_tokens
        engine.step()
        assert _request(engine, "doc").num_computed_tokens - before >= floor
    _drain(engine)
    assert engine.stats().num_free_blocks == engine.stats().num_total_blocks


def test_decodes_keep_their_budget_beside_a_prompt_admitted_before_them():
    engine = _engine()
    engine.add_request("doc", list(range(600)), LONG)
    engine.step()
    # Admitted after "doc" (short prompts get the room), so its decodes sort after the
    # document's prompt chunks in the running list, which could fill every budget by itself.
    engine.add_request("chat", list(range(2000, 2010)), LONG)
    assert _steps_to_first_token(engine, "chat") == 1
    chat, doc = _request(engine, "chat"), _request(engine, "doc")
    assert chat.admitted_seq > doc.admitted_seq
    for n in range(1, 4):
        engine.step()
        assert chat.num_output_tokens == 1 + n  # one token a step
        assert doc.num_computed_tokens < 600
    _drain(engine)


@pytest.mark.parametrize("chunk", [16, 0])
def test_a_long_prompts_chunk_is_capped_only_beside_other_requests(chunk):
    engine = _engine(long_prefill_chunk=chunk)
    engine.add_request("doc", list(range(600)), LONG)
    engine.step()
    doc = _request(engine, "doc")
    assert doc.num_computed_tokens == BUDGET  # alone: the whole budget
    engine.add_request("chat", list(range(2000, 2010)), LONG)
    engine.step()  # chat's prompt (10 tokens) and a chunk of the document
    engine.step()  # chat decodes beside the next chunk
    step = chunk or BUDGET - 1  # (the decode takes one token of the budget)
    assert doc.num_computed_tokens == BUDGET + (chunk or BUDGET - 10) + step
    if chunk:
        while _request(engine, "chat") is not None:
            engine.step()
            assert doc.num_computed_tokens <= BUDGET + chunk * 40
        before = doc.num_computed_tokens
        assert before < 600
        engine.step()
        assert doc.num_computed_tokens == min(600, before + BUDGET)  # alone again
    _drain(engine)


def test_the_slice_cap_holds_without_short_first():
    engine = _engine(short_prefill_first=False, long_prefill_chunk=16)
    engine.add_request("doc", list(range(600)), LONG)
    engine.add_request("chat", list(range(2000, 2010)), LONG)
    engine.step()  # arrival order: the document first, but in a slice beside the chat prompt
    assert _request(engine, "doc").num_computed_tokens == 16
    assert _request(engine, "chat").num_computed_tokens >= 10
    _drain(engine)


def test_a_running_batch_prompt_leaves_the_waiting_interactive_prompts_their_share():
    # Running requests' chunks are served before waiting ones are admitted: a flex prompt (or
    # one recomputing after a preemption) must not take the step while an interactive one waits.
    engine = _engine(ttft_prompt_tokens=10_000)  # nothing here is "long"
    engine.add_request("flex", list(range(600)), LONG, "batch")
    engine.step()
    flex = _request(engine, "flex")
    assert flex.num_computed_tokens == BUDGET
    engine.add_request("chat", list(range(1000, 1020)), LONG, "interactive")
    assert _steps_to_first_token(engine, "chat") == 1  # before: after the flex prompt, 9 steps
    assert flex.num_computed_tokens == 2 * BUDGET - 20  # it still moved, by what chat left
    assert _drain(engine) == {"flex": "length", "chat": "length"}


def test_the_batch_prompt_keeps_its_floor_under_interactive_prompts():
    engine = _engine(ttft_prompt_tokens=10_000)
    engine.add_request("flex", list(range(600)), LONG, "batch")
    engine.step()
    flex = _request(engine, "flex")
    engine.add_request("chat", list(range(1000, 1100)), LONG, "interactive")  # > the budget
    engine.step()
    assert flex.num_computed_tokens == BUDGET + BUDGET // 8
    assert _request(engine, "chat").num_computed_tokens == BUDGET - BUDGET // 8
    assert _drain(engine) == {"flex": "length", "chat": "length"}
