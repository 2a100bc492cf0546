"""Held-out GSM8K evaluation: greedy answers (accuracy, format rate, 95 % intervals) and sampled
answers (``--samples K``: pass@1 and pass@K with intervals, paired against ``--compare``).

CLI::

    python -m grpo_course.measure.evaluate --model smollm2-135m-instruct --split test --n 200 --json

A run folder of :mod:`grpo_course.core.train` as ``--model`` (or ``--compare``) also prints the config
it was trained with (under ``run_configs`` with ``--json``).
"""
from __future__ import annotations

import contextlib
import csv
import json
import sys
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from grpo_course.config import SAMPLING_DTYPES, START_BUDGETS, ConfigError, get_profile
from grpo_course.core.answers import (
    answers_match,  # the course's one correctness rule (also the rewards')
    extract_hash_answer,
)
from grpo_course.core.data import (
    STRATA,
    SYSTEM_PROMPT,
    chat_prompt,
    check_lines_left,
    gold_starts,
    load_gsm8k,
    start_prompt,
)
from grpo_course.core.loading import load_model, quiet_loading
from grpo_course.core.policy import adapter_state, set_adapter_state
from grpo_course.core.pool import correct_counts, sampled_blocks, sampled_records
from grpo_course.core.rewards import REWARD_FUNCTIONS, computed_results, score_completions, score_groups
from grpo_course.core.runs import RUN_CONFIG_FILE, load_run_config
from grpo_course.core.sampling import sample_completions, sampler_dtype
from grpo_course.infra.atomic import atomic_write, write_json_atomic
from grpo_course.infra.errors import OneLineArgumentParser, report
from grpo_course.infra.fingerprint import code_fingerprint, weights_fingerprint
from grpo_course.infra.paths import keyed_cache_file, read_cached, shown_path
from grpo_course.infra.progress import tqdm
from grpo_course.measure.stats import (
    mcnemar_test,
    mean_interval,
    mixed_group_chance,
    paired_difference,
    pass_at_k_estimate,
    wilson_interval,
)


def work_consistent(completion: str) -> bool | None:
    """Does the final ``####`` answer equal the result of the last ``... = c`` in the work?

    ``None`` when there is no final answer or the work shows no computation.
    """
    answer = extract_hash_answer(completion)
    if answer is None:
        return None
    results = computed_results(completion)
    if not results:
        return None
    return answers_match(results[-1], answer)


@dataclass
class EvalResult:
    """Summary and per-problem records of one evaluation."""

    n: int
    correct: int
    formatted: int
    records: list[dict[str, Any]] = field(repr=False, default_factory=list)
    seconds: float = 0.0
    model: str = ""
    cached: bool = False        # records reused from an identical earlier run (see evaluate_model)

    @classmethod
    def from_records(cls, records: list[dict[str, Any]], seconds: float = 0.0, model: str = "",
                     cached: bool = False) -> EvalResult:
        """Counts from per-problem records (each with ``correct`` and ``formatted``)."""
        return cls(n=len(records), correct=sum(r["correct"] for r in records),
                   formatted=sum(r["formatted"] for r in records), records=records,
                   seconds=seconds, model=model, cached=cached)

    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.n else 0.0

    @property
    def format_rate(self) -> float:
        return self.formatted / self.n if self.n else 0.0

    @property
    def accuracy_ci95(self) -> tuple[float, float]:
        return wilson_interval(self.correct, self.n)

    @property
    def format_ci95(self) -> tuple[float, float]:
        return wilson_interval(self.formatted, self.n)

    def by_stratum(self) -> dict[str, dict[str, Any]]:
        """Accuracy and format rate per difficulty stratum, with n and intervals."""
        out: dict[str, dict[str, Any]] = {}
        for stratum in STRATA:
            rows = [r for r in self.records if r.get("difficulty") == stratum]
            k = sum(r["correct"] for r in rows)
            f = sum(r["formatted"] for r in rows)
            out[stratum] = {"n": len(rows), "accuracy": k / len(rows) if rows else 0.0,
                            "accuracy_ci95": wilson_interval(k, len(rows)),
                            "format_rate": f / len(rows) if rows else 0.0}
        return out

    def stratum_table(self):
        """:meth:`by_stratum` as the pages show it: one row per stratum, n as a count, rates in
        percent, the accuracy's 95 % Wilson interval as "lo–hi"."""
        import pandas as pd
        return pd.DataFrame({stratum: {"n": r["n"], "accuracy %": round(100 * r["accuracy"], 1),
                                       "95 % CI": "–".join(f"{100 * b:.1f}" for b in r["accuracy_ci95"]),
                                       "format %": round(100 * r["format_rate"], 1)}
                             for stratum, r in self.by_stratum().items()}).T

    def summary(self) -> dict[str, Any]:
        lengths = [r["completion_tokens"] for r in self.records]
        judged = [r["consistent"] for r in self.records if r.get("consistent") is not None]
        return {"model": shown_path(self.model), "n": self.n, "accuracy": self.accuracy,
                "answer_work_consistency": sum(judged) / len(judged) if judged else None,
                "n_consistency_judged": len(judged),
                "accuracy_ci95": list(self.accuracy_ci95), "format_rate": self.format_rate,
                "format_ci95": list(self.format_ci95),
                "mean_completion_tokens": sum(lengths) / len(lengths) if lengths else 0.0,
                "tool_results_per_answer": sum(r.get("tool_results", 0) for r in self.records)
                / len(self.records) if self.records else 0.0,
                "cached": self.cached,
                "by_stratum": self.by_stratum(), "seconds": round(self.seconds, 2)}


#: Problems decoded (and cached) together: an evaluation runs over consecutive blocks of this many
#: rows, each sorted by prompt length and batched on its own. Records therefore do not depend on
#: how many rows follow, and an evaluation of the first 128 problems reuses the cached blocks of one
#: of the first 512 (chapter 4 reuses chapter 3's warm-start evaluation this way).
EVAL_BLOCK = 64


def _usable(stored: dict[str, Any]) -> bool:
    return isinstance(stored["records"], list) and isinstance(stored["seconds"], (int, float))


def evaluate_model(model, tokenizer, dataset, batch_size: int = 32, max_new_tokens: int = 256,
                   system_prompt: str = SYSTEM_PROMPT, progress: bool = True,
                   name: str = "", sampling_dtype: str | None = "auto",
                   cache: bool = False, fast: bool | None = None,
                   calculator: bool = False) -> EvalResult:
    """Greedy-decode every problem of ``dataset`` (from :func:`load_gsm8k`) and score it.

    Rows are decoded in blocks of :data:`EVAL_BLOCK`, batched by prompt length within a block
    (less padding); records keep dataset order. ``sampling_dtype`` is the decoder's weight
    precision (``"auto"``: bf16 on CPUs with native bf16, see
    :func:`~grpo_course.core.sampling.resolve_sampling_dtype`; ``None`` or ``"float32"``: the model's
    own). ``fast`` picks the decoder as in :func:`~grpo_course.core.sampling.sample_completions`
    (``None``: the compact one where the model supports it; ``False``: the model's own
    transformers forward pass, the path a quantized model takes). Greedy decoding is
    deterministic, so with ``cache=True`` each block's records are stored under
    ``cache_dir()/evals`` and reused when the weights (their fingerprint), the block's prompts and
    the decoding settings are all identical; ``cached`` is true when every block was.
    ``calculator``: GSM8K's calculator writes each annotation's result
    (:mod:`grpo_course.core.calculator`); without it the model writes its own.
    """

    if batch_size <= 0 or max_new_tokens <= 0:
        raise ValueError("batch_size and max_new_tokens must be positive")
    rows = list(dataset)
    prompts = [start_prompt(r, tokenizer, system_prompt) for r in rows]
    dtype = sampler_dtype(model, sampling_dtype, fast)
    fingerprint = weights_fingerprint(model) if cache else None
    code = code_fingerprint("grpo_course.measure.evaluate") if cache else None   # this module and all it imports
    records: list[dict[str, Any]] = []
    seconds, all_cached = 0.0, True
    bar = None          # a bar once a block must be decoded: records read from the cache print one line
    for lo in range(0, len(rows), EVAL_BLOCK):
        block, block_prompts = rows[lo:lo + EVAL_BLOCK], prompts[lo:lo + EVAL_BLOCK]
        path = None
        if cache:
            key = {"weights": fingerprint, "prompts": block_prompts,
                   "gold": [r["answer"] for r in block], "batch_size": batch_size,
                   "max_new_tokens": max_new_tokens, "dtype": str(dtype),
                   "code": code, **({} if fast is None else {"fast": fast}),
                   **({"calculator": True} if calculator else {})}
            path = keyed_cache_file("evals", key, digits=32)
            stored = read_cached(path, _usable)
            if stored is not None:
                records += stored["records"]
                seconds += stored["seconds"]
                continue
        if bar is None:
            bar = tqdm(total=len(rows), initial=len(records), desc="evaluate", disable=not progress)
        start = time.perf_counter()
        done = _decode_block(model, tokenizer, block, block_prompts, lo, batch_size,
                             max_new_tokens, dtype, bar, fast, calculator)
        spent = time.perf_counter() - start
        if path is not None:
            write_json_atomic(path, {"key": {k: v for k, v in key.items() if k != "prompts"},
                                     "seconds": spent, "records": done})
        records += done
        seconds += spent
        all_cached = False
    if bar is not None:
        bar.close()
    elif progress and rows:
        print(f"evaluate: {len(rows)} problems read from the cache ({shown_path(name) if name else 'this model'}, decoded "
              f"before in {seconds:.0f} s)")
    return EvalResult.from_records(records, seconds, name, cached=cache and all_cached and bool(rows))


def _decode_block(model, tokenizer, rows, prompts, first: int, batch_size: int,
                  max_new_tokens: int, dtype, bar, fast: bool | None = None,
                  calculator: bool = False) -> list[dict[str, Any]]:
    """Greedy answers and scores of one block of rows (``first``: the block's first row in the
    data set, the ``idx`` of rows without one), in the rows' order; ``tool_results``: the
    results the calculator wrote into each answer."""

    order = sorted(range(len(rows)), key=lambda i: len(prompts[i]))
    records: list[dict[str, Any] | None] = [None] * len(rows)
    for lo in range(0, len(order), batch_size):
        chunk = order[lo:lo + batch_size]
        batch = sample_completions(model, tokenizer, [prompts[i] for i in chunk],
                                   num_generations=1, max_new_tokens=max_new_tokens,
                                   temperature=0.0, sampling_dtype=dtype, fast=fast,
                                   calculator=calculator)
        lengths = batch.completion_lengths.tolist()
        tool_results = forced_results(batch).tolist()
        for j, i in enumerate(chunk):
            row, text = rows[i], batch.completions[j]
            predicted = extract_hash_answer(text)
            records[i] = {"idx": row.get("idx", first + i), "difficulty": row.get("difficulty"),
                          "num_steps": row.get("num_steps"), "lines_left": row.get("lines_left"),
                          "gold": row["answer"],
                          "predicted": predicted, "formatted": predicted is not None,
                          "correct": answers_match(predicted, row["answer"]),
                          "consistent": work_consistent(text),
                          "completion_tokens": int(lengths[j]),
                          "tool_results": int(tool_results[j]), "completion": text}
        bar.update(len(chunk))
    return [r for r in records if r is not None]


def forced_results(batch) -> torch.Tensor:
    """[rows] how many results the calculator wrote into each completion of ``batch`` (runs of
    forced tokens)."""
    forced = batch.completion_mask - batch.model_mask
    starts = forced[:, 1:] > forced[:, :-1]
    return forced[:, 0] + starts.sum(1)


def held_out_rows(split: str = "test", n: int = 200, offset: int = 0,
                  data_dir: str | None = None, lines_left: int | None = None,
                  calculator: bool = False):
    """``n`` problems of ``split`` from row ``offset`` on; with ``lines_left`` at the gold start
    that leaves that many work lines (problems with fewer are skipped, and a line on stderr says
    how many). A :class:`ValueError` naming the option when nothing is left."""
    dataset = load_gsm8k(split, data_dir=data_dir, limit=n, offset=offset)
    if len(dataset) == 0:
        raise ValueError(f"no GSM8K {split} problems to evaluate from row {offset} on: the file is "
                         f"empty or --offset is past its end")
    if lines_left is None:
        return dataset
    starts = gold_starts(dataset, check_lines_left(lines_left), calculator=calculator)
    skipped = len(dataset) - len(starts)
    if len(starts) == 0:
        raise ValueError(f"none of the {len(dataset)} problems has {lines_left} or more work "
                         f"lines: --lines-left {lines_left} leaves nothing to evaluate")
    if skipped:
        print(f"--lines-left {lines_left}: skipped {skipped} of {len(dataset)} problems with "
              f"fewer work lines; evaluating {len(starts)}", file=sys.stderr)
    return starts


def evaluate(model_name: str, split: str = "test", n: int = 200, offset: int = 0,
             data_dir: str | None = None, batch_size: int = 32, max_new_tokens: int = 256,
             progress: bool = True, sampling_dtype: str | None = "auto",
             lines_left: int | None = None, calculator: bool = False) -> EvalResult:
    """Load ``model_name`` (bundled name, folder or hub id) and evaluate it greedily on
    ``n`` problems of ``split`` starting at row ``offset`` (:func:`held_out_rows`)."""

    dataset = held_out_rows(split, n, offset, data_dir, lines_left, calculator)
    model, tokenizer = load_model(model_name)
    return evaluate_model(model, tokenizer, dataset, batch_size=batch_size,
                          max_new_tokens=max_new_tokens, progress=progress, name=model_name,
                          sampling_dtype=sampling_dtype, calculator=calculator)


def evaluate_sampled(model_name: str, dataset, samples: int, max_new_tokens: int,
                     temperature: float = 1.0, seed: int = 0, batch_prompts: int = 4,
                     sampling_dtype: str | None = "auto", progress: bool = True,
                     calculator: bool = False) -> SampledResult:
    """Load ``model_name`` and sample ``samples`` answers to each problem of ``dataset``
    (:func:`~grpo_course.core.pool.sampled_records`): pass@1 and pass@k of one model."""
    model, tokenizer = load_model(model_name)
    start = time.perf_counter()
    records = sampled_records(model, tokenizer, dataset, samples, max_new_tokens, temperature,
                              seed, batch_prompts, sampling_dtype, progress,
                              f"{'/'.join(Path(model_name).parts[-2:])}: {samples} samples",  # not a build's path
                              calculator)
    return SampledResult(samples, records, time.perf_counter() - start, model_name)


def compare(a: EvalResult, b: EvalResult) -> dict[str, Any]:
    """Paired comparison of two evaluations of the same problems (B minus A)."""
    if [r["idx"] for r in a.records] != [r["idx"] for r in b.records]:
        raise ValueError("the two evaluations are not on the same problems")
    test = mcnemar_test([r["correct"] for r in a.records], [r["correct"] for r in b.records])
    return {"accuracy_a": a.accuracy, "accuracy_b": b.accuracy,
            "difference": b.accuracy - a.accuracy, "mcnemar": test}


def paired_verdict(a: EvalResult, b: EvalResult, name_a: str, name_b: str,
                   alpha: float = 0.05) -> str:
    """One computed sentence on two evaluations of the same problems: both accuracies with
    95 % intervals, whether the intervals overlap, the discordant counts and McNemar's p."""
    test = compare(a, b)["mcnemar"]
    (alo, ahi), (blo, bhi) = a.accuracy_ci95, b.accuracy_ci95
    overlap = max(alo, blo) <= min(ahi, bhi)
    text = (f"{name_a} {100 * a.accuracy:.1f} % [{100 * alo:.1f}, {100 * ahi:.1f}] and {name_b} "
            f"{100 * b.accuracy:.1f} % [{100 * blo:.1f}, {100 * bhi:.1f}] on the same {a.n} problems; "
            f"the intervals {'overlap' if overlap else 'do not overlap'}. {test['a_only']} problems "
            f"only {name_a} solved and {test['b_only']} only {name_b} (McNemar p = "
            f"{test['p_value']:.2f}): ")
    if test["p_value"] < alpha:
        better = name_b if test["b_only"] > test["a_only"] else name_a
        return text + f"{better} is better, beyond what chance explains at this n."
    return text + "a difference this test cannot tell from chance at this n."


def attribution_table(results: dict[str, EvalResult]) -> list[dict[str, Any]]:
    """One row per evaluated model (same problems): accuracy and format with 95 % intervals,
    answer-work consistency, mean completion length, and accuracy per difficulty stratum."""
    rows = []
    for name, r in results.items():
        s = r.summary()
        row = {"model": name, "n": r.n, "accuracy %": 100 * r.accuracy,
               "accuracy 95% CI": "{:.1f}-{:.1f}".format(*(100 * x for x in r.accuracy_ci95)),
               "format %": 100 * r.format_rate,
               "consistency %": None if s["answer_work_consistency"] is None
               else 100 * s["answer_work_consistency"],
               "mean tokens": s["mean_completion_tokens"]}
        for stratum, v in r.by_stratum().items():
            row[f"{stratum} % (n={v['n']})"] = 100 * v["accuracy"]
        rows.append(row)
    return rows


@dataclass
class SampledResult:
    """A sampled evaluation: ``samples`` answers to each of ``n`` problems at a temperature."""

    samples: int
    records: list[dict[str, Any]] = field(repr=False, default_factory=list)
    seconds: float = 0.0
    model: str = ""

    @property
    def pass_at_1(self) -> dict[str, float]:
        """The mean share of right answers per problem, with its 95 % interval over problems."""
        return mean_interval([r["right"] / self.samples for r in self.records], (0, 1))

    def summary(self) -> dict[str, Any]:
        n, k = len(self.records), self.samples
        solved = sum(r["right"] > 0 for r in self.records)
        tokens = sum(r.get("tokens", 0) for r in self.records)
        return {"model": shown_path(self.model), "n": n, "samples": k, "pass_at_1": self.pass_at_1,
                "entropy": sum(r.get("nll", 0.0) for r in self.records) / tokens if tokens else None,
                f"pass_at_{k}": {"mean": solved / n, "ci95": list(wilson_interval(solved, n))},
                "format_rate": sum(r["formatted"] for r in self.records) / (n * k),
                "right": [r["right"] for r in self.records], "seconds": round(self.seconds, 1)}


def compare_sampled(a: SampledResult, b: SampledResult) -> dict[str, Any]:
    """Paired difference of pass@1 over the same problems, B minus A: its mean, 95 % interval
    and p (:func:`~grpo_course.measure.stats.paired_difference`), and the problems up and down."""
    if [r["idx"] for r in a.records] != [r["idx"] for r in b.records] or a.samples != b.samples:
        raise ValueError("the two sampled evaluations are not of the same problems and samples")
    ra, rb = [r["right"] for r in a.records], [r["right"] for r in b.records]
    test = paired_difference([x / a.samples for x in ra], [y / b.samples for y in rb])
    return {"pass_at_1": test, "up": sum(y > x for x, y in zip(ra, rb, strict=True)),
            "down": sum(y < x for x, y in zip(ra, rb, strict=True))}


def pass_at_k(model, tokenizer, dataset, k: int, max_new_tokens: int, temperature: float = 1.0,
              seed: int = 0, batch_prompts: int = 4, sampling_dtype: str | None = "auto",
              progress: bool = True) -> dict[str, Any]:
    """pass@k: the share of problems with at least one correct answer among ``k`` samples
    (the chance that a GRPO group of G = k holds a correct completion), with its interval."""
    solved = [c > 0 for c in correct_counts(model, tokenizer, dataset, k, max_new_tokens,
                                            temperature, seed, batch_prompts, sampling_dtype,
                                            progress, f"pass@{k}")]
    hits = sum(solved)
    return {"n": len(solved), "k": k, "pass_at_k": hits / len(solved) if solved else 0.0,
            "ci95": wilson_interval(hits, len(solved)), "solved": solved}


def pass_at_k_curve(counts: Sequence[int], samples: int, ks: Sequence[int] = (1, 2, 4, 8, 16),
                    group_size: int | None = None) -> dict[str, Any]:
    """pass@k for each ``k`` of ``ks`` (at most ``samples``) from each problem's right answers
    among ``samples`` (:func:`~grpo_course.core.pool.correct_counts`), by the unbiased estimator, with 95 % intervals
    over problems; with ``group_size`` also the share of groups of that size that are mixed
    (right and wrong answers both: the groups whose correctness reward teaches)."""
    if len(counts) < 2:
        raise ValueError(f"pass@k intervals need at least 2 problems; got {len(counts)}")
    curve = {str(k): mean_interval([pass_at_k_estimate(samples, c, k) for c in counts], (0, 1))
             for k in ks if k <= samples}
    out: dict[str, Any] = {"n": len(counts), "samples": samples, "pass_at_k": curve}
    if group_size is not None:
        out["mixed_groups"] = mean_interval([mixed_group_chance(samples, c, group_size)
                                             for c in counts], (0, 1))
        out["group_size"] = group_size
    return out


def sampled_rewards(model, tokenizer, dataset, k: int, max_new_tokens: int,
                    reward_weights: dict[str, float], temperature: float = 1.0, seed: int = 0,
                    batch_prompts: int = 4, sampling_dtype: str | None = "auto",
                    reward_funcs: dict | None = None, progress: bool = True) -> dict[str, Any]:
    """The policy's weighted training reward on fixed prompts: ``k`` samples per problem of
    ``dataset``, scored with ``reward_weights`` (the course's rewards, or ``reward_funcs``), and
    each problem's mean (``per_function``: each function's unweighted per-problem means, which
    say what moved). Two models scored on the same problems give a paired test of whether
    training moved the reward, free of which prompts a training step happened to draw."""

    funcs = reward_funcs or {n: REWARD_FUNCTIONS[n] for n in reward_weights}
    per_prompt: list[float] = []
    per_function: dict[str, list[float]] = {n: [] for n in funcs}
    for chunk, batch in sampled_blocks(model, tokenizer, list(dataset), k, max_new_tokens,
                                        temperature, seed, batch_prompts, sampling_dtype,
                                        f"reward of {k} samples", progress):
        columns = {c: [r[c] for r in chunk] for c in chunk[0]}
        weighted, each = score_groups(batch.completions, columns, funcs, reward_weights, k)
        per_prompt += weighted.view(len(chunk), k).mean(1).tolist()
        for name, values in each.items():
            per_function[name] += values.view(len(chunk), k).mean(1).tolist()
    return {"n": len(per_prompt), "k": k, "per_prompt": per_prompt, "per_function": per_function,
            "mean": sum(per_prompt) / len(per_prompt) if per_prompt else float("nan")}


def write_csv(result: EvalResult, path: str) -> None:
    """Per-problem records as CSV (written atomically)."""
    keys = list(result.records[0]) if result.records else ["idx"]

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=keys)
            writer.writeheader()
            writer.writerows(result.records)
    atomic_write(path, write)


def run_configs(names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The saved config (``config.yaml`` of :mod:`grpo_course.core.train`) of each name that is a
    run folder holding one; an unreadable one is reported as ``{"error": ...}``."""
    configs = {}
    for name in names:
        try:
            config = load_run_config(name) if Path(name).is_dir() else None
        except ConfigError as exc:
            config = {"error": str(exc)}
        if config is not None:
            configs[name] = {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}
    return configs

# ---------------------------------------------------------------- ask the models
def _answer_row(name: str, text: str, gold: str | None, solution: str | None) -> dict[str, Any]:
    """One model's answer: its text, its ``#### N`` and, with a ``gold`` answer, its rewards."""
    row = {"model": name, "answer": extract_hash_answer(text), "completion": text}
    if gold is not None:
        names = ["correctness", "exact_format", "number_extraction"] + \
            (["intermediate_results"] if solution is not None else [])
        scores = score_completions([text], [gold], names,
                                   solutions=None if solution is None else [solution])
        row.update({k: v[0] for k, v in scores.items()})
    return row


def answers_side_by_side(model, tokenizer, question: str, states: dict[str, dict | None],
                         gold: str | None = None, solution: str | None = None,
                         max_new_tokens: int = 200) -> list[dict[str, Any]]:
    """Greedy answers to one ``question`` from one LoRA model under several adapter ``states``
    (name -> :func:`grpo_course.core.policy.adapter_state`, or ``None`` for the base model: adapter switched off), with
    each answer's rewards against ``gold``. The model's own weights are put back afterwards."""

    current = adapter_state(model)
    rows = []
    try:
        for name, state in states.items():
            set_adapter_state(model, state or current)
            off = model.disable_adapter() if state is None and hasattr(model, "disable_adapter") \
                else contextlib.nullcontext()
            with off:
                text = sample_completions(model, tokenizer, [chat_prompt(question, tokenizer)], 1,
                                          max_new_tokens, temperature=0.0).completions[0]
            rows.append(_answer_row(name, text, gold, solution))
    finally:
        set_adapter_state(model, current)
    return rows


def recorded_answers(results: dict[str, EvalResult], idx: int, gold: str | None = None,
                     solution: str | None = None) -> list[dict[str, Any]]:
    """The rows of :func:`answers_side_by_side` for problem ``idx`` of greedy evaluations that
    held it (name -> :class:`EvalResult`), read from their records instead of decoded again."""
    rows = []
    for name, result in results.items():
        record = next((r for r in result.records if r["idx"] == idx), None)
        if record is None:
            raise ValueError(f"the evaluation {name!r} has no record of problem {idx}")
        rows.append(_answer_row(name, record["completion"], gold, solution))
    return rows


def _parser() -> OneLineArgumentParser:
    """The command line of ``python -m grpo_course.measure.evaluate``."""
    parser = OneLineArgumentParser(prog="python -m grpo_course.measure.evaluate",
                                   description="GSM8K evaluation with 95 %% intervals: greedy "
                                               "accuracy, or with --samples K sampled pass@1 "
                                               "and pass@K.")
    parser.add_argument("--model", default="smollm2-135m-instruct",
                        help="bundled name, a model/adapter folder, or a hub id")
    parser.add_argument("--split", default="test", choices=["train", "test"])
    parser.add_argument("--n", type=int, default=200, help="number of problems")
    parser.add_argument("--offset", type=int, default=0, help="first problem (row number)")
    parser.add_argument("--data-dir", default=None, help="GSM8K folder (else $GSM8K_DIR, else hub)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="completion budget (default: 256 greedy; with --samples the budget "
                             "GRPO samples at that start, config.START_BUDGETS)")
    parser.add_argument("--sampling-dtype", default="auto", choices=SAMPLING_DTYPES,
                        help="decoder weight precision (auto: bf16 on CPUs with native bf16)")
    parser.add_argument("--lines-left", type=int, default=None, metavar="K",
                        help="evaluate at the gold start: the answer begins with each solution's "
                             "work lines but the last K (problems with fewer lines are skipped)")
    parser.add_argument("--samples", type=int, default=None, metavar="K",
                        help="sample K answers to each problem (--temperature): right answers "
                             "per problem, pass@1 and pass@K with 95 %% intervals")
    parser.add_argument("--calculator", action="store_true",
                        help="GSM8K's calculator writes the result of each <<a*b=>> annotation "
                             "the model opens (its tokens forced, as when the model trained with "
                             "it); without it the model writes its own results")
    parser.add_argument("--temperature", type=float, default=1.0, help="with --samples")
    parser.add_argument("--seed", type=int, default=0, help="with --samples: the sampler's seed")
    parser.add_argument("--csv", default=None, help="write per-problem records here")
    parser.add_argument("--compare", default=None, metavar="OTHER",
                        help="also evaluate OTHER on the same problems and test the difference "
                             "(paired: exact McNemar greedy; with --samples the paired "
                             "difference of pass@1, OTHER minus MODEL, its 95 %% CI and p)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def _budget(parser, args) -> int:
    """The completion budget: ``--max-new-tokens``, else the default of the mode and start; a
    sampled budget shorter than GRPO's at that start is an error naming both."""
    if args.samples is None:
        return 256 if args.max_new_tokens is None else args.max_new_tokens
    try:    # the full profile's greedy budget for whole problems (a bad $GRPO_COURSE_SIZES: one line)
        need = START_BUDGETS.get(args.lines_left, get_profile("full").eval.max_new_tokens)
    except ConfigError as exc:
        parser.error(str(exc))
    if args.max_new_tokens is None:
        return need
    if args.max_new_tokens < need:
        where = "whole problems" if args.lines_left is None else f"--lines-left {args.lines_left}"
        parser.error(f"--max-new-tokens {args.max_new_tokens} is too short for --samples at "
                     f"{where}: an answer there needs up to {need} tokens (the budget GRPO "
                     f"samples with)")
    return args.max_new_tokens


def _check(parser, args) -> int:
    """Every numeric option in range (one error line naming it); returns the budget."""
    for flag, value, low in (("--n", args.n, 1), ("--offset", args.offset, 0),
                             ("--batch-size", args.batch_size, 1),
                             ("--max-new-tokens", args.max_new_tokens or 1, 1),
                             ("--lines-left", 1 if args.lines_left is None else args.lines_left, 1),
                             ("--samples", 1 if args.samples is None else args.samples, 1)):
        if value < low:
            parser.error(f"{flag} must be >= {low}; got {value}")
    if not args.temperature > 0:
        parser.error(f"--temperature must be > 0; got {args.temperature}")
    if args.csv and (Path(args.csv).is_dir() or not Path(args.csv).parent.is_dir()):
        parser.error(f"--csv {args.csv!r} must name a file in an existing folder")
    if args.csv and args.samples:
        parser.error("--csv writes greedy records; with --samples use --json")
    return _budget(parser, args)


def _sampled_main(args, names: list[str], budget: int) -> int:
    """``--samples K``: each model's sampled evaluation, and the paired test with ``--compare``."""
    try:
        quiet_loading()
        rows = held_out_rows(args.split, args.n, args.offset, args.data_dir, args.lines_left,
                             args.calculator)
        if args.compare and len(rows) < 2:
            raise ValueError(f"a paired test needs at least 2 problems; --n {args.n} gives "
                             f"{len(rows)}")
        results = [evaluate_sampled(name, rows, args.samples, budget, args.temperature,
                                    args.seed, sampling_dtype=args.sampling_dtype,
                                    progress=not args.json, calculator=args.calculator)
                   for name in names]
        summary = results[0].summary() if len(rows) > 1 else None
    except (ValueError, RuntimeError, OSError) as exc:
        return report(exc)
    if summary is None:
        return report(f"--n {args.n} gives 1 problem: an interval over problems needs 2 or more")
    if args.compare:
        summary["compare"] = {"other": results[1].summary(), **compare_sampled(*results)}
    if args.json:
        print(json.dumps({**summary, "run_configs": run_configs(names)}))
        return 0
    k = args.samples
    for r in (summary, *([summary["compare"]["other"]] if args.compare else [])):
        p1, pk = r["pass_at_1"], r[f"pass_at_{k}"]
        print(f"{r['model']}: pass@1 {p1['mean']:.1%} (95% CI {p1['lo']:.1%}-{p1['hi']:.1%}), "
              f"pass@{k} {pk['mean']:.1%}, format {r['format_rate']:.1%}, n={r['n']} x {k} "
              f"samples, {r['seconds']:.0f} s")
    if args.compare:
        d = summary["compare"]["pass_at_1"]
        print(f"{args.compare} - {args.model}: pass@1 {d['difference']:+.1%} (95% CI "
              f"{d['lo']:+.1%} to {d['hi']:+.1%}, paired t p = {d['p_value']:.3g}; "
              f"{summary['compare']['up']} problems up, {summary['compare']['down']} down)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m grpo_course.measure.evaluate``: greedy accuracy of one model (or two, paired) with its
    95 % interval, or with ``--samples`` sampled pass@1 and pass@K, as text or one JSON object."""
    parser = _parser()
    args = parser.parse_args(argv)
    budget = _check(parser, args)
    names = [args.model] + ([args.compare] if args.compare else [])
    if args.samples is not None:
        return _sampled_main(args, names, budget)
    results = []
    try:
        quiet_loading()
        for name in names:
            results.append(evaluate(name, args.split, args.n, args.offset, args.data_dir,
                                    args.batch_size, budget, progress=not args.json,
                                    sampling_dtype=args.sampling_dtype,
                                    lines_left=args.lines_left, calculator=args.calculator))
        if args.csv:
            write_csv(results[0], args.csv)
    except (ValueError, RuntimeError, OSError) as exc:   # CourseError: data, model, config
        return report(exc)
    summary = results[0].summary()
    if args.compare:
        summary["compare"] = {"other": results[1].summary(), **compare(results[0], results[1])}
    configs = run_configs(names)
    if args.json:
        summary["run_configs"] = configs        # {run folder: the config it was trained with}
        print(json.dumps(summary))
        return 0
    for name, config in configs.items():
        print(f"{name} was trained with ({Path(name) / RUN_CONFIG_FILE}):")
        print(textwrap.indent(yaml.safe_dump(config, sort_keys=False), "  "), end="")
    for result in results:
        lo, hi = result.accuracy_ci95
        print(f"{result.model}: accuracy {result.accuracy:.1%} (95% CI {lo:.1%}-{hi:.1%}), "
              f"format {result.format_rate:.1%}, n={result.n}, {result.seconds:.0f} s")
    if args.compare:
        test = summary["compare"]["mcnemar"]
        print(f"{args.compare} - {args.model}: {summary['compare']['difference']:+.1%} "
              f"(McNemar exact p = {test['p_value']:.3g}; {test['b_only']} vs {test['a_only']} "
              f"discordant problems)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
