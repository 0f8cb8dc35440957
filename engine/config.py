# Engine knobs. The engine never reads the environment: callers pass these explicitly.
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class EngineConfig:
    model: str
    dtype: str = "auto"  # auto → the checkpoint's dtype on CUDA, float32 on CPU
    device: str = "auto"  # auto → cuda when available, else cpu
    block_size: int = 16
    num_kv_blocks: int | None = None  # None → sized from memory (see core/kv_cache.py)
    gpu_memory_utilization: float = 0.90
    cpu_kv_cache_bytes: int = 512 * 2**20
    max_model_len: int | None = None  # None → the model's max_position_embeddings (capped below)
    # The per-step token budget (decodes + prompt chunks). 4,096 rather than 8,192: on one H200
    # at 12 req/s of `seed` a large budget lets arrivals pile into runs of 250-400 ms steps, and a
    # prompt arriving during one waits it and the next out (engine TTFT p95 0.80 -> 0.49 s, TPOT
    # and output unchanged; docs/benchmarks.md#the-per-step-token-budget-h200).
    max_num_batched_tokens: int = 4096
    max_num_seqs: int = 256
    enable_prefix_caching: bool = True
    seed: int = 0  # dummy-weight initialisation and unseeded sampling
    use_cuda_graphs: bool = True
    # Compile at start-up the attention variants mixed steps reach (engine/runner/kernel_warmup.py;
    # CUDA only), rather than in the first step that needs one (up to ~2 s on an H200).
    warm_up_kernels: bool = True
    # FP8 (docs/serving.md#fp8-and-tensor-parallelism). quantization="fp8": e4m3 weights with
    # per-output-channel scales, activations quantized per token (a pre-quantized FP8
    # checkpoint runs in FP8 without it). kv_cache_dtype="fp8": an e4m3 KV cache, twice the
    # tokens in the same memory ("auto": the model dtype).
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    # Tensor parallelism: this many processes (ranks, one GPU each), rank 0 in the caller's.
    tensor_parallel_size: int = 1
    # Steps with prompt chunks up to this many tokens run as per-layer CUDA graph pieces around
    # eager attention (runner/piecewise_graphs.py; CUDA, one GPU, no draft model). Measured on an
    # H200: half the host time to launch such a step, ~5 % off the mean step (docs/benchmarks.md).
    use_piecewise_graphs: bool = True
    # 2,560 covers a long prompt's 2,048-token slice beside ~500 decodes.
    piecewise_max_tokens: int = 2560
    # Their token-count buckets: 0, powers of two; N, powers of two up to N then every multiple
    # of N (less padding, more graphs to capture). 128 measured on an H200 at 12 req/s of
    # `seed`: TPOT p95 40.0 -> 38.4 ms, +2 % output tok/s (docs/benchmarks.md).
    piecewise_bucket_step: int = 128
    # Speculative decoding (docs/speculative.md; the adaptive rule lives in spec/policy.py).
    speculative_method: str | None = None  # None (off) | "ngram" | "draft"
    num_speculative_tokens: int = 4  # k: most draft tokens proposed per request per step
    ngram_min: int = 2  # prompt lookup tries match lengths ngram_max down to ngram_min
    ngram_max: int = 4
    draft_model: str | None = None  # preset or HF dir sharing the target's vocabulary
    spec_max_batch_size: int = 64  # more running decodes than this → no speculation this step
    # A request's acceptance EMA below this (scaled up with the batch, spec/policy.py) → it
    # stops drafting. None → 0.15 for n-gram lookup (free to propose), 0.35 for a draft model.
    spec_min_acceptance: float | None = None
    # Latency-aware prefill (engine/core/step_cost.py): with a target, a step that carries decodes
    # takes only as many prefill tokens as keep its predicted time under it (None: the whole
    # max_num_batched_tokens budget may go to prefill, as without the model).
    step_time_target_s: float | None = None
    # Without a target: prompts still take whole steps, but while decodes run the long prompts
    # get only long_prompt_share of the GPU's time (a 70B's 30k-token document is ~10 s of an
    # H200; taken in whole steps it holds every running stream that long).
    pace_long_prompts: bool = False
    # Prefill attention cuts the key range of a step's prompt chunks into splits when the chunks
    # alone would leave SMs idle (kernels/paged_prefill_attention.py prefill_num_splits): a
    # document's short chunk over a 21k prefix launched 24 programs on an H100's 132 SMs. Off
    # until a GPU measures it.
    prefill_split_keys: bool = False
    # With a target or paced documents: time synthetic steps of chosen shapes at start-up and
    # keep them in every fit of the cost model (engine/runner/step_calibration.py; seconds on a
    # 70B).
    calibrate_step_costs: bool = True
    prefill_ttft_guard_s: float = 0.0  # a short interactive prompt waiting this long goes first
    # With a target, prompts still get the tokens they are due (engine/core/step_cost.py
    # PrefillPolicy): a short prompt by its first token's deadline, ttft_target_s after arrival;
    # the long prompts, oldest first, long_prompt_share of the GPU's time beside the decodes.
    ttft_target_s: float = 0.8
    long_prompt_share: float = 0.25
    ttft_prompt_tokens: int = 4000  # "short": the TTFT target applies below this prompt length
    # The order of prompt chunks in a step (engine/core/prefill_order.py): short prompts' before
    # long ones' (off: interactive before batch, each in arrival order), and a long prompt's chunk
    # while other requests run or wait (0: up to the whole budget).
    short_prefill_first: bool = True
    long_prefill_chunk: int = 2048
    # Overlapped scheduling (engine/runner/overlap.py): step N+1 is scheduled and launched before
    # step N's sampled tokens reach the host; N+1 reads them on the device. None (auto): on for a
    # CUDA engine without speculative decoding or tensor parallelism (measured on the H200: GPU idle
    # between steps 12.5 % -> 1.0 %, +10 % output tok/s at 256 running), off otherwise (a CPU step
    # is synchronous: nothing to overlap). True with either of those is refused.
    overlap_scheduling: bool | None = None
    # Shared-prefix decode attention (kernels/shared_prefix_decode.py, docs/serving.md): the
    # decode steps read a prompt prefix that >= 2 running rows share (the prefix cache's same
    # blocks, >= shared_prefix_min_tokens keys) once per group of rows, not once per row. Off
    # until it measures faster (benchmarks/shared_prefix_bench.py). Decode graphs are captured
    # twice (with and without groups).
    shared_prefix_decode: bool = False
    shared_prefix_min_tokens: int = 256
    # Constrained decoding: compiled grammars kept, by spec (engine/grammar.py).
    grammar_cache_size: int = 256

    def __post_init__(self) -> None:
        if self.grammar_cache_size < 1:
            raise ValueError("grammar_cache_size must be positive")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError("num_kv_blocks must be positive")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be positive")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be positive")
        if self.piecewise_max_tokens < 1:
            raise ValueError("piecewise_max_tokens must be positive")
        if self.piecewise_bucket_step < 0 or self.piecewise_bucket_step & (
            self.piecewise_bucket_step - 1
        ):
            raise ValueError("piecewise_bucket_step must be 0 or a power of two")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError("max_model_len must be at least 2")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16", "float64"):
            raise ValueError(f"unsupported dtype {self.dtype!r}")
        if self.quantization not in (None, "fp8"):
            raise ValueError(f"quantization must be None or 'fp8', got {self.quantization!r}")
        if self.kv_cache_dtype not in ("auto", "fp8"):
            raise ValueError(f"kv_cache_dtype must be 'auto' or 'fp8', got {self.kv_cache_dtype!r}")
        if self.tensor_parallel_size < 1:
            raise ValueError("tensor_parallel_size must be >= 1")
        if self.tensor_parallel_size > 1:
            if self.device not in ("auto", "cuda", "cpu"):
                raise ValueError(
                    "with tensor_parallel_size > 1 the device is 'auto', 'cuda' or 'cpu' "
                    f"(rank r runs on cuda:r), got {self.device!r}"
                )
            if self.speculative_method == "draft":
                raise ValueError("a draft model is not supported with tensor_parallel_size > 1")
        if self.speculative_method not in (None, "ngram", "draft"):
            raise ValueError(
                f"speculative_method must be None, 'ngram' or 'draft', "
                f"got {self.speculative_method!r}"
            )
        if self.speculative_method == "draft" and not self.draft_model:
            raise ValueError("speculative_method='draft' needs draft_model")
        if self.draft_model and self.speculative_method != "draft":
            raise ValueError("draft_model is only used with speculative_method='draft'")
        if not 1 <= self.num_speculative_tokens <= 16:
            raise ValueError("num_speculative_tokens must be in [1, 16]")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError("need 1 <= ngram_min <= ngram_max")
        if self.spec_max_batch_size < 1:
            raise ValueError("spec_max_batch_size must be positive")
        if self.spec_min_acceptance is None:
            self.spec_min_acceptance = 0.35 if self.speculative_method == "draft" else 0.15
        if not 0.0 <= self.spec_min_acceptance < 1.0:
            raise ValueError("spec_min_acceptance must be in [0, 1)")
        if self.step_time_target_s is not None and self.step_time_target_s <= 0:
            raise ValueError("step_time_target_s must be positive")
        if self.overlap_scheduling and self.speculative_method is not None:
            raise ValueError(
                "overlap_scheduling does not combine with speculative decoding (a verify step "
                "needs the previous step's tokens on the host to propose drafts)"
            )
        if self.overlap_scheduling and self.tensor_parallel_size > 1:
            raise ValueError(
                "overlap_scheduling is not supported with tensor_parallel_size > 1 (the other "
                "ranks would need rank 0's sampled tokens on their devices)"
            )
        if self.long_prefill_chunk < 0:
            raise ValueError("long_prefill_chunk must be >= 0 (0: no cap)")
        if self.ttft_target_s <= 0 or not 0 < self.long_prompt_share < 1:
            raise ValueError("need ttft_target_s > 0 and long_prompt_share in (0, 1)")
        if self.shared_prefix_decode and not self.enable_prefix_caching:
            raise ValueError(
                "shared_prefix_decode needs enable_prefix_caching (rows share a prefix's KV "
                "only through the prefix cache's blocks)"
            )
        if self.shared_prefix_min_tokens < self.block_size:
            raise ValueError("shared_prefix_min_tokens must be >= block_size")
        if self.prefill_ttft_guard_s < 0 or self.ttft_prompt_tokens < 1:
            raise ValueError("prefill_ttft_guard_s must be >= 0 and ttft_prompt_tokens >= 1")
