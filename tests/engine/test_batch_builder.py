# BatchBuilder's packed layout: the decode rows' launch order (longest context first, ties in
# row order) travels with the step and comes back on the device beside the block tables, which
# it must not disturb; a step without decodes has no order. With shared-prefix decode on, the
# decode rows that share prefix-cache blocks come back as groups after the order.
import pytest
import torch

from engine import SamplingParams
from engine.core.prefix_groups import PrefixGroupLimits
from engine.core.request import Priority, Request
from engine.core.scheduler import SchedulerOutput
from engine.runner.batch_builder import BatchBuilder

BLOCK = 4


def _request(name: str, num_tokens: int, computed: int) -> Request:
    r = Request(name, list(range(1, num_tokens + 1)), SamplingParams(), Priority.INTERACTIVE, 8)
    r.num_computed_tokens = computed
    r.block_ids = list(range(100, 100 + -(-num_tokens // BLOCK)))
    return r


def test_decode_rows_are_ordered_longest_first_beside_intact_tables():
    # three decodes with contexts 6, 11, 6 (after this step) and a 5-token prompt chunk
    decodes = [_request("a", 6, 5), _request("b", 11, 10), _request("c", 6, 5)]
    prompt = _request("p", 5, 0)
    out = SchedulerOutput(requests=[*decodes, prompt], num_new_tokens=[1, 1, 1, 5], num_decodes=3)
    batch = BatchBuilder(BLOCK, torch.device("cpu")).prepare(out)
    meta = batch.meta
    assert meta.seq_lens.tolist() == [6, 11, 6, 5]
    assert meta.decode_order.dtype == torch.int32
    assert meta.decode_order.tolist() == [1, 0, 2]  # b (11 keys), then a and c in row order
    tables = meta.block_tables.tolist()
    assert tables[1] == [100, 101, 102] and tables[0] == [100, 101, 0]
    assert tables[3] == [100, 101, 0]


def test_a_step_without_decodes_has_no_order():
    out = SchedulerOutput(requests=[_request("p", 5, 0)], num_new_tokens=[5], num_decodes=0)
    meta = BatchBuilder(BLOCK, torch.device("cpu")).prepare(out).meta
    assert meta.decode_order is None
    assert meta.block_tables.tolist() == [[100, 101]]


def _sharing(name: str, num_tokens: int, prefix_ids: list[int], own_from: int) -> Request:
    r = _request(name, num_tokens, num_tokens - 1)
    r.block_ids = prefix_ids + list(range(own_from, own_from + len(r.block_ids) - len(prefix_ids)))
    return r


def test_decode_rows_sharing_prefix_blocks_travel_as_groups():
    # a, c, d share blocks 7, 8, 9 (12 keys); b shares only 7 with them; a prompt chunk after
    shared = [7, 8, 9]
    decodes = [
        _sharing("a", 18, shared, 200),
        _sharing("b", 15, [7, 50, 51], 300),
        _sharing("c", 14, shared, 400),
        _sharing("d", 21, shared, 500),
    ]
    prompt = _request("p", 5, 0)
    out = SchedulerOutput(
        requests=[*decodes, prompt], num_new_tokens=[1, 1, 1, 1, 5], num_decodes=4
    )
    limits = PrefixGroupLimits(min_blocks=2, max_blocks=64, max_groups=8, max_rows=4)
    builder = BatchBuilder(BLOCK, torch.device("cpu"), prefix_groups=limits)
    meta = builder.prepare(out).meta
    groups = meta.decode_prefix_groups
    assert groups.rows.tolist() == [[0, 2, 3, -1]]  # the used group only, its rows in order
    assert groups.prefix_lens.tolist() == [12]
    assert groups.key_start.tolist() == [12, 0, 12, 12]
    assert meta.decode_prefix_splits == 1 and meta.decode_num_splits is None  # CPU: no splits
    # the rest of the layout is undisturbed
    assert meta.decode_order.tolist() == [3, 0, 1, 2]
    assert meta.block_tables[1].tolist()[:4] == [7, 50, 51, 300]
    assert meta.seq_lens.tolist() == [18, 15, 14, 21, 5]


def test_no_groups_without_limits_or_sharing():
    decodes = [_sharing("a", 18, [7, 8, 9], 200), _sharing("b", 18, [10, 11, 12], 300)]
    out = SchedulerOutput(requests=decodes, num_new_tokens=[1, 1], num_decodes=2)
    limits = PrefixGroupLimits(min_blocks=2, max_blocks=64, max_groups=8, max_rows=4)
    assert BatchBuilder(BLOCK, torch.device("cpu"), prefix_groups=limits).prepare(
        out
    ).meta.decode_prefix_groups is None  # fmt: skip
    shared = [_sharing("a", 18, [7, 8, 9], 200), _sharing("b", 18, [7, 8, 9], 300)]
    out = SchedulerOutput(requests=shared, num_new_tokens=[1, 1], num_decodes=2)
    assert BatchBuilder(BLOCK, torch.device("cpu")).prepare(out).meta.decode_prefix_groups is None


def test_shared_prefix_decode_config():
    from engine.config import EngineConfig
    from engine.core.prefix_groups import shared_prefix_limits

    assert shared_prefix_limits(EngineConfig(model="tiny")) is None
    limits = shared_prefix_limits(
        EngineConfig(model="tiny", shared_prefix_decode=True, shared_prefix_min_tokens=100)
    )
    assert limits.min_blocks == 7 and limits.max_rows >= 2  # ceil(100 / 16) blocks
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        EngineConfig(model="tiny", shared_prefix_decode=True, enable_prefix_caching=False)
    with pytest.raises(ValueError, match="block_size"):
        EngineConfig(model="tiny", shared_prefix_min_tokens=8)


def test_a_short_chunk_over_a_long_prefix_travels_with_key_splits():
    # prefill_split (EngineConfig.prefill_split_keys on a GPU): a 74-token chunk after 21.5k
    # cached tokens beside two decodes fills 3 row tiles x 8 KV heads of 132 SMs, so its
    # attention is cut into key ranges; a whole 2,048-token chunk, or the option off, is not.
    decodes = [_request("a", 6, 5), _request("b", 11, 10)]
    doc = _request("doc", 21_600, 21_526)
    out = SchedulerOutput(requests=[*decodes, doc], num_new_tokens=[1, 1, 74], num_decodes=2)
    split = BatchBuilder(BLOCK, torch.device("cpu"), 8, prefill_split=(4, 132))
    assert split.pack(out).prefill_num_splits == 11
    assert split.prepare(out).meta.prefill_num_splits == 11
    assert BatchBuilder(BLOCK, torch.device("cpu"), 8).pack(out).prefill_num_splits == 1
    fresh = _request("fresh", 2048, 0)
    whole = SchedulerOutput(requests=[*decodes, fresh], num_new_tokens=[1, 1, 2048], num_decodes=2)
    assert split.pack(whole).prefill_num_splits == 1
