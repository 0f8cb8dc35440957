# tests/kernels/ttgir_rows.py reads, from TTGIR text, which rows each consumer warpgroup of a
# warp-specialized kernel works on. Synthetic TTGIR shaped like Triton 3.6's: the second
# consumer of dense_prefill_ws before the fix splatted m0 + 64 (the pass's offset of q's load
# coordinate, the same SSA value) under a make_range already sliced to [64, 128).
from tests.kernels.ttgir_rows import consumer_rows, rows_problem, tma_box_mismatches

_TMA = (
    "      ttng.async_tma_copy_global_to_local %d[%q, %c0_i32] %b, %bar, %true "
    "{async_task_id = array<i32: 0>} : !tt.tensordesc<tensor<{box}xbf16, #shared1>>, "
    "!ttg.memdesc<1xi64, #shared, #smem, mutable> -> !ttg.memdesc<64x128xbf16, #shared1, #smem, "
    "mutable> loc(#loc)"
)


def _consumer(i: int, start: int, base: str) -> str:
    task = f"async_task_id = array<i32: {i + 1}>"
    t = f"{{{task}}}"
    rows = f"{{{task}, end = {start + 64} : i32, start = {start} : i32}}"
    keys = f"{{{task}, end = 64 : i32, start = 0 : i32}}"
    return f"""    partition{i}(%arg0: i32 loc("x"), %n0: i32 loc("y")) num_warps(4) {{
      %tile = tt.get_program_id z {t} : i32 loc(#loc1)
      %c128_i32 = arith.constant {t} 128 : i32 loc(#loc1)
      %q = arith.constant {t} 64 : i32 loc(#loc2)
      %m0 = arith.muli %tile, %c128_i32 {t} : i32 loc(#loc3)
      %m0_q = arith.addi %m0, %q {t} : i32 loc(#loc4)
      %r = tt.make_range {rows} : tensor<64xi32, #blocked1> loc(#loc5)
      %s = tt.splat {base} {t} : i32 -> tensor<64xi32, #blocked1> loc(#loc6)
      %rows = arith.addi %s, %r {t} : tensor<64xi32, #blocked1> loc(#loc7)
      %kr = tt.make_range {keys} : tensor<64xi32, #blocked1> loc(#loc5)
      %ks = tt.splat %n0 {t} : i32 -> tensor<64xi32, #blocked1> loc(#loc6)
      %keys = arith.addi %ks, %kr {t} : tensor<64xi32, #blocked1> loc(#loc7)
      ttg.warp_return loc(#loc)
    }}
"""


def _ttgir(second_base: str, box: str = "64x128") -> str:
    return (
        "module {\n  tt.func public @k() {\n"
        "    ttg.warp_specialize(%a) attributes {requestedRegisters = array<i32: 232, 232>}\n"
        "    default {\n" + _TMA.replace("{box}", box) + "\n      ttg.warp_yield loc(#loc)\n    }\n"
        + _consumer(0, 0, "%m0") + _consumer(1, 64, second_base)
        + "    tt.return loc(#loc)\n  }\n}\n"
    )  # fmt: skip


def test_consumers_that_split_the_tile_pass():
    text = _ttgir("%m0")
    rows = consumer_rows(text, 64)
    assert sorted((lo, hi) for v in rows.values() for _, lo, hi in v) == [(0, 64), (64, 128)]
    assert rows_problem(text, 128) is None
    assert tma_box_mismatches(text) == []


def test_the_double_offset_of_the_second_consumer_is_caught():
    text = _ttgir("%m0_q")  # m0 + 64 splatted under a range of [64, 128): rows 128 .. 191
    rows = consumer_rows(text, 64)
    assert [(lo, hi) for _, lo, hi in rows["partition1"]] == [(128, 192)]
    problem = rows_problem(text, 128)
    assert problem and "(128, 192)" in problem


def test_a_host_box_bigger_than_its_buffer_is_caught():
    assert len(tma_box_mismatches(_ttgir("%m0", box="128x128"))) == 1
