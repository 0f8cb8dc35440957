import json
import math
import subprocess
import sys

import pytest

from engine.models.config import PRESETS
from fleetlm.capacity import (
    GPUS,
    Deployment,
    DoesNotFit,
    Prices,
    Reserve,
    achieved_over_roofline,
    best_serving_point,
    decode_floor,
    decode_step_floor_s,
    get_workload,
    make_plan,
    memory_plan,
    parse_gpus,
    prefill_floor,
    roofline_decode_tok_s,
    roofline_prefill_tok_s,
    steady_step,
)

SEED = get_workload("seed")


def brief(gpus="4xH100", kv="bf16", **kw):
    return Deployment.create("llama-3.1-70b", gpus, weights_dtype="fp8", kv_dtype=kv, **kw)


def near(value, expected, rel=0.05):
    return abs(value - expected) <= rel * expected


# --- the brief's example: Llama-70B, FP8 weights, bf16 KV, 4×H100 ---


def test_brief_memory_figures():
    mem = memory_plan(brief(), SEED)
    assert near(mem.weight_bytes, 70e9)  # "70 GB of FP8 weights"
    assert mem.weight_bytes == PRESETS["llama-3.1-70b"].num_params()  # one byte per param
    assert mem.kv_bytes_per_token == 80 * 8 * 128 * 2 * 2 == 327_680  # "320 KB of KV per token"
    assert mem.kv_bytes_per_token == 320 * 1024
    assert near(mem.kv_pool_bytes, 206e9)  # "about 206 GB of KV cache"
    assert near(mem.kv_tokens, 640_000)  # "about 640,000 tokens"
    assert near(mem.conversations, 250)  # "~250 concurrent conversations"
    assert mem.mean_context_tokens == 2400


def test_brief_reserve_rule_is_stated_and_adds_up():
    dep, reserve = brief(), Reserve()
    mem = memory_plan(dep, SEED, reserve)
    # 10% of each 80 GB card plus 3 GB each: 4 × (8 + 3) = 44 GB.
    assert mem.reserve_bytes == pytest.approx(44e9)
    assert mem.total_bytes == pytest.approx(320e9)
    assert mem.kv_pool_bytes == pytest.approx(320e9 - mem.weight_bytes - 44e9)
    assert "10%" in reserve.describe() and "3 GB" in reserve.describe()
    assert mem.kv_tokens == int(mem.kv_pool_bytes // 327_680)
    assert mem.conversations == mem.kv_tokens // 2400


def test_more_gpus_more_capacity():
    tokens = [memory_plan(brief(f"{n}xH100"), SEED).kv_tokens for n in (2, 4, 8)]
    assert tokens[0] < tokens[1] < tokens[2]
    # Each added GPU brings its whole usable memory to the pool: the weights are paid once.
    assert tokens[2] - tokens[1] > tokens[1] - tokens[0]
    assert memory_plan(brief("4xH200"), SEED).kv_tokens > tokens[1]


def test_fp8_kv_holds_twice_the_tokens():
    bf16, fp8 = memory_plan(brief(kv="bf16"), SEED), memory_plan(brief(kv="fp8"), SEED)
    assert fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token
    assert abs(fp8.kv_tokens - 2 * bf16.kv_tokens) <= 1
    assert abs(fp8.conversations - 2 * bf16.conversations) <= 1


def test_prefix_sharing_and_long_tail():
    mem = memory_plan(brief(), SEED)
    # 60% of the 2,000 input tokens shared: a conversation owns 2,400 − 1,200 tokens.
    assert mem.conversations_prefix_shared == mem.kv_tokens // 1200
    assert mem.longest_context_bytes == 32_000 * 327_680


def test_does_not_fit():
    with pytest.raises(DoesNotFit, match="exceed"):
        memory_plan(brief("1xH100"), SEED)
    with pytest.raises(DoesNotFit):
        memory_plan(Deployment.create("llama-3.1-70b", "2xH100", weights_dtype="bf16"), SEED)


def test_kv_replicated_when_gpus_outnumber_kv_heads():
    model = PRESETS["qwen2.5-7b"]  # 4 KV heads
    four = Deployment.create(model, "4xH100")
    eight = Deployment.create(model, "8xH100")
    assert four.kv_bytes_per_token == model.kv_bytes_per_token(2)
    assert eight.kv_replication == 2
    assert eight.kv_bytes_per_token == 2 * four.kv_bytes_per_token


# --- decode and prefill floors ---


def test_decode_is_bandwidth_bound_at_every_batch_that_fits():
    dep = brief()
    mem = memory_plan(dep, SEED)
    for batch in (1, 16, mem.conversations):
        f = decode_floor(dep, batch, 2400)
        assert f.bound == "bandwidth"
        assert f.arithmetic_intensity < dep.ridge_flop_per_byte
        # Bandwidth-bound on both phases: the floor is exactly everything read ÷ bandwidth.
        assert f.seconds == pytest.approx(f.bytes / dep.bandwidth_bytes_s)
    # Batch 1 reads the weights (less the input embedding table) for ~2 FLOPs per byte.
    one = decode_floor(dep, 1, 2400)
    assert one.weight_bytes == dep.model.num_params() - 128256 * 8192 - 8192
    assert one.seconds == pytest.approx(one.weight_bytes / 13.4e12, rel=0.02)
    assert 1.5 < one.arithmetic_intensity < 3


def test_decode_floor_grows_with_batch_and_context_but_throughput_grows_too():
    dep = brief()
    assert decode_step_floor_s(dep, 64, 2400) > decode_step_floor_s(dep, 8, 2400)
    assert decode_step_floor_s(dep, 8, 8000) > decode_step_floor_s(dep, 8, 2000)
    assert roofline_decode_tok_s(dep, 64, 2400) > roofline_decode_tok_s(dep, 8, 2400)
    with pytest.raises(ValueError):
        decode_floor(dep, 0, 100)


def test_prefill_flops_formula_and_compute_bound():
    dep, p = brief(), 4000
    m = dep.model
    f = prefill_floor(dep, p)
    assert f.linear_flops == 2 * dep.layer_params * p + 2 * 128256 * 8192
    assert f.attention_flops == 4 * m.num_layers * m.num_heads * m.head_dim * p * (p + 1) / 2
    assert f.bound == "compute"
    assert f.seconds == pytest.approx(f.flops / dep.peak_flops, rel=1e-9)
    assert f.seconds < SEED.ttft_target_s
    # With 60% of the prompt cached only 1,600 tokens are computed.
    assert prefill_floor(dep, p, cached_tokens=2400).seconds < f.seconds / 2


def test_fp8_weights_without_fp8_tensor_cores_compute_at_bf16():
    a100 = Deployment.create("llama-3.1-8b", "A100", weights_dtype="fp8")
    h100 = Deployment.create("llama-3.1-8b", "H100", weights_dtype="fp8")
    assert a100.compute_dtype == "bf16" and a100.peak_flops == GPUS["A100-80GB"].bf16_flops
    assert h100.compute_dtype == "fp8" and h100.peak_flops == GPUS["H100-SXM"].fp8_flops


def test_measured_figures_override_the_datasheet():
    datasheet = brief()
    slow = brief(bandwidth_bytes_s=3.35e12 / 2)
    assert "measured: bandwidth" in slow.gpu.source
    assert decode_step_floor_s(slow, 32, 2400) == pytest.approx(
        2 * decode_step_floor_s(datasheet, 32, 2400)
    )
    weak = brief(flops=500e12)
    assert weak.peak_flops == 4 * 500e12
    assert prefill_floor(weak, 4000).seconds > prefill_floor(datasheet, 4000).seconds


def test_achieved_over_roofline():
    dep = Deployment.create("llama-3.1-8b", "1xH100", bandwidth_bytes_s=3.0e12, flops=700e12)
    ceiling = roofline_decode_tok_s(dep, 32, 1024)
    assert achieved_over_roofline(ceiling, dep, batch=32, context=1024) == pytest.approx(1.0)
    assert achieved_over_roofline(0.5 * ceiling, dep, batch=32, context=1024) == pytest.approx(0.5)
    prefill = roofline_prefill_tok_s(dep, 2048, batch=4)
    ratio = achieved_over_roofline(0.7 * prefill, dep, phase="prefill", prompt_tokens=2048, batch=4)
    assert ratio == pytest.approx(0.7)
    # Four prompts prefilled together read the weights once; never slower per token than one.
    assert prefill >= roofline_prefill_tok_s(dep, 2048)
    with pytest.raises(ValueError):
        achieved_over_roofline(1.0, dep, phase="training")


# --- serving under targets, and cost ---


def test_best_serving_point_bf16_kv_is_capacity_limited():
    dep = brief()
    mem = memory_plan(dep, SEED)
    point = best_serving_point(dep, SEED, mem.kv_tokens)
    assert point.limited_by == "KV capacity" and point.batch == mem.conversations
    assert point.tpot_s <= SEED.tpot_target_s and point.ttft_s <= SEED.ttft_target_s
    assert point.output_tok_s == pytest.approx(point.batch / point.tpot_s)
    # Prefill is not free: the steady step is longer than decode alone at the same batch.
    assert point.tpot_s > decode_step_floor_s(dep, point.batch, 2400)
    assert point.prompt_tok_s == pytest.approx(2 * point.output_tok_s)  # 800 new in / 400 out
    # The brief's 8,000 tok/s per replica is reachable, but only just, even at the floor.
    assert 8000 < point.output_tok_s < 8000 * 1.3


def test_best_serving_point_fp8_kv_is_latency_limited():
    dep = brief(kv="fp8")
    mem = memory_plan(dep, SEED)
    point = best_serving_point(dep, SEED, mem.kv_tokens)
    assert point.limited_by == "TPOT target"
    assert point.batch < mem.conversations
    assert point.tpot_s <= SEED.tpot_target_s
    assert steady_step(dep, SEED, point.batch + 1).seconds > SEED.tpot_target_s
    bf16 = best_serving_point(brief(), SEED, memory_plan(brief(), SEED).kv_tokens)
    assert point.output_tok_s > bf16.output_tok_s


def test_infeasible_serving_point():
    tight = SEED.with_overrides(tpot_target_s=0.001)
    dep = brief()
    point = best_serving_point(dep, tight, memory_plan(dep, tight).kv_tokens)
    assert not point.feasible and "TPOT" in point.limited_by
    assert point.output_tok_s == 0


def test_economics_are_at_the_forecast_not_the_floor():
    plan = make_plan(brief(), SEED, prices=Prices(gpu_hour=2.5, utilisation=0.6))
    e, tok_s = plan.economics, plan.forecast.output_tok_s
    assert 0 < tok_s < plan.serving.output_tok_s
    assert e.output_tokens_per_gpu_hour == pytest.approx(tok_s * 3600 / 4)
    assert e.cost_per_m_output == pytest.approx(2.5 * 4 / (tok_s * 3600 * 0.6) * 1e6)
    assert e.replicas_for_target == math.ceil(8000 / tok_s)
    assert make_plan(brief(), SEED, target_output_tok_s=50_000).economics.replicas_for_target == (
        math.ceil(50_000 / tok_s)
    )
    # Hosted: $0.80 per output token-million plus 5 input tokens per output at $0.60.
    assert e.api_cost_per_m_output == pytest.approx(0.8 + 5 * 0.6)
    # At the break-even utilisation self-hosting costs exactly the API price.
    be = e.break_even_utilisation
    at_be = make_plan(brief(), SEED, prices=Prices(utilisation=be)).economics
    assert at_be.cost_per_m_output == pytest.approx(e.api_cost_per_m_output)
    assert 0 < be < SEED.min_utilisation


def test_hf_config_dir_matches_preset(tmp_path):
    hf = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 128256,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "max_position_embeddings": 131072,
    }
    (tmp_path / "config.json").write_text(json.dumps(hf))
    from_dir = Deployment.create(tmp_path, "4xH100", weights_dtype="fp8")
    assert memory_plan(from_dir, SEED) == memory_plan(brief(), SEED)


def test_gpu_table_and_parsing():
    for spec in GPUS.values():
        assert "nvidia.com" in spec.source
        assert spec.memory_bytes > 0 and spec.bandwidth_bytes_s > 0 and spec.bf16_flops > 0
        assert spec.fp8_flops is None or spec.fp8_flops == pytest.approx(2 * spec.bf16_flops, 0.02)
    assert set(GPUS) == {"H100-SXM", "H200", "A100-80GB", "L40S", "B200"}
    assert parse_gpus("4xH100") == (GPUS["H100-SXM"], 4)
    assert parse_gpus("8 x h200") == (GPUS["H200"], 8)
    assert parse_gpus("B200") == (GPUS["B200"], 1)
    assert parse_gpus("2×a100-80gb") == (GPUS["A100-80GB"], 2)
    for bad in ("4xTPU", "0xH100", ""):
        with pytest.raises(ValueError):
            parse_gpus(bad)


def test_importing_the_planner_does_not_load_torch():
    code = (
        "import sys, fleetlm.capacity, fleetlm.plan_cmd, fleetlm.cli; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
