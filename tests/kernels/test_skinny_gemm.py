# skinny_gemm (Triton) against skinny_gemm_ref, on the interpreter here and compiled on a GPU.
# Tolerances: kernel_test_utils.TOL, on outputs scaled by 1/sqrt(K) inputs (entries ~N(0, 1)).
# Outputs are pre-filled with NaN to catch unwritten tiles; a second call on the same buffers
# checks that the split-K arrival counters were left at zero (else the reduction would be
# skipped or done twice, and the tile left NaN or wrong).
import pytest
import torch

from kernels import skinny_gemm as sg
from tests.kernels.kernel_test_utils import DEVICE, ON_GPU, assert_close, gen, nan_like, randn


def operands(m: int, n: int, k: int, dtype: torch.dtype, seed: int = 0):
    g = gen(seed)
    x = randn(m, k, g=g, dtype=torch.float32)
    w = randn(n, k, g=g, dtype=torch.float32) / k**0.5
    return x.to(dtype), w.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(
    ("m", "n", "k", "config"),
    [
        (1, 64, 64, sg.SkinnyConfig(block_n=64, block_k=32, split_k=1)),
        (5, 96, 128, sg.SkinnyConfig(block_n=64, block_k=32, split_k=2)),  # N not a tile multiple
        (17, 128, 256, sg.SkinnyConfig(block_n=32, block_k=32, split_k=4)),  # 32-row block
        (130, 64, 64, sg.SkinnyConfig(block_n=32, block_k=16, split_k=2)),  # two row tiles
    ],
    ids=["m1", "m5_ragged_n", "m17_split4", "m130_two_row_tiles"],
)
def test_skinny_gemm_matches_reference(dtype, m, n, k, config):
    x, w = operands(m, n, k, dtype)
    ref = sg.skinny_gemm_ref(x, w)
    for _ in range(2):  # the second launch finds the counters the first left
        out = nan_like(ref)
        ret = sg.skinny_gemm(x, w, out=out, config=config)
        assert ret is out and not out.isnan().any()
        assert_close(out, ref, dtype)


def test_skinny_gemm_default_config_and_strided_rows():
    x, w = operands(9, 192, 1024, torch.float32, seed=1)
    buf = torch.zeros(9, 1100, device=DEVICE)
    buf[:, 7:1031] = x
    xs = buf[:, 7:1031]  # row stride 1100
    cfg = sg.default_config(9, 192, 1024)
    assert cfg.split_k > 1  # 3 column tiles are far from filling 132 SMs
    assert_close(sg.skinny_gemm(xs, w), sg.skinny_gemm_ref(x, w), torch.float32)


def test_default_config_splits_within_one_wave():
    assert sg.default_config(32, 4096, 4096).split_k == 2  # 64 tiles → 128 programs
    assert sg.default_config(32, 4096, 14336).split_k == 2
    assert sg.default_config(32, 6144, 4096).split_k == 1  # 96 tiles: 192 would be two waves
    assert sg.default_config(32, 28672, 4096).num_stages == 3  # 448 tiles: waves of them
    assert sg.default_config(8, 4096, 256).split_k == 1  # 2 K tiles: nothing to split
    assert sg.default_config(200, 64, 4096).num_stages == 2  # 256-row x tiles: smem bound
    assert sg.block_m_for(1) == 16 and sg.block_m_for(33) == 64 and sg.block_m_for(500) == 256


def test_skinny_gemm_empty_and_zero_k():
    x, w = operands(0, 64, 64, torch.float32)
    assert sg.skinny_gemm(x, w).shape == (0, 64)
    out = sg.skinny_gemm(torch.empty(3, 0, device=DEVICE), torch.empty(8, 0, device=DEVICE))
    assert out.shape == (3, 8) and not out.any()


@pytest.mark.parametrize("case", ["k_mismatch", "dtype_mismatch", "k_not_split", "bad_config"])
def test_skinny_gemm_rejects_bad_inputs(case):
    x, w = operands(4, 64, 128, torch.float32)
    kw = {}
    if case == "k_mismatch":
        w = w[:, :64]
    elif case == "dtype_mismatch":
        w = w.half()
    elif case == "k_not_split":
        kw["config"] = sg.SkinnyConfig(block_k=64, split_k=4)  # 128 is not 4 × 64
    with pytest.raises(ValueError):
        if case == "bad_config":
            sg.SkinnyConfig(block_n=48)
        sg.skinny_gemm(x, w, **kw)


def test_skinny_config_only_where_it_wins():
    x, w = operands(4, 64, 256, torch.bfloat16)
    if not ON_GPU:
        assert sg.skinny_config(x, w) is None  # CPU tensors: torch's matmul
        return
    hopper = torch.cuda.get_device_capability()[0] == 9
    assert (sg.skinny_config(x, w) is not None) == hopper
    big = torch.zeros(sg.SKINNY_MAX_ROWS + 1, 256, dtype=torch.bfloat16, device=DEVICE)
    assert sg.skinny_config(big, w) is None  # cuBLAS from 65 rows
    assert sg.skinny_config(big[:48], w) is None  # a small weight: cuBLAS from 33 rows
    large_w = torch.zeros(sg.SMALL_WEIGHT // 256 + 64, 256, dtype=torch.bfloat16, device=DEVICE)
    assert sg.skinny_config(big[:48], large_w) is not None
    assert sg.skinny_config(x.float(), w.float()) is None  # 16-bit only
    assert sg.skinny_config(x[:, :200], w[:, :200]) is None  # K not a whole number of tiles


def test_workspace_refuses_to_grow_inside_a_capture(monkeypatch):
    # its counters' zero fill would be captured, not run: the graph's first replay would start
    # from whatever the memory held
    ws = sg._Workspace()
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="before capturing"):
        ws.get(torch.device("cuda", 0), 1024, 64)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    partials, counters = ws.get(torch.device("cpu"), 1024, 64)  # outside a capture: grows
    assert partials.numel() >= 1024 and counters.numel() >= 64 and not counters.any()


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_skinny_gemm_split_k_replays_in_a_cuda_graph():
    x, w = operands(32, 4096, 4096, torch.bfloat16)
    cfg = sg.SkinnyConfig(split_k=4)
    out = torch.empty(32, 4096, dtype=torch.bfloat16, device=DEVICE)
    sg.skinny_gemm(x, w, out=out, config=cfg)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sg.skinny_gemm(x, w, out=out, config=cfg)
    for seed in range(3):
        x.copy_(operands(32, 4096, 4096, torch.bfloat16, seed=seed + 5)[0])
        out.fill_(float("nan"))
        graph.replay()
        assert_close(out, sg.skinny_gemm_ref(x, w), torch.bfloat16)


def fp8_operands(m: int, n: int, k: int, seed: int = 0):
    from engine.models.fp8 import quantize_weight

    x, w = operands(m, n, k, torch.float32, seed)
    w_q, w_scale = quantize_weight(w * 3.0)  # scales far from 1, so a missing one shows
    return x, w_q, w_scale


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize(
    ("m", "n", "k", "config"),
    [
        (3, 64, 256, sg.SkinnyConfig(block_n=64, block_k=64, split_k=1)),
        (17, 96, 512, sg.SkinnyConfig(block_n=32, block_k=64, split_k=4)),  # ragged N, split
    ],
    ids=["m3", "m17_split4_ragged_n"],
)
def test_skinny_gemm_fp8_weights_match_reference(x_dtype, m, n, k, config):
    # W8A16: the e4m3 weight widened in registers, its per-channel scale on the output
    x, w_q, w_scale = fp8_operands(m, n, k)
    x = x.to(x_dtype)
    ref = sg.skinny_gemm_ref(x, w_q, w_scale)
    for _ in range(2):
        out = nan_like(ref)
        sg.skinny_gemm(x, w_q, w_scale=w_scale, out=out, config=config)
        assert not out.isnan().any()
        assert_close(out, ref, x_dtype)


@pytest.mark.parametrize("split_k", [1, 2])
def test_skinny_gemm_fp8_activations_match_reference(split_k):
    # W8A8: x quantized per row to e4m3, both scales applied to the float32 sum
    from kernels.fp8_quant import quantize_fp8_ref

    x, w_q, w_scale = fp8_operands(9, 128, 256, seed=3)
    x_q, x_scale = quantize_fp8_ref(x)
    ref = sg.skinny_gemm_ref(x_q, w_q, w_scale, x_scale, out_dtype=torch.bfloat16)
    cfg = sg.SkinnyConfig(block_n=64, block_k=64, split_k=split_k)
    out = sg.skinny_gemm(
        x_q, w_q, w_scale=w_scale, x_scale=x_scale, out_dtype=torch.bfloat16, config=cfg
    )
    assert out.dtype == torch.bfloat16
    assert_close(out, ref, torch.bfloat16)
    # and both are x @ w^T up to e4m3 rounding of x
    exact = x @ (w_q.float() * w_scale[:, None]).T
    assert ((out.float() - exact).norm() / exact.norm()).item() < 0.05


@pytest.mark.parametrize("case", ["no_w_scale", "stray_scale", "bad_scale_shape", "fp8_x_only"])
def test_skinny_gemm_fp8_rejects_bad_scales(case):
    x, w_q, w_scale = fp8_operands(4, 64, 128)
    kw = {"w_scale": w_scale}
    w = w_q
    if case == "no_w_scale":
        kw = {}
    elif case == "stray_scale":
        w = w_q.float()
    elif case == "bad_scale_shape":
        kw["w_scale"] = w_scale[:32]
    elif case == "fp8_x_only":
        x, w, kw = x.to(torch.float8_e4m3fn), w_q.float(), {"x_scale": torch.ones(4)}
    with pytest.raises(ValueError):
        sg.skinny_gemm(x, w, **kw)


def test_fp8_default_config_keeps_a_stage_at_16_kb_of_weight():
    c = sg.default_config(32, 8192, 8192, w_bytes=1)
    assert c.block_k == 256 and c.block_n * c.block_k == 16384
    assert sg.default_config(32, 8192, 8192).block_k == 128


def test_skinny_config_for_e4m3_operands():
    x, w_q, _ = fp8_operands(4, 64, 256)
    x_q = x.to(torch.float8_e4m3fn)
    if not ON_GPU or torch.cuda.get_device_capability()[0] != 9:
        assert sg.skinny_config(x_q, w_q) is None  # torch._scaled_mm or the reference
        return
    assert sg.skinny_config(x_q, w_q) is not None
    assert sg.skinny_config(x_q.bfloat16(), w_q) is None  # W8A8 only: x quantized first
    rows = torch.zeros(sg.FP8_SKINNY_MAX_ROWS + 1, 256, device=DEVICE).to(torch.float8_e4m3fn)
    assert sg.skinny_config(rows[: sg.FP8_SKINNY_MAX_ROWS], w_q) is not None
    assert sg.skinny_config(rows, w_q) is None  # torch._scaled_mm from 129 rows
