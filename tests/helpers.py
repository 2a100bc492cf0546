"""What several test files share (not a test file): a tiny character-level tokenizer and Llama,
toy GSM8K-style rows with a reward that has spread, a tiny ``CourseTrainer``, and small helpers
for the browser and server tests. Fixtures live in ``conftest.py``."""
from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import torch

from grpo_course.config import GRPOConfig

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789 #+-*/=.?,\n")
CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}"
                 "{% if add_generation_prompt %}<s>{% endif %}")

#: GSM8K-style rows written for the tests (the answer field as GSM8K has it)
ROWS = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?",
     "answer": "Tom has 3 + 4 = <<3+4=7>>7 apples.\n#### 7"},
    {"question": "A book costs $1,200 and is discounted by $250. What is the new price?",
     "answer": "The price is 1200 - 250 = <<1200-250=950>>950 dollars.\n#### 950"},
    {"question": "It is 2 degrees and gets 5 degrees colder. What is the temperature?",
     "answer": "2 - 5 = <<2-5=-3>>-3.\nSo it is -3 degrees.\n#### -3"},
    {"question": "Ann splits 3 pizzas among 4 friends. How much pizza does each get?",
     "answer": "Each gets 3 / 4 = <<3/4=0.75>>0.75 pizzas.\n#### 0.75"},
    {"question": "Bob walks 2 km a day for 3 days, then 4 km a day for 2 days, then rests. "
                 "Then he walks 1 km. How far did he walk?",
     "answer": "First 2 * 3 = <<2*3=6>>6 km.\nThen 4 * 2 = <<4*2=8>>8 km.\nThen 1 km.\n"
               "In total 6 + 8 = <<6+8=14>>14.\nAnd 14 + 1 = <<14+1=15>>15 km.\n#### 15"},
    {"question": "A shop sells 1,000 pens at $2 each. How much money does it make?",
     "answer": "1000 * 2 = <<1000*2=2000>>2,000\n#### 2,000"},
]


def write_jsonl(path: Path, rows) -> Path:
    """``rows`` as a JSON-lines file at ``path``."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


#: toy addition problems with a solution (the rows the tiny trainer trains on)
ADDITION_ROWS = [{"question": f"what is {a}+{b}?", "answer": str(a + b),
                  "solution": f"{a}+{b}={a + b}\n#### {a + b}"} for a, b in
                 [(1, 2), (3, 4), (5, 6), (7, 8), (2, 2), (9, 1)]]


def tiny_tokenizer():
    """A character-level tokenizer with <pad>=0, <s>=1, </s>=2 (EOS) and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({c: i + 4 for i, c in enumerate(CHARS)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")
    fast.add_special_tokens({"additional_special_tokens": ["<s>", "</s>"]})
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


#: the one tiny Llama's shape; each test states only what it changes
TINY_LLAMA = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)


def tiny_llama(seed: int = 0, **shape):
    """A randomly initialised Llama of :data:`TINY_LLAMA`'s shape with ``shape``'s changes."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**{**TINY_LLAMA, **shape}))


def tiny_model(seed: int = 0, vocab: int = 64):
    """The tiny Llama the sampler and trainer tests use: 2 layers, grouped-query attention, the
    character tokenizer's special tokens, tied embeddings, eval mode."""
    model = tiny_llama(seed, vocab_size=vocab, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=512, pad_token_id=0, bos_token_id=1,
                       eos_token_id=2, tie_word_embeddings=True).eval()
    model.generation_config.eos_token_id = 2
    return model


def length_reward(completions, answer=None, **kw):
    """A toy reward with spread: shorter completions score higher."""
    return [1.0 / (1 + len(c)) for c in completions]


def tiny_trainer(out_dir=None, **changes):
    """A ``CourseTrainer`` on the tiny model and the addition rows (LoRA, the length reward)."""
    import datasets

    from grpo_course.core.train import CourseTrainer

    cfg = GRPOConfig(**{**dict(num_generations=2, per_step_completions=4,
                               max_completion_length=6, max_steps=4, learning_rate=1e-2,
                               lora_r=4, lora_alpha=8, reward_weights={"length": 1.0},
                               lora_target_modules=("q_proj", "v_proj", "up_proj")), **changes})
    return CourseTrainer(tiny_model(), tiny_tokenizer(), cfg, datasets.Dataset.from_list(ADDITION_ROWS),
                         reward_funcs={"length": length_reward}, out_dir=out_dir)


def chromium() -> str | None:
    """The path of a Chromium-like browser, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def free_port() -> int:
    """A free TCP port on localhost."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeTokenizer:
    """A tokenizer whose save is interrupted (Ctrl-C) when ``fail`` is set."""

    def __init__(self, fail: bool):
        self.fail = fail

    def save_pretrained(self, folder):
        if self.fail:
            raise KeyboardInterrupt  # the user pressed Ctrl-C in the middle of the first load
        Path(folder, "tokenizer.json").write_text("{}")
