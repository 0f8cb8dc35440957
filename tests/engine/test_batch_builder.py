# BatchBuilder's packed layout: the decode rows' launch order (longest context first, ties in
# row order) travels with the step and comes back on the device beside the block tables, which
# it must not disturb; a step without decodes has no order.
import torch

from engine import SamplingParams
from engine.batch_builder import BatchBuilder
from engine.request import Priority, Request
from engine.scheduler import SchedulerOutput

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
