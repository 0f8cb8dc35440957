# `fleetlm generate`: run the engine offline on one prompt and stream the text to the terminal.
from __future__ import annotations

import argparse
import sys
import time


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text offline with the engine (no services)")
    p.add_argument("--model", required=True, help="HF checkpoint directory or preset name")
    p.add_argument("--prompt", required=True)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--stats", action="store_true", help="print token counts and timings")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from engine import LLM, SamplingParams

    try:
        params = SamplingParams(
            temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
            max_tokens=args.max_tokens, stop=args.stop, ignore_eos=args.ignore_eos,
        )  # fmt: skip
        llm = LLM(args.model, device=args.device, dtype=args.dtype)
    except (ValueError, FileNotFoundError) as exc:
        print(f"fleetlm generate: {exc}", file=sys.stderr)
        return 2
    prompt = args.prompt
    if args.chat:
        prompt = llm.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=True
        )
    start = time.perf_counter()
    last = None
    for delta in llm.stream(prompt, params):
        sys.stdout.write(delta.new_text)
        sys.stdout.flush()
        last = delta
    sys.stdout.write("\n")
    if last is not None and last.finish_reason == "error":
        print(f"fleetlm generate: request failed: {last.error}", file=sys.stderr)
        return 1
    if args.stats and last is not None:
        elapsed = time.perf_counter() - start
        u = last.usage
        print(
            f"[{last.finish_reason}] prompt {u.prompt_tokens} tokens, output {u.completion_tokens} "
            f"tokens in {elapsed:.2f}s ({u.completion_tokens / elapsed:.1f} tok/s)",
            file=sys.stderr,
        )
    return 0
