# Host-side helpers shared by the Triton launchers: argument checks (metadata only: shapes,
# dtypes, devices, strides; never tensor values, so the launchers stay CUDA-graph safe) and a
# few launch-configuration choices.
import functools
import operator
import os
from dataclasses import dataclass

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)
KV_CACHE_DTYPES = (*FLOAT_DTYPES, torch.float8_e4m3fn)  # e4m3: the FP8 KV cache


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def dot_config(dtype: torch.dtype) -> tuple[bool, str]:
    """(upcast, input_precision) for a tl.dot over `dtype` operands.

    float32 uses "ieee" (no TF32) so fp32 results match the reference to ~1e-5. The interpreter
    cannot multiply bfloat16 (numpy has no bf16: it would matmul the raw uint16 bit patterns),
    so under TRITON_INTERPRET=1 the kernels upcast dot operands to float32; on a GPU the dot runs
    in the input dtype with float32 accumulation.
    """
    upcast = interpreting() and dtype != torch.float32
    precision = "ieee" if (dtype == torch.float32 or upcast) else "tf32"
    return upcast, precision


def is_power_of_2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@functools.cache
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.cache
def _capability_of(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


def capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device, asked once per device."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _capability_of(index)


def num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return 132  # H100/H200; only used to size grids when interpreting on CPU


def check_tensor(
    name: str,
    t: object,
    *,
    ndim: int,
    dtypes: tuple[torch.dtype, ...] | None = None,
    device: torch.device | None = None,
) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"{name} dtype must be one of ({allowed}), got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device} (all inputs on one device)")


def host_int(name: str, value: object, *, minimum: int = 0) -> int:
    """A launch parameter that must live on the host: a tensor here would need a device sync."""
    if isinstance(value, (torch.Tensor, bool)):
        raise ValueError(f"{name} must be a host int, got {type(value).__name__} (no syncs)")
    try:
        n = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be a host int, got {value!r}") from None
    if n < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {n}")
    return n


def check_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    if t.numel() and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension, strides {t.stride()}")


def check_contiguous(name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")


def check_shape(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")


def output_buffer(
    name: str, out: torch.Tensor | None, shape: tuple[int, ...], like: torch.Tensor
) -> torch.Tensor:
    """`out` (a static CUDA-graph buffer) checked against the shape and like's dtype and device,
    or a new one; either way contiguous in its last dimension."""
    if out is None:
        out = torch.empty(shape, dtype=like.dtype, device=like.device)
    check_tensor(name, out, ndim=len(shape), dtypes=(like.dtype,), device=like.device)
    check_shape(name, out, shape)
    check_last_dim_contiguous(name, out)
    return out


@dataclass(frozen=True, slots=True)
class PagedAttentionShape:
    num_seqs: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int


def check_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
) -> PagedAttentionShape:
    """The arguments both paged-attention launchers take.
    q: [num_tokens, num_heads, head_dim]; k_cache/v_cache: [num_blocks, block_size,
    num_kv_heads, head_dim]; block_tables: [num_seqs, max_blocks_per_seq]; seq_lens: [num_seqs].
    The caches hold q's dtype, or e4m3 (the FP8 KV cache) for both.
    """
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES)
    device = q.device
    cache_dtypes = (q.dtype, torch.float8_e4m3fn)
    check_tensor("k_cache", k_cache, ndim=4, dtypes=cache_dtypes, device=device)
    check_tensor("v_cache", v_cache, ndim=4, dtypes=(k_cache.dtype,), device=device)
    check_tensor("block_tables", block_tables, ndim=2, dtypes=INDEX_DTYPES, device=device)
    check_tensor("seq_lens", seq_lens, ndim=1, dtypes=INDEX_DTYPES, device=device)
    _, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    num_seqs = seq_lens.shape[0]
    check_shape("k_cache", k_cache, (k_cache.shape[0], block_size, num_kv_heads, head_dim))
    check_shape("v_cache", v_cache, tuple(k_cache.shape))
    if block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables has {block_tables.shape[0]} rows, expected {num_seqs}")
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(
            f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
        )
    if not is_power_of_2(head_dim) or head_dim < 16:
        raise ValueError(f"head_dim must be a power of two >= 16, got {head_dim}")
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_last_dim_contiguous(name, t)
    check_last_dim_contiguous("block_tables", block_tables)
    check_contiguous("seq_lens", seq_lens)
    return PagedAttentionShape(num_seqs, num_heads, num_kv_heads, head_dim, block_size)


def check_launchable(t: torch.Tensor) -> None:
    if interpreting():
        patch_interpreter_index()
    elif t.device.type != "cuda":
        raise ValueError(
            f"Triton kernels need CUDA tensors (got {t.device}); on CPU set TRITON_INTERPRET=1 "
            "before importing triton, or call the *_ref function"
        )


def patch_interpreter_index() -> None:
    """Work around triton-lang/triton#9171 in Triton's CPU interpreter (testing only).

    The interpreter holds scalar kernel arguments as 1-element numpy arrays and converts them
    with int(array), which numpy >= 2.4 rejects ("only 0-dimensional arrays can be converted"),
    so `for i in range(lo, hi, BLOCK)` over runtime bounds fails. This re-applies the upstream
    fix (convert through .item()) for the duration of each interpreted launch. It is a no-op on
    GPUs and once per process; drop it when the pinned Triton ships the fix.
    """
    try:
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - layout of a future Triton
        return
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_fleetlm_index_fix", False):
        return

    def _patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        # restored in LIFO order by the interpreter's patch scope, after the launch
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    _patch_lang_tensor._fleetlm_index_fix = True
    interpreter._patch_lang_tensor = _patch_lang_tensor
