"""Progressive curriculum over GSM8K's difficulty strata, the diagonal Fisher, and EWC.

1. :func:`curriculum_stages` splits a data set into three disjoint stages that cover it,
   one per difficulty stratum, ordered by step count (basic -> intermediate -> advanced)
   or, with :func:`order_by_pass_rate`, by a pass rate measured on the current model
   (:func:`measure_pass_rates`). :func:`reverse_stages` is R3's reverse curriculum: the same
   problems with the gold start sliding back (one line left, two, the whole problem).
   :func:`shuffled_stages` is the non-curriculum baseline: the same rows and stage sizes
   (equal compute), in random order. :func:`accuracy_change` tests a stage on its own task.
2. :func:`fisher_diagonal` estimates the diagonal Fisher information of the policy,
   ``F_i = mean_n (d/d theta_i log p(y_n | x_n))^2``, from completions ``y_n`` (sampled from
   the policy or GSM8K's reference solutions), over the trainable parameters.
3. :func:`ewc_penalty` is elastic weight consolidation (Kirkpatrick et al., 2017):
   ``lam / 2 * sum_i F_i (theta_i - theta*_i)^2``. :class:`EWC` holds ``F`` and ``theta*`` and
   is the ``penalty`` hook of :class:`grpo_course.core.train.CourseTrainer`; it persists as
   safetensors beside a checkpoint so a stage can resume.
"""
from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from grpo_course.core.answers import answers_match, extract_hash_answer
from grpo_course.core.data import STRATA, chat_prompt, gold_starts, sft_text, start_prompt, work_lines
from grpo_course.core.policy import per_token_logps, uses_activation_checkpointing
from grpo_course.core.runs import write_run
from grpo_course.core.sampling import sample_completions
from grpo_course.core.train import CourseTrainer
from grpo_course.infra import hardware
from grpo_course.infra.atomic import atomic_write
from grpo_course.infra.errors import CourseError
from grpo_course.infra.progress import tqdm
from grpo_course.measure.stats import mcnemar_test, p_text, paired_difference, reading

EWC_FILE = "ewc.safetensors"


class CurriculumError(CourseError, ValueError):
    """Bad input to the curriculum or EWC helpers (one readable message)."""


# ---------------------------------------------------------------- 1. stages
@dataclass
class Stage:
    """One curriculum stage: its name, the strata it draws from and its rows."""

    name: str
    strata: tuple[str, ...]
    dataset: Any  # datasets.Dataset

    def __len__(self) -> int:
        return len(self.dataset)


def curriculum_stages(dataset, order: Sequence[str] = STRATA) -> list[Stage]:
    """One stage per stratum of ``dataset`` (a :func:`~grpo_course.core.data.load_gsm8k` set),
    in ``order``. The stages are disjoint and together hold every row exactly once."""
    if "difficulty" not in dataset.column_names:
        raise CurriculumError("the data set has no 'difficulty' column; load it with "
                              "grpo_course.core.data.load_gsm8k")
    if sorted(order) != sorted(STRATA):
        raise CurriculumError(f"order must be a permutation of {STRATA}, got {tuple(order)}")
    labels = dataset["difficulty"]
    unknown = set(labels) - set(STRATA)
    if unknown:
        raise CurriculumError(f"unknown difficulty labels {sorted(unknown)}; expected {STRATA}")
    stages = []
    for k, stratum in enumerate(order, start=1):
        idx = [i for i, label in enumerate(labels) if label == stratum]
        stages.append(Stage(f"stage {k}: {stratum}", (stratum,), dataset.select(idx)))
    return stages


def take(stages: Sequence[Stage], n: int | Sequence[int], seed: int | None = None) -> list[Stage]:
    """The first ``n`` rows of each stage (a random ``n`` with ``seed``); ``n`` may be per stage."""
    sizes = [n] * len(stages) if isinstance(n, int) else list(n)
    if len(sizes) != len(stages) or any(s < 0 for s in sizes):
        raise CurriculumError(f"need one size >= 0 per stage, got {sizes} for {len(stages)} stages")
    out = []
    for stage, size in zip(stages, sizes, strict=False):
        if size > len(stage):
            raise CurriculumError(f"{stage.name} has {len(stage)} rows, fewer than {size}")
        idx = list(range(len(stage)))
        if seed is not None:
            random.Random(seed).shuffle(idx)
        out.append(Stage(stage.name, stage.strata, stage.dataset.select(sorted(idx[:size]))))
    return out


#: R3's reverse curriculum: the work lines left to the model at each stage (``None``: whole problem)
REVERSE_STARTS: tuple[int | None, ...] = (1, 2, None)


def start_name(lines_left: int | None) -> str:
    """How a start reads in tables: ``"1 line left"``, ``"2 lines left"``, ``"whole problem"``."""
    if lines_left is None:
        return "whole problem"
    return f"{lines_left} line{'s' if lines_left != 1 else ''} left"


def start_key(lines_left: int | None) -> str:
    """A start's key in the benches' records (``headroom.json``): ``"whole"`` or ``"<n>_left"``."""
    return "whole" if lines_left is None else f"{lines_left}_left"


def reverse_stages(dataset, n: int, starts: Sequence[int | None] = REVERSE_STARTS,
                   seed: int | None = 0) -> list[Stage]:
    """R3's reverse curriculum (Xi et al. 2024): ``n`` problems of ``dataset``, drawn at random
    with ``seed`` (``None``: the first ``n``, in order) among those with more work lines than the
    largest start (so no two stages give the same start), posed at each start in turn; each
    stage's rows carry their ``start`` and ``lines_left`` columns
    (:func:`~grpo_course.core.data.gold_starts`), which the trainer uses."""
    if not starts or any(k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1)
                         for k in starts):
        raise CurriculumError(f"starts must be whole numbers >= 1 or None, got {tuple(starts)}")
    deepest = max((k for k in starts if k is not None), default=0)
    eligible = [i for i, s in enumerate(dataset["solution"]) if len(work_lines(s)) > deepest]
    if n < 1 or n > len(eligible):
        raise CurriculumError(f"need 1 to {len(eligible)} problems with more than {deepest} work "
                              f"lines, got n = {n}")
    if seed is not None:
        random.Random(seed).shuffle(eligible)
    problems = dataset.select(sorted(eligible[:n]))
    out = []
    for k, left in enumerate(starts, start=1):
        rows = gold_starts(problems, left)
        out.append(Stage(f"stage {k}: {start_name(left)}", tuple(sorted(set(rows["difficulty"]))), rows))
    return out


def accuracy_change(before, after) -> dict[str, Any]:
    """A paired test of two greedy evaluations of the same problems (``before`` then
    ``after``, :class:`~grpo_course.measure.evaluate.EvalResult`): both accuracies, the change in
    points with its 95 % interval, the problems lost and gained, and McNemar's exact p."""
    a = {r["idx"]: bool(r["correct"]) for r in before.records}
    b = {r["idx"]: bool(r["correct"]) for r in after.records}
    if set(a) != set(b) or len(a) < 2:
        raise CurriculumError("the two evaluations do not hold the same problems (at least 2)")
    keys = sorted(a)
    test = mcnemar_test([a[i] for i in keys], [b[i] for i in keys])
    diff = paired_difference([a[i] for i in keys], [b[i] for i in keys])
    return {"n": len(keys), "before": 100 * diff["mean_a"], "after": 100 * diff["mean_b"],
            "change": 100 * diff["difference"], "lo": 100 * diff["lo"], "hi": 100 * diff["hi"],
            "lost": test["a_only"], "gained": test["b_only"], "p_value": test["p_value"]}


def unchanged(d: Mapping[str, Any]) -> bool:
    """Whether no problem changed sides in :func:`accuracy_change`'s result ``d``. There is then
    nothing to test: a t interval over all-zero differences collapses to [0, 0] and would look
    certain, so tables, plots and sentences say "no problem changed" instead of showing it."""
    return d["lost"] == d["gained"] == 0


def moved(change: float, p: float, between: bool = False) -> str:
    """The verb for a paired change, from its p (:func:`~grpo_course.measure.stats.reading`):
    "rose", "fell" or "showed no detectable change"; for a difference between two runs
    (``between``): "was higher", "was lower" or "showed no detectable difference"."""
    word = reading(change, p)
    if between:
        return {"rose": "was higher", "fell": "was lower"}.get(word, "showed no detectable difference")
    return word if word in ("rose", "fell") else f"showed {word}"


def accuracy_reading(d: Mapping[str, Any], between: bool = False) -> str:
    """What one paired accuracy test (:func:`accuracy_change`) says: the verb from McNemar's exact p
    with its numbers, or, where no problem changed, that there was nothing to test."""
    if unchanged(d):
        return (f"showed no difference (the two runs solved the same of the {d['n']} problems)" if between
                else f"did not change (no problem of the {d['n']} changed sides)")
    return f"{moved(d['change'], d['p_value'], between)} ({d['change']:+.1f} points, McNemar p = {p_text(d['p_value'])})"


def likelihood_reading(g: Mapping[str, Any], between: bool = False) -> str:
    """What one paired log-likelihood test (:func:`likelihood_change`) says, from its paired t p."""
    return f"{moved(g['change'], g['p_value'], between)} ({g['change']:+.3f} nats/token, p = {p_text(g['p_value'])})"


def accuracy_change_text(d: Mapping[str, Any], levels: bool = True) -> str:
    """:func:`accuracy_change`'s result in words, led by both accuracies (``levels``) or by the
    change alone; where no problem changed (:func:`unchanged`) the sentence says so instead of
    giving an interval."""
    lead = f"{d['before']:.1f} → {d['after']:.1f} %" if levels else f"{d['change']:+.1f} points"
    if unchanged(d):
        return f"{lead} (no problem of the {d['n']} changed, so this test cannot show a change)"
    change = f"{d['change']:+.1f} points, " if levels else ""
    return (f"{lead} ({change}95 % CI [{d['lo']:+.1f}, {d['hi']:+.1f}], {d['lost']} lost, "
            f"{d['gained']} gained, p = {p_text(d['p_value'])})")


def gold_continuation(row: Mapping[str, Any]) -> str:
    """What the model writes at a row's start (``lines_left`` work lines, see
    :func:`~grpo_course.core.data.gold_start`) in the gold solution's words: those lines, then the
    ``#### N`` line."""
    lines = work_lines(row["solution"])
    final = row["solution"].rsplit("####", 1)[-1].strip()
    return "".join(line + "\n" for line in lines[len(lines) - row["lines_left"]:]) + f"#### {final}"


@torch.no_grad()
def gold_log_likelihood(model, tokenizer, rows, batch_size: int = 8,
                        max_completion_length: int = 160, bf16: bool | None = None) -> list[float]:
    """The mean per-token log-likelihood (nats) of each row's gold continuation
    (:func:`gold_continuation`, ended by the end-of-turn token) after its start: a continuous,
    paired measure of what a stage taught or forgot, where greedy accuracy at a few hundred
    problems sees only large changes. Rows carry ``start`` and ``lines_left``
    (:func:`~grpo_course.core.data.gold_starts`). ``bf16``: matrix products in bf16 as the
    training pass runs them (default: where the CPU has native bf16); compare only measurements
    taken with the same setting."""
    rows, training = list(rows), model.training
    bf16 = hardware.native_bf16() if bf16 is None else bf16
    end = tokenizer.eos_token or ""
    prompts = [start_prompt(r, tokenizer) for r in rows]
    golds = [gold_continuation(r) + end for r in rows]
    # batches of similar length: padding to a batch's longest row is compute spent on nothing
    order = sorted(range(len(rows)), key=lambda i: len(prompts[i]) + len(golds[i]))
    out = [0.0] * len(rows)
    model.eval()                          # no dropout, no activation checkpointing: measure only
    side = tokenizer.padding_side
    try:
        for lo in range(0, len(rows), batch_size):
            chunk = order[lo:lo + batch_size]
            tokenizer.padding_side = "left"
            enc = tokenizer([prompts[i] for i in chunk], return_tensors="pt", padding=True,
                            add_special_tokens=False)
            tokenizer.padding_side = "right"
            comp = tokenizer([golds[i] for i in chunk], return_tensors="pt", padding=True,
                             add_special_tokens=False, truncation=True,
                             max_length=max_completion_length)
            batch = {"prompt_ids": enc["input_ids"], "prompt_mask": enc["attention_mask"],
                     "completion_ids": comp["input_ids"], "completion_mask": comp["attention_mask"]}
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                ll = completion_log_likelihood(model, batch).float()
            for i, v in zip(chunk, (ll / batch["completion_mask"].sum(-1).clamp(min=1)).tolist(),
                            strict=True):
                out[i] = v
    finally:
        tokenizer.padding_side = side
        model.train(training)
    return out


def likelihood_change(before: Sequence[float], after: Sequence[float]) -> dict[str, Any]:
    """A paired test of two :func:`gold_log_likelihood` measurements of the same problems:
    both means (nats per token), the change with its 95 % interval and p (paired t)."""
    d = paired_difference(before, after)
    return {"n": d["n"], "before": d["mean_a"], "after": d["mean_b"], "change": d["difference"],
            "lo": d["lo"], "hi": d["hi"], "p_value": d["p_value"]}


def shuffled_stages(stages: Sequence[Stage], seed: int = 0) -> list[Stage]:
    """The non-curriculum baseline: the rows of ``stages`` pooled, shuffled and cut into
    stages of the same sizes (same data, same compute, no difficulty order)."""
    from datasets import concatenate_datasets

    pooled = concatenate_datasets([s.dataset for s in stages])
    idx = list(range(len(pooled)))
    random.Random(seed).shuffle(idx)
    out, start = [], 0
    for k, stage in enumerate(stages, start=1):
        part = pooled.select(idx[start:start + len(stage)])
        out.append(Stage(f"stage {k}: shuffled", tuple(sorted(set(part["difficulty"]))), part))
        start += len(stage)
    return out


def order_by_pass_rate(pass_rates: Mapping[str, float]) -> tuple[str, ...]:
    """Strata from easiest (highest measured pass rate) to hardest; ties keep step order."""
    missing = set(STRATA) - set(pass_rates)
    if missing:
        raise CurriculumError(f"pass_rates lacks strata {sorted(missing)}")
    return tuple(sorted(STRATA, key=lambda s: (-pass_rates[s], STRATA.index(s))))


def measure_pass_rates(model, tokenizer, dataset, per_stratum: int = 16,
                       num_generations: int = 4, max_new_tokens: int = 128,
                       temperature: float = 1.0, seed: int = 0) -> dict[str, float]:
    """Fraction of ``num_generations`` sampled completions that answer correctly, on the
    first ``per_stratum`` problems of each stratum of ``dataset`` (the current model's
    pass rate, for :func:`order_by_pass_rate`)."""

    rates = {}
    stages = curriculum_stages(dataset)
    for stage in take(stages, [min(per_stratum, len(s)) for s in stages]):
        rows = list(stage.dataset)
        if not rows:
            rates[stage.strata[0]] = 0.0
            continue
        batch = sample_completions(model, tokenizer, [chat_prompt(r["question"], tokenizer)
                                                      for r in rows],
                                   num_generations=num_generations,
                                   max_new_tokens=max_new_tokens, temperature=temperature,
                                   seed=seed)
        golds = [r["answer"] for r in rows for _ in range(num_generations)]
        hits = [answers_match(extract_hash_answer(t), g) for t, g in zip(batch.completions, golds, strict=False)]
        rates[stage.strata[0]] = sum(hits) / len(hits)
    return rates


# ---------------------------------------------------------------- 2. Fisher
def trainable_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """``name -> parameter`` for every parameter that requires a gradient (LoRA or full)."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if not params:
        raise CurriculumError("the model has no trainable parameters (all requires_grad=False)")
    return params


def completion_log_likelihood(model, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``[N]`` log p(completion | prompt) under ``model``: the sum of the per-token
    log-probs over real completion tokens. ``batch`` holds ``prompt_ids``, ``prompt_mask``
    (one row per prompt or per completion), ``completion_ids`` and ``completion_mask``."""

    logps = per_token_logps(model, batch["prompt_ids"], batch["prompt_mask"],
                            batch["completion_ids"], batch["completion_mask"])
    return (logps * batch["completion_mask"].to(logps.dtype)).sum(-1)


def fisher_diagonal(model, batches: Iterable[Mapping[str, torch.Tensor]],
                    params: Mapping[str, torch.Tensor] | Sequence[str] | None = None,
                    log_likelihood: Callable | None = None,
                    progress: bool = True) -> dict[str, torch.Tensor]:
    """Diagonal Fisher ``F_i = (1/N) sum_n (d log p(y_n|x_n) / d theta_i)^2`` over the batches'
    completions: the *true* Fisher when they are sampled from the policy (:func:`sampled_batches`),
    the *empirical* Fisher when they are reference solutions (:func:`reference_batches`).

    Each sequence gets its own forward and backward pass (the Fisher needs per-sequence
    gradients: squaring a batch gradient would mix the sequences; and a backward pass of one
    row through a batched graph costs as much as the whole batch's, so the rows are split
    before the forward pass). ``params``: names or ``name -> parameter`` (default: all
    trainable ones). ``log_likelihood(model, batch) -> [N]`` defaults to
    :func:`completion_log_likelihood`.
    """

    named = dict(model.named_parameters())
    if params is None:
        chosen = trainable_parameters(model)
    elif isinstance(params, Mapping):
        chosen = dict(params)
    else:
        unknown = [n for n in params if n not in named]
        if unknown:
            raise CurriculumError(f"no parameters named {unknown[:3]} in the model")
        chosen = {n: named[n] for n in params}
    frozen = [n for n, p in chosen.items() if not p.requires_grad]
    if frozen:
        raise CurriculumError(f"parameters {frozen[:3]} do not require grad; the Fisher is "
                              "taken over trainable parameters")
    log_likelihood = log_likelihood or completion_log_likelihood
    names, tensors = list(chosen), list(chosen.values())
    fisher = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in chosen.items()}
    count, was_training = 0, model.training
    # no dropout: the Fisher of the deterministic policy. A model that recomputes its activations
    # in the backward pass (activation checkpointing: the binder profile) does so in train mode
    # only; where train mode drops nothing it is the same function, and each backward pass then
    # holds one layer's activations instead of every layer's
    model.train(uses_activation_checkpointing(model) and not drops_anything(model))
    try:
        for batch in tqdm(batches, desc="fisher", disable=not progress):
            for n in range(_batch_rows(batch)):
                ll = log_likelihood(model, _batch_row(batch, n))
                if ll.shape != (1,):
                    raise CurriculumError(f"log_likelihood must return [N], got {tuple(ll.shape)} "
                                          "for one sequence")
                grads = torch.autograd.grad(ll[0], tensors, allow_unused=True)
                for name, g in zip(names, grads, strict=False):
                    if g is not None:
                        fisher[name] += g.detach().float() ** 2
                count += 1
    finally:
        model.train(was_training)
    if count == 0:
        raise CurriculumError("fisher_diagonal got no sequences (empty batches)")
    return {n: f / count for n, f in fisher.items()}


def drops_anything(model: torch.nn.Module) -> bool:
    """Whether train mode would drop anything in ``model``: a dropout layer with p > 0 (e.g.
    LoRA's ``lora_dropout``) or attention dropout in its config."""
    config = getattr(model, "config", None)
    return (float(getattr(config, "attention_dropout", 0.0) or 0.0) > 0
            or any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()))


def _batch_rows(batch: Mapping[str, torch.Tensor]) -> int:
    """Sequences of a Fisher batch: the most rows of its tensors. A tensor with fewer rows
    holds one row per prompt, shared by ``G = sequences / rows`` consecutive completions."""
    sizes = {v.shape[0] for v in batch.values()}
    most = max(sizes, default=0)
    if any(most % size for size in sizes):
        raise CurriculumError(f"the batch's row counts {sorted(sizes)} do not divide each other")
    return most


def _batch_row(batch: Mapping[str, torch.Tensor], n: int) -> dict[str, torch.Tensor]:
    """Sequence ``n`` of a Fisher batch as a batch of one (per-prompt tensors: its prompt's row)."""
    most = _batch_rows(batch)
    return {k: v[n // (most // v.shape[0])][None] for k, v in batch.items()}


def fisher_agreement(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor],
                     top: float = 0.01) -> dict[str, float]:
    """How far two diagonal Fishers of the same parameters agree: Spearman's rank correlation
    of the flattened diagonals, and the overlap of their top ``top`` fraction of parameters
    (the ones EWC holds stiffly)."""
    if set(a) != set(b):
        raise CurriculumError(f"the two Fishers cover different parameters: "
                              f"{sorted(set(a) ^ set(b))[:3]}")
    x = torch.cat([a[n].flatten() for n in sorted(a)]).double()
    y = torch.cat([b[n].flatten() for n in sorted(a)]).double()
    if x.numel() < 2:
        raise CurriculumError("a rank correlation needs at least two parameters")

    def ranks(v: torch.Tensor) -> torch.Tensor:
        r = torch.empty_like(v)
        r[v.argsort()] = torch.arange(len(v), dtype=v.dtype)
        return r

    rx, ry = ranks(x), ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    spearman = float((rx * ry).sum() / (rx.norm() * ry.norm()).clamp_min(1e-300))
    k = max(1, int(len(x) * top))
    top_x, top_y = set(x.topk(k).indices.tolist()), set(y.topk(k).indices.tolist())
    return {"spearman": spearman, "top_overlap": len(top_x & top_y) / k, "parameters": len(x)}


class SizedBatches(Iterator):
    """Batches made one at a time (each a sampling or tokenizing call) that know how many there
    will be, so a progress bar over them (:func:`fisher_diagonal`'s) shows a total."""

    def __init__(self, batches: Iterator[dict[str, torch.Tensor]], n: int) -> None:
        self._batches, self._n = batches, n

    def __next__(self) -> dict[str, torch.Tensor]:
        return next(self._batches)

    def __len__(self) -> int:
        return self._n

    @classmethod
    def over(cls, rows: list, batch_size: int,
             make: Callable[[int, list], dict[str, torch.Tensor]]) -> SizedBatches:
        """``make(lo, rows[lo:lo + batch_size])`` for each block of ``rows``, made when asked for."""
        blocks = (make(lo, rows[lo:lo + batch_size]) for lo in range(0, len(rows), batch_size))
        return cls(blocks, -(-len(rows) // batch_size))


def sampled_batches(model, tokenizer, rows, batch_size: int = 8, max_new_tokens: int = 128,
                    temperature: float = 1.0, seed: int = 0, sampling_dtype=None) -> SizedBatches:
    """Completions sampled from the policy for ``rows`` (one per problem, continuing its ``start``
    where a row has one), as Fisher batches (the *true* Fisher: expectations under the model's
    own distribution). ``sampling_dtype`` as in
    :func:`grpo_course.core.sampling.sample_completions` (``"auto"``: the trainer's sampler, bf16
    weights where the CPU has bf16; ``None``: the model's own precision)."""

    def batch(lo: int, chunk: list) -> dict[str, torch.Tensor]:
        b = sample_completions(model, tokenizer, [start_prompt(r, tokenizer) for r in chunk],
                               num_generations=1, max_new_tokens=max_new_tokens,
                               temperature=temperature, seed=seed + lo,
                               sampling_dtype=sampling_dtype)
        return {"prompt_ids": b.prompt_ids, "prompt_mask": b.prompt_mask,
                "completion_ids": b.completion_ids, "completion_mask": b.completion_mask}
    return SizedBatches.over(list(rows), batch_size, batch)


def reference_batches(tokenizer, rows, batch_size: int = 8, max_completion_length: int = 128) -> SizedBatches:
    """GSM8K's reference solutions of ``rows`` as completions (the *empirical* Fisher: gradients at
    the data's answers rather than the model's)."""

    def batch(lo: int, chunk: list) -> dict[str, torch.Tensor]:
        pairs = [sft_text(r["question"], r["solution"], tokenizer) for r in chunk]
        tokenizer.padding_side = "left"
        enc = tokenizer([p for p, _ in pairs], return_tensors="pt", padding=True,
                        add_special_tokens=False)
        tokenizer.padding_side = "right"
        comp = tokenizer([t for _, t in pairs], return_tensors="pt", padding=True,
                         add_special_tokens=False, truncation=True,
                         max_length=max_completion_length)
        tokenizer.padding_side = "left"
        return {"prompt_ids": enc["input_ids"], "prompt_mask": enc["attention_mask"],
                "completion_ids": comp["input_ids"], "completion_mask": comp["attention_mask"]}
    return SizedBatches.over(list(rows), batch_size, batch)


# ---------------------------------------------------------------- 3. EWC
def ewc_penalty(params: Mapping[str, torch.Tensor], anchor_params: Mapping[str, torch.Tensor],
                fisher: Mapping[str, torch.Tensor], lam: float) -> torch.Tensor:
    """``lam / 2 * sum_i F_i (theta_i - theta*_i)^2`` over the names in ``fisher``.

    Its gradient is ``lam * F * (theta - theta*)``: a spring pulling each parameter back to
    its anchor, stiff where the Fisher says the old task is sensitive."""
    if lam < 0:
        raise CurriculumError(f"lam must be >= 0, got {lam}")
    missing = [n for n in fisher if n not in params or n not in anchor_params]
    if missing:
        raise CurriculumError(f"{len(missing)} Fisher entries have no parameter or anchor, "
                              f"e.g. {missing[:2]}; was the Fisher taken on another model?")
    total = None
    for name, f in fisher.items():
        theta, anchor = params[name], anchor_params[name]
        if theta.shape != f.shape or anchor.shape != f.shape:
            raise CurriculumError(f"shape mismatch for {name}: parameter {tuple(theta.shape)}, "
                                  f"anchor {tuple(anchor.shape)}, Fisher {tuple(f.shape)}")
        term = (f * (theta - anchor.detach()) ** 2).sum()
        total = term if total is None else total + term
    if total is None:
        raise CurriculumError("the Fisher is empty")
    return 0.5 * lam * total


class EWC:
    """Fisher ``F`` and anchor ``theta*`` of earlier stages; ``penalty(model)`` is the trainer's
    hook. :meth:`consolidate` adds a later stage (online EWC: ``F <- gamma F + F_new``,
    ``theta* <- theta``)."""

    def __init__(self, fisher: Mapping[str, torch.Tensor], anchor: Mapping[str, torch.Tensor],
                 lam: float):
        if set(fisher) != set(anchor):
            raise CurriculumError("fisher and anchor must name the same parameters")
        if lam < 0:
            raise CurriculumError(f"lam must be >= 0, got {lam}")
        self.fisher = {n: f.detach().float().clone() for n, f in fisher.items()}
        self.anchor = {n: a.detach().clone() for n, a in anchor.items()}
        self.lam = float(lam)

    @classmethod
    def from_model(cls, model, batches, lam: float, params=None, log_likelihood=None,
                   progress: bool = True) -> EWC:
        """Fisher of ``model`` on ``batches``; the anchor is the model's current weights."""
        fisher = fisher_diagonal(model, batches, params=params, log_likelihood=log_likelihood,
                                 progress=progress)
        named = dict(model.named_parameters())
        return cls(fisher, {n: named[n] for n in fisher}, lam)

    def penalty(self, model) -> torch.Tensor:
        return ewc_penalty(dict(model.named_parameters()), self.anchor, self.fisher, self.lam)

    __call__ = penalty

    def consolidate(self, model, batches, gamma: float = 1.0, log_likelihood=None,
                    progress: bool = True) -> EWC:
        """Add the Fisher of ``model`` on ``batches`` and move the anchor to ``model``."""
        new = fisher_diagonal(model, batches, params=list(self.fisher),
                              log_likelihood=log_likelihood, progress=progress)
        named = dict(model.named_parameters())
        self.fisher = {n: gamma * self.fisher[n] + new[n] for n in self.fisher}
        self.anchor = {n: named[n].detach().clone() for n in self.fisher}
        return self

    def save(self, path: str | Path) -> Path:
        """Write ``ewc.safetensors`` (Fisher and anchor, ``lam`` in the metadata) into the
        folder ``path`` (e.g. a checkpoint folder), or to ``path`` if it ends in .safetensors;
        atomically (:func:`~grpo_course.infra.atomic.atomic_write`)."""

        path = Path(path)
        target = path if path.suffix == ".safetensors" else path / EWC_FILE
        tensors = {f"fisher/{n}": t.contiguous() for n, t in self.fisher.items()}
        tensors.update({f"anchor/{n}": t.contiguous() for n, t in self.anchor.items()})
        metadata = {"lam": json.dumps(self.lam)}
        return atomic_write(target, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))

    @classmethod
    def load(cls, path: str | Path) -> EWC:
        """Read what :meth:`save` wrote (a folder holding ``ewc.safetensors`` or the file)."""

        path = Path(path)
        target = path if path.suffix == ".safetensors" else path / EWC_FILE
        if not target.is_file():
            raise CurriculumError(f"{target} does not exist: no EWC state was saved there")
        fisher, anchor = {}, {}
        with safe_open(str(target), framework="pt") as fh:
            lam = json.loads((fh.metadata() or {}).get("lam", "0"))
            for key in fh.keys():
                kind, name = key.split("/", 1)
                (fisher if kind == "fisher" else anchor)[name] = fh.get_tensor(key)
        return cls(fisher, anchor, lam)

    def drift(self, model) -> dict[str, float]:
        """How far ``model``'s weights moved from the anchor: the plain distance
        ``|theta - theta*|`` and the Fisher-weighted ``sum F (theta - theta*)^2`` (the penalty is
        ``lam / 2`` times the latter)."""
        named = dict(model.named_parameters())
        delta = {n: named[n].detach().float() - self.anchor[n].float() for n in self.fisher}
        return {"|theta - theta*|": float(sum((d ** 2).sum() for d in delta.values()) ** 0.5),
                "sum F (theta - theta*)^2": float(sum((self.fisher[n] * d ** 2).sum()
                                                      for n, d in delta.items()))}

    def summary(self) -> dict[str, float]:
        """Size and spread of the Fisher (for tables)."""
        flat = torch.cat([f.flatten() for f in self.fisher.values()])
        return {"parameters": flat.numel(), "lam": self.lam, "mean": float(flat.mean()),
                "median": float(flat.median()), "max": float(flat.max())}


# ---------------------------------------------------------------- 4. staged runs and forgetting
def train_stages(model, tokenizer, config, stages: Sequence[Stage], steps_per_stage: int, *,
                 penalty=None, consolidate: Callable | None = None,
                 after_stage: Callable | None = None, resume: str | Path | None = None,
                 out_dir: str | Path | None = None, profile: str | None = None):
    """Train ``stages`` in order with :class:`~grpo_course.core.train.CourseTrainer`, one trainer
    (fresh optimizer) per stage on the same model; ``steps_per_stage`` GRPO steps each.

    ``penalty`` is the trainer's hook (e.g. an :class:`EWC`); with ``consolidate(stage, model)
    -> batches`` the EWC adds each finished stage's Fisher before the next one.
    ``after_stage(k, stage, model) -> dict`` (e.g. an evaluation) is collected per stage.
    ``resume`` starts the first stage from the weights of a :meth:`CourseTrainer.save_checkpoint`
    folder (``model`` must then be the fresh base); the stage itself starts as every stage does
    (fresh optimizer, its rows from the first, step 0), so a run resumed at a stage boundary ends
    where the uninterrupted one would. With ``out_dir`` the run is saved in the layout of
    every run (:func:`grpo_course.core.runs.write_run`: its config and every stage's GRPO steps, each
    row tagged with its stage and numbered across stages, after the checkpoint's steps where it
    resumes, so that it plots at the steps of the uninterrupted run). Each stage's trainer counts
    its own steps, so that numbering holds for a checkpoint of the first stage (chapter 5's); a
    later stage's checkpoint holds that stage's count alone. Returns ``(last_trainer, records)``.
    """

    records, trainer, rows, first_step = [], None, [], 0
    for k, stage in enumerate(stages):
        if k == 0 and resume is not None:     # the finished stage's weights, not its trainer
            resumed = CourseTrainer.resume(resume, model, tokenizer, stage.dataset)
            model, first_step = resumed.model, resumed.global_step
        trainer = CourseTrainer(model if trainer is None else trainer.model, tokenizer,
                                config, stage.dataset, penalty=penalty)
        steps = trainer.train(max_steps=trainer.global_step + steps_per_stage)   # this stage's rows
        grpo_rows = [r for r in steps if r.get("phase", "grpo") == "grpo"]
        rows += [{**r, "stage": stage.name, "step": first_step + len(rows) + i} for i, r in enumerate(grpo_rows)]
        record = {"stage": stage.name, "steps": steps}
        if after_stage is not None:
            record.update(after_stage(k, stage, trainer.model))
        records.append(record)
        if consolidate is not None and penalty is not None and k < len(stages) - 1:
            penalty.consolidate(trainer.model, consolidate(stage, trainer.model), progress=False)
    if out_dir is not None:
        write_run(out_dir, config, rows, profile, trainer="curriculum")
    return trainer, records
