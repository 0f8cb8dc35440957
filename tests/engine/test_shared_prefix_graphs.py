# Decode CUDA graphs with shared-prefix decode (engine/runner/cuda_graphs.py): a step that carries
# prefix groups replays the grouped graph with the groups copied into its static buffers (the
# unused group slots emptied, padding rows' key_start 0); a step without groups replays the
# plain one. On the CPU replay runs the same static-buffer path eagerly, so the layout is
# checked here; tests/engine/test_gpu_paths.py compares the text on a GPU.
import torch

from engine.core.prefix_groups import PrefixGroupLimits
from engine.core.scheduler import SchedulerOutput
from engine.runner.batch_builder import BatchBuilder
from engine.runner.cuda_graphs import GRAPH_PREFIX_SPLITS, StepGraphs
from tests.engine.test_batch_builder import BLOCK, _sharing

LIMITS = PrefixGroupLimits(min_blocks=2, max_blocks=64, max_groups=4, max_rows=4)


def _graphs(seen):
    def forward(input_ids, positions, meta):
        groups = meta.decode_prefix_groups
        seen.append(
            None if groups is None else (
                groups.rows.tolist(), groups.prefix_lens.tolist(), groups.key_start.tolist(),
                meta.decode_prefix_splits, meta.decode_num_splits,
            )
        )  # fmt: skip
        return torch.zeros(input_ids.shape[0], 8)

    return StepGraphs(
        forward, lambda hidden, dtype: hidden.to(dtype), vocab_size=8, model_dtype=torch.float32,
        num_kv_heads=2, device=torch.device("cpu"), max_num_seqs=8, max_model_len=64,
        block_size=BLOCK, prefix_groups=LIMITS,
    )  # fmt: skip


def test_a_grouped_step_replays_the_grouped_graph_with_its_groups():
    decodes = [
        _sharing("a", 18, [7, 8, 9], 200),
        _sharing("b", 15, [7, 50, 51], 300),
        _sharing("c", 14, [7, 8, 9], 400),
    ]
    out = SchedulerOutput(requests=decodes, num_new_tokens=[1, 1, 1], num_decodes=3)
    batch = BatchBuilder(BLOCK, torch.device("cpu"), prefix_groups=LIMITS).prepare(out)
    seen = []
    graphs = _graphs(seen)
    assert graphs.can_run(batch)
    graphs.replay(batch)
    bs = graphs.padded_size(3)
    rows, prefix_lens, key_start, prefix_splits, _ = seen[-1]
    assert rows == [[0, 2, -1, -1], [-1] * 4, [-1] * 4, [-1] * 4]
    assert prefix_lens == [12, 0, 0, 0]
    assert key_start == [12, 0, 12] + [0] * (bs - 3)  # padding rows start at 0
    assert prefix_splits == GRAPH_PREFIX_SPLITS and graphs.last_key[3] is True

    # the next step has no groups: the plain graph, whatever the buffers still hold
    plain = [_sharing("a", 18, [7, 8, 9], 200), _sharing("b", 15, [7, 50, 51], 300)]
    out = SchedulerOutput(requests=plain, num_new_tokens=[1, 1], num_decodes=2)
    graphs.replay(BatchBuilder(BLOCK, torch.device("cpu"), prefix_groups=LIMITS).prepare(out))
    assert seen[-1] is None and graphs.last_key[3] is False


def test_graphs_without_shared_prefix_have_no_grouped_variant():
    graphs = StepGraphs(
        lambda i, p, m: torch.zeros(i.shape[0], 8), lambda h, d: h, vocab_size=8,
        model_dtype=torch.float32, num_kv_heads=2, device=torch.device("cpu"), max_num_seqs=8,
        max_model_len=64, block_size=BLOCK,
    )  # fmt: skip
    assert not graphs.shared_prefix and graphs.group_variants == [False]
