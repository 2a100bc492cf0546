"""Two models on the same held-out problems, paired per problem: the one home of the course's
shipped-run tests.

Every shipped run is tested against the warm start it began from (its ``sft/``) in the same two
ways, whatever its start, its sizes and its tool:

* :func:`greedy_test`: greedy accuracy with McNemar's exact test (and, with ``answers=True``, what
  the answers' own arithmetic does, the calculator's annotations taken out: :func:`own_work`);
* :func:`sampled_test`: sampled pass@1, pass@K and entropy, paired per problem, drawn either in one
  call per model (:func:`sampled_pair`, the reference run's test) or block by block through a cache
  that resumes (:func:`cached_samples`, the whole-problem tests);
* :func:`live_recheck_sentence`: a page's re-sample of the first problems of a test against the
  benchmark's samples of them.

The runs' modules (:mod:`~grpo_course.measure.reference`, :mod:`~grpo_course.measure.whole_problems`,
:mod:`~grpo_course.measure.calculator_tests`) hold what each fixed in advance: rows, samples, seeds
and budgets.
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from grpo_course.core.data import strip_calculations
from grpo_course.core.loading import load_model
from grpo_course.core.pool import sampled_records
from grpo_course.core.sampling import resolve_sampling_dtype
from grpo_course.infra.atomic import write_json_atomic
from grpo_course.infra.fingerprint import code_fingerprint, data_hash, file_hash
from grpo_course.infra.memory import free_memory
from grpo_course.infra.paths import keyed_cache_file, read_cached
from grpo_course.measure.attribution import paired_mcnemar, phase_changes
from grpo_course.measure.evaluate import SampledResult, compare_sampled, evaluate_model, evaluate_sampled

BATCH_PROMPTS = 4                # problems sampled together (a block's seed is its seed + its first row)
CACHE_BLOCK = 16 * BATCH_PROMPTS  # problems a cache entry holds (a whole number of sampling blocks)


# ---- greedy
def greedy_answers(folder: str, rows, max_new_tokens: int, progress: bool = True,
                   calculator: bool = False):
    """Greedy answers of the model ``folder`` (an adapter folder or a model name) to ``rows``,
    cached block by block (``calculator``: GSM8K's calculator writes the annotations' results);
    the model is let go before it returns (one in memory at a time)."""
    model, tok = load_model(folder)
    result = evaluate_model(model, tok, rows, max_new_tokens=max_new_tokens, name=folder,
                            progress=progress, cache=True, calculator=calculator)
    del model
    free_memory()
    return result


def greedy_summary(a, b) -> dict[str, Any]:
    """Two models' greedy results on the same rows: accuracy, format rate, McNemar's exact test."""
    return {"n": a.n, "before": a.accuracy, "after": b.accuracy,
            "format_before": a.format_rate, "format_after": b.format_rate,
            "mcnemar": paired_mcnemar(a, b, "correct")}


def own_work(result):
    """``result`` (greedy records) with each completion's ``<<a*b=c>>`` annotations taken out: the
    equations left are the ones the model wrote itself, not the calculator's."""
    if not any("<<" in r["completion"] for r in result.records):
        return result
    records = [{**r, "completion": strip_calculations(r["completion"])} for r in result.records]
    return dataclasses.replace(result, records=records)


def greedy_test(before, after, rows, max_new_tokens: int, progress: bool = True,
                calculator: bool = False, answers: bool = False) -> dict[str, Any]:
    """Both models' greedy accuracy on ``rows`` (cached) and McNemar's exact test; ``answers``:
    also what the answers do, their arithmetic read without the calculator's annotations."""
    a, b = (greedy_answers(str(f), rows, max_new_tokens, progress, calculator) for f in (before, after))
    out = greedy_summary(a, b)
    if answers:
        out["answers"] = phase_changes(*(own_work(r) for r in (a, b)), rows)
    return out


# ---- sampled
def sampled_pair(before: str, after: str, rows, samples: int, max_new_tokens: int,
                 progress: bool = True, **sampling) -> tuple[SampledResult, SampledResult]:
    """Both models' sampled evaluation of ``rows`` (``sampling``: ``evaluate_sampled``'s seed,
    temperature, blocks, dtype), one model in memory at a time."""
    out = []
    for folder in (before, after):
        out.append(evaluate_sampled(str(folder), rows, samples, max_new_tokens, progress=progress, **sampling))
        free_memory()
    return out[0], out[1]


def adapter_settings(folder: Path) -> dict:
    """The adapter's ``adapter_config.json`` with its target modules sorted: PEFT writes them in a
    set's order, which differs between processes, so two copies of one adapter may differ in that
    order alone."""
    config = json.loads((folder / "adapter_config.json").read_text())
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
    return config


def cached_samples(folder: str | Path, rows, samples: int, max_new_tokens: int, seed: int,
                   kind: str = "sampled_tests", progress: bool = True,
                   calculator: bool = False, temperature: float = 1.0) -> SampledResult:
    """The adapter in ``folder`` sampled on ``rows`` (``samples`` answers each at ``temperature``,
    ``seed``), :data:`CACHE_BLOCK` problems at a time: each block is read from the cache
    (``$GRPO_COURSE_CACHE/<kind>/``) when the same adapter sampled the same rows with the same code
    before, else sampled and stored there (atomically), so a bench stopped part way loses at most
    one block. The block from problem ``lo`` samples with seed ``seed + lo``: the answers one call of
    ``evaluate_sampled`` on all the rows would draw (its sampling blocks start at ``seed + lo``).
    ``calculator``: GSM8K's calculator writes the annotations' results."""
    folder, rows = Path(folder), list(rows)
    key = {"adapter": file_hash(folder / "adapter_model.safetensors"),
           "adapter_config": adapter_settings(folder),
           "rows": data_hash(rows), "start": [r.get("start") for r in rows], "samples": samples,
           "max_new_tokens": max_new_tokens, "temperature": temperature, "seed": seed,
           "batch_prompts": BATCH_PROMPTS,
           "dtype": str(resolve_sampling_dtype("auto") or "float32"),     # bf16 where native
           "code": code_fingerprint("grpo_course.measure.paired"),        # with the sampler it imports
           **({"calculator": True} if calculator else {})}
    records, seconds, model = [], 0.0, None
    for lo in range(0, len(rows), CACHE_BLOCK):
        path = keyed_cache_file(kind, {**key, "block": [lo, lo + CACHE_BLOCK]})
        stored = read_cached(path, lambda s: isinstance(s.get("records"), list))
        if stored is None:
            if model is None:
                model, tokenizer = load_model(str(folder))
            start = time.perf_counter()
            block = sampled_records(model, tokenizer, rows[lo:lo + CACHE_BLOCK], samples, max_new_tokens,
                                    temperature, seed + lo, BATCH_PROMPTS, "auto", progress,
                                    f"{folder.name}: {samples} samples, problems {lo}-"
                                    f"{min(lo + CACHE_BLOCK, len(rows)) - 1}", calculator)
            stored = {"records": block, "seconds": time.perf_counter() - start}
            write_json_atomic(path, stored)
        records += stored["records"]
        seconds += stored["seconds"]
    if model is not None:
        del model
        free_memory()
    return SampledResult(samples, records, seconds, str(folder))


def sampled_test(before, after, rows, samples: int, seed: int, max_new_tokens: int,
                 progress: bool = True, calculator: bool = False, cached: bool = True) -> dict[str, Any]:
    """Both models' sampled pass@1, pass@K and entropy on ``rows``, paired per problem: drawn
    through the cache (:func:`cached_samples`), or with ``cached=False`` in one call per model
    (:func:`sampled_pair`, whose sampling blocks are ``evaluate_sampled``'s defaults)."""
    if cached:
        a, b = (cached_samples(f, rows, samples, max_new_tokens, seed, progress=progress,
                               calculator=calculator) for f in (before, after))
    else:
        a, b = sampled_pair(before, after, rows, samples, max_new_tokens, progress, seed=seed,
                            calculator=calculator)
    return {"before": a.summary(), "after": b.summary(), **compare_sampled(a, b)}


# ---- a page's live re-check, in words
def recheck_sentence(pairs: list[tuple[dict[str, Any], dict[str, Any]]], problems: int, samples: int,
                     what: str, machine: str) -> str:
    """A page's live re-sample of the first ``problems`` of a fixed test against the benchmark's
    samples of the same problems. ``pairs`` holds one (live, benchmark) record per slice, each with
    both models' right answers per problem (``"before"``/``"after"``, ``"right"``). Identical, or
    how far each live change of pass@1 is from the benchmark's and whether it moved the same way."""
    same = [live[side]["right"] == bench[side]["right"][:problems]
            for live, bench in pairs for side in ("before", "after")]
    if all(same):
        return (f"the page sampled the first {problems} problems of {what} again: every problem's right "
                f"answers match the benchmark's, for both models")
    change = lambda rec: (sum(rec["after"]["right"][:problems])
                          - sum(rec["before"]["right"][:problems])) / (samples * problems)
    mine, theirs = [change(live) for live, _ in pairs], [change(bench) for _, bench in pairs]
    sign = lambda x: (x > 0) - (x < 0)           # a change of 0 moves neither way
    agree = all(sign(a) == sign(b) for a, b in zip(mine, theirs, strict=True))
    points = lambda xs: ", ".join(f"{100 * x:+.1f}" for x in xs)
    counted = "model-slice counts" if len(pairs) > 1 else "models' counts"
    # how far apart the two changes are, in right samples of a slice: one sample is within any re-draw
    apart = round(max(abs(a - b) for a, b in zip(mine, theirs, strict=True)) * samples * problems)
    # short sentences: the first stays lower-case, as pages and results boxes put it after "Live:"
    return (f"the page sampled the first {problems} problems of {what} again. "
            f"{sum(not s for s in same)} of {len(same)} {counted} differ from the benchmark's: this "
            f"machine samples differently (bf16 against fp32, another CPU, or the run changed since the "
            f"benchmark). On those {problems} problems ({samples} samples each) the live change of pass@1 "
            f"was {points(mine)} points against the benchmark's {points(theirs)}"
            + (", slice by slice" if len(pairs) > 1 else "")
            + f". The verdict below is the benchmark's, from its {machine}: "
            + ("the live change moved the same way as the benchmark's" if agree else
               f"the two changes differ by {apart} right sample{'s' if apart != 1 else ''} of "
               f"{samples * problems}, too few to confirm or contradict it" if apart <= 1 else
               "the live change did not move the same way as the benchmark's, so on this machine the "
               "result may differ"))


def live_recheck_sentence(live: dict[str, Any], fixed: dict[str, Any], samples: int, cpu: str) -> str:
    """The page's re-sample of a fixed test's first problems against the benchmark's samples of
    them (:func:`recheck_sentence`). A record with ``"slices"`` (the reference run's) pairs slice by
    slice; otherwise ``live`` is one sampled test (``"before"``/``"after"``) to set against
    ``fixed["sampled"]`` (test (b) of the whole-problem runs)."""
    if "slices" in fixed:
        pairs = [(ls["sampled"], fs["sampled"]) for ls, fs in zip(live["slices"], fixed["slices"], strict=True)]
        what = "each slice"
    else:
        pairs, what = [(live, fixed["sampled"])], "test (b)"
    return recheck_sentence(pairs, len(pairs[0][0]["after"]["right"]), samples, what, cpu)
