# One replica: a model at a precision, tensor-parallel across N identical GPUs. Everything the
# arithmetic needs about "how many bytes, how fast" is derived here, once.
#
# Tensor parallelism is modelled ideally: the replica behaves like one GPU with N× the memory,
# bandwidth and FLOP/s, and the all-reduces cost nothing. Real replicas lose some of that to
# NVLink traffic and imbalance, which is why everything downstream is a floor, not a forecast.
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.models.config import ModelConfig, resolve_model_config
from fleetlm.capacity.gpus import GpuSpec, parse_gpus

# fp16 is priced like bf16 (same bytes, same tensor-core rate on every GPU in the table).
DTYPE_BYTES = {"fp8": 1, "bf16": 2, "fp16": 2}


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}") from None


@dataclass(frozen=True, slots=True)
class Deployment:
    model: ModelConfig
    gpu: GpuSpec
    num_gpus: int = 1
    weights_dtype: str = "bf16"
    kv_dtype: str = "bf16"

    def __post_init__(self) -> None:
        dtype_bytes(self.weights_dtype)
        dtype_bytes(self.kv_dtype)
        if self.num_gpus < 1:
            raise ValueError("num_gpus must be at least 1")

    @classmethod
    def create(
        cls,
        model: str | Path | ModelConfig,
        gpus: str = "1xH100",
        *,
        weights_dtype: str = "bf16",
        kv_dtype: str = "bf16",
        bandwidth_bytes_s: float | None = None,
        flops: float | None = None,
        memory_bytes: float | None = None,
        fp8_flops: float | None = None,
    ) -> Deployment:
        """The constructor benchmarks use: measured per-GPU figures override the datasheet."""
        cfg = model if isinstance(model, ModelConfig) else resolve_model_config(model)
        gpu, count = parse_gpus(gpus)
        gpu = gpu.measured(
            memory_bytes=memory_bytes,
            bandwidth_bytes_s=bandwidth_bytes_s,
            flops=flops,
            fp8_flops=fp8_flops,
        )
        return cls(cfg, gpu, count, weights_dtype, kv_dtype)

    # --- parameters, split by how a forward pass touches them ---

    @property
    def lm_head_params(self) -> int:
        return self.model.vocab_size * self.model.hidden_size

    @property
    def layer_params(self) -> int:
        # Everything that multiplies every token: attention, MLP and norms of all layers.
        m = self.model
        tables = self.lm_head_params * (1 if m.tie_word_embeddings else 2)
        return m.num_params() - tables - m.hidden_size  # minus the final norm

    @property
    def weight_bytes(self) -> int:
        return self.model.num_params() * dtype_bytes(self.weights_dtype)

    @property
    def weight_bytes_read(self) -> int:
        # Bytes one forward pass streams from HBM. The input embedding is a gather of a few
        # rows, not a read of the whole table, so an untied table does not count; the LM head
        # (the same matrix when tied) is read in full.
        return (self.layer_params + self.lm_head_params) * dtype_bytes(self.weights_dtype)

    # --- KV cache ---

    @property
    def kv_replication(self) -> int:
        # With more GPUs than KV heads, tensor parallelism has to copy each KV head onto
        # several GPUs: the replica stores (and reads) every token's KV that many times.
        return max(1, -(-self.num_gpus // self.model.num_kv_heads))

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV one token occupies in the whole replica."""
        return self.model.kv_bytes_per_token(dtype_bytes(self.kv_dtype)) * self.kv_replication

    # --- the replica's aggregate hardware ---

    @property
    def memory_bytes(self) -> float:
        return self.gpu.memory_bytes * self.num_gpus

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.gpu.bandwidth_bytes_s * self.num_gpus

    @property
    def compute_dtype(self) -> str:
        return "fp8" if self.weights_dtype == "fp8" and self.gpu.fp8_flops else "bf16"

    @property
    def peak_flops(self) -> float:
        return self.gpu.peak_flops(self.compute_dtype) * self.num_gpus

    @property
    def ridge_flop_per_byte(self) -> float:
        # Arithmetic intensity at which a kernel stops waiting on memory and starts waiting on
        # the tensor cores. Anything below it is bandwidth-bound.
        return self.peak_flops / self.bandwidth_bytes_s

    def describe(self) -> str:
        name = self.model.name or "model"
        return (
            f"{name}, {self.weights_dtype} weights, {self.kv_dtype} KV, "
            f"{self.num_gpus}x{self.gpu.name} (tensor parallel)"
        )
