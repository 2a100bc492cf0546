"""A balanced prompt pool: GRPO on the prompts the policy solves sometimes, not never or always.

A group teaches correctness only where some of its answers are right and some wrong: its
advantages are then non-zero, and the gradient grows with the variance of the right-answer
rate (balanced online difficulty filtering, arXiv 2504.03380; DAPO's dynamic sampling is the
same filter applied online, step by step). :func:`screen_prompts` samples answers to each
training prompt once, at the run's start, with the warm start; :func:`mixed_ids` keeps those
solved sometimes. :func:`sampled_records` and :func:`correct_counts` count the right answers among
a prompt's samples: the screening reads them, and so do the evaluation's pass@k and sampled pass@1
(:mod:`grpo_course.measure.evaluate`). :func:`screened_pool` caches the screening, keyed by the weights that sampled
it, the prompts, the sampling settings and the code (:mod:`grpo_course.infra.fingerprint`), so a
rerun of a recipe screens once, and a screening stopped part way goes on where it stopped.
"""
from __future__ import annotations

import time
from typing import Any

from grpo_course.core.answers import answers_match, extract_hash_answer
from grpo_course.core.data import gold_start, start_prompt
from grpo_course.core.sampling import resolve_sampling_dtype, sample_completions
from grpo_course.infra.atomic import write_json_atomic
from grpo_course.infra.fingerprint import code_fingerprint, data_hash, weights_fingerprint
from grpo_course.infra.paths import keyed_cache_file, read_cached
from grpo_course.infra.progress import tqdm


def sampled_blocks(model, tokenizer, rows: list, k: int, max_new_tokens: int, temperature: float,
                    seed: int, batch_prompts: int, sampling_dtype, desc: str, progress: bool,
                    calculator: bool = False):
    """``(chunk, batch)`` for blocks of ``batch_prompts`` problems: ``k`` samples of each (a
    :class:`~grpo_course.core.sampling.SampleBatch`), the block starting at problem ``lo`` drawn with
    seed ``seed + lo``."""

    for lo in tqdm(range(0, len(rows), batch_prompts), desc=desc, disable=not progress):
        chunk = rows[lo:lo + batch_prompts]
        batch = sample_completions(model, tokenizer, [start_prompt(r, tokenizer) for r in chunk],
                                   k, max_new_tokens,
                                   temperature, seed=seed + lo, sampling_dtype=sampling_dtype,
                                   calculator=calculator)
        yield chunk, batch


def sampled_records(model, tokenizer, dataset, samples: int, max_new_tokens: int,
                    temperature: float = 1.0, seed: int = 0, batch_prompts: int = 4,
                    sampling_dtype: str | None = "auto", progress: bool = True,
                    desc: str | None = None, calculator: bool = False) -> list[dict[str, Any]]:
    """``samples`` sampled answers to each problem of ``dataset`` (at its ``start``, where the
    rows have one), one record a problem: its ``idx``, ``difficulty``, how many answers were
    ``right`` and ``formatted`` (a ``#### N`` line), and the ``nll`` (nats) of their ``tokens``
    under the sampling distribution: its mean per token estimates the policy's entropy."""
    records = []
    for chunk, batch in sampled_blocks(model, tokenizer, list(dataset), samples, max_new_tokens,
                                        temperature, seed, batch_prompts, sampling_dtype,
                                        desc or f"{samples} samples", progress, calculator):
        # the model's own tokens: the calculator's have no sampling log-prob
        nll = -(batch.sampling_logps * batch.model_mask).reshape(len(chunk), -1).sum(1)
        tokens = batch.model_mask.reshape(len(chunk), -1).sum(1)
        for j, r in enumerate(chunk):
            answers = [extract_hash_answer(t) for t in batch.completions[j * samples:(j + 1) * samples]]
            records.append({"idx": r.get("idx"), "difficulty": r.get("difficulty"),
                            "right": sum(answers_match(a, r["answer"]) for a in answers),
                            "formatted": sum(a is not None for a in answers),
                            "nll": float(nll[j]), "tokens": int(tokens[j])})
    return records


def correct_counts(model, tokenizer, dataset, samples: int, max_new_tokens: int,
                   temperature: float = 1.0, seed: int = 0, batch_prompts: int = 4,
                   sampling_dtype: str | None = "auto", progress: bool = True,
                   desc: str | None = None, calculator: bool = False) -> list[int]:
    """How many of ``samples`` sampled answers to each problem of ``dataset`` are right (at its
    ``start``, where the rows have one): what pass@k and the mixed groups are estimated from."""
    return [r["right"] for r in sampled_records(model, tokenizer, dataset, samples, max_new_tokens,
                                                temperature, seed, batch_prompts, sampling_dtype,
                                                progress, desc, calculator)]


def mixed_ids(ids: list[int], correct: list[int], samples: int) -> list[int]:
    """The ``ids`` whose screened right answers are strictly between 0 and ``samples``."""
    return [i for i, c in zip(ids, correct, strict=True) if 0 < c < samples]


def screen_prompts(model, tokenizer, rows: dict[str, list], samples: int, max_new_tokens: int,
                   lines_left: int | None, temperature: float = 1.0, seed: int = 0,
                   sampling_dtype: str = "auto", batch_prompts: int = 8,
                   progress: bool = True, calculator: bool = False) -> list[int]:
    """How many of ``samples`` sampled answers to each prompt of ``rows`` (columns) are right,
    each prompt at the trainer's start (its gold start of ``lines_left``; a problem with that
    many lines or fewer starts whole), or at the rows' own ``start`` where they have one
    (``start_mix``)."""
    starts = rows.get("start") or [gold_start(s, lines_left, calculator) or "" for s in rows["solution"]]
    problems = [{"question": q, "answer": a, "start": s}
                for q, a, s in zip(rows["question"], rows["answer"], starts, strict=True)]
    return correct_counts(model, tokenizer, problems, samples, max_new_tokens, temperature,
                          seed, batch_prompts, sampling_dtype, progress, "screening the pool",
                          calculator)


def screened_pool(model, tokenizer, config, rows: dict[str, list], ids: list[int],
                  progress: bool = True) -> dict[str, Any]:
    """``{"ids", "correct", "samples", "mixed"}``: the screening of the prompts ``ids`` (their
    ``rows``) by ``model`` with ``config``'s start, budget, temperature and seed, and the ids it
    keeps; read from the cache when the same weights screened the same prompts before. It decodes
    as many prompts at once as a sampling round of the run (``prompts_per_round``), so it needs no
    more memory than training does."""
    samples = config.pool_samples or config.num_generations
    batch_prompts = max(1, config.prompts_per_round)
    problems = [{"question": q, "answer": a} for q, a in zip(rows["question"], rows["answer"], strict=True)]
    if "start" in rows:                 # start_mix: a prompt is a (problem, start) pair
        problems = [{**p, "start": s} for p, s in zip(problems, rows["start"], strict=True)]
    key = {"weights": weights_fingerprint(model), "model": config.model, "data": data_hash(problems),
           "ids": ids, "samples": samples, "max_new_tokens": config.max_completion_length,
           "lines_left": config.lines_left, "start_mix": list(config.start_mix),
           "temperature": config.temperature,
           "seed": config.seed, "batch_prompts": batch_prompts,
           "dtype": str(resolve_sampling_dtype(config.sampling_dtype) or "float32"),
           "code": code_fingerprint("grpo_course.core.pool"),
           **({"calculator": True} if config.calculator else {})}
    path = keyed_cache_file("pools", key)
    stored = read_cached(path, lambda s: s["ids"] == ids and len(s["correct"]) == len(ids))
    if stored is not None:
        return stored
    # a long screening keeps its progress, a sampling round at a time: stopped part way, it goes on
    # from the last round it saved
    partial = path.with_name(path.stem + ".partial" + path.suffix)
    done = read_cached(partial, lambda s: s["ids"] == ids) or {}
    correct, seconds = list(done.get("correct", [])), done.get("seconds", 0.0)
    with tqdm(total=len(ids), initial=len(correct), desc="screening the pool", disable=not progress) as bar:
        for lo in range(len(correct), len(ids), batch_prompts):
            start = time.perf_counter()
            # seed + lo: the block at ``lo`` draws what it would draw in one uninterrupted call
            correct += screen_prompts(model, tokenizer, {k: v[lo:lo + batch_prompts] for k, v in rows.items()},
                                      samples, config.max_completion_length, config.lines_left,
                                      config.temperature, config.seed + lo, config.sampling_dtype,
                                      batch_prompts, False, config.calculator)
            seconds += time.perf_counter() - start
            write_json_atomic(partial, {"ids": ids, "correct": correct, "seconds": seconds})
            bar.update(len(correct) - bar.n)
    pool = {"ids": ids, "correct": correct, "samples": samples,
            "mixed": mixed_ids(ids, correct, samples), "start_mix": list(config.start_mix),
            "seconds": round(seconds, 1)}
    write_json_atomic(path, pool)
    partial.unlink(missing_ok=True)
    return pool


def pool_summary(pool: dict[str, Any]) -> dict[str, Any]:
    """The screening in numbers: prompts screened, kept, and the share never / sometimes /
    always solved (``pool["mixed"]`` is the list of kept ids)."""
    n, s = len(pool["correct"]), pool["samples"]
    never = sum(c == 0 for c in pool["correct"])
    always = sum(c == s for c in pool["correct"])
    return {"screened": n, "kept": len(pool["mixed"]), "samples": s, "never_share": never / n,
            "mixed_share": len(pool["mixed"]) / n, "always_share": always / n}


#: what a screening holds (``screened_pool``), besides the summary
POOL_KEYS = ("ids", "correct", "samples", "mixed", "seconds", "start_mix")


def pool_record(pool: dict[str, Any]) -> dict[str, Any]:
    """A screening as a run folder keeps it (``pool.json``): its summary, then the screening."""
    return {**pool_summary(pool), **{k: pool[k] for k in POOL_KEYS if k in pool}}
