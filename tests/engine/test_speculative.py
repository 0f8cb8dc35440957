# Speculation on or off, greedy outputs are identical (n-gram and draft-model proposers,
# every HF-parity family), KV blocks reclaimed after rejections, prefix-cache hashes
# only over verified tokens, the rejection sampler's output distribution, the adaptive policy
# and stop conditions inside an accepted run.
import math
import random

import pytest
import torch

from engine import LLM, EngineConfig, LLMEngine, SamplingParams
from engine.spec.ngram import NgramIndex, propose_ngram
from engine.spec.verify import rejection_sample
from tests.hf_models import FAMILIES, VOCAB, build_hf_model

NEW_TOKENS = 24
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)


def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = []
    for n, reps in ((6, 4), (11, 3), (3, 2), (20, 2)):  # repetitive: n-gram lookup finds matches
        unit = [rng.randrange(2, VOCAB - 8) for _ in range(n)]
        prompts.append(unit * reps + unit[: n // 2])
    prompts += [[rng.randrange(2, VOCAB - 8) for _ in range(n)] for n in (1, 17, 40)]
    return prompts


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory):
    # Another model of the same vocabulary (2-layer Qwen2 shape, other weights).
    directory = tmp_path_factory.mktemp("draft")
    build_hf_model(directory, "qwen2", seed=11)
    return directory


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_case(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(f"spec-{request.param}")
    build_hf_model(directory, request.param)
    prompts = _prompts(5)
    plain = _llm(directory).generate(prompts, GREEDY)
    return directory, prompts, [o.token_ids for o in plain]


def _llm(directory, **options) -> LLM:
    options.setdefault("num_kv_blocks", 256)
    return LLM(str(directory), dtype="float32", device="cpu", **options)


def _check(llm, outputs, expected):
    for i, (out, want) in enumerate(zip(outputs, expected)):
        assert out.finish_reason == "length", (i, out.error)
        assert out.token_ids == want, f"prompt {i}: {out.token_ids} != {want}"
    stats = llm.engine.stats()
    assert stats.num_free_blocks == stats.num_total_blocks
    return stats


def test_ngram_greedy_is_exact(family_case):
    directory, prompts, expected = family_case
    # Random-weight models rarely copy their context, so most of these drafts are rejected:
    # this is the exactness-under-rejection check (the policy is told never to give up).
    # Acceptance of n-gram drafts is checked on the tiny preset, whose greedy text cycles.
    llm = _llm(directory, speculative_method="ngram", spec_min_acceptance=0.0)
    stats = _check(llm, llm.generate(prompts, GREEDY), expected)
    assert stats.spec_decode_num_draft_tokens > 0
    assert stats.spec_decode_num_accepted_tokens <= stats.spec_decode_num_draft_tokens


def test_ngram_accepts_on_repetitive_text():
    prompts = [[1, 2, 3, 4, 5, 6, 7] * 2 + [1, 2, 3], list(range(40)), [9, 8] * 10]
    plain = LLM("tiny", device="cpu", num_kv_blocks=64)
    expected = [o.token_ids for o in plain.generate(prompts, GREEDY)]
    llm = LLM("tiny", device="cpu", num_kv_blocks=64, speculative_method="ngram")
    outputs = llm.generate(prompts, GREEDY)
    stats = _check(llm, outputs, expected)
    assert stats.spec_decode_num_accepted_tokens > 0
    assert stats.spec_decode_num_accepted_tokens / stats.spec_decode_num_draft_tokens > 0.3


def test_draft_model_greedy_is_exact(family_case, draft_dir):
    directory, prompts, expected = family_case
    llm = _llm(directory, speculative_method="draft", draft_model=str(draft_dir))
    stats = _check(llm, llm.generate(prompts, GREEDY), expected)
    assert stats.spec_decode_num_draft_tokens > 0
    # The target as its own draft: nearly everything is accepted, so long runs commit at once.
    llm = _llm(directory, speculative_method="draft", draft_model=str(directory))
    outputs = llm.generate(prompts, GREEDY)
    stats = _check(llm, outputs, expected)
    assert stats.spec_decode_num_accepted_tokens >= 0.9 * stats.spec_decode_num_draft_tokens > 0
    assert sum(o.num_preemptions for o in outputs) == 0


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_tiny_pool_and_small_budget_stay_exact(family_case, method):
    directory, prompts, expected = family_case
    extra = {"draft_model": str(directory)} if method == "draft" else {}
    # 6 blocks × 16 slots: requests are preempted and recomputed; a 12-token budget splits
    # prefills and squeezes drafts.
    llm = _llm(
        directory,
        speculative_method=method,
        num_kv_blocks=6,
        max_num_batched_tokens=12,
        spec_min_acceptance=0.0,
        **extra,
    )
    outputs = llm.generate(prompts, GREEDY)
    stats = _check(llm, outputs, expected)
    assert stats.spec_decode_num_draft_tokens > 0
    if method == "draft":  # the target as its own draft
        assert stats.spec_decode_num_accepted_tokens > 0
    assert sum(o.num_preemptions for o in outputs) > 0


# -- invariants, step by step on the tiny preset ----------------------------------------------


def _engine(**options) -> LLMEngine:
    options.setdefault("num_kv_blocks", 64)
    return LLMEngine(EngineConfig(model="tiny", device="cpu", **options))


def _drain_checking(engine: LLMEngine) -> dict[str, list[int]]:
    bm = engine.block_manager
    bs = bm.block_size
    finished: dict[str, list[int]] = {}
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for d in engine.step():
            tokens.setdefault(d.request_id, []).extend(d.new_token_ids)
            if d.finished:
                finished[d.request_id] = tokens[d.request_id]
        for r in engine.scheduler.running:
            # No block kept for rejected drafts: just what the tokens (pending included) need.
            assert len(r.block_ids) <= math.ceil(r.num_tokens / bs), r
            assert len(r.block_hashes) <= r.num_tokens // bs
            assert not r.spec_token_ids  # drafts never outlive their step
            for i, block_id in enumerate(r.block_ids):
                block = bm.blocks[block_id]
                if block.block_hash is not None:  # published: only verified, computed tokens
                    assert (i + 1) * bs <= r.num_computed_tokens
                    assert block.token_ids == tuple(r.token_ids[i * bs : (i + 1) * bs])
    return finished


IDS_60 = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True, detokenize=False)


def test_rejections_free_blocks_and_never_reach_the_prefix_cache():
    engine = _engine(
        speculative_method="draft",
        draft_model="tiny",
        num_speculative_tokens=8,
        spec_min_acceptance=0.0,
    )
    engine.runner.draft.corrupt_fraction = 0.3  # the target as draft, 30% of drafts spoiled
    prompts = {f"r{i}": [(7 * i + j) % 200 + 3 for j in range(5 + 9 * i)] for i in range(6)}
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, IDS_60)
    outputs = _drain_checking(engine)
    stats = engine.stats()
    assert 0 < stats.spec_decode_num_accepted_tokens < stats.spec_decode_num_draft_tokens
    assert stats.num_free_blocks == stats.num_total_blocks
    # Every published block holds a chunk of some request's final, verified sequence.
    finals = [tuple(prompts[rid] + out) for rid, out in outputs.items()]
    bs = engine.block_manager.block_size
    for block_id in engine.block_manager.cached_blocks.values():
        block = engine.block_manager.blocks[block_id]
        assert any(
            seq[i * bs : (i + 1) * bs] == block.token_ids
            for seq in finals
            for i in range(len(seq) // bs)
        )
    # And the outputs are what plain decoding gives.
    plain = _engine()
    for rid, prompt in prompts.items():
        plain.add_request(rid, prompt, IDS_60)
    assert _drain_checking(plain) == outputs


def test_drafts_squeezed_out_by_a_tiny_budget():
    # A 3-token budget: most proposed drafts get no slots (or fewer than proposed) and must
    # vanish without a trace; outputs stay exact.
    prompts = {f"r{i}": [1 + i, 2, 3, 4, 5] * 4 for i in range(5)}
    outputs = []
    for options in ({}, {"speculative_method": "ngram"}):
        engine = _engine(max_num_batched_tokens=3, **options)
        for rid, prompt in prompts.items():
            engine.add_request(rid, prompt, IDS_60)
        outputs.append(_drain_checking(engine))
        assert engine.stats().num_free_blocks == engine.stats().num_total_blocks
    assert outputs[0] == outputs[1]
    assert engine.stats().spec_decode_num_accepted_tokens > 0


# -- the rejection sampler --------------------------------------------------------------------


def _first_token_frequencies(p, q, num_draws, point_mass):
    gen = torch.Generator().manual_seed(0)
    probs = torch.tensor(p).expand(num_draws, -1).contiguous()
    q_t = torch.tensor(q)
    drafts = torch.multinomial(q_t.expand(num_draws, -1), 1, generator=gen).squeeze(1)
    draft_probs = None if point_mass else q_t.expand(num_draws, -1).contiguous()
    accepted, fallback = rejection_sample(probs, drafts, draft_probs, [None] * num_draws)
    first = torch.where(accepted, drafts, fallback)
    return torch.bincount(first, minlength=len(p)).float() / num_draws, accepted.float().mean()


@pytest.mark.parametrize("point_mass", [True, False])
def test_rejection_sampling_preserves_the_target_distribution(point_mass):
    torch.manual_seed(1)
    p = [0.5, 0.25, 0.15, 0.07, 0.03, 0.0]
    q = [0.1, 0.2, 0.1, 0.3, 0.1, 0.2]  # badly matched on purpose; q has mass where p has none
    n = 200_000
    freq, acceptance = _first_token_frequencies(p, q, n, point_mass)
    # 5 sigma of a binomial proportion at n draws: < 0.006.
    assert torch.allclose(freq, torch.tensor(p), atol=0.006), freq
    expected = sum(qi * pi for pi, qi in zip(p, q)) if point_mass else sum(map(min, p, q))
    assert abs(acceptance.item() - expected) < 0.006


def test_bonus_rows_sample_from_p():
    torch.manual_seed(2)
    p = torch.tensor([0.6, 0.3, 0.1])
    n = 100_000
    accepted, fallback = rejection_sample(
        p.expand(n, -1).contiguous(), torch.full((n,), -1), None, [None] * n
    )
    assert not accepted.any()
    assert torch.allclose(torch.bincount(fallback, minlength=3) / n, p, atol=0.008)


def test_sampled_speculation_is_reproducible_with_seeds():
    prompt = [5, 6, 7, 8, 9] * 5
    params = [
        SamplingParams(
            temperature=0.8, top_p=0.9, seed=s, max_tokens=30, ignore_eos=True, detokenize=False
        )
        for s in (1, 2, 3)
    ]
    for options in (
        {"speculative_method": "ngram"},
        {"speculative_method": "draft", "draft_model": "tiny"},
    ):
        runs = [
            LLM("tiny", device="cpu", num_kv_blocks=64, **options).generate([prompt] * 3, params)
            for _ in range(2)
        ]
        assert [o.token_ids for o in runs[0]] == [o.token_ids for o in runs[1]]
        assert all(len(o.token_ids) == 30 for o in runs[0])


# -- policy, counts and stops -----------------------------------------------------------------


def test_batch_gate_turns_speculation_off_above_threshold():
    engine = _engine(speculative_method="draft", draft_model="tiny", spec_max_batch_size=2)
    long = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, detokenize=False)
    short = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, detokenize=False)
    for i in range(4):
        engine.add_request(f"r{i}", [3 + i, 9, 4, 4], long if i < 2 else short)
    engine.step()  # prefill: four decodes from here on
    engine.step()
    assert engine.stats().spec_decode_num_draft_tokens == 0  # 4 decodes > 2: off
    assert engine.speculator.num_steps_gated >= 1
    while len(engine.scheduler.running) > 2:
        engine.step()
    engine.step()
    engine.step()
    assert engine.stats().spec_decode_num_draft_tokens > 0  # 2 decodes left: back on


def test_draft_sits_out_gated_steps_and_catches_up_exactly():
    # The target as its own draft: any gap left in the draft's cache would show up as rejected
    # drafts. While 4 decodes exceed the gate the draft model must not run at all; afterwards
    # the survivors catch up (their tokens decoded while gated) and are accepted again.
    long = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, detokenize=False)
    short = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, detokenize=False)
    prompts = [[3 + i, 9, 4, 4, 7] for i in range(4)]
    plain = _engine()
    spec = _engine(speculative_method="draft", draft_model="tiny", spec_max_batch_size=2)
    for engine in (plain, spec):
        for i, prompt in enumerate(prompts):
            engine.add_request(f"r{i}", prompt, long if i < 2 else short)
    calls = {"forward": 0, "catch_up": 0}
    forward, catch_up = spec.runner.draft.forward, spec.runner.draft.catch_up

    def counting_forward(*args):
        calls["forward"] += 1
        return forward(*args)

    def counting_catch_up(requests, *args):
        calls["catch_up"] += len(requests)
        return catch_up(requests, *args)

    spec.runner.draft.forward = counting_forward
    spec.runner.draft.catch_up = counting_catch_up
    outputs: dict[str, list[int]] = {}

    def step(engine, into):
        for d in engine.step():
            into.setdefault(d.request_id, []).extend(d.new_token_ids)

    step(spec, outputs)  # prefill: the draft follows the prompts
    assert calls["forward"] == 1
    gated_steps = 0
    while len(spec.scheduler.running) > 2:
        step(spec, outputs)
        gated_steps += 1
    assert gated_steps >= 5 and calls["forward"] == 1  # decodes only, gated: no draft work
    assert sum(r.draft_lag is not None for r in spec.scheduler.running) == 2
    while spec.has_unfinished():
        step(spec, outputs)
    assert calls["catch_up"] >= 2
    expected: dict[str, list[int]] = {}
    while plain.has_unfinished():
        step(plain, expected)
    assert outputs == expected
    stats = spec.stats()
    assert stats.spec_decode_num_draft_tokens > 0
    assert stats.spec_decode_num_accepted_tokens == stats.spec_decode_num_draft_tokens


def test_draft_model_drafts_for_the_whole_batch_or_not_at_all():
    # A draft model's passes cost about the same for one drafting request as for all, so the
    # policy decides on the batch's mean acceptance; n-gram lookup decides per request.
    engine = _engine(speculative_method="draft", draft_model="tiny")
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, detokenize=False)
    for i in range(4):
        engine.add_request(f"r{i}", [5 + i, 7, 7, 2], params)
    engine.step()  # prefill: four decodes
    spec, running = engine.speculator, engine.scheduler.running
    required = spec.min_acceptance * (1 + 4 / spec.max_batch_size)
    for rates, drafting in (([0.9, 0.9, 0.1, 0.1], True), ([0.9, 0.1, 0.1, 0.1], False)):
        for r, rate in zip(running, rates):
            r.spec_acceptance = rate
        assert (sum(rates) / 4 >= required) is drafting
        assert spec.plan(running) is drafting
        assert [r.spec_slots for r in running] == [4 if drafting else 0] * 4
    ngram = _engine(speculative_method="ngram").speculator
    request = running[0]
    request.spec_acceptance = 0.9
    assert ngram.num_drafts_for(request, 4, required=0.5) == 4
    request.spec_acceptance = 0.1
    assert ngram.num_drafts_for(request, 4, required=0.5) == 0


def test_low_acceptance_switches_a_request_off_and_opt_out_is_honoured():
    engine = _engine(speculative_method="draft", draft_model="tiny", spec_min_acceptance=0.5)
    engine.runner.draft.corrupt_fraction = 1.0  # every draft is wrong
    params = SamplingParams(temperature=0, max_tokens=80, ignore_eos=True, detokenize=False)
    engine.add_request("bad", [1, 2, 3], params)
    engine.add_request(
        "out",
        [1, 2, 3],
        SamplingParams(
            temperature=0, max_tokens=80, ignore_eos=True, detokenize=False, speculative=False
        ),
    )
    usage = {}
    while engine.has_unfinished():
        for d in engine.step():
            usage[d.request_id] = d.usage
    assert usage["out"].spec_proposed_tokens == 0
    bad = usage["bad"]
    assert bad.spec_accepted_tokens == 0
    # Optimistic start: k=4 while the EMA (weight 0.1, from 1.0) stays above the cut-off of
    # 0.5 × (1 + 2/64): 7 steps, 28 drafts. Then one-token probes at steps 16, 32 and 64 of
    # the policy clock (the interval doubles after each failed probe): at most 4 more.
    assert 28 <= bad.spec_proposed_tokens <= 32
    assert bad.completion_tokens == 80


def test_stops_inside_an_accepted_run(tmp_path):
    build_hf_model(tmp_path, "llama", seed=3)
    llm = _llm(tmp_path, speculative_method="draft", draft_model=str(tmp_path))
    prompt = "The scheduler admits a request when"
    base = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0]
    assert len(base.token_ids) == 40
    # Several tokens per delta: the draft (= target) is accepted in long runs.
    deltas = list(llm.stream(prompt, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)))
    assert max(len(d.new_token_ids) for d in deltas) > 1
    assert [t for d in deltas for t in d.new_token_ids] == base.token_ids
    assert deltas[-1].usage.spec_accepted_tokens > 0
    # max_tokens inside a run: never exceeded.
    for m in (1, 2, 7, 13):
        out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=m, ignore_eos=True))
        assert out[0].token_ids == base.token_ids[:m] and out[0].finish_reason == "length"
    # A stop token id inside a run: output ends at its first occurrence.
    target = base.token_ids[9]
    first = base.token_ids.index(target)
    out = llm.generate(
        prompt,
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop_token_ids=[target]),
    )[0]
    assert out.finish_reason == "stop" and out.token_ids == base.token_ids[: first + 1]
    # A stop string inside a run: text ends before it, tokens end at the one completing it.
    stop = base.text[12:16]
    out = llm.generate(
        prompt, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop])
    )[0]
    assert out.finish_reason == "stop"
    assert out.text == base.text[: base.text.index(stop)]
    assert out.token_ids == base.token_ids[: len(out.token_ids)]
    assert llm.tokenizer.decode(out.token_ids).find(stop) >= 0
    assert stop not in llm.tokenizer.decode(out.token_ids[:-1])
    assert llm.engine.stats().num_free_blocks == llm.engine.stats().num_total_blocks


def test_ngram_lookup():
    import numpy as np

    t = np.array([1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 1, 2, 3])
    assert propose_ngram(t, 2, 4, 3) == [5, 6, 1]  # most recent earlier match of [1, 2, 3]
    assert propose_ngram(t, 2, 4, 10) == [5, 6, 1, 2, 3]
    assert propose_ngram(np.array([1, 2, 3]), 1, 3, 4) == []
    assert propose_ngram(np.array([4, 4]), 1, 3, 4) == [4]


@pytest.mark.parametrize("seed", range(5))
def test_incremental_ngram_index_agrees_with_the_scan(seed):
    import numpy as np

    rng = random.Random(seed)
    tokens = [rng.randrange(6) for _ in range(rng.randrange(1, 5))]  # few symbols: many hits
    index = NgramIndex(2, 4)
    while len(tokens) < 200:
        index.update(tokens)
        k = rng.randrange(1, 6)
        assert index.propose(tokens, k) == propose_ngram(np.array(tokens), 2, 4, k), tokens
        tokens += [rng.randrange(6) for _ in range(rng.randrange(1, 4))]  # accepted runs


@pytest.mark.parametrize(
    "kwargs",
    [
        {"speculative_method": "medusa"},
        {"speculative_method": "draft"},
        {"draft_model": "tiny"},
        {"speculative_method": "ngram", "num_speculative_tokens": 0},
        {"speculative_method": "ngram", "ngram_min": 3, "ngram_max": 2},
        {"spec_max_batch_size": 0},
        {"spec_min_acceptance": 1.0},
    ],
)
def test_config_rejects_bad_speculation_options(kwargs):
    with pytest.raises(ValueError):
        EngineConfig(model="tiny", **kwargs)


def test_graph_layouts_stay_exact(family_case, draft_dir):
    # The CUDA-graph paths (decode and verify steps on static, padded buffers; the draft's
    # captured proposal chain) run eagerly on the CPU over the very same buffers, so their
    # packing — padding tokens and sequences, per-sequence query lengths — is checked here.
    directory, prompts, expected = family_case
    llm = _llm(directory, speculative_method="draft", draft_model=str(draft_dir), max_num_seqs=5)
    runner = llm.engine.runner
    runner.capture_graphs(5)  # sizes 1, 2, 4, 5: most steps pad
    used = {"decode": 0, "verify": 0, "chain": 0}

    def counting(name, fn):
        def wrapper(*args):
            used[name] += 1
            return fn(*args)

        return wrapper

    runner.graphs.replay = counting("decode", runner.graphs.replay)
    runner.verify_graphs.replay = counting("verify", runner.verify_graphs.replay)
    runner.draft.graphs.run = counting("chain", runner.draft.graphs.run)
    _check(llm, llm.generate(prompts, GREEDY), expected)
    assert used["verify"] > 0 and used["chain"] > 0, used
