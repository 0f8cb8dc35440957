# A small byte-level BPE tokenizer trained on the spot, so tests need no downloads. Greedy-parity
# tests save a random-weight HF model into the same directory and load it with HF and with us.
from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (BOS, EOS, IM_START, IM_END)

CHATML_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_TEXT = """\
The quick brown fox jumps over the lazy dog.
A journey of a thousand miles begins with a single step.
It was the best of times, it was the worst of times, it was the age of wisdom.
She sells sea shells by the sea shore; the shells she sells are surely seashells!
Why do we serve models ourselves? Because the GPU is the bill, and every token counts.
The scheduler admits a request when its prompt fits in the free pages of the cache.
"Hello," he said, "how are you doing today?" - "Fine, thanks. And you?"
We met at the café near the station, ordered a crème brûlée and talked about naïve ideas.
東京と日本の天気は晴れです。こんにちは世界! 你好，世界。 Привет, мир! Γειά σου Κόσμε.
Emoji are bytes too: 🙂 👍 🚀 🎉 ❤️ and flags like 🇫🇷 take several code points.
In 1969, 3 astronauts flew 384,400 km; the mission cost about $25.4 billion (≈ 2% of GDP).
Prices: 19.99, 0.5, -7, 1e-5, 3.14159, 2,718 and 100% of 42 is still 42.
Dates such as 2024-05-17T12:30:00Z and times like 09:45 appear in logs all the time.
"""

_CODE = """\
def fibonacci(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a

class PageTable:
    def __init__(self, num_pages):
        self.free = list(range(num_pages))

    def allocate(self):
        if not self.free:
            raise RuntimeError("out of pages")
        return self.free.pop()

for (int i = 0; i < n; ++i) { sum += x[i] * y[i]; }
SELECT tenant_id, SUM(tokens) FROM usage WHERE ts >= NOW() - INTERVAL '1 day' GROUP BY 1;
{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
"""

_WORD_LIST = (
    "the a of and to in is that it for on with as was at by an be this from or are have not but "
    "token model request cache page batch prompt output stream tenant bill engine kernel server "
    "fast slow small large first last every never always often again again"
)
_WORDS = _WORD_LIST.split()


def _corpus() -> list[str]:
    rng = random.Random(1234)
    lines = _TEXT.splitlines() + _CODE.splitlines()
    for _ in range(200):
        words = rng.choices(_WORDS, k=rng.randint(4, 14))
        end = rng.choice([".", "!", "?", ",", ":", ";", "..."])
        lines.append(" ".join(words).capitalize() + end + f" {rng.randint(0, 99999)}")
    return lines


def write_test_tokenizer(directory: Path, vocab_size: int = 512) -> None:
    if vocab_size < 256 + len(SPECIAL_TOKENS) + 1:
        raise ValueError(
            "vocab_size must leave room for the 256 byte tokens, the specials and a merge"
        )
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    # Specials go after the learned vocabulary, as in Llama 3.
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS}:0 $A:0",
                pair=f"{BOS}:0 $A:0 {BOS}:1 $B:1",
                special_tokens=[(BOS, bos_id)],
            ),
        ]
    )
    tok.save(str(directory / "tokenizer.json"))

    config = {
        # PreTrainedTokenizerFast keeps tokenizer.json as it is; a model-specific class could
        # rebuild the pipeline from its own defaults.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": CHATML_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    special_map = {"bos_token": BOS, "eos_token": EOS}
    (directory / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")
