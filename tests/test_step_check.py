"""Chapter 3's written-out GRPO step (its ``grpo_step``, read from the notebook) against
``CourseTrainer.step`` with the chapter's tolerances (:mod:`grpo_course.book.step_check`): a group with
a truncated completion, the KL penalty with two updates per batch, a tied group left out of the
trainer's pass with several groups in several micro-batches.

Each case runs twice: on the tiny model with the full profile's loss settings (fast, in
``make test``), and on the bundled model at the full profile's sizes (marked ``fullsize``: ``make
check-steps``, which CI runs after ``make test``), where the frozen base is also held in bf16
where the CPU has native bf16 (as the full profile holds it)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from grpo_course.book.step_check import assert_same_step, compare_steps, relative_gap, simple_config
from grpo_course.config import get_profile
from grpo_course.core import rewards as rewards_module
from grpo_course.core.sampling import sample_completions
from grpo_course.infra.hardware import native_bf16
from tests.helpers import ADDITION_ROWS, length_reward, tiny_trainer

#: the real-model cases: the bundled model at the full profile's sizes
fullsize = [pytest.mark.slow, pytest.mark.fullsize]
NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "03_grpo_from_scratch.ipynb"


#: the student's four exercises, unwritten: the loop's cell then runs the course's parts
EXERCISE_STUBS = ("my_group_advantages", "my_token_logps", "my_clipped_surrogate", "my_aggregate_loss")


def _not_written(*args, **kwargs):
    raise NotImplementedError


def notebook_function(name: str):
    """The function ``name`` as chapter 3's code cell defines it (exec'd on its own, with the
    chapter's exercise stubs unwritten, so the step runs the course's four parts)."""
    for cell in json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and f"def {name}(" in source:
            namespace = {"torch": torch, "sample_completions": sample_completions,
                         **dict.fromkeys(EXERCISE_STUBS, _not_written)}
            exec(compile(source, f"{NOTEBOOK.name}:{name}", "exec"), namespace)
            return namespace[name]
    raise AssertionError(f"no code cell of {NOTEBOOK.name} defines {name}()")


def tie_for_marked(completions, answer=None, **kwargs):
    """A reward that ties every completion of a prompt whose gold answer is 7 (any other prompt:
    the completion's length mod 5, which differs within a group)."""
    return [0.0 if a == "7" else float(len(c) % 5) for c, a in zip(completions, answer, strict=False)]


def lora_b_drawn(trainer):
    """``trainer`` with its LoRA B drawn small and nonzero (the same draw each time), so that
    every adapter weight gets a gradient."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.02)
    return trainer


def lora_trainer(train_dtype: str, rows):
    """A CourseTrainer on the bundled model with the full profile's config and ``train_dtype``,
    its LoRA B drawn small and nonzero (the same draw each time) so every adapter weight gets
    a gradient. Where the training pass and the warm-up both run in bf16 (the full profile's
    "auto" where the CPU has native bf16) the frozen base is held in bf16, as chapter 3's run
    holds it."""
    from grpo_course.core.loading import load_model
    from grpo_course.core.train import CourseTrainer

    model, tokenizer = load_model()
    config = dataclasses.replace(get_profile("full").grpo, train_dtype=train_dtype)
    return lora_b_drawn(CourseTrainer(model, tokenizer, config, rows))


@pytest.fixture(scope="module")
def full_trainer(course_rows):
    """The full profile's trainer: frozen base in bf16 where native."""
    return lora_trainer(get_profile("full").grpo.train_dtype, course_rows)


def columns(rows: list[dict]) -> dict[str, list]:
    return {k: [r[k] for r in rows] for k in rows[0]}


#: the full profile's loss settings, which the tiny trainer takes over
LOSS_FIELDS = ("loss_type", "scale_rewards", "epsilon_low", "epsilon_high", "max_grad_norm",
               "mask_truncated_completions", "temperature", "top_p", "lora_target_modules")


@dataclasses.dataclass
class Case:
    """A trainer with an fp32 training pass and the rows each check runs on: ``long`` (prompts
    whose completions are cut off at max_completion_length, some of them) and ``tied`` (three
    prompts, the first with the gold answer 7, so :func:`tie_for_marked` ties its group)."""
    trainer: object
    long: dict[str, list]
    tied: dict[str, list]
    results: dict = dataclasses.field(default_factory=dict)


@pytest.fixture(scope="module", params=["tiny", pytest.param("fullsize", marks=fullsize)])
def fp32_case(request, course_rows):
    """The tiny model with the full profile's loss settings (G = 4, 12-token completions, one
    group per micro-batch), or the bundled model at the full profile's sizes."""
    if request.param == "tiny":
        full = get_profile("full").grpo
        trainer = lora_b_drawn(tiny_trainer(
            num_generations=4, per_step_completions=12, max_completion_length=12,
            train_micro_batch=4, sampling_dtype="float32", train_dtype="float32",
            **{k: getattr(full, k) for k in LOSS_FIELDS}))
        rows = columns(ADDITION_ROWS)
        tied = columns([ADDITION_ROWS[1], ADDITION_ROWS[0], ADDITION_ROWS[2]])
        return Case(trainer, {k: v[:3] for k, v in rows.items()}, tied)
    return Case(lora_trainer("float32", course_rows), columns(course_rows[4:5]),
                columns(course_rows[:3]))


@pytest.fixture(autouse=True)
def length_reward_by_name(monkeypatch):
    """The tiny trainer's reward, found by name as the written-out step scores."""
    monkeypatch.setitem(rewards_module.REWARD_FUNCTIONS, "length", length_reward)


@pytest.fixture(scope="module")
def grpo_step():
    return notebook_function("grpo_step")


def sampled(monkeypatch) -> list:
    """Every batch the sampler returns from now on (to check which case a test ran)."""
    batches = []
    import grpo_course.core.train as train_module

    def recording(*args, **kwargs):
        batch = sample_completions(*args, **kwargs)
        batches.append(batch)
        return batch
    monkeypatch.setattr(train_module, "sample_completions", recording)
    return batches


@pytest.mark.heavy
def test_truncated_completion(fp32_case, grpo_step, monkeypatch):
    """Groups in which a completion hits max_completion_length: the full profile masks it out
    of the loss (mask_truncated_completions), and both steps must agree on that."""
    config = simple_config(fp32_case.trainer.config)
    assert config.mask_truncated_completions
    batches = sampled(monkeypatch)
    result = compare_steps(fp32_case.trainer, grpo_step, fp32_case.long, config)
    assert batches and bool(batches[0].truncated.any()), "no completion was truncated"
    assert not bool(batches[0].truncated.all()), "every completion was truncated"
    assert result["moved"] > 0
    assert_same_step(result)


@pytest.mark.heavy
def test_kl_penalty_and_two_updates_per_batch(fp32_case, grpo_step):
    """beta > 0 (the reference: the adapter switched off) and mu = 2 (the second update's ratio
    has left 1, so the clip can bind): the same update by hand and by the trainer."""
    config = dataclasses.replace(simple_config(fp32_case.trainer.config), beta=0.04,
                                 num_iterations=2)
    result = compare_steps(fp32_case.trainer, grpo_step, fp32_case.long, config)
    assert result["hand"]["kl"] > 0 and result["trainer"]["kl"] > 0
    assert result["hand"]["kl"] == pytest.approx(result["trainer"]["kl"], rel=1e-3)
    assert result["hand"]["clip_ratio"] == pytest.approx(result["trainer"]["clip_ratio/region_mean"],
                                                         abs=1e-6)
    assert_same_step(result)


def tied_and_informative(trainer, monkeypatch):
    """Three prompts for ``trainer``: one group whose rewards all tie (the trainer leaves it out
    of its training pass and rescales the loss), then two informative ones."""
    monkeypatch.setitem(rewards_module.REWARD_FUNCTIONS, "tie_for_marked", tie_for_marked)
    monkeypatch.setitem(trainer.__dict__, "reward_funcs",
                        {**trainer.reward_funcs, "tie_for_marked": tie_for_marked})
    return dataclasses.replace(simple_config(trainer.config),
                               reward_weights={"tie_for_marked": 1.0})


def check_tied_and_informative(result, config):
    G = config.num_generations
    rewards = torch.tensor(result["hand"]["rewards"]).view(-1, G)
    assert float(rewards[0].max() - rewards[0].min()) == 0.0, "the first group did not tie"
    assert bool((rewards[1:].max(1).values > rewards[1:].min(1).values).all())
    assert result["trainer"]["informative_groups"] == 2


def tied_step(case: Case, grpo_step, monkeypatch) -> dict:
    """:func:`compare_steps` on ``case``'s tied rows (computed once per case: the trainer's own
    state never changes, so the bf16 check below reuses it)."""
    config = tied_and_informative(case.trainer, monkeypatch)
    if "tied" not in case.results:
        case.results["tied"] = compare_steps(case.trainer, grpo_step, case.tied, config)
    return case.results["tied"]


@pytest.mark.heavy
def test_tied_group_left_out_and_micro_batches(fp32_case, grpo_step, monkeypatch):
    """A tied group and two informative ones, trained one group per forward/backward pass (the
    full profile's train_micro_batch = G), against one pass over the whole batch by hand."""
    config = tied_and_informative(fp32_case.trainer, monkeypatch)
    assert config.train_micro_batch == config.num_generations
    result = tied_step(fp32_case, grpo_step, monkeypatch)
    check_tied_and_informative(result, config)
    assert_same_step(result)


@pytest.mark.slow
@pytest.mark.fullsize
@pytest.mark.skipif(not native_bf16(), reason="the frozen base is held in bf16 only where native")
@pytest.mark.parametrize("fp32_case", ["fullsize"], indirect=True)
def test_micro_batches_over_a_bf16_base_differ_by_bf16_rounding(
        full_trainer, fp32_case, grpo_step, monkeypatch):
    """With the frozen base held in bf16, the trainer's passes (one group each, the tied group
    left out) and the one pass by hand multiply matrices of other shapes, and their bf16
    roundings differ. What bf16 does to the written-out step is measured here (its gradient over
    the bf16 base against the same step over the fp32 base): ``rounding``, the largest entry's
    gap, and ``turn``, one minus the two gradients' cosine. The trainer's bf16 gradient may lie
    that far from its own fp32 gradient, twice the gap (four times the turn) from the bf16
    gradient by hand: two independent roundings, each about ``rounding`` from the fp32 step, lie
    within twice that of each other, and a CPU's bf16 kernels (AMX or AVX-512) change which of
    the two lies closer. A mistake in the trainer's bf16 path (a group scaled wrongly, a cast
    lost) moves the gradient by far more. The updates themselves are not compared: AdamW's first
    update is about the sign of each gradient entry times the learning rate, so the many small
    entries whose sign bf16 rounding flips weigh as much as the large ones."""
    config = tied_and_informative(full_trainer, monkeypatch)
    bf16 = compare_steps(full_trainer, grpo_step, fp32_case.tied, config)
    check_tied_and_informative(bf16, config)
    fp32 = tied_step(fp32_case, grpo_step, monkeypatch)
    assert fp32["hand"]["rewards"] == bf16["hand"]["rewards"], "the two runs sampled differently"
    (hand_bf16, trainer_bf16), (hand_fp32, trainer_fp32) = bf16["gradients"], fp32["gradients"]

    def turn(a, b):
        return 1.0 - float(a @ b / (a.norm() * b.norm()))
    rounding, bf16_turn = relative_gap(hand_bf16, hand_fp32), turn(hand_bf16, hand_fp32)
    assert 0 < rounding < 0.1, "bf16 rounding should move the step a little, not much"
    assert relative_gap(trainer_bf16, trainer_fp32) <= 2 * rounding
    assert relative_gap(trainer_bf16, hand_bf16) <= 2 * rounding
    assert turn(trainer_bf16, hand_bf16) <= 4 * bf16_turn
