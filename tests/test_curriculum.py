"""Curriculum stages, the diagonal Fisher and the EWC penalty."""
from __future__ import annotations

import math

import pytest
import torch

from grpo_course.core.data import STRATA, load_gsm8k, work_lines
from grpo_course.measure.evaluate import EvalResult
from grpo_course.topics.curriculum import (
    EWC,
    CurriculumError,
    accuracy_change,
    accuracy_change_text,
    accuracy_reading,
    completion_log_likelihood,
    curriculum_stages,
    ewc_penalty,
    fisher_agreement,
    fisher_diagonal,
    likelihood_reading,
    moved,
    order_by_pass_rate,
    reference_batches,
    reverse_stages,
    shuffled_stages,
    start_key,
    start_name,
    take,
    unchanged,
)
from tests import helpers


# ---------------------------------------------------------------- stages
def _check_partition(dataset, stages):
    ids = [i for s in stages for i in s.dataset["idx"]]
    assert len(ids) == len(set(ids)), "stages overlap"
    assert sorted(ids) == sorted(dataset["idx"]), "stages do not cover the data"


def test_stages_disjoint_and_covering(gsm8k_dir):
    data = load_gsm8k("train", data_dir=gsm8k_dir)
    stages = curriculum_stages(data)
    assert [s.strata for s in stages] == [(s,) for s in STRATA]
    _check_partition(data, stages)
    for stage in stages:
        assert set(stage.dataset["difficulty"]) <= set(stage.strata)
    assert [len(s) for s in stages] == [5, 0, 1]   # Bob's five-line solution is advanced


def test_stages_on_real_gsm8k(real_gsm8k_dir):
    data = load_gsm8k("train", data_dir=real_gsm8k_dir, limit=600)
    stages = curriculum_stages(data, order=("intermediate", "basic", "advanced"))
    _check_partition(data, stages)
    assert stages[0].strata == ("intermediate",) and all(len(s) > 0 for s in stages)
    small = take(stages, 20, seed=1)
    assert [len(s) for s in small] == [20, 20, 20]
    shuffled = shuffled_stages(small, seed=0)
    assert [len(s) for s in shuffled] == [20, 20, 20]
    # the baseline uses exactly the same rows, in another order
    assert sorted(i for s in shuffled for i in s.dataset["idx"]) == \
        sorted(i for s in small for i in s.dataset["idx"])
    assert len({i for s in shuffled for i in s.dataset["idx"]}) == 60
    assert set(shuffled[0].dataset["difficulty"]) != {"basic"}


def test_reverse_stages_slide_the_start_back_on_the_same_problems(real_gsm8k_dir):
    data = load_gsm8k("train", data_dir=real_gsm8k_dir, limit=200)
    stages = reverse_stages(data, 12, seed=3)
    assert [s.name for s in stages] == ["stage 1: 1 line left", "stage 2: 2 lines left",
                                        "stage 3: whole problem"]
    ids = [list(s.dataset["idx"]) for s in stages]
    assert ids[0] == ids[1] == ids[2] and len(ids[0]) == 12       # the same problems each stage
    one, two, whole = (list(s.dataset) for s in stages)
    for a, b, c in zip(one, two, whole, strict=True):
        assert a["lines_left"] == 1 and b["lines_left"] == 2 and c["start"] == ""
        assert c["lines_left"] > 2          # a whole problem's lines_left: all its work lines
        # the start slides back: stage 1 is given one more gold line than stage 2
        assert a["start"].startswith(b["start"]) and a["start"].count("\n") == b["start"].count("\n") + 1
        assert b["start"]            # more than two work lines: stage 2 is not the whole problem
    assert list(reverse_stages(data, 12, seed=3)[0].dataset["idx"]) == ids[0]    # seeded
    first = [i for i, s in zip(data["idx"], data["solution"], strict=True)
             if len(work_lines(s)) > 2][:12]
    assert list(reverse_stages(data, 12, seed=None)[1].dataset["idx"]) == first   # in order
    shuffled = shuffled_stages(stages, seed=0)                # the control keeps each row's start
    def pairs(plan):
        return sorted((r["idx"], r["lines_left"]) for s in plan for r in s.dataset)
    assert pairs(shuffled) == pairs(stages)
    with pytest.raises(CurriculumError, match="n = 0"):
        reverse_stages(data, 0)
    with pytest.raises(CurriculumError, match="starts"):
        reverse_stages(data, 3, starts=(0, None))
    assert start_name(1) == "1 line left" and start_name(None) == "whole problem"
    assert start_key(1) == "1_left" and start_key(None) == "whole"   # headroom.json's keys


def _result(correct):
    return EvalResult.from_records([{"idx": i, "correct": c, "formatted": True, "difficulty": "basic"}
                                    for i, c in enumerate(correct)])


def test_accuracy_change_is_paired():
    before = _result([True, True, False, False, False, False])
    after = _result([True, False, True, True, False, False])
    d = accuracy_change(before, after)
    assert (d["n"], d["lost"], d["gained"]) == (6, 1, 2)
    assert d["before"] == pytest.approx(100 * 2 / 6) and d["after"] == pytest.approx(50)
    assert d["change"] == pytest.approx(100 / 6) and d["lo"] < d["change"] < d["hi"]
    assert d["p_value"] == pytest.approx(1.0)            # 1 lost vs 2 gained: no evidence
    with pytest.raises(CurriculumError, match="same problems"):
        accuracy_change(before, _result([True] * 5))


def test_accuracy_change_text_tests_only_where_a_problem_changed():
    d = accuracy_change(_result([True, True, False, False, False, False]),
                        _result([True, False, True, True, False, False]))
    assert accuracy_change_text(d).startswith("33.3 → 50.0 % (+16.7 points, 95 % CI [")
    assert accuracy_change_text(d).endswith("1 lost, 2 gained, p = 1)")
    assert accuracy_change_text(d, levels=False).startswith("+16.7 points (95 % CI [")
    same = accuracy_change(_result([True, False, False]), _result([True, False, False]))
    for levels, lead in ((True, "33.3 → 33.3 %"), (False, "+0.0 points")):
        assert accuracy_change_text(same, levels) == \
            f"{lead} (no problem of the 3 changed, so this test cannot show a change)"


def test_readings_take_their_verb_from_p_and_say_when_nothing_changed():
    assert moved(+2.0, 0.01) == "rose" and moved(-2.0, 0.01) == "fell"
    assert moved(+2.0, 0.3) == "showed no detectable change"
    assert moved(+2.0, 0.01, between=True) == "was higher" and moved(-2.0, 0.01, between=True) == "was lower"
    assert moved(+2.0, 0.3, between=True) == "showed no detectable difference"
    d = accuracy_change(_result([True, True, False, False, False, False]),
                        _result([True, False, True, True, False, False]))
    assert not unchanged(d)
    assert accuracy_reading(d) == "showed no detectable change (+16.7 points, McNemar p = 1)"
    same = accuracy_change(_result([True, False, False]), _result([True, False, False]))
    assert unchanged(same)      # nothing to test: the words say so, no collapsed interval
    assert accuracy_reading(same) == "did not change (no problem of the 3 changed sides)"
    assert accuracy_reading(same, between=True) == \
        "showed no difference (the two runs solved the same of the 3 problems)"
    g = {"change": -0.031, "p_value": 0.004}
    assert likelihood_reading(g) == "fell (-0.031 nats/token, p = 0.004)"
    assert likelihood_reading(g, between=True) == "was lower (-0.031 nats/token, p = 0.004)"


def test_order_by_pass_rate_easiest_first_ties_keep_step_order():
    assert order_by_pass_rate({"basic": 0.1, "intermediate": 0.3, "advanced": 0.0}) == \
        ("intermediate", "basic", "advanced")
    assert order_by_pass_rate({s: 0.0 for s in STRATA}) == STRATA
    with pytest.raises(CurriculumError, match="lacks strata"):
        order_by_pass_rate({"basic": 1.0})


def test_bad_stage_input(gsm8k_dir):
    data = load_gsm8k("train", data_dir=gsm8k_dir)
    with pytest.raises(CurriculumError, match="permutation"):
        curriculum_stages(data, order=("basic", "basic", "advanced"))
    with pytest.raises(CurriculumError, match="difficulty"):
        curriculum_stages(data.remove_columns("difficulty"))
    with pytest.raises(CurriculumError, match="fewer than"):
        take(curriculum_stages(data), 3)


# ---------------------------------------------------------------- Fisher
class Bernoulli(torch.nn.Module):
    """p(y = 1) = sigmoid(theta): d log p(y) / d theta = y - sigmoid(theta)."""

    def __init__(self, theta: float):
        super().__init__()
        self.theta = torch.nn.Parameter(torch.tensor(theta))


def bernoulli_ll(model, batch):
    y = batch["y"].float()
    return y * torch.nn.functional.logsigmoid(model.theta) + \
        (1 - y) * torch.nn.functional.logsigmoid(-model.theta)


def test_fisher_matches_hand_computed_value():
    # sigmoid(log 3) = 0.75: the score is +0.25 for y = 1 and -0.75 for y = 0.
    # Data y = 1, 1, 0 (two batches): F = (0.25^2 + 0.25^2 + 0.75^2) / 3 = 0.6875 / 3.
    model = Bernoulli(math.log(3.0))
    batches = [{"y": torch.tensor([1, 1])}, {"y": torch.tensor([0])}]
    fisher = fisher_diagonal(model, batches, log_likelihood=bernoulli_ll, progress=False)
    assert set(fisher) == {"theta"}
    assert fisher["theta"].item() == pytest.approx(0.6875 / 3, rel=1e-6)
    # it is a mean of squares per sequence, not the square of the batch gradient
    assert fisher["theta"].item() != pytest.approx(((0.25 + 0.25 - 0.75) / 3) ** 2)


def test_fisher_of_softmax_classifier_closed_form():
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 4, bias=False)
    x, y = torch.randn(5, 3), torch.tensor([0, 3, 1, 1, 2])

    def ll(model, batch):
        return torch.log_softmax(model(batch["x"]), -1).gather(1, batch["y"][:, None])[:, 0]

    fisher = fisher_diagonal(lin, [{"x": x, "y": y}], log_likelihood=ll, progress=False)
    with torch.no_grad():  # d log p(y|x) / dW = (onehot(y) - p) x^T
        p = torch.softmax(lin(x), -1)
        score = (torch.nn.functional.one_hot(y, 4) - p)[:, :, None] * x[:, None, :]
    torch.testing.assert_close(fisher["weight"], (score ** 2).mean(0))
    assert not lin.weight.grad  # the Fisher leaves no .grad behind


def tiny_llama():
    return helpers.tiny_llama(vocab_size=40)


def test_fisher_of_tiny_llama_matches_per_sequence_forward():
    model = tiny_llama()
    prompt_ids = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]])     # left pad = 0
    prompt_mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    completion_ids = torch.tensor([[12, 13, 14], [15, 16, 0], [17, 18, 19], [20, 0, 0]])
    completion_mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]])
    batch = dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask,      # G = 2 per prompt
                 completion_ids=completion_ids, completion_mask=completion_mask)
    params = ["model.layers.0.self_attn.q_proj.weight", "lm_head.weight"]
    fisher = fisher_diagonal(model, [batch], params=params, progress=False)

    named = dict(model.named_parameters())
    expected = {n: torch.zeros_like(named[n]) for n in params}
    for b in range(4):  # plain forward of prompt + completion, no cache, no padding
        p = prompt_ids[b // 2][prompt_mask[b // 2].bool()]
        c = completion_ids[b][completion_mask[b].bool()]
        ids = torch.cat([p, c])[None]
        logps = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1)
        ll = logps[len(p) - 1:].gather(1, c[:, None]).sum()
        grads = torch.autograd.grad(ll, [named[n] for n in params])
        for n, g in zip(params, grads, strict=False):
            expected[n] += g ** 2 / 4
    for n in params:
        torch.testing.assert_close(fisher[n], expected[n], rtol=1e-4, atol=1e-8)
    ll = completion_log_likelihood(model, batch)
    assert ll.shape == (4,) and bool((ll < 0).all())


def test_fisher_with_activation_checkpointing_is_the_same_fisher():
    """With activation checkpointing on (the binder profile) the Fisher runs in train mode, which
    recomputes activations in the backward pass (and drops nothing here): the same values, and
    the model's mode is restored. With dropout in the model it stays in eval mode."""
    from grpo_course.topics.curriculum import drops_anything

    batch = dict(prompt_ids=torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]]),
                 prompt_mask=torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]),
                 completion_ids=torch.tensor([[12, 13, 14], [15, 16, 0]]),
                 completion_mask=torch.tensor([[1, 1, 1], [1, 1, 0]]))
    params = ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight"]
    plain = fisher_diagonal(tiny_llama(), [batch], params=params, progress=False)
    model = tiny_llama()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.eval()
    modes = []
    model.model.layers[0].register_forward_hook(lambda m, i, o: modes.append(m.training))
    checkpointed = fisher_diagonal(model, [batch], params=params, progress=False)
    assert modes and all(modes) and not model.training       # train mode inside, eval again after
    for n in params:
        torch.testing.assert_close(checkpointed[n], plain[n], rtol=1e-4, atol=1e-8)
    assert not drops_anything(model)
    model.config.attention_dropout = 0.1
    modes.clear()
    fisher_diagonal(model, [batch], params=params, progress=False)
    assert drops_anything(model) and modes and not any(modes)


def test_fisher_bad_input():
    model = Bernoulli(0.0)
    with pytest.raises(CurriculumError, match="no sequences"):
        fisher_diagonal(model, [], log_likelihood=bernoulli_ll, progress=False)
    with pytest.raises(CurriculumError, match="no parameters named"):
        fisher_diagonal(model, [], params=["nope"], log_likelihood=bernoulli_ll)
    model.theta.requires_grad_(False)
    with pytest.raises(CurriculumError, match="no trainable"):
        fisher_diagonal(model, [], log_likelihood=bernoulli_ll)


def test_reference_batches_score_the_gsm8k_solution(gsm8k_dir):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = "<pad> <eos> Tom has 3 apples and buys 4 more".split()
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    rows = list(load_gsm8k("train", data_dir=gsm8k_dir))[:3]
    batches = reference_batches(tokenizer, rows, batch_size=3, max_completion_length=5)
    assert len(batches) == 1 and len(reference_batches(tokenizer, rows, batch_size=2)) == 2   # a bar's total
    batch = next(batches)
    assert batch["prompt_ids"].shape[0] == 3 and batch["completion_ids"].shape == (3, 5)
    assert batch["prompt_mask"][:, -1].all()          # prompts padded on the left
    assert batch["completion_mask"][:, 0].all()       # completions padded on the right


# ---------------------------------------------------------------- EWC
def _setup():
    torch.manual_seed(1)
    theta = {"a": torch.randn(3, 2, requires_grad=True), "b": torch.randn(4, requires_grad=True)}
    anchor = {n: t.detach() + 0.3 * torch.randn_like(t) for n, t in theta.items()}
    fisher = {n: torch.rand_like(t) for n, t in theta.items()}
    return theta, anchor, fisher


def test_penalty_zero_at_anchor_and_hand_value():
    theta, anchor, fisher = _setup()
    at_anchor = {n: a.clone().requires_grad_(True) for n, a in anchor.items()}
    assert ewc_penalty(at_anchor, anchor, fisher, lam=7.0).item() == 0.0
    one = ewc_penalty({"w": torch.tensor([3.0, 1.0])}, {"w": torch.tensor([1.0, 1.0])},
                      {"w": torch.tensor([0.5, 9.0])}, lam=2.0)
    assert one.item() == pytest.approx(2.0 / 2 * 0.5 * 4.0)


def test_penalty_gradient_is_lam_f_delta():
    theta, anchor, fisher = _setup()
    lam = 3.5
    value = ewc_penalty(theta, anchor, fisher, lam)
    grads = torch.autograd.grad(value, [theta["a"], theta["b"]])
    for n, g in zip(["a", "b"], grads, strict=False):
        torch.testing.assert_close(g, lam * fisher[n] * (theta[n].detach() - anchor[n]))


def test_penalty_bad_input():
    theta, anchor, fisher = _setup()
    with pytest.raises(CurriculumError, match="no parameter or anchor"):
        ewc_penalty({"a": theta["a"]}, anchor, fisher, 1.0)
    with pytest.raises(CurriculumError, match="shape mismatch"):
        ewc_penalty(theta, anchor, {"a": torch.ones(2), "b": fisher["b"]}, 1.0)
    with pytest.raises(CurriculumError, match="lam"):
        ewc_penalty(theta, anchor, fisher, -1.0)


def test_ewc_hook_save_load_roundtrip(tmp_path):
    lin = torch.nn.Linear(3, 2)
    batches = [{"x": torch.randn(4, 3), "y": torch.tensor([0, 1, 1, 0])}]

    def ll(model, batch):
        return torch.log_softmax(model(batch["x"]), -1).gather(1, batch["y"][:, None])[:, 0]

    ewc = EWC(fisher_diagonal(lin, batches, log_likelihood=ll, progress=False),
              {n: p for n, p in lin.named_parameters()}, lam=10.0)
    assert ewc.penalty(lin).item() == 0.0
    with torch.no_grad():
        lin.weight += 0.1
    value = ewc(lin)
    value.backward()
    torch.testing.assert_close(lin.weight.grad, 10.0 * ewc.fisher["weight"] * 0.1)
    path = ewc.save(tmp_path / "checkpoint-3")
    assert path.name == "ewc.safetensors"
    again = EWC.load(tmp_path / "checkpoint-3")
    assert again.lam == 10.0 and set(again.fisher) == {"weight", "bias"}
    torch.testing.assert_close(again(lin), value.detach())
    with pytest.raises(CurriculumError, match="does not exist"):
        EWC.load(tmp_path / "elsewhere")
    summary = again.summary()
    flat = torch.cat([f.flatten() for f in ewc.fisher.values()])
    assert summary["parameters"] == 8 and summary["lam"] == 10.0
    assert summary["max"] == pytest.approx(float(flat.max()))        # the saved Fisher, read back
    assert summary["median"] == pytest.approx(float(flat.median()))


def test_consolidate_accumulates_fisher_and_moves_anchor():
    model = Bernoulli(math.log(3.0))
    ewc = EWC({"theta": torch.tensor(0.2)}, {"theta": torch.tensor(0.0)}, lam=1.0)
    ewc.consolidate(model, [{"y": torch.tensor([1, 1, 0])}], gamma=0.5,
                    log_likelihood=bernoulli_ll, progress=False)
    assert ewc.fisher["theta"].item() == pytest.approx(0.1 + 0.6875 / 3, rel=1e-6)
    assert ewc.anchor["theta"].item() == pytest.approx(math.log(3.0))
    assert ewc.penalty(model).item() == 0.0


def test_drift_measures_the_distance_from_the_anchor_and_matches_the_penalty():
    model = Bernoulli(math.log(3.0))
    ewc = EWC({"theta": torch.tensor(0.5)}, {"theta": torch.tensor(0.0)}, lam=4.0)
    drift = ewc.drift(model)
    assert drift["|theta - theta*|"] == pytest.approx(math.log(3.0))
    assert drift["sum F (theta - theta*)^2"] == pytest.approx(0.5 * math.log(3.0) ** 2)
    assert ewc.penalty(model).item() == pytest.approx(4.0 / 2 * drift["sum F (theta - theta*)^2"])


def test_fisher_agreement_ranks_and_top_overlap():
    a = {"w": torch.tensor([1.0, 2.0, 3.0, 4.0]), "v": torch.tensor([10.0, 0.5])}
    same_order = {"w": a["w"] * 7, "v": a["v"] ** 2}           # monotone: the ranks do not change
    out = fisher_agreement(a, same_order, top=0.2)
    assert out == {"spearman": pytest.approx(1.0), "top_overlap": 1.0, "parameters": 6}
    reversed_ = {"w": -a["w"], "v": -a["v"]}
    assert fisher_agreement(a, reversed_)["spearman"] == pytest.approx(-1.0)
    # hand value: x = [1,2,3,4], y = [1,3,2,4] -> Spearman 1 - 6*2/(4*15) = 0.8
    got = fisher_agreement({"w": torch.tensor([1.0, 2, 3, 4])}, {"w": torch.tensor([1.0, 3, 2, 4])},
                             top=0.5)
    assert got["spearman"] == pytest.approx(0.8) and got["top_overlap"] == 0.5
    with pytest.raises(CurriculumError, match="different parameters"):
        fisher_agreement(a, {"w": a["w"]})


def test_the_gold_continuation_is_what_the_start_leaves():
    from grpo_course.core.data import gold_start
    from grpo_course.topics.curriculum import gold_continuation
    from tests.helpers import ROWS
    solution = ROWS[4]["answer"]
    row = {"solution": solution, "lines_left": 2}
    assert gold_continuation(row) == "In total 6 + 8 = 14.\nAnd 14 + 1 = 15 km.\n#### 15"
    whole = gold_start(solution, 2) + gold_continuation(row)
    assert whole == "First 2 * 3 = 6 km.\nThen 4 * 2 = 8 km.\nThen 1 km.\n" + gold_continuation(row)
    assert gold_continuation({"solution": solution, "lines_left": 5}).startswith("First 2 * 3 = 6 km.\n")


def test_gold_log_likelihood_is_per_problem_and_paired():
    import datasets

    from grpo_course.core.data import gold_starts
    from grpo_course.topics.curriculum import gold_log_likelihood, likelihood_change
    from tests.helpers import ADDITION_ROWS, tiny_model, tiny_tokenizer
    rows = gold_starts(datasets.Dataset.from_list(ADDITION_ROWS), 1)
    model, tok = tiny_model(), tiny_tokenizer()
    model.train()
    ll = gold_log_likelihood(model, tok, rows, batch_size=4, bf16=False)
    assert len(ll) == len(ADDITION_ROWS) and all(v < 0 for v in ll) and model.training
    # batched by length, returned in the rows' order: the same values at any batch size...
    assert gold_log_likelihood(model, tok, rows, batch_size=2, bf16=False) == pytest.approx(ll, abs=1e-5)
    one_by_one = [gold_log_likelihood(model, tok, rows.select([i]), batch_size=1, bf16=False)[0]
                  for i in range(len(rows))]
    assert one_by_one == pytest.approx(ll, abs=1e-5)
    # ... and in bf16 within its rounding of fp32's
    assert gold_log_likelihood(model, tok, rows, batch_size=4, bf16=True) == pytest.approx(ll, abs=0.05)
    same = likelihood_change(ll, ll)
    assert same["change"] == 0 and same["n"] == len(ll) and same["p_value"] == 1.0
    up = likelihood_change(ll, [v + 0.1 + 0.01 * k for k, v in enumerate(ll)])
    assert up["change"] == pytest.approx(0.125) and up["lo"] > 0 and up["p_value"] < 0.05
