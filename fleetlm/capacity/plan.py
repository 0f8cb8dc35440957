# The whole sizing for one replica on one workload: memory, the decode and prefill floors,
# the serving floor under the targets, the forecast (what an engine at measured efficiencies
# serves under them), and what that costs. `fleetlm plan` prints this.
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from fleetlm.capacity.cost import Economics, Prices, economics
from fleetlm.capacity.deployment import Deployment
from fleetlm.capacity.forecast import EngineProfile, Forecast, forecast
from fleetlm.capacity.memory import MemoryPlan, Reserve, memory_plan
from fleetlm.capacity.roofline import Floor, decode_floor, prefill_floor
from fleetlm.capacity.serving import ServingPoint, best_serving_point
from fleetlm.capacity.workloads import Workload


@dataclass(frozen=True, slots=True)
class Plan:
    deployment: Deployment
    workload: Workload
    reserve: Reserve
    memory: MemoryPlan
    decode_batch: int
    decode_context: int
    decode: Floor
    decode_single: Floor  # batch 1 at the same context: the latency floor
    prompt_tokens: int
    prefill: Floor
    prefill_cached: Floor | None  # the same prompt with the workload's prefix-cache hit
    serving: ServingPoint  # the floor: no engine serves more under the targets
    forecast: Forecast  # what an engine at the profile's efficiencies serves
    economics: Economics  # at the forecast

    def to_dict(self) -> dict[str, Any]:
        dep, m = self.deployment, self.deployment.model
        return {
            "model": {
                "name": m.name,
                "params": m.num_params(),
                "layers": m.num_layers,
                "heads": m.num_heads,
                "kv_heads": m.num_kv_heads,
                "head_dim": m.head_dim,
            },
            "gpu": asdict(dep.gpu) | {"count": dep.num_gpus},
            "weights_dtype": dep.weights_dtype,
            "kv_dtype": dep.kv_dtype,
            "compute_dtype": dep.compute_dtype,
            "replica": {
                "memory_bytes": dep.memory_bytes,
                "bandwidth_bytes_s": dep.bandwidth_bytes_s,
                "peak_flops": dep.peak_flops,
                "ridge_flop_per_byte": dep.ridge_flop_per_byte,
            },
            "workload": self.workload.to_dict(),
            "reserve": asdict(self.reserve) | {"rule": self.reserve.describe()},
            "memory": self.memory.to_dict(),
            "decode": {
                "batch": self.decode_batch,
                "context_tokens": self.decode_context,
                "floor": self.decode.to_dict(),
                "tpot_s": self.decode.seconds,
                "batch1_floor": self.decode_single.to_dict(),
            },
            "prefill": {
                "prompt_tokens": self.prompt_tokens,
                "floor": self.prefill.to_dict(),
                "ttft_s": self.prefill.seconds,
                "prefix_cached": self.prefill_cached.to_dict() if self.prefill_cached else None,
            },
            "serving": self.serving.to_dict(),  # the floor
            "forecast": self.forecast.to_dict(),
            "economics": self.economics.to_dict(),
        }


def make_plan(
    dep: Deployment,
    workload: Workload,
    *,
    reserve: Reserve | None = None,
    prices: Prices | None = None,
    batch: int | None = None,
    context: int | None = None,
    prompt_tokens: int | None = None,
    target_output_tok_s: float | None = None,
    profile: EngineProfile | None = None,
) -> Plan:
    reserve = reserve or Reserve()
    mem = memory_plan(dep, workload, reserve)
    context = context or workload.mean_context_tokens
    # By default, the decode floor is shown at the batch the KV pool allows.
    batch = batch or max(1, mem.conversations)
    prompt_tokens = prompt_tokens or workload.ttft_prompt_tokens
    cached = prompt_tokens * workload.prefix_shared_fraction
    serving = best_serving_point(dep, workload, mem.kv_tokens)
    expected = forecast(dep, workload, mem.kv_tokens, profile)
    return Plan(
        deployment=dep,
        workload=workload,
        reserve=reserve,
        memory=mem,
        decode_batch=batch,
        decode_context=context,
        decode=decode_floor(dep, batch, context),
        decode_single=decode_floor(dep, 1, context),
        prompt_tokens=prompt_tokens,
        prefill=prefill_floor(dep, prompt_tokens),
        prefill_cached=(
            prefill_floor(dep, prompt_tokens, cached) if 0 < cached <= prompt_tokens - 1 else None
        ),
        serving=serving,
        forecast=expected,
        economics=economics(
            expected.output_tok_s,
            dep.num_gpus,
            mean_input_tokens=workload.mean_input_tokens,
            mean_output_tokens=workload.mean_output_tokens,
            target_output_tok_s=target_output_tok_s or workload.target_output_tok_s,
            prices=prices,
        ),
    )
