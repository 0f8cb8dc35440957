#!/usr/bin/env python
"""Train fleetlm's default model, fleetlm-tiny-chat, on one CPU thread in about twelve minutes.

The model is a toy: a ~4M-parameter Llama (GQA, rotary, SwiGLU, tied embeddings) with a
4,096-token byte-level BPE, trained on the English prose of the Python standard library's
docstrings plus chat-shaped question/answer pairs built from them. It writes sentence-like text;
it is not a useful assistant. What it proves is the path: the output is a standard Hugging Face
checkpoint directory (config.json, model.safetensors, tokenizer.json, tokenizer_config.json with
a ChatML template, generation_config.json) that HF transformers and fleetlm's engine both load.

    python scripts/train_default_model.py --out models/fleetlm-tiny-chat        # the real run
    python scripts/train_default_model.py --smoke --out /tmp/tiny               # CI: ~20 steps

Nothing is downloaded and transformers is not used: the training model below is plain torch
whose weights carry HF Llama names (tests/models/test_default_model.py proves the layout by
greedy parity with transformers and with fleetlm's engine).

Determinism: the output is a function of --seed, the corpus and the software. The corpus is the
docstrings of the running interpreter's standard library, collected in sorted module order, so it
(and therefore the tokenizer and the weights) changes slightly between Python versions; given the
same Python, torch and tokenizers versions, the same --threads and the same CPU, two runs write
byte-identical files.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import io
import json
import math
import os
import pkgutil
import platform
import random
import re
import sys
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # ids 0, 1, 2

# ChatML, no BOS. The same text as engine.tokenizer.CHATML_TEMPLATE.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

MODEL_NAME = "fleetlm-tiny-chat"
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "models" / MODEL_NAME


@dataclass(frozen=True)
class TrainConfig:
    # model
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 688
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    # optimisation
    # Small batches learn the most per CPU-second here (measured against 8 and 16 x 256).
    steps: int = 1200
    batch_size: int = 4
    seq_len: int = 256
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 30
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    # corpus: None = every importable standard-library module
    modules: tuple[str, ...] | None = None
    val_fraction: float = 0.02
    save_dtype: str = "bfloat16"


FULL = TrainConfig()

# CI smoke run: a handful of modules, a byte-level vocabulary with a few merges, a 2-layer model.
SMOKE = TrainConfig(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=160,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    max_position_embeddings=256,
    steps=20,
    batch_size=8,
    seq_len=64,
    lr=1e-2,
    warmup_steps=2,
    modules=("base64", "bisect", "fnmatch", "heapq", "json", "shlex", "string", "textwrap"),
    val_fraction=0.05,
    save_dtype="float32",
)


# ---------------------------------------------------------------------------------------------
# Corpus: English prose paragraphs from standard-library docstrings, and chats built from them.
# ---------------------------------------------------------------------------------------------

# Modules that act on import (open a browser, print, draw) or hold generated/huge/non-prose text.
_SKIP_MODULES = {
    "antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "ensurepip",
    "distutils", "lib2to3", "pydoc_data", "encodings", "test", "tests", "idle_test", "__main__",
}  # fmt: skip
_MAX_PACKAGE_DEPTH = 3
_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`~?([^`<]+?)(?:\s*<[^>]*>)?`")  # :func:`x` → x
_NOT_PROSE = re.compile(r"[{}\[\]=<>@\\|]|->|__|https?:|www\.|Copyright|\.py\b")


def _quiet_import(name: str):
    try:
        with (
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore")
            return importlib.import_module(name)
    except BaseException:  # ImportError, platform-specific failures, SystemExit from scripts
        return None


def stdlib_modules(names: tuple[str, ...] | None = None) -> list:
    """Importable stdlib modules and their public submodules, in sorted (deterministic) order."""
    found = []

    def visit(name: str, depth: int) -> None:
        if any(p.startswith("_") or p in _SKIP_MODULES for p in name.split(".")):
            return
        module = _quiet_import(name)
        if module is None:
            return
        found.append(module)
        if hasattr(module, "__path__") and depth < _MAX_PACKAGE_DEPTH:
            for info in sorted(pkgutil.iter_modules(module.__path__), key=lambda i: i.name):
                visit(f"{name}.{info.name}", depth + 1)

    for name in sorted(names if names is not None else sys.stdlib_module_names):
        visit(name, 0)
    return found


def prose_paragraphs(doc: str) -> list[str]:
    """The paragraphs of a docstring that read as English sentences (no code, tables, lists)."""
    out = []
    for para in re.split(r"\n\s*\n", inspect.cleandoc(doc)):
        lines = para.splitlines()
        if any(
            line[:1].isspace()
            or line.lstrip().startswith((">>>", "...", "-", "*", "+", ":", "..", "|", "=", "#"))
            for line in lines
        ):
            continue
        text = " ".join(line.strip() for line in lines)
        text = _ROLE.sub(r"\1", text).replace("``", "").replace("`", "")
        text = re.sub(r"\s+", " ", text).strip()
        if not 40 <= len(text) <= 800 or not text[0].isupper() or text[-1] not in ".!?":
            continue
        if not text.isascii() or _NOT_PROSE.search(text) or len(text.split()) < 6:
            continue
        if sum(c.isalpha() or c == " " for c in text) / len(text) < 0.88:
            continue
        out.append(text)
    return out


@dataclass(frozen=True)
class DocItem:
    name: str  # json.dumps, str.split (builtins lose their prefix)
    kind: str  # module | class | function
    paragraphs: tuple[str, ...]


def _documented_objects(module) -> list[tuple[str, str, object]]:
    mod = module.__name__
    items: list[tuple[str, str, object]] = [(mod, "module", module)]
    prefix = "" if mod == "builtins" else mod + "."
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for attr in sorted(vars(module)):
            obj = vars(module)[attr]
            if attr.startswith("_") or getattr(obj, "__module__", None) != mod:
                continue
            if inspect.isclass(obj):
                items.append((prefix + attr, "class", obj))
                for meth in sorted(vars(obj)):
                    member = vars(obj)[meth]
                    if isinstance(member, staticmethod | classmethod):
                        member = member.__func__
                    if not meth.startswith("_") and (
                        inspect.isroutine(member) or isinstance(member, property)
                    ):
                        items.append((f"{prefix}{attr}.{meth}", "function", member))
            elif inspect.isroutine(obj):
                items.append((prefix + attr, "function", obj))
    return items


def collect_docs(modules: tuple[str, ...] | None) -> list[DocItem]:
    seen: set[str] = set()
    docs = []
    for module in stdlib_modules(modules):
        for name, kind, obj in _documented_objects(module):
            with warnings.catch_warnings():  # typing.io and friends warn on attribute access
                warnings.simplefilter("ignore")
                doc = getattr(obj, "__doc__", None)
            if not isinstance(doc, str) or doc in seen:  # inherited and shared docstrings once
                continue
            seen.add(doc)
            paragraphs = prose_paragraphs(doc)
            if paragraphs:
                docs.append(DocItem(name, kind, tuple(paragraphs)))
    return docs


_QUESTIONS = {
    "module": (
        "What is the {name} module?",
        "What is the {name} module for?",
        "Tell me about the {name} module.",
        "What does the {name} module do?",
        "Can you explain the {name} module?",
        "what is {name} used for",
    ),
    "class": (
        "What is {name}?",
        "What is the {name} class?",
        "Describe the class {name}.",
        "Explain {name}.",
        "Can you tell me about {name}?",
        "what is {name}",
    ),
    "function": (
        "What does {name} do?",
        "What is {name} for?",
        "Explain {name}.",
        "Can you tell me what {name} does?",
        "Describe {name}.",
        "what does {name} do",
    ),
}

# Small talk, so the first "Hello" to `fleetlm serve` gets a fitting answer.
_SMALL_TALK = (
    (
        ("Hello!", "Hi", "Hello", "Hi there!", "Hey", "Good morning!", "Hello, how are you?"),
        (
            "Hello! I am fleetlm-tiny-chat, a tiny demo model. Ask me about a Python module.",
            "Hi! I am a small language model that has read the Python documentation strings.",
            "Hello! I am fine, thank you. What would you like to know about Python?",
        ),
    ),
    (
        ("Who are you?", "What are you?", "What is your name?", "Introduce yourself."),
        (
            "I am fleetlm-tiny-chat, a tiny language model trained in a few minutes on a CPU.",
            "My name is fleetlm-tiny-chat. I am a small demo model served by fleetlm.",
            "I am a toy model with a few million parameters. I write sentences, but I know "
            "very little.",
        ),
    ),
    (
        ("What can you do?", "How can you help me?", "What do you know?", "Can you help me?"),
        (
            "I can answer short questions about the Python standard library, such as what a "
            "module or a function does.",
            "I know a little about the modules of the Python standard library. Try asking "
            "what the json module is for.",
        ),
    ),
    (
        ("Thank you!", "Thanks", "Thanks a lot.", "Great, thank you."),
        ("You are welcome!", "Glad I could help.", "You are welcome. Ask me anything else."),
    ),
    (
        ("Bye", "Goodbye!", "See you later."),
        ("Goodbye!", "Bye! Have a nice day.", "See you later."),
    ),
    (
        ("What is Python?", "Tell me about Python.", "What is Python used for?"),
        (
            "Python is a programming language. Its standard library has modules for files, "
            "text, numbers, networking and much more.",
            "Python is a programming language that is easy to read. It comes with a large "
            "standard library.",
        ),
    ),
    (
        ("What is fleetlm?", "What does fleetlm do?"),
        (
            "fleetlm is a self-hosted server for large language models. I am its default "
            "model, small enough to run on any CPU.",
        ),
    ),
)
_SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are fleetlm-tiny-chat, a small and friendly assistant.",
    "Answer the question in one or two sentences.",
)


def _answer(item: DocItem, rng: random.Random) -> str:
    text = item.paragraphs[0]
    if len(item.paragraphs) > 1 and len(text) < 200 and rng.random() < 0.5:
        text += " " + item.paragraphs[1]
    return text


def build_documents(docs: list[DocItem], seed: int) -> tuple[list[str], list[str]]:
    """(training documents, plain texts for the tokenizer). Chats are rendered in ChatML."""
    rng = random.Random(seed)
    plain = [" ".join(d.paragraphs) for d in docs]
    chats: list[list[dict[str, str]]] = []
    for item in docs:
        question = rng.choice(_QUESTIONS[item.kind]).format(name=item.name)
        answer = _answer(item, rng)
        chats.append(
            [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        )
    # About one chat in eight is small talk.
    for _ in range(max(len(docs) // 8, 8 * len(_SMALL_TALK))):
        questions, answers = rng.choice(_SMALL_TALK)
        chats.append(
            [
                {"role": "user", "content": rng.choice(questions)},
                {"role": "assistant", "content": rng.choice(answers)},
            ]
        )
    rng.shuffle(chats)
    # Some chats get a system prompt, some continue with a second exchange.
    documents = list(plain)
    i = 0
    while i < len(chats):
        messages = list(chats[i])
        if rng.random() < 0.25 and i + 1 < len(chats):
            i += 1
            messages += chats[i]
        if rng.random() < 0.2:
            messages.insert(0, {"role": "system", "content": rng.choice(_SYSTEM_PROMPTS)})
        documents.append(render_chat(messages, add_generation_prompt=False))
        i += 1
    rng.shuffle(documents)
    tokenizer_texts = plain + [m["content"] for c in chats for m in c] + list(_SYSTEM_PROMPTS)
    return documents, tokenizer_texts


def render_chat(messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """CHAT_TEMPLATE in Python (the tests check that both render the same)."""
    text = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
    return text + (f"{IM_START}assistant\n" if add_generation_prompt else "")


# ---------------------------------------------------------------------------------------------
# Tokenizer: byte-level BPE, special tokens first (ids 0-2).
# ---------------------------------------------------------------------------------------------


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, wanted {vocab_size}")
    for i, special in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(special) == i, special
    return tok


def encode_documents(tok, documents: list[str]) -> torch.Tensor:
    """One stream of token ids, each document followed by <|endoftext|>."""
    eot = tok.token_to_id(ENDOFTEXT)
    ids: list[int] = []
    for enc in tok.encode_batch(documents, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.long)


# ---------------------------------------------------------------------------------------------
# Model: Llama in plain torch; parameter names are exactly the HF LlamaForCausalLM ones.
# ---------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    # The "neox" layout HF Llama uses: the two halves of each head are the rotated pairs.
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, c: TrainConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads = c.num_heads, c.num_kv_heads
        self.head_dim = c.hidden_size // c.num_heads
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_heads * self.head_dim, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # q: [b, num_heads, t, head_dim]; k, v: [b, num_kv_heads, t, head_dim]
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # GQA: query head h reads KV head h // (num_heads // num_kv_heads), as HF's repeat_kv.
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, c: TrainConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c: TrainConfig):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, c: TrainConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class TinyLlama(nn.Module):
    """Llama with tied embeddings: state_dict() keys are HF's (lm_head.weight is the embedding)."""

    def __init__(self, c: TrainConfig):
        super().__init__()
        self.config = c
        self.model = Backbone(c)
        head_dim = c.hidden_size // c.num_heads
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        self.register_buffer("inv_freq", 1.0 / (c.rope_theta**exponents), persistent=False)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator) -> None:
        # GPT-2 style: N(0, 0.02), the projections into the residual stream scaled by depth.
        residual_std = 0.02 / math.sqrt(2 * self.config.num_layers)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                p.normal_(0.0, residual_std, generator=generator)
            else:
                p.normal_(0.0, 0.02, generator=generator)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        positions = torch.arange(t, dtype=torch.float32, device=input_ids.device)
        freqs = torch.outer(positions, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)  # [t, head_dim]
        cos, sin = emb.cos(), emb.sin()
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return F.linear(self.model.norm(x), self.model.embed_tokens.weight)  # [b, t, vocab]

    @torch.no_grad()
    def greedy(self, ids: list[int], max_new_tokens: int, stop: set[int]) -> list[int]:
        out: list[int] = []
        for _ in range(max_new_tokens):
            logits = self(torch.tensor([ids + out], device=self.inv_freq.device))[0, -1]
            token = int(logits.argmax())
            if token in stop:
                break
            out.append(token)
        return out


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------


def lr_at(step: int, c: TrainConfig) -> float:
    if step < c.warmup_steps:
        return c.lr * (step + 1) / c.warmup_steps
    progress = (step - c.warmup_steps) / max(1, c.steps - c.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return c.lr * (c.min_lr_ratio + (1.0 - c.min_lr_ratio) * cosine)


def _batch(stream: torch.Tensor, c: TrainConfig, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - c.seq_len - 1, (c.batch_size,), generator=gen)
    return torch.stack([stream[s : s + c.seq_len + 1] for s in starts.tolist()])


@torch.no_grad()
def evaluate(model: TinyLlama, stream: torch.Tensor, c: TrainConfig, max_windows: int = 32):
    n = min(max_windows, (len(stream) - 1) // c.seq_len)
    if n == 0:
        return float("nan")
    windows = torch.stack([stream[i * c.seq_len : (i + 1) * c.seq_len + 1] for i in range(n)])
    losses = []
    for chunk in windows.split(c.batch_size):
        chunk = chunk.to(model.inv_freq.device)
        logits = model(chunk[:, :-1])
        losses.append(
            F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum")
        )
    return float(sum(losses).item() / (n * c.seq_len))


def train(model: TinyLlama, stream: torch.Tensor, c: TrainConfig, seed: int, log) -> list[float]:
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2 or "embed" in n]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": c.weight_decay},
            {"params": no_decay, "weight_decay": 0},
        ],
        lr=c.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        foreach=True,
    )
    gen = torch.Generator().manual_seed(seed + 1)
    losses = []
    model.train()
    t0 = time.perf_counter()
    for step in range(c.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, c)
        batch = _batch(stream, c, gen).to(model.inv_freq.device)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), c.grad_clip)
        opt.step()
        losses.append(loss.item())
        if step % 10 == 0 or step == c.steps - 1:
            elapsed = time.perf_counter() - t0
            log(f"step {step:4d}/{c.steps}  loss {losses[-1]:.4f}  lr {lr_at(step, c):.2e}  "
                f"{elapsed:6.1f}s")  # fmt: skip
    model.eval()
    return losses


# ---------------------------------------------------------------------------------------------
# Writing the HF checkpoint directory
# ---------------------------------------------------------------------------------------------


def hf_config(c: TrainConfig, eos_ids: list[int], pad_id: int) -> dict:
    head_dim = c.hidden_size // c.num_heads
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": c.max_position_embeddings,
        "rms_norm_eps": c.rms_norm_eps,
        # transformers < 5 reads rope_theta, 5 reads rope_parameters; both say the same.
        "rope_theta": c.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "initializer_range": 0.02,
        "bos_token_id": None,
        "eos_token_id": eos_ids,
        "pad_token_id": pad_id,
        "torch_dtype": c.save_dtype,
        "use_cache": True,
    }


def save_checkpoint(out: Path, model: TinyLlama, tok, c: TrainConfig) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, c.save_dtype)
    # Tied: lm_head.weight is the embedding and is left out, as HF does for tied models.
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})

    eos_ids = [tok.token_to_id(IM_END), tok.token_to_id(ENDOFTEXT)]
    pad_id = tok.token_to_id(ENDOFTEXT)
    _write_json(out / "config.json", hf_config(c, eos_ids, pad_id))
    _write_json(out / "generation_config.json", {"eos_token_id": eos_ids, "pad_token_id": pad_id})
    tok.save(str(out / "tokenizer.json"))
    _write_json(
        out / "tokenizer_config.json",
        {
            # PreTrainedTokenizerFast keeps tokenizer.json as it is.
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None,
            "eos_token": IM_END,
            "pad_token": ENDOFTEXT,
            "unk_token": None,
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": c.max_position_embeddings,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    _write_json(
        out / "special_tokens_map.json",
        {
            "eos_token": IM_END,
            "pad_token": ENDOFTEXT,
            "additional_special_tokens": [IM_START, IM_END],
        },
    )


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


SAMPLE_PROMPTS = (
    "Hello!",
    "Who are you?",
    "What does the json module do?",
    "What does str.split do?",
    "Explain how to sort a list.",
)


def model_card(c: TrainConfig, args, summary: dict, samples: list[tuple[str, str]]) -> str:
    cmd = "python scripts/train_default_model.py --out models/fleetlm-tiny-chat"
    if args.steps is not None:
        cmd += f" --steps {args.steps}"
    if args.seed != 0:
        cmd += f" --seed {args.seed}"
    sample_lines = "\n".join(f"- **{q}** → {a!r}" for q, a in samples)
    return f"""\
# {MODEL_NAME}

fleetlm's default model: a tiny Llama-architecture chat model trained from scratch on a CPU, so
that `fleetlm serve` answers in words on a machine with no GPU and no network. It is a toy that
writes sentence-like English about the Python standard library; it is **not** a useful assistant:
it makes things up, ignores most of what you ask and knows nothing beyond its tiny corpus.

| | |
|---|---|
| architecture | `LlamaForCausalLM`: {c.num_layers} layers, hidden {c.hidden_size}, \
{c.num_heads} heads / {c.num_kv_heads} KV heads (GQA), SwiGLU {c.intermediate_size}, \
RoPE θ={c.rope_theta:g}, tied embeddings |
| parameters | {summary["num_params"]:,} |
| weights | `model.safetensors`, {c.save_dtype} |
| tokenizer | byte-level BPE, {c.vocab_size} tokens; specials `<\\|endoftext\\|>` (0), \
`<\\|im_start\\|>` (1), `<\\|im_end\\|>` (2); no BOS |
| chat template | ChatML: `<\\|im_start\\|>{{role}}\\n{{content}}<\\|im_end\\|>\\n` \
per message, then `<\\|im_start\\|>assistant\\n` |
| end of turn | `eos_token_id` = [2, 0] (`<\\|im_end\\|>`, `<\\|endoftext\\|>`) |
| context | trained on {c.seq_len}-token windows; `max_position_embeddings` \
{c.max_position_embeddings}, but expect nonsense past a few hundred tokens |

## Training

- Corpus: the English prose paragraphs of the docstrings of every importable module of the
  Python {summary["python"]} standard library (modules, classes, functions, methods; code,
  tables and lists filtered out), plus ChatML conversations built from them ("What does
  json.dumps do?" → the first paragraph of its docstring) and a little scripted small talk.
  {summary["num_docs"]:,} docstrings, {summary["num_tokens"]:,} tokens.
- {c.steps} steps of AdamW (β = 0.9, 0.95; weight decay {c.weight_decay}), peak learning rate
  {c.lr:g} with {c.warmup_steps} warm-up steps and cosine decay to {c.min_lr_ratio:g}×, batch
  {c.batch_size} × {c.seq_len} tokens, gradient clipping {c.grad_clip:g}, seed {args.seed}, fp32
  on {args.threads} CPU thread(s) (torch {summary["torch"]}).
- Final training loss {summary["final_loss"]:.3f} (mean of the last 10 steps), held-out loss
  {summary["val_loss"]:.3f} nats/token.

Rebuild it with

    {cmd}

The result depends on the seed, the Python version (its docstrings are the corpus), the torch
and tokenizers versions, the thread count and the CPU; with all of those fixed it is
byte-identical.

## Samples (greedy, chat template)

{sample_lines}

## Limitations

A few million parameters and a few minutes of training: grammatical-looking sentences, wrong
facts, no reasoning, no instruction following beyond the shape of a short answer. Use it to check
that serving works, never for answers. The training text is the Python standard library's
docstrings (PSF license).
"""


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="checkpoint directory")
    parser.add_argument(
        "--steps", type=int, default=None, help=f"optimizer steps (default {FULL.steps})"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--smoke", action="store_true", help="tiny corpus and model, 20 steps")
    parser.add_argument(
        "--device", default="cpu", help="torch device; only CPU runs are the reference build"
    )
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))  # tokenizers' thread pool
    c = SMOKE if args.smoke else FULL
    if args.steps is not None:
        c = replace(c, steps=args.steps, warmup_steps=min(c.warmup_steps, max(1, args.steps // 10)))

    def log(msg: str) -> None:
        print(msg, flush=True)

    t_start = time.perf_counter()
    docs = collect_docs(c.modules)
    documents, tokenizer_texts = build_documents(docs, args.seed)
    tok = train_tokenizer(tokenizer_texts, c.vocab_size)
    stream = encode_documents(tok, documents)
    n_val = max(int(len(stream) * c.val_fraction), c.seq_len + 1)
    train_stream, val_stream = stream[:-n_val], stream[-n_val:]
    log(f"corpus: {len(docs)} docstrings, {len(documents)} documents, {len(stream)} tokens "
        f"({len(val_stream)} held out); {time.perf_counter() - t_start:.1f}s")  # fmt: skip

    torch.manual_seed(args.seed)
    model = TinyLlama(c)
    model.init_weights(torch.Generator().manual_seed(args.seed))
    model.to(args.device)
    num_params = sum(p.numel() for p in model.parameters())
    log(f"model: {num_params:,} parameters")
    t_train = time.perf_counter()
    losses = train(model, train_stream, c, args.seed, log)
    train_s = time.perf_counter() - t_train

    # Evaluate and sample with the weights as saved (rounded to the save dtype).
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(getattr(torch, c.save_dtype)).float())
    val_loss = evaluate(model, val_stream, c)
    stop = {tok.token_to_id(IM_END), tok.token_to_id(ENDOFTEXT)}
    samples = []
    for prompt in SAMPLE_PROMPTS:
        ids = tok.encode(render_chat([{"role": "user", "content": prompt}])).ids
        samples.append((prompt, tok.decode(model.greedy(ids, 40, stop))))

    summary = {
        "steps": c.steps,
        "seed": args.seed,
        "num_params": num_params,
        "num_docs": len(docs),
        "num_tokens": len(stream),
        "initial_loss": losses[0],
        "final_loss": sum(losses[-10:]) / len(losses[-10:]),
        "val_loss": val_loss,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "losses": [round(x, 4) for x in losses],
        "config": {k: v for k, v in asdict(c).items() if k != "modules"},
    }
    save_checkpoint(args.out, model, tok, c)
    (args.out / "README.md").write_text(model_card(c, args, summary, samples))
    _write_json(args.out / "training_log.json", summary)
    for prompt, answer in samples:
        log(f"sample: {prompt!r} → {answer!r}")
    total_s = time.perf_counter() - t_start
    log(f"final loss {summary['final_loss']:.4f} (first {losses[0]:.4f}), val {val_loss:.4f}; "
        f"training {train_s:.1f}s, total {total_s:.1f}s → {args.out}")  # fmt: skip
    return summary


if __name__ == "__main__":
    main()
