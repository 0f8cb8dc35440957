# Capacity planning: the GPU arithmetic behind `fleetlm plan`, and the roofline the benchmarks
# divide by. Pure Python on model shapes; importing it never loads torch.
from fleetlm.capacity.cost import Economics, Prices, economics
from fleetlm.capacity.deployment import DTYPE_BYTES, Deployment, dtype_bytes
from fleetlm.capacity.forecast import (
    EngineProfile,
    Forecast,
    ForecastPoint,
    forecast,
    forecast_at,
    prefill_seconds,
)
from fleetlm.capacity.gpus import GPUS, GpuSpec, get_gpu, parse_gpus
from fleetlm.capacity.memory import DoesNotFit, MemoryPlan, Reserve, memory_plan
from fleetlm.capacity.plan import Plan, make_plan
from fleetlm.capacity.report import plan_json, plan_table, simulated_table
from fleetlm.capacity.roofline import (
    Floor,
    achieved_over_roofline,
    decode_floor,
    decode_step_floor_s,
    forward_floor,
    prefill_floor,
    prefill_floor_s,
    roofline_decode_tok_s,
    roofline_prefill_tok_s,
)
from fleetlm.capacity.serving import ServingPoint, best_serving_point, steady_step
from fleetlm.capacity.workloads import WORKLOADS, Workload, get_workload

__all__ = [
    "DTYPE_BYTES",
    "GPUS",
    "WORKLOADS",
    "Deployment",
    "DoesNotFit",
    "Economics",
    "EngineProfile",
    "Floor",
    "Forecast",
    "ForecastPoint",
    "GpuSpec",
    "MemoryPlan",
    "Plan",
    "Prices",
    "Reserve",
    "ServingPoint",
    "Workload",
    "achieved_over_roofline",
    "best_serving_point",
    "decode_floor",
    "decode_step_floor_s",
    "dtype_bytes",
    "economics",
    "forecast",
    "forecast_at",
    "forward_floor",
    "get_gpu",
    "get_workload",
    "make_plan",
    "memory_plan",
    "parse_gpus",
    "plan_json",
    "plan_table",
    "prefill_floor",
    "prefill_floor_s",
    "prefill_seconds",
    "roofline_decode_tok_s",
    "roofline_prefill_tok_s",
    "simulated_table",
    "steady_step",
]
