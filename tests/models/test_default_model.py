# The committed default model (models/fleetlm-tiny-chat) and the script that trains it: the
# checkpoint loads in HF transformers and in fleetlm with the same greedy tokens, its chat template
# renders ChatML exactly, it answers in words, and a smoke run of the training script learns.
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine import LLM, SamplingParams
from engine.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT / "models" / "fleetlm-tiny-chat"
SCRIPT = ROOT / "scripts" / "train_default_model.py"

IM_END, ENDOFTEXT = 2, 0
NEW_TOKENS = 32
# Prompts whose greedy paths have no near-ties (top-2 logit gap > 0.01), so float rounding
# cannot flip a token between implementations.
CHAT_PROMPTS = [
    "Hello!",
    "Who are you?",
    "What is the os module for?",
    "What is collections.OrderedDict?",
    "Explain how to sort a list.",
]
TEXT_PROMPTS = ["Return the number of", "This module provides"]


def _hf_greedy(model, prompt_ids: list[int], max_new_tokens: int, eos: list[int] | None):
    input_ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=ENDOFTEXT,
        )
    return out[0, len(prompt_ids) :].tolist()


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_pretrained(MODEL_DIR)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    chats = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=True)
        for p in CHAT_PROMPTS
    ]
    return chats + [tokenizer.encode(p) for p in TEXT_PROMPTS]


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(str(MODEL_DIR), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def hf_model():
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32)
    return model.eval()


def test_checkpoint_directory_is_complete_and_small():
    names = {p.name for p in MODEL_DIR.iterdir()}
    for required in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
        "README.md",
    ):
        assert required in names
    assert sum(p.stat().st_size for p in MODEL_DIR.iterdir()) <= 16 * 2**20
    config = json.loads((MODEL_DIR / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["tie_word_embeddings"] is True
    generation = json.loads((MODEL_DIR / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [IM_END, ENDOFTEXT]


@pytest.mark.slow
def test_greedy_tokens_match_transformers(hf_model, llm, prompts):
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outputs = llm.generate(prompts, params)
    for prompt, out in zip(prompts, outputs):
        assert out.token_ids == _hf_greedy(hf_model, prompt, NEW_TOKENS, eos=None)


def test_both_stop_at_the_same_end_of_turn(hf_model, llm, prompts):
    chats = prompts[: len(CHAT_PROMPTS)]
    outputs = llm.generate(chats, SamplingParams(temperature=0.0, max_tokens=64))
    for prompt, out in zip(chats, outputs):
        assert out.token_ids == _hf_greedy(hf_model, prompt, 64, eos=[IM_END, ENDOFTEXT])


def test_tokenizers_agree_with_transformers(tokenizer):
    transformers = pytest.importorskip("transformers")
    hf_tok = transformers.AutoTokenizer.from_pretrained(MODEL_DIR)
    text = "Return a list of the words in the string, using sep as the delimiter string."
    assert tokenizer.encode(text) == hf_tok.encode(text)
    messages = [{"role": "user", "content": "What does str.split do?"}]
    ours = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    theirs = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert ours == theirs
    assert hf_tok.eos_token == "<|im_end|>"
    assert tokenizer.eos_token_ids == (IM_END, ENDOFTEXT)
    assert tokenizer.bos_token_id is None


def test_chat_template_renders_chatml(tokenizer):
    messages = [
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Hi! Ask me about a Python module."},
    ]
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=False) == (
        "<|im_start|>user\nHello!<|im_end|>\n"
        "<|im_start|>assistant\nHi! Ask me about a Python module.<|im_end|>\n"
    )
    assert tokenizer.apply_chat_template(messages[:1], add_generation_prompt=True) == (
        "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"
    )
    # The special tokens are single ids, so the end of a turn is one token.
    ids = tokenizer.apply_chat_template(messages[:1], add_generation_prompt=True, tokenize=True)
    assert ids[0] == tokenizer.token_to_id("<|im_start|>") == 1
    assert ids.count(IM_END) == 1


def _reads_as_words(text: str) -> bool:
    words = text.split()
    wordlike = [w for w in words if re.fullmatch(r"[\"'(]?[A-Za-z][\w'.-]*[.,:;!?)\"']*", w)]
    return len(words) >= 3 and len(wordlike) >= 0.8 * len(words)


def test_answers_in_words(llm, prompts):
    chats = prompts[: len(CHAT_PROMPTS)]
    greedy = llm.generate(chats, SamplingParams(temperature=0.0, max_tokens=80))
    sampled = llm.generate(chats, SamplingParams(temperature=0.7, seed=0, max_tokens=80))
    for out in greedy + sampled:
        assert _reads_as_words(out.text), out.text
    # Greedy answers end their turn with <|im_end|> rather than running on.
    assert sum(out.finish_reason == "stop" for out in greedy) >= len(greedy) - 1


def _start_smoke(out: Path, seed: int = 0) -> subprocess.Popen:
    cmd = [sys.executable, str(SCRIPT), "--smoke", "--out", str(out), "--seed", str(seed)]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT
    )


def _smoke_log(proc: subprocess.Popen, out: Path) -> dict:
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    return json.loads((out / "training_log.json").read_text())


@pytest.mark.slow
def test_training_script_smoke_run_learns_and_is_deterministic(tmp_path):
    # The two runs at once: each trains on one thread (--threads 1), so on two cores they take
    # the time of one, and neither can see the other's files.
    runs = {name: _start_smoke(tmp_path / name) for name in ("a", "b")}
    try:
        first, second = (_smoke_log(proc, tmp_path / name) for name, proc in runs.items())
    finally:
        for proc in runs.values():  # one failed: the other is not left running
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert first["steps"] == 20
    assert first["final_loss"] < first["initial_loss"] - 0.5, first["losses"]
    assert second["losses"] == first["losses"]
    for name in ("model.safetensors", "tokenizer.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()

    # The script's own Llama is laid out as HF's and ours: the tiny checkpoint agrees too.
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "a", dtype=torch.float32)
    llm = LLM(str(tmp_path / "a"), device="cpu", dtype="float32")
    prompt = llm.tokenizer.encode("Return the string")
    ours = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    assert ours[0].token_ids == _hf_greedy(hf.eval(), prompt, 16, eos=None)
