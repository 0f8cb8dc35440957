# Datasheet figures for the GPUs we size fleets on, one row per part, each with where it came from.
#
# Units are SI throughout: bytes (decimal, 1 GB = 1e9 B, as the datasheets print them), bytes/s
# and FLOP/s. NVIDIA's tables headline tensor-core throughput *with 2:4 structured sparsity*;
# inference on dense checkpoints never sees that, so every FLOP/s figure here is the dense one,
# i.e. half the starred datasheet number.
from __future__ import annotations

import re
from dataclasses import dataclass, replace

GB = 1e9
TB = 1e12
TFLOP = 1e12


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    memory_bytes: float
    bandwidth_bytes_s: float
    bf16_flops: float  # dense tensor-core peak
    fp8_flops: float | None  # None: no FP8 tensor cores (A100)
    source: str
    aliases: tuple[str, ...] = ()

    def peak_flops(self, dtype: str) -> float:
        # FP8 weights on a GPU without FP8 tensor cores run as weight-only quantisation: the
        # weights are dequantised on the fly and the matmul runs at the 16-bit rate.
        if dtype == "fp8" and self.fp8_flops is not None:
            return self.fp8_flops
        return self.bf16_flops

    def measured(
        self,
        *,
        memory_bytes: float | None = None,
        bandwidth_bytes_s: float | None = None,
        flops: float | None = None,
        fp8_flops: float | None = None,
    ) -> GpuSpec:
        """The same part with measured figures in place of the datasheet's.

        `flops` replaces the peak at every precision (a benchmark measures the one it runs
        at); `fp8_flops`, when measured too, then replaces the FP8 one.
        """
        changes: dict[str, float] = {}
        what: list[str] = []
        if memory_bytes is not None:
            changes["memory_bytes"] = memory_bytes
            what.append("memory")
        if bandwidth_bytes_s is not None:
            changes["bandwidth_bytes_s"] = bandwidth_bytes_s
            what.append("bandwidth")
        if flops is not None:
            changes["bf16_flops"] = changes["fp8_flops"] = flops
            what.append("FLOP/s")
        if fp8_flops is not None and self.fp8_flops is not None:
            changes["fp8_flops"] = fp8_flops
            what.append("FP8 FLOP/s")
        if not changes:
            return self
        measured = ", ".join(what)
        return replace(self, **changes, source=f"{self.source}; measured: {measured}")


GPUS: dict[str, GpuSpec] = {
    "H100-SXM": GpuSpec(
        name="H100-SXM",
        memory_bytes=80 * GB,
        bandwidth_bytes_s=3.35 * TB,
        bf16_flops=989.4 * TFLOP,  # datasheet: 1,979 TFLOPS with sparsity
        fp8_flops=1978.9 * TFLOP,  # datasheet: 3,958 TFLOPS with sparsity
        source="NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column "
        "(https://www.nvidia.com/en-us/data-center/h100/)",
        aliases=("H100", "H100SXM", "H100-SXM5", "H100-80GB"),
    ),
    "H200": GpuSpec(
        name="H200",
        memory_bytes=141 * GB,
        bandwidth_bytes_s=4.8 * TB,
        bf16_flops=989.4 * TFLOP,  # same Hopper die as H100 SXM; only the HBM3e changed
        fp8_flops=1978.9 * TFLOP,
        source="NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column "
        "(https://www.nvidia.com/en-us/data-center/h200/)",
        aliases=("H200-SXM", "H200SXM"),
    ),
    "A100-80GB": GpuSpec(
        name="A100-80GB",
        memory_bytes=80 * GB,
        bandwidth_bytes_s=2.039 * TB,
        bf16_flops=312 * TFLOP,  # datasheet: 624 TFLOPS with sparsity
        fp8_flops=None,
        source="NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM column "
        "(https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
        "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf)",
        aliases=("A100", "A100-SXM", "A100-80G"),
    ),
    "L40S": GpuSpec(
        name="L40S",
        memory_bytes=48 * GB,
        bandwidth_bytes_s=0.864 * TB,
        bf16_flops=362.05 * TFLOP,  # datasheet: 733 TFLOPS with sparsity
        fp8_flops=733 * TFLOP,  # datasheet: 1,466 TFLOPS with sparsity
        source="NVIDIA L40S GPU datasheet (https://www.nvidia.com/en-us/data-center/l40s/)",
    ),
    "B200": GpuSpec(
        name="B200",
        memory_bytes=180 * GB,
        bandwidth_bytes_s=7.7 * TB,
        bf16_flops=2250 * TFLOP,  # per-GPU table: 4.5 PFLOPS with sparsity
        fp8_flops=4500 * TFLOP,  # per-GPU table: 9 PFLOPS with sparsity
        source="NVIDIA HGX B200 specifications, individual Blackwell GPU column "
        "(https://www.nvidia.com/en-us/data-center/hgx/)",
        aliases=("B200-SXM", "HGX-B200"),
    ),
}


def _key(name: str) -> str:
    return re.sub(r"[\s_\-]", "", name).upper()


_LOOKUP = {_key(alias): spec for spec in GPUS.values() for alias in (spec.name, *spec.aliases)}


def get_gpu(name: str) -> GpuSpec:
    spec = _LOOKUP.get(_key(name))
    if spec is None:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}")
    return spec


def gpu_for_device(device_name: str) -> str | None:
    """The GPUS key of a device as the driver names it ('NVIDIA H200' → 'H200'), or None."""
    squashed = _key(device_name)
    for key, spec in GPUS.items():
        if any(_key(name) in squashed for name in (key, spec.name, *spec.aliases)):
            return key
    return None


def parse_gpus(text: str) -> tuple[GpuSpec, int]:
    """'4xH100' → (H100 SXM, 4). A bare name means one GPU."""
    m = re.fullmatch(r"\s*(?:(\d+)\s*[x×*]\s*)?(.+?)\s*", text, flags=re.IGNORECASE)
    if m is None or not m.group(2):
        raise ValueError(f"cannot read GPUs from {text!r}; expected e.g. 4xH100")
    count = int(m.group(1) or 1)
    if count < 1:
        raise ValueError("GPU count must be at least 1")
    return get_gpu(m.group(2)), count
