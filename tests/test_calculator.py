"""GSM8K's calculator: a safe evaluator, forced tokens in the sampler, and the tool's tokens out of
the loss (GRPO's and SFT's)."""
from __future__ import annotations

import time

import pytest
import torch

from grpo_course.core.calculator import (
    Calculator,
    calculate,
    calculator_solution,
    format_result,
    tool_spans,
    tool_token_mask,
)
from grpo_course.core.sampling import _decode_into, sample_completions
from tests.helpers import tiny_model


def calc_tokenizer():
    """The tests' character tokenizer with the calculator's characters ``< > ( )`` added."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from tests.helpers import CHARS, CHAT_TEMPLATE

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({c: i + 4 for i, c in enumerate(CHARS + list("<>()"))})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


# ---------------------------------------------------------------- the evaluator
@pytest.mark.parametrize("expression, result", [
    ("48/2", "24"), ("48+24", "72"), ("(3+4)*2.5", "17.5"), ("2-5", "-3"), ("3/4", "0.75"),
    ("1/3", "0.3333"), ("2/3", "0.6667"), ("1,200-250", "950"), (" 12 * .5 ", "6"),
    ("-(2+3)", "-5"), ("0.1+0.2", "0.3"), ("8*18", "144"), ("7-4.2-2.05", "0.75"),
])
def test_calculate(expression, result):
    assert calculate(expression) == result


@pytest.mark.parametrize("expression", [
    "__import__('os')", "__import__('os').system('true')", "9**9**9", "2**3", "1/0", "(1-1)/(2-2)",
    "9" * 10_000, "1" + "*99999999" * 20, "((((((((((1))))))))))", "a+1", "", "   ", "3+", "(3",
    "3)", "1..2", "3 4", "1e5", "0x10", "1_000", "=", "2=2", None, 12,
])
def test_calculate_refuses_what_is_not_bounded_arithmetic(expression):
    """A hostile or malformed annotation never raises, hangs or runs code: None, and the model's
    own tokens continue."""
    start = time.perf_counter()
    assert calculate(expression) is None
    assert time.perf_counter() - start < 0.5


@pytest.mark.parametrize("prefix, forced", [
    ("Half of 48 is <<48/2=", "24>>"), ("<<3+4=7>>7 then <<7*2=", "14>>"), ("<<1,200*3=", "3600>>"),
    ("<<48/2=24>> so", None), ("<<48/2=2", None), ("no tool=", None), ("<<1/0=", None),
    ("<<__import__('os')=", None), ("<<9**9**9=", None), ("<<2=2=", None), ("", None),
])
def test_forced_text_is_what_the_tool_writes_next(prefix, forced):
    from grpo_course.core.calculator import forced_text
    assert forced_text(prefix) == forced


def test_format_result():
    from fractions import Fraction
    assert format_result(Fraction(-7, 2)) == "-3.5"
    assert format_result(Fraction(1, 100000)) == "0"
    assert format_result(Fraction(10**6)) == "1000000"


def test_every_gsm8k_style_annotation_evaluates_to_its_result(course_rows):
    """The test rows' annotations: the calculator gives what the annotator wrote."""
    for row in course_rows:
        for span in tool_spans(row["solution"]):
            assert span[1] > span[0]
        assert calculator_solution(row["solution"]) == row["solution"]


def test_calculator_solution_writes_the_tools_result():
    assert calculator_solution("8*18 = <<8*18=144.00>>144\n#### 144") == "8*18 = <<8*18=144>>144\n#### 144"
    # an annotation the calculator cannot read is kept as written
    assert calculator_solution("<<x*2=4>>4") == "<<x*2=4>>4"


def test_tool_spans_and_token_mask():
    text = "3+4 = <<3+4=7>>7\n#### 7"
    spans = tool_spans(text)
    assert [text[a:b] for a, b in spans] == ["7>>"]
    tok = calc_tokenizer()
    enc = tok([text], return_offsets_mapping=True, return_tensors="pt", add_special_tokens=False)
    mask = tool_token_mask(enc["offset_mapping"], [spans])
    kept = "".join(tok.decode([i]) for i, m in zip(enc["input_ids"][0], mask[0], strict=True) if m)
    assert kept == "3+4 = <<3+4=7\n#### 7"


# ---------------------------------------------------------------- the sampler's tool
class ScriptedDecoder:
    """A decoder whose logits spell a fixed text per row, whatever it is fed: the model that
    'wants' to write ``script``; what the calculator forces replaces those steps."""

    def __init__(self, tok, scripts: list[str], vocab: int):
        self.ids = [tok(s, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for s in scripts]
        self.vocab, self.t = vocab, 0

    def allocate(self, batch, max_new_tokens):
        pass

    def _logits(self, rows):
        out = torch.zeros(len(rows), self.vocab)
        for i, r in enumerate(rows):
            ids = self.ids[r]
            out[i, ids[min(self.t, len(ids) - 1)]] = 8.0
        return out

    def prefill(self, ids, mask, positions, repeat):
        self.rows, self.t = torch.arange(len(self.ids)), 0
        return self._logits(self.rows.tolist())

    def select(self, rows):
        self.rows = self.rows[rows]

    def decode(self, tokens, positions, t):
        self.t = t + 1
        return self._logits(self.rows.tolist())


def scripted(scripts, calculator=True, steps=40):
    tok = calc_tokenizer()
    B = len(scripts)
    out = (torch.zeros(B, steps, dtype=torch.long), torch.zeros(B, steps), torch.zeros(B, steps, dtype=torch.long),
           torch.ones(B, steps, dtype=torch.long))
    tool = Calculator(tok, 64).rows(B) if calculator else None
    step, _, _ = _decode_into(ScriptedDecoder(tok, scripts, 64), torch.ones(B, 2, dtype=torch.long),
                              torch.ones(B, 2, dtype=torch.long), 1, out, 0.0, 1.0, None,
                              torch.tensor([tok.eos_token_id]), tok.pad_token_id, tool=tool)
    ids, logps, live, tool_mask = (t[:, :step + 1] for t in out)
    texts = tok.batch_decode(ids, skip_special_tokens=True)
    return texts, logps, live, tool_mask, ids, tok


def test_the_sampler_forces_the_result_and_masks_it():
    """The model writes 3+4=9; the calculator writes 7>> over its 9> and the model's own tokens
    go on from there; tool_mask is 0 exactly on the forced tokens, whose log-prob is 0."""
    texts, logps, live, tool_mask, ids, tok = scripted(["a <<3+4=9>>9 b", "no tool 3+4=9"])
    assert texts[0] == "a <<3+4=7>>9 b"
    assert texts[1] == "no tool 3+4=9"
    forced = (tool_mask[0] == 0) & (live[0] == 1)
    assert tok.decode(ids[0][forced]) == "7>>"
    assert (logps[0][forced] == 0).all() and (logps[0][~forced & (live[0] == 1)] != 0).all()
    assert (tool_mask[1] == 1).all()


def test_the_sampler_leaves_what_it_cannot_evaluate_to_the_model():
    hostile = ["<<1/0=5>>5", "<<a*2=4>>4", "<<2**2=4>>4", "<<" + "9" * 30 + "=1>>1"]
    texts, _, _, tool_mask, _, _ = scripted(hostile + ["<<(2)=3>>"], steps=48)
    assert texts == hostile + ["<<(2)=2>>"]
    assert (tool_mask[:4] == 1).all() and (tool_mask[4] == 0).sum() == 3


def test_without_the_calculator_the_model_writes_its_own_results():
    texts, *_ = scripted(["a <<3+4=9>>9 b"], calculator=False)
    assert texts == ["a <<3+4=9>>9 b"]


def test_two_annotations_in_a_row():
    texts, *_ = scripted(["<<2*3=5>>5 and <<5+1=0>>0"])
    assert texts == ["<<2*3=6>>5 and <<5+1=6>>0"]


@pytest.mark.heavy
def test_sample_completions_with_the_calculator_is_reproducible():
    """On a real (tiny) model, with the tool on: the same seed draws the same tokens, and with no
    annotation drawn the tool changes nothing."""
    model, tok = tiny_model(), calc_tokenizer()
    prompts = ["what is 2+3?", "7*8=?"]
    a = sample_completions(model, tok, prompts, 4, 24, seed=3, calculator=True)
    b = sample_completions(model, tok, prompts, 4, 24, seed=3, calculator=True)
    plain = sample_completions(model, tok, prompts, 4, 24, seed=3)
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.tool_mask, b.tool_mask)
    if (a.tool_mask == 1).all():
        assert torch.equal(a.completion_ids, plain.completion_ids)
    assert a.model_mask.shape == a.completion_mask.shape


def test_select_and_concat_keep_the_tool_mask():
    from grpo_course.core.sampling import SampleBatch, concat_batches
    ones = torch.ones(4, 3, dtype=torch.long)
    tool = torch.tensor([[1, 0, 1], [1, 1, 1], [0, 0, 1], [1, 1, 1]])
    b = SampleBatch(ones[:2], ones[:2], ones, ones, torch.zeros(4, 3), ["a"] * 4, 2,
                    torch.zeros(4, dtype=torch.bool), tool_mask=tool)
    picked = b.select_groups(torch.tensor([False, True]))
    assert torch.equal(picked.tool_mask, tool[2:])
    plain = SampleBatch(ones[:2], ones[:2], ones, ones, torch.zeros(4, 3), ["a"] * 4, 2,
                        torch.zeros(4, dtype=torch.bool))
    both = concat_batches([b, plain])
    assert torch.equal(both.tool_mask, torch.cat([tool, ones]))
    assert torch.equal(both.model_mask, torch.cat([tool, ones]))


# ---------------------------------------------------------------- out of the loss
def _calc_trainer(**changes):
    import datasets

    from grpo_course.config import GRPOConfig
    from grpo_course.core.train import CourseTrainer
    from tests.helpers import ADDITION_ROWS, length_reward

    cfg = GRPOConfig(**{**dict(num_generations=2, per_step_completions=4, max_completion_length=6,
                               max_steps=1, learning_rate=1e-2, reward_weights={"r": 1.0},
                               sampling_dtype="float32", train_dtype="float32", lora_r=4,
                               lora_alpha=8, lora_target_modules=("q_proj", "v_proj")), **changes})
    return CourseTrainer(tiny_model(), calc_tokenizer(), cfg, datasets.Dataset.from_list(ADDITION_ROWS),
                         reward_funcs={"r": length_reward})


@pytest.mark.heavy
def test_the_calculators_tokens_leave_the_grpo_loss():
    """Forced tokens (tool_mask 0) are attended to but count in no sum of the loss: their ratio
    plays no part, and the token count of the clip, KL and entropy means leaves them out."""
    t = _calc_trainer(calculator=True)
    inputs = t._generate_and_score_completions(t._rows(0, 2))
    assert torch.equal(inputs["tool_mask"], torch.ones_like(inputs["completion_mask"]))
    assert inputs["sampled"]["tool_tokens"] == 0.0      # logged per step: the tool wrote nothing here
    tool = torch.ones_like(inputs["completion_mask"])
    tool[:, 1] = 0
    inputs["tool_mask"] = tool
    inputs["advantages"] = torch.tensor([1.0, -1.0, 0.5, -0.5])
    inputs["groups_to_train"] = torch.ones(2, dtype=torch.bool)

    def loss_of(micro):
        t._metrics = {}
        with t._training_pass():
            return float(t.compute_loss(t.model, micro).detach())

    micro = t._prepare_inputs(inputs)[0]
    first = loss_of(micro)
    assert t._metrics["tokens"] == float((inputs["completion_mask"] * tool).sum())
    moved = dict(micro, old_per_token_logps=micro["old_per_token_logps"].clone())
    moved["old_per_token_logps"][:, 1] -= 0.5          # a forced token's ratio moves: no change
    assert loss_of(moved) == pytest.approx(first, abs=1e-7)
    moved["old_per_token_logps"][:, 0] -= 0.5          # a chosen token's ratio moves: a change
    assert loss_of(moved) != pytest.approx(first, abs=1e-7)


def test_sft_with_the_calculator_keeps_annotations_and_masks_the_results(monkeypatch, course_rows):
    """SFT's targets keep the annotations, and the result tokens the calculator would force are
    out of its loss (nanochat's mask): the loss is the mean over the other target tokens."""
    from grpo_course.core import sft
    from grpo_course.core.data import sft_text

    t = _calc_trainer(calculator=True, sft_batch_size=2)
    seen = {}

    def fake_logps(model, ids, mask, target_ids, target_mask, *args, **kwargs):
        seen["target_ids"] = target_ids
        values = -torch.arange(target_ids.shape[1], dtype=torch.float32).expand(target_ids.shape)
        return values.clone().requires_grad_()

    monkeypatch.setattr(sft, "per_token_logps", fake_logps)
    rows = {"question": [r["question"] for r in course_rows[:2]],
            "solution": [r["solution"] for r in course_rows[:2]]}
    loss = t.sft_step(rows, torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0))["loss"]
    targets = [sft_text(q, s, t.tokenizer, calculator=True)[1] for q, s in zip(rows["question"], rows["solution"],
                                                                               strict=True)]
    assert "<<3+4=7>>7" in targets[0]
    t.tokenizer.padding_side = "right"
    enc = t.tokenizer(targets, return_tensors="pt", padding=True, add_special_tokens=False,
                      return_offsets_mapping=True)
    mask = enc["attention_mask"] * tool_token_mask(enc["offset_mapping"], [tool_spans(x) for x in targets])
    positions = torch.arange(mask.shape[1], dtype=torch.float32).expand(mask.shape)
    assert 0 < mask.sum() < enc["attention_mask"].sum()
    assert loss == pytest.approx(float((positions * mask).sum() / mask.sum()))
    assert torch.equal(seen["target_ids"], enc["input_ids"])


def test_gold_starts_keep_annotations_with_the_calculator(course_rows):
    from grpo_course.core.data import gold_start
    bob = course_rows[4]["solution"]
    assert gold_start(bob, 1, calculator=True) == ("First 2 * 3 = <<2*3=6>>6 km.\nThen 4 * 2 = <<4*2=8>>8 km.\n"
                                                   "Then 1 km.\nIn total 6 + 8 = <<6+8=14>>14.\n")
    assert "<<" not in gold_start(bob, 1)


def test_the_format_reward_accepts_annotations():
    from grpo_course.core.rewards import correctness, exact_format
    text = "3+4 = <<3+4=7>>7\n#### 7"
    assert exact_format([text]) == [3.0]
    assert correctness([text], answer=["7"]) == [3.0]


def test_the_bundled_tokenizers_calculator(bundled_tokenizer):
    """SmolLM2's vocabulary: ``<<`` opens, ``>>`` closes, ``=`` ends an expression, and the tool's
    result is written in the tokens SFT trains the model to read."""
    tok = bundled_tokenizer
    calc = Calculator(tok)
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]
    assert calc.flags[ids(" <<")[0]] & 1 and calc.flags[ids(">>")[0]] & 2 and calc.flags[ids("=")[0]] & 4
    assert tok.decode(calc.result_ids("48/2")) == "24>>"
    # in context, SFT's target tokenizes the result as the sampler forces it
    assert ids("<<48/2=24>>")[-len(calc.result_ids("48/2")):] == calc.result_ids("48/2")


@pytest.mark.heavy
def test_a_long_warm_up_keeps_snapshots_and_resumes_where_it_stopped(tmp_path):
    """sft_save_every: the adapter every few warm-up steps (what a shorter warm-up gives) and a
    checkpoint; a run resumed from it ends with the uninterrupted run's weights."""
    from grpo_course.core.cli import CHECKPOINT
    from grpo_course.core.policy import adapter_state
    from grpo_course.core.sft import SFT_SNAPSHOTS
    from grpo_course.core.train import CourseTrainer

    whole = _calc_trainer(calculator=True, sft_steps=4, sft_batch_size=2, sft_save_every=2, max_steps=0)
    whole.out_dir = tmp_path / "whole"
    whole.train()
    assert (tmp_path / "whole" / SFT_SNAPSHOTS / "2" / "adapter_config.json").is_file()
    assert not (tmp_path / "whole" / SFT_SNAPSHOTS / "4").exists()      # the last is the run's sft/
    # the adapter kept at step 2 is the warm-up of 2 steps (what bench/shipped_run.py --sft_step ships)
    from safetensors.torch import load_file
    short = _calc_trainer(calculator=True, sft_steps=2, sft_batch_size=2, max_steps=0)
    short.out_dir = tmp_path / "short"
    short.train()
    kept = load_file(tmp_path / "whole" / SFT_SNAPSHOTS / "2" / "adapter_model.safetensors")
    two = load_file(tmp_path / "short" / "sft" / "adapter_model.safetensors")      # train() keeps it as sft/
    assert kept.keys() == two.keys()
    for name, value in two.items():
        torch.testing.assert_close(kept[name], value)

    cut = _calc_trainer(calculator=True, sft_steps=4, sft_batch_size=2, sft_save_every=2, max_steps=0)
    cut.out_dir = tmp_path / "cut"
    cut.sft(2)
    assert (tmp_path / "cut" / CHECKPOINT / "trainer.json").is_file()
    cut.sft(3)                                  # step 3 is not a save point: the checkpoint is step 2's
    fresh = _calc_trainer(calculator=True, sft_steps=4, sft_batch_size=2, sft_save_every=2, max_steps=0)
    resumed = CourseTrainer.resume(tmp_path / "cut" / CHECKPOINT, fresh.model, fresh.tokenizer,
                                   fresh.dataset, config=fresh.config, out_dir=tmp_path / "cut",
                                   reward_funcs=fresh.reward_funcs)
    assert resumed.sft_done == 2
    resumed.train()
    for name, value in adapter_state(whole.model).items():
        torch.testing.assert_close(adapter_state(resumed.model)[name], value)


@pytest.mark.heavy
def test_trl_samples_through_the_calculator_rollout(tmp_path):
    """TRL's way: GRPOTrainer(rollout_func=calculator_rollout) samples with the course sampler and
    the tool, G completions of each prompt, with env_mask (TRL's tool mask) beside them."""
    from datasets import Dataset
    from trl import GRPOTrainer

    from grpo_course.config import GRPOConfig
    from grpo_course.topics import trl_bridge

    trl_bridge.quiet_trl()
    seen = []

    def rollout(prompts, trainer):
        out = trl_bridge.calculator_rollout(prompts, trainer)
        seen.append((list(prompts), out))
        return out

    cfg = GRPOConfig(num_generations=2, per_step_completions=4, max_completion_length=8, max_steps=1,
                     reward_weights={"exact_format": 1.0}, use_lora=False, calculator=True)
    args = trl_bridge.grpo_config_from_course(cfg, tmp_path / "trl")
    tok = calc_tokenizer()
    trainer = GRPOTrainer(model=tiny_model(), reward_funcs=lambda completions, **k: [float(sum(map(ord, c)) % 7) for c in completions],
                          args=args, train_dataset=Dataset.from_dict({"prompt": ["what is 2+3?", "7*8=?"]}),
                          processing_class=tok, rollout_func=rollout)
    trainer.train()
    assert trainer.state.global_step == 1
    prompts, out = seen[0]
    n = len(out["completion_ids"])
    assert n == 4 and all(len(out[k]) == n for k in ("prompt_ids", "logprobs", "env_mask"))
    assert [len(m) for m in out["env_mask"]] == [len(c) for c in out["completion_ids"]]
    assert out["prompt_ids"][0] == out["prompt_ids"][1]           # a prompt's G completions together
    # TRL reads env_mask as its tool mask: with every token the tool's, nothing is trained
    def all_tool(prompts, trainer):
        out = trl_bridge.calculator_rollout(prompts, trainer)
        return {**out, "env_mask": [[0] * len(m) for m in out["env_mask"]]}

    masked = GRPOTrainer(model=tiny_model(), reward_funcs=lambda completions, **k: [float(sum(map(ord, c)) % 7) for c in completions],
                         args=trl_bridge.grpo_config_from_course(cfg, tmp_path / "masked"),
                         train_dataset=Dataset.from_dict({"prompt": ["what is 2+3?", "7*8=?"]}),
                         processing_class=tok, rollout_func=all_tool)
    masked.train()
    assert masked.state.log_history[0]["grad_norm"] == 0.0
    assert trainer.state.log_history[0]["grad_norm"] > 0.0
