# Overlapped scheduling on the GPU: with CUDA graphs (decode replays whose input buffer is
# filled on the device from the previous step's sampled ids) and piecewise graphs (mixed steps),
# the outputs are the plain engine's token for token, and the step trace measures the GPU's
# idle time between steps. Skipped on CPU-only machines with a visible reason.
import json
import math

import pytest

from engine import LLM, LLMEngine, SamplingParams
from engine.config import EngineConfig
from engine.runner.step_trace import gpu_idle_between_steps
from engine.sampling_params import StructuredOutput
from tests.engine.overlap_workload import drive, pick_eos, plan, with_endings
from tests.engine.test_structured_output import SCHEMAS
from tests.hf_models import EOS_ID, build_hf_model

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("overlap-gpu")
    build_hf_model(directory, "llama", seed=11)
    return directory


def _engine(model_dir, overlap: bool, eos: int, **options) -> LLMEngine:
    config = EngineConfig(
        model=str(model_dir), device="cuda", dtype="float32", num_kv_blocks=128,
        max_num_seqs=16, overlap_scheduling=overlap, **options,
    )  # fmt: skip
    engine = LLMEngine(config)
    engine.scheduler.eos_token_ids = frozenset({eos, EOS_ID})
    engine.runner.eos_token_ids = (eos, EOS_ID)
    return engine


@pytest.mark.parametrize("seeded", [False, True], ids=["greedy", "seeded"])
@pytest.mark.parametrize(
    "options",
    [{}, {"use_piecewise_graphs": True, "piecewise_max_tokens": 256}],
    ids=["decode-graphs", "piecewise-graphs"],
)
def test_overlap_with_cuda_graphs_matches_plain(model_dir, seeded, options):
    planned = plan(3, seeded_sampling=seeded)
    base = drive(_engine(model_dir, False, EOS_ID, **options), planned)
    eos = pick_eos(planned, base)
    planned = with_endings(planned, base, eos)
    plain = drive(_engine(model_dir, False, eos, **options), planned, split=True)
    engine = _engine(model_dir, True, eos, **options)
    graphs = engine.runner.graphs
    assert graphs is not None and graphs.graphs
    fed = []
    replay = graphs.replay
    graphs.replay = lambda batch: fed.append(batch.fed_rows is not None) or replay(batch)
    trace = engine.enable_step_trace()
    assert drive(engine, planned, split=True) == plain
    assert sum(fed) > 10  # decode replays whose inputs came from the device
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    cols = trace.columns()
    gaps = cols["gpu_gap_s"][1:]
    assert gaps.size and (gaps >= 0).all()
    assert not math.isnan(gpu_idle_between_steps(cols))


def test_constrained_overlapped_steps_with_graphs_match_plain(model_dir):
    # Constrained rows no longer sync: the next decode graph is replayed before the host has
    # the previous token, and the mask (filled from it meanwhile) is applied to the graph's
    # logits before sampling. Same tokens as the plain engine, no sync step.
    prompts = [[5 + i, 17, 33 + i] for i in range(6)]
    params = [
        SamplingParams(temperature=1.0, seed=i, max_tokens=300,
                       structured_output=StructuredOutput("json_schema", json.dumps(schema)))
        for i, schema in enumerate(SCHEMAS * 2)
    ]  # fmt: skip
    outputs = {}
    for overlap in (False, True):
        llm = LLM(str(model_dir), device="cuda", dtype="float32", num_kv_blocks=128,
                  max_num_seqs=16, overlap_scheduling=overlap)  # fmt: skip
        outputs[overlap] = [(o.token_ids, o.finish_reason) for o in llm.generate(prompts, params)]
        if overlap:
            assert llm.engine.overlap.num_synced == 0
    assert outputs[True] == outputs[False]
    assert all(reason == "stop" for _, reason in outputs[True])
