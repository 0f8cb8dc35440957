# Speculative decoding through the service layer: the worker builds its engine with the
# FLEETLM_SPECULATIVE_* settings, and draft counts reach the API's usage details.
from __future__ import annotations

from engine import SamplingParams
from metering.records import usage_counts
from service.schemas.sampling import Usage
from service.settings import Settings
from workers.gpu_worker import build_engine


def test_worker_engine_speculates_when_configured():
    settings = Settings(model="tiny", device="cpu", num_kv_blocks=64, speculative_method="ngram")
    engine = build_engine(settings)
    assert engine.speculator is not None
    # `tiny`'s greedy output cycles, so prompt lookup finds continuations to propose.
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    engine.add_request("spec", [7, 8, 9, 10] * 6, params)
    last = None
    while engine.has_unfinished():
        for delta in engine.step():
            last = delta
    assert last.finished and last.usage.completion_tokens == 48
    assert last.usage.spec_proposed_tokens > 0
    assert 0 <= last.usage.spec_accepted_tokens <= last.usage.spec_proposed_tokens


def test_usage_details_report_accepted_and_rejected_drafts():
    usage = Usage.from_counts(
        usage_counts({"prompt_tokens": 20, "cached_tokens": 16, "completion_tokens": 12,
                      "spec_proposed_tokens": 10, "spec_accepted_tokens": 7})
    )  # fmt: skip
    details = usage.completion_tokens_details
    assert (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == (7, 3)
    assert usage.total_tokens == 32 and usage.prompt_tokens_details.cached_tokens == 16
    plain = Usage.from_counts(usage_counts({"prompt_tokens": 3, "completion_tokens": 2}))
    assert plain.completion_tokens_details.accepted_prediction_tokens == 0
    assert plain.completion_tokens_details.rejected_prediction_tokens == 0
