# The fast path (Triton kernels, CUDA graphs) and the plain path (torch references, eager) must
# compute the same thing. These run only where CUDA exists (the H200 suite); elsewhere they are
# skipped with a visible reason by tests/conftest.py.
import pytest
import torch

from engine import LLM, SamplingParams
from kernels.rms_norm import rms_norm_ref
from kernels.silu_mul import silu_and_mul_ref
from tests.hf_models import build_hf_model

pytestmark = pytest.mark.gpu

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_ops_fast_path_matches_reference(dtype, tol):
    from engine.models import ops

    torch.manual_seed(0)
    x = torch.randn(37, 256, device="cuda", dtype=dtype)
    res = torch.randn_like(x)
    w = torch.randn(256, device="cuda", dtype=dtype)
    y, s = ops.rms_norm(x, w, 1e-6, res)
    y_ref, s_ref = rms_norm_ref(x, w, 1e-6, res)
    assert _rel(y, y_ref) < tol and _rel(s, s_ref) < tol
    gate_up = torch.randn(37, 512, device="cuda", dtype=dtype)
    assert _rel(ops.silu_and_mul(gate_up), silu_and_mul_ref(gate_up)) < tol


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gpu-llama")
    build_hf_model(directory, "llama", seed=4)
    return directory


def _prompts():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(2, 500, (n,), generator=g).tolist() for n in (1, 7, 16, 33, 100, 257)]


def test_cuda_engine_matches_cpu_engine(model_dir):
    prompts = _prompts()
    cpu = LLM(str(model_dir), device="cpu", dtype="float32", num_kv_blocks=128).generate(
        prompts, GREEDY
    )
    gpu = LLM(str(model_dir), device="cuda", dtype="float32", num_kv_blocks=128).generate(
        prompts, GREEDY
    )
    for a, b in zip(cpu, gpu):
        assert a.token_ids == b.token_ids


def test_piecewise_graphs_match_eager(model_dir):
    # Steps with prompt chunks replayed as per-layer graph pieces around eager attention.
    prompts = _prompts()
    opts = dict(device="cuda", dtype="float32", num_kv_blocks=128, max_num_batched_tokens=64)
    eager = LLM(str(model_dir), use_cuda_graphs=False, **opts).generate(prompts, GREEDY)
    llm = LLM(str(model_dir), use_piecewise_graphs=True, piecewise_max_tokens=64, **opts)
    pieces = llm.engine.runner.piecewise
    assert pieces is not None and pieces.graphs
    runs = []
    run = pieces.run
    pieces.run = lambda batch: runs.append(1) or run(batch)
    for a, b in zip(eager, llm.generate(prompts, GREEDY)):
        assert a.token_ids == b.token_ids
    assert runs


def test_cuda_graphs_match_eager(model_dir):
    prompts = _prompts()
    eager = LLM(str(model_dir), device="cuda", dtype="float32", num_kv_blocks=128,
                use_cuda_graphs=False).generate(prompts, GREEDY)  # fmt: skip
    llm = LLM(str(model_dir), device="cuda", dtype="float32", num_kv_blocks=128, max_num_seqs=8)
    assert llm.engine.runner.graphs is not None
    graphed = llm.generate(prompts, GREEDY)
    for a, b in zip(eager, graphed):
        assert a.token_ids == b.token_ids


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_fp8_fused_activation_quantization_matches_unfused(model_dir, monkeypatch, dtype):
    # Decode steps (graphs) and short prompts take rms_norm_fp8 / silu_and_mul_fp8 into the FP8
    # layers: the bits of rms_norm / silu_and_mul then quantize_fp8, so the same greedy tokens.
    from engine.models import fp8_activation

    prompts = _prompts()
    outputs = {}
    monkeypatch.setattr(fp8_activation, "FUSE_SILU_MUL_QUANT", True)  # off by default (slower)
    for fuse in (True, False):
        monkeypatch.setattr(fp8_activation, "FUSE_ACTIVATION_QUANT", fuse)
        llm = LLM(str(model_dir), device="cuda", dtype=dtype, quantization="fp8",
                  num_kv_blocks=128, max_num_seqs=8)  # fmt: skip
        assert llm.engine.runner.graphs is not None
        outputs[fuse] = [o.token_ids for o in llm.generate(prompts, GREEDY)]
        del llm
    assert outputs[True] == outputs[False]


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculation_with_graphs_matches_plain_decoding(model_dir, method):
    # Verify steps and the draft's proposal chain replay captured graphs; greedy text must be
    # what plain decoding gives (float32, so kernel rounding cannot flip an argmax). n-gram
    # lookup runs on the tiny preset, whose greedy text cycles, so its drafts find matches.
    model = "tiny" if method == "ngram" else str(model_dir)
    prompts = [[1, 2, 3, 4, 5, 6, 7] * 2 + [1, 2, 3], list(range(40)), [9, 8] * 10, *_prompts()]
    plain = LLM(model, device="cuda", dtype="float32", num_kv_blocks=128).generate(prompts, GREEDY)
    extra = {"draft_model": model} if method == "draft" else {}
    llm = LLM(model, device="cuda", dtype="float32", num_kv_blocks=128, max_num_seqs=8,
              speculative_method=method, spec_min_acceptance=0.0, **extra)  # fmt: skip
    runner = llm.engine.runner
    assert runner.verify_graphs is not None and runner.verify_graphs.graphs
    replays = []
    replay = runner.verify_graphs.replay
    runner.verify_graphs.replay = lambda batch: replays.append(1) or replay(batch)
    for a, b in zip(plain, llm.generate(prompts, GREEDY)):
        assert a.token_ids == b.token_ids
    assert replays
    assert llm.engine.stats().spec_decode_num_accepted_tokens > 0
    if method == "draft":
        assert runner.draft.graphs is not None and runner.draft.graphs.graphs


def test_kv_pool_is_sized_from_free_memory():
    llm = LLM("tiny", device="cuda", gpu_memory_utilization=0.05, max_num_seqs=4)
    _, total = torch.cuda.mem_get_info()
    per_block = (
        llm.engine.runner.kv_caches[:, :, :1].numel() * llm.engine.runner.kv_caches.element_size()
    )
    pool_bytes = llm.engine.block_manager.num_blocks * per_block
    assert 0 < pool_bytes <= 0.05 * total
    out = llm.generate(
        [[1, 2, 3]], SamplingParams(temperature=0.7, seed=1, max_tokens=5, ignore_eos=True)
    )
    assert len(out[0].token_ids) == 5


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("rotary", [False, True], ids=["rotated", "rotary-fused"])
def test_paged_attention_prefill_paths_match_reference(cache_dtype, rotary):
    # One step: two decodes, a whole new prompt (dense kernel, cache unread), a prefix-cache hit
    # and a later chunk (dense over the chunk, paged over the prefix); an FP8 cache keeps the
    # paged extend kernel; q and k rotated beforehand or by the kernel that writes the cache.
    # Against the CPU path (torch references), bf16 tolerance.
    from engine.runner.attention import AttentionMetadata, paged_attention

    g = torch.Generator().manual_seed(11)
    H, Hkv, D, bs = 32, 8, 128, 16
    ctx_lens, q_lens = [300, 17, 0, 512, 1000], [1, 1, 700, 64, 257]
    seq_lens = [c + n for c, n in zip(ctx_lens, q_lens)]
    width = max((s + bs - 1) // bs for s in seq_lens)
    num_blocks = len(seq_lens) * width
    tables = torch.randperm(num_blocks, generator=g).view(len(seq_lens), width).int()
    slots = [
        int(tables[i, p // bs]) * bs + p % bs
        for i, (c, n) in enumerate(zip(ctx_lens, q_lens))
        for p in range(c, c + n)
    ]
    qsl = [0]
    for n in q_lens:
        qsl.append(qsl[-1] + n)
    T = qsl[-1]
    q, k, v = (torch.randn(T, h, D, generator=g).bfloat16() for h in (H, Hkv, Hkv))
    cache = (torch.randn(2, num_blocks, bs, Hkv, D, generator=g) * 0.5).to(cache_dtype)

    def run(device: str) -> torch.Tensor:
        def i32(x):
            return torch.tensor(x, dtype=torch.int32, device=device)

        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, device=device),
            block_tables=tables.to(device),
            seq_lens=i32(seq_lens),
            query_start_loc=i32(qsl),
            num_decodes=2,
            max_query_len=max(q_lens),
            max_seq_len=max(seq_lens),
            prefill_query_start_loc=i32([x - qsl[2] for x in qsl[2:]]),
            max_decode_seq_len=max(seq_lens[:2]),
        )
        c = cache.clone().to(device)
        args = (q.to(device), k.to(device), v.to(device), c[0], c[1], meta, D**-0.5)
        positions = torch.tensor(
            [p for c, n in zip(ctx_lens, q_lens) for p in range(c, c + n)], device=device
        )
        freqs = torch.arange(2048, device=device)[:, None] * 1e-4 ** (
            torch.arange(D // 2, device=device) / (D // 2)
        )
        cos_sin = torch.cat((freqs.cos(), freqs.sin()), -1).float()
        rot = (positions, cos_sin) if rotary else None
        return paged_attention(*args, k_scale=0.5, v_scale=0.5, rotary=rot).float().cpu()

    got, want = run("cuda"), run("cpu")
    assert _rel(got, want) < 1e-2


@pytest.mark.parametrize("shared_prefix", [False, True], ids=["plain", "shared-prefix"])
def test_no_kernel_compiles_after_start_up_warm_up(model_dir, shared_prefix):
    # Mixed steps of every shape (prompts of 1 to ~600 tokens, half behind a cached prefix,
    # chunked by a small budget, beside decodes of growing context) must find every attention
    # variant compiled by the start-up warm-up (engine/runner/kernel_warmup.py), with shared-prefix
    # decode (the decodes behind the cached system prompt form groups) too.
    from kernels import compile_counter

    g = torch.Generator().manual_seed(1)
    system = torch.randint(2, 500, (96,), generator=g).tolist()
    lens = [1, 2, 3, 4, 5, 8, 9, 15, 17, 31, 33, 64, 100, 257, 600]
    prompts = [torch.randint(2, 500, (n,), generator=g).tolist() for n in lens]
    prompts += [system + p for p in prompts]
    shared = {"shared_prefix_decode": True, "shared_prefix_min_tokens": 32} if shared_prefix else {}
    # A pool of its own size: sized by gpu_memory_utilization, the first parameter's engine (not
    # yet collected) left the second no memory for its cache on an 80 GB H100.
    llm = LLM(str(model_dir), dtype="bfloat16", device="cuda", max_num_batched_tokens=256,
              num_kv_blocks=1024, **shared)  # fmt: skip
    report = llm.engine.runner.warmup_report
    assert report is not None and report["steps"] > 10
    before = compile_counter.snapshot()
    for i in range(0, len(prompts), 5):  # arrivals in waves: decodes beside new prompts
        llm.generate(prompts[i : i + 10], GREEDY)
    after = compile_counter.snapshot()
    new = {k: n - before.by_kernel.get(k, 0) for k, n in after.by_kernel.items()}
    assert llm.engine.stats().kernel_compiles == 0, {k: n for k, n in new.items() if n}


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_shared_prefix_decode_matches_plain_decode(model_dir, kv_cache_dtype, graphs, monkeypatch):
    # Decode steps (eager, or replaying decode graphs) with shared-prefix attention on: the same
    # greedy text as without it, and the shared kernel really ran (rows reuse a cached system
    # prompt's blocks; under graphs it runs at capture and in the replays).
    from kernels import shared_prefix_decode as spd
    from tests.engine.test_prefix_groups import shared_prompts

    prompts = shared_prompts()
    opts = dict(device="cuda", dtype="float32", num_kv_blocks=128, use_cuda_graphs=graphs,
                max_num_seqs=8, kv_cache_dtype=kv_cache_dtype)  # fmt: skip
    plain_llm = LLM(str(model_dir), **opts)
    plain_llm.generate(prompts[:1], GREEDY)
    plain = plain_llm.generate(prompts, GREEDY)
    calls = []
    run = spd.shared_prefix_decode_attention
    monkeypatch.setattr(
        spd, "shared_prefix_decode_attention", lambda *a, **k: calls.append(1) or run(*a, **k)
    )
    llm = LLM(str(model_dir), shared_prefix_decode=True, shared_prefix_min_tokens=32, **opts)
    llm.generate(prompts[:1], GREEDY)
    for a, b in zip(plain, llm.generate(prompts, GREEDY)):
        assert a.token_ids == b.token_ids
    assert calls
    if graphs:
        assert llm.engine.runner.graphs.shared_prefix
        assert any(key[3] for key in llm.engine.runner.graphs.graphs)


def test_an_engine_with_a_step_time_target_starts_calibrated_and_decodes_the_same(model_dir):
    # The start-up calibration (engine/runner/step_calibration.py) runs graph replays, graph
    # pieces and eager steps over the pool's first blocks with padding slots: it must leave
    # nothing behind (greedy tokens as an engine without it) and compile nothing later.
    from kernels import compile_counter

    prompts = _prompts()
    opts = dict(device="cuda", dtype="float32", num_kv_blocks=256, max_num_batched_tokens=256)
    plain = LLM(str(model_dir), **opts).generate(prompts, GREEDY)
    # a target no step reaches: the same schedule as without one, the calibration all the same
    llm = LLM(str(model_dir), step_time_target_s=100.0, **opts)
    report = llm.engine.calibration_report
    assert report is not None and "error" not in report and report["steps"] >= 10, report
    assert llm.engine.prefill_policy.model.fitted
    before = compile_counter.count()
    for a, b in zip(plain, llm.generate(prompts, GREEDY)):
        assert a.token_ids == b.token_ids
    assert compile_counter.count() == before
