# The peer in the same device run: HF transformers on the same requests, model shape and dummy
# weights, in its two best forms — continuous batching (`generate_batch`, paged attention over
# SDPA) and static-cache batched `generate` (fixed batch, left-padded to a fixed width).
# Every request produces exactly its output length (EOS disabled), so token counts match ours.
from __future__ import annotations

import time

from fleetlm.bench.workloads import BenchRequest


def hf_config(model_config):
    import transformers

    c = model_config
    cls = {
        "llama": transformers.LlamaConfig,
        "mistral": transformers.MistralConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
    }[c.family]
    kwargs = dict(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim,
        max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
        rope_theta=c.rope_theta, tie_word_embeddings=c.tie_word_embeddings,
        bos_token_id=0, eos_token_id=-1, pad_token_id=0,
    )  # fmt: skip
    if c.rope_scaling:
        kwargs["rope_scaling"] = dict(c.rope_scaling)
    return cls(**kwargs)


def build_hf_model(model_config, device: str = "cuda"):
    import torch
    import transformers

    config = hf_config(model_config)
    cls = {
        "llama": transformers.LlamaForCausalLM,
        "mistral": transformers.MistralForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "qwen3": transformers.Qwen3ForCausalLM,
    }[model_config.family]
    with torch.device(device):
        model = cls._from_config(config, torch_dtype=torch.bfloat16)
    return model.eval()


def run_static(model, requests: list[BenchRequest], batch_size: int = 64) -> dict:
    """Batched generate with a static cache; each batch runs to its longest output, and only
    each request's own output length counts as useful tokens."""
    import torch
    from transformers import GenerationConfig

    useful = 0
    start = time.perf_counter()
    for b in range(0, len(requests), batch_size):
        chunk = requests[b : b + batch_size]
        width = max(len(r.prompt_ids) for r in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, r in enumerate(chunk):  # left padding
            ids[row, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            mask[row, width - len(r.prompt_ids) :] = 1
        new = max(r.max_tokens for r in chunk)
        gen = GenerationConfig(
            max_new_tokens=new, min_new_tokens=new, do_sample=False, eos_token_id=-1,
            pad_token_id=0, cache_implementation="static",
        )  # fmt: skip
        with torch.inference_mode():
            model.generate(input_ids=ids.cuda(), attention_mask=mask.cuda(), generation_config=gen)
        useful += sum(r.max_tokens for r in chunk)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    return _result(f"static-cache generate, batch {batch_size}", requests, useful, elapsed)


def run_continuous(model, requests: list[BenchRequest], max_requests_per_batch: int = 32) -> dict:
    """The continuous-batching manager with paged attention over SDPA, each request added with
    its own max_new_tokens. cuDNN attention is off: with it PyTorch re-plans every step."""
    import torch
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    torch.backends.cuda.enable_cudnn_sdp(False)
    model.set_attn_implementation("paged|sdpa")
    longest = max(r.max_tokens for r in requests)
    gen = GenerationConfig(max_new_tokens=longest, eos_token_id=-1, do_sample=False, pad_token_id=0)
    cb = ContinuousBatchingConfig(max_requests_per_batch=max_requests_per_batch)
    useful = 0
    start = time.perf_counter()
    with model.continuous_batching_context_manager(
        generation_config=gen, continuous_batching_config=cb, block=True, timeout=5
    ) as manager:
        ids = [manager.add_request(r.prompt_ids, max_new_tokens=r.max_tokens) for r in requests]
        remaining = set(ids)
        deadline = time.time() + 900
        while remaining and time.time() < deadline:
            result = manager.get_result(timeout=1)
            if result is not None and result.request_id in remaining and result.is_finished():
                remaining.discard(result.request_id)
                useful += len(result.generated_tokens)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    if remaining:
        raise RuntimeError(f"{len(remaining)} HF requests did not finish")
    form = f"continuous batching (paged|sdpa, max_requests_per_batch {max_requests_per_batch})"
    return _result(form, requests, useful, elapsed)


def _result(form: str, requests: list[BenchRequest], useful: int, elapsed: float) -> dict:
    return {
        "form": form,
        "num_requests": len(requests),
        "output_tokens": useful,
        "elapsed_s": elapsed,
        "output_tok_s": useful / elapsed,
    }
