"""Reward functions for GSM8K and their registry (chapter 2).

Every reward has TRL's signature ``fn(completions, **kwargs) -> list[float]``:
``completions`` are plain strings or chat-message lists
(``[{"role": "assistant", "content": ...}]``), dataset columns such as ``answer``
arrive as keyword lists, and unknown keywords (``prompts``, ``completion_ids``,
``trainer_state`` ...) are ignored. Whatever the text, a reward returns one finite
float per completion and never raises.

The answer format is configurable (:class:`~grpo_course.core.answers.AnswerFormat`); the course teaches
GSM8K's own final line ``#### <number>`` (:data:`~grpo_course.core.answers.HASH_FORMAT`), and
:data:`~grpo_course.core.answers.TAG_FORMAT` is the ``<reasoning>...</reasoning><answer>...</answer>`` style of
many GRPO notebooks. Number parsing, the answer slot and the correctness rule are
:mod:`grpo_course.core.answers`' (shared with evaluation).
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from decimal import Decimal, InvalidOperation
from functools import cache
from typing import Any

import torch

from grpo_course.config import ConfigError, GRPOConfig
from grpo_course.core.answers import (
    HASH_FORMAT,
    AnswerFormat,
    answer_slot,
    answers_match,
    extract_answer,
    normalize_number,
)
from grpo_course.core.arithmetic import EQUATION, equation_is_right
from grpo_course.core.data import solution_results
from grpo_course.infra.errors import RewardError

RewardFn = Callable[..., list[float]]


# Correctness tiers (the HF cookbook recreation's, documented in chapter 2).
EXACT_REWARD = 3.0        # the answer is the gold number (answers.answers_match: within 1e-6)
CLOSE_REWARD = 1.5        # answer / gold in [0.9, 1.1]
NEAR_REWARD = 0.5         # answer / gold in [0.8, 1.2]
WRONG_REWARD = -0.5       # a number, but not close
MISSING_REWARD = -1.0     # no number in the answer slot (or no answer slot)
CLOSE_RATIO = (Decimal("0.9"), Decimal("1.1"))
NEAR_RATIO = (Decimal("0.8"), Decimal("1.2"))

FORMAT_REWARD = 3.0       # exact_format, structure perfect
TAG_CREDIT = 0.5          # approximate_format, per marker present exactly once
TRAILING_PENALTY = 0.001  # approximate_format, per character after the answer slot
MAX_TRAILING_PENALTY = 1.0
NUMBER_REWARD = 1.5       # number_extraction
STEP_REWARD = 1.0         # intermediate_results, all of the gold solution's step results and no others
HEURISTIC_CREDIT = 0.5    # heuristic, per satisfied check (4 checks -> max 2.0)
HEURISTIC_WORDS = (10, 300)   # "reasonable length" in words
#: a result the work computes: the number after an ``=`` (shared with evaluate.work_consistent)
RESULT = re.compile(r"=\s*\$?\s*(-?[\d,]*\.?\d+)")
_OPERATION = re.compile(r"\d\s*[-+*/×÷x]\s*\d|=")
_STEP = re.compile(r"(?im)^\s*(?:step\s*\d+|\d+[.)]|first|then|next|so|finally)\b")


# ---------------------------------------------------------------- parsing
@cache
def format_regex(fmt: AnswerFormat = HASH_FORMAT) -> re.Pattern[str]:
    """The one regex of a perfectly formatted completion (groups ``reasoning``, ``answer``).

    Compiled with ``re.DOTALL``: reasoning spans lines, and without DOTALL ``.``
    stops at the first newline, so ``re.match`` silently fails on every real
    completion (the pitfall shown in chapter 2). The reasoning may not contain
    the solution marker, and nothing but whitespace may follow the answer.
    """
    e = re.escape
    no_marker = rf"(?:(?!{e(fmt.solution_start)}).)"
    reasoning = rf"(?P<reasoning>\S{no_marker}*?)"
    # without a closing reasoning tag, the solution marker must start its own line
    between = r"\s*" if fmt.reasoning_end else r"[ \t]*\n\s*"
    if fmt.solution_end:  # the answer may span lines, up to the closing tag
        answer = rf"\s*(?P<answer>\S.*?)\s*{e(fmt.solution_end)}"
    else:                 # the answer is the rest of the marker's line
        answer = r"[ \t]*(?P<answer>\S[^\n]*?)"
    pattern = (rf"^\s*{e(fmt.reasoning_start)}\s*{reasoning}{between}{e(fmt.reasoning_end)}"
               rf"\s*{e(fmt.solution_start)}{answer}\s*$")
    return re.compile(pattern, re.DOTALL)


def completion_text(completion: Any) -> str:
    """The text of one completion: a string, or the assistant content of a message list."""
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    if isinstance(completion, (list, tuple)):
        parts = [m.get("content") or "" for m in completion
                 if isinstance(m, dict) and m.get("role", "assistant") == "assistant"]
        return "".join(str(p) for p in parts)
    return str(completion)


def answer_tier(guess: str | None, gold: str | None) -> float:
    """Correctness tier of a parsed ``guess`` against the ``gold`` answer (see the constants);
    the exact tier is evaluation's rule, :func:`grpo_course.core.answers.answers_match`."""
    if guess is None:
        return MISSING_REWARD
    gold_value = normalize_number(str(gold)) if gold is not None else None
    if gold_value is None:
        return WRONG_REWARD
    if answers_match(guess, gold_value):
        return EXACT_REWARD
    try:
        g, t = Decimal(guess), Decimal(gold_value)
        if t == 0:
            return WRONG_REWARD
        ratio = g / t
    except (InvalidOperation, ArithmeticError, ValueError):
        return WRONG_REWARD
    if CLOSE_RATIO[0] <= ratio <= CLOSE_RATIO[1]:
        return CLOSE_REWARD
    if NEAR_RATIO[0] <= ratio <= NEAR_RATIO[1]:
        return NEAR_REWARD
    return WRONG_REWARD


def is_correct(completion: Any, gold: str, fmt: AnswerFormat = HASH_FORMAT) -> bool:
    """The course's answer checker: the answer slot holds the gold number (the rule of
    :func:`grpo_course.core.answers.answers_match`, as in evaluation)."""
    return answer_tier(extract_answer(completion_text(completion), fmt), gold) == EXACT_REWARD


# ---------------------------------------------------------------- safety net
def _safe(score: Callable[[str], float], texts: Iterable[Any], fallback: float) -> list[float]:
    """Apply ``score`` to each completion's text; an exception or a non-finite value
    gives ``fallback`` (a reward must never stop a training run)."""
    out = []
    for completion in texts:
        try:
            value = float(score(completion_text(completion)))
        except Exception:  # rewards never raise on text
            value = fallback
        out.append(value if math.isfinite(value) else fallback)
    return out


def _answers(completions: Sequence[Any], answer: Any, name: str,
             column: str = "answer") -> list[Any]:
    if answer is None:
        raise ValueError(f"{name} needs the gold {column}s: pass {column}=[...] (the dataset "
                         f"column '{column}', one per completion)")
    if isinstance(answer, (str, int, float)):
        return [answer] * len(completions)
    answer = list(answer)
    if len(answer) != len(completions):
        raise ValueError(f"{name}: got {len(completions)} completions but {len(answer)} "
                         f"{column}s; TRL repeats each {column} G times, pass one per completion")
    return answer


# ---------------------------------------------------------------- rewards
def exact_format(completions, fmt: AnswerFormat = HASH_FORMAT, **kwargs) -> list[float]:
    """3.0 when the whole completion matches :func:`format_regex`, else 0.0."""
    regex = format_regex(fmt)
    return _safe(lambda t: FORMAT_REWARD if regex.match(t) else 0.0, completions, 0.0)


def _approximate(text: str, fmt: AnswerFormat) -> float:
    score = sum(TAG_CREDIT if text.count(tag) == 1 else -TAG_CREDIT for tag in fmt.tags)
    found = answer_slot(text, fmt)
    if found is not None:
        score -= min(MAX_TRAILING_PENALTY, TRAILING_PENALTY * len(found[1].strip()))
    return score


def approximate_format(completions, fmt: AnswerFormat = HASH_FORMAT, **kwargs) -> list[float]:
    """+0.5 per format marker present exactly once, -0.5 per marker missing or repeated,
    minus 0.001 per character after the answer slot (at most 1.0)."""
    return _safe(lambda t: _approximate(t, fmt), completions, -TAG_CREDIT * len(fmt.tags))


def correctness(completions, answer=None, fmt: AnswerFormat = HASH_FORMAT,
                **kwargs) -> list[float]:
    """Tiers: 3.0 exact, 1.5 ratio in [0.9, 1.1], 0.5 in [0.8, 1.2], -0.5 wrong,
    -1.0 when the answer slot holds no number (see :func:`answer_tier`)."""
    golds = _answers(completions, answer, "correctness")
    return [_safe(lambda t, gold=gold: answer_tier(extract_answer(t, fmt), gold), [c], MISSING_REWARD)[0]
            for c, gold in zip(completions, golds, strict=False)]


def number_extraction(completions, fmt: AnswerFormat = HASH_FORMAT, **kwargs) -> list[float]:
    """1.5 when a number parses from the answer slot, else 0.0."""
    return _safe(lambda t: NUMBER_REWARD if extract_answer(t, fmt) is not None else 0.0,
                 completions, 0.0)


def computed_results(text: str, fmt: AnswerFormat = HASH_FORMAT) -> list[str]:
    """The normalized numbers the work before the answer slot computes (``... = c``)."""
    work = text.rsplit(fmt.solution_start, 1)[0]
    return [v for v in (normalize_number(m) for m in RESULT.findall(work)) if v is not None]


def step_f1(text: str, gold_steps: Sequence[str], fmt: AnswerFormat = HASH_FORMAT) -> float:
    """F1 of the results ``text`` computes against a solution's step results: recall rewards
    reaching the gold intermediate values, precision stops a text that lists many numbers."""
    mine, gold = set(computed_results(text, fmt)), set(gold_steps)
    if not mine or not gold:
        return 0.0
    hits = len(mine & gold)
    return 2 * hits / (len(mine) + len(gold))


def intermediate_results(completions, solution=None, fmt: AnswerFormat = HASH_FORMAT,
                         **kwargs) -> list[float]:
    """Dense correctness: ``STEP_REWARD`` x F1 between the results the work computes and the
    gold solution's step results (:func:`grpo_course.core.data.solution_results`). A completion
    that gets the first steps right earns part of it even when its final answer is wrong."""
    golds = _answers(completions, solution, "intermediate_results", "solution")
    return [_safe(lambda t, gold=gold: STEP_REWARD * step_f1(t, solution_results(str(gold)), fmt),
                  [c], 0.0)[0] for c, gold in zip(completions, golds, strict=False)]


def grounded_score(text: str, gold_steps: Sequence[str], fmt: AnswerFormat = HASH_FORMAT) -> float:
    """The gold step results that a right ``a op b = c`` equation of the work computes (each
    counted once), over the larger of the equations written and the gold steps: a wrong or
    repeated equation earns nothing and dilutes the rest, and so does every equation past the
    gold solution's count."""
    work = text.rsplit(fmt.solution_start, 1)[0]
    equations, gold = EQUATION.findall(work), set(gold_steps)
    if not equations or not gold:
        return 0.0
    grounded = {normalize_number(result) for expression, result in equations
                if equation_is_right(expression, result)}
    return len(grounded & gold) / max(len(equations), len(gold))


def grounded_steps(completions, solution=None, fmt: AnswerFormat = HASH_FORMAT,
                   **kwargs) -> list[float]:
    """Dense correctness that writing more cannot farm: ``STEP_REWARD`` x
    :func:`grounded_score`. Unlike ``intermediate_results`` it credits a gold value only where
    the work's own arithmetic produces it, and caps what one answer can earn by its number of
    equations (step rewards get farmed by repeating steps that score: Gao et al. 2024)."""
    golds = _answers(completions, solution, "grounded_steps", "solution")
    return [_safe(lambda t, gold=gold: STEP_REWARD * grounded_score(t, solution_results(str(gold)), fmt),
                  [c], 0.0)[0] for c, gold in zip(completions, golds, strict=False)]


def heuristic_checks(text: str) -> dict[str, bool]:
    """The four no-ground-truth checks of :func:`heuristic`."""
    words = len(text.split())
    lines = [line for line in text.splitlines() if line.strip()]
    return {"has_number": any(ch.isdigit() for ch in text),
            "shows_operations": bool(_OPERATION.search(text)),
            "reasonable_length": HEURISTIC_WORDS[0] <= words <= HEURISTIC_WORDS[1],
            "step_structure": len(lines) >= 3 or bool(_STEP.search(text))}


def heuristic(completions, fmt: AnswerFormat = HASH_FORMAT, **kwargs) -> list[float]:
    """0.5 per satisfied check (contains a number, shows an operation or ``=``,
    10-300 words, at least 3 lines or step words). No ground truth: it can be hacked."""
    return _safe(lambda t: HEURISTIC_CREDIT * sum(heuristic_checks(t).values()),
                 completions, 0.0)


REWARD_FUNCTIONS: dict[str, RewardFn] = {
    "exact_format": exact_format,
    "approximate_format": approximate_format,
    "correctness": correctness,
    "number_extraction": number_extraction,
    "heuristic": heuristic,
    "intermediate_results": intermediate_results,
    "grounded_steps": grounded_steps,
}
for _name, _fn in REWARD_FUNCTIONS.items():  # TRL logs rewards/<__name__>
    assert _fn.__name__ == _name


def reward_for(name: str, fmt: AnswerFormat = HASH_FORMAT) -> RewardFn:
    """The registry reward ``name`` bound to ``fmt``, keeping its ``__name__`` (for TRL's logs)."""
    fn = REWARD_FUNCTIONS[check_reward_names([name])[0]]
    if fmt == HASH_FORMAT:
        return fn

    def bound(completions, **kwargs):
        kwargs.pop("fmt", None)
        return fn(completions, fmt=fmt, **kwargs)

    bound.__name__ = bound.__qualname__ = name
    bound.__doc__ = fn.__doc__
    return bound


def _default_weights() -> dict[str, float]:
    return dict(GRPOConfig().reward_weights)


def check_reward_names(names: Iterable[str]) -> list[str]:
    names = list(names)
    unknown = [n for n in names if n not in REWARD_FUNCTIONS]
    if unknown:
        raise ValueError(f"unknown reward name(s) {unknown}; choose from "
                         f"{', '.join(REWARD_FUNCTIONS)}")
    return names


#: rewards that read a dataset column besides ``answer``
NEEDS_SOLUTION = ("intermediate_results", "grounded_steps")


def score_completions(completions: Sequence[Any], answers: Any = None,
                      names: Iterable[str] | None = None,
                      fmt: AnswerFormat = HASH_FORMAT,
                      solutions: Any = None) -> dict[str, list[float]]:
    """Every named reward of ``completions``: ``{name: [float, ...]}``. The default names are
    all rewards, less those that read gold ``solutions`` when none are given."""
    if names is None:
        names = [n for n in REWARD_FUNCTIONS if solutions is not None or n not in NEEDS_SOLUTION]
    names = check_reward_names(names)
    completions = list(completions)
    return {n: REWARD_FUNCTIONS[n](completions, answer=answers, fmt=fmt, solution=solutions)
            for n in names}


def weighted_sum(rewards_by_name: dict[str, Sequence[float]],
                 weights: dict[str, float]) -> list[float]:
    """``sum_k weights[k] * rewards_by_name[k]`` per completion (names not weighted count 0)."""
    missing = [n for n in weights if n not in rewards_by_name]
    if missing:
        raise ValueError(f"weights name {missing} but the rewards given are "
                         f"{list(rewards_by_name)}")
    lengths = {len(v) for v in rewards_by_name.values()}
    if len(lengths) > 1:
        raise ValueError(f"reward lists have different lengths {sorted(lengths)}")
    n = lengths.pop() if lengths else 0
    return [float(sum(w * rewards_by_name[k][i] for k, w in weights.items())) for i in range(n)]


def combined(completions, answer=None, weights: dict[str, float] | None = None,
             fmt: AnswerFormat = HASH_FORMAT, solution=None, **kwargs) -> list[float]:
    """The weighted sum of the registry rewards (default weights: the trainer's,
    ``GRPOConfig().reward_weights``)."""
    weights = _default_weights() if weights is None else dict(weights)
    scores = score_completions(completions, answer, names=weights, fmt=fmt, solutions=solution)
    return weighted_sum(scores, weights)


# ---------------------------------------------------------------- a step's rewards
def default_rewards(weights: dict[str, float]) -> dict[str, Callable]:
    """The course's reward functions that ``weights`` names, by name (unknown names are a
    :class:`~grpo_course.config.ConfigError`)."""
    unknown = [n for n in weights if n not in REWARD_FUNCTIONS]
    if unknown:
        raise ConfigError(f"reward_weights names unknown reward(s) {unknown}; "
                          f"choose from {', '.join(REWARD_FUNCTIONS)}")
    return {n: REWARD_FUNCTIONS[n] for n in weights}


def checked_rewards(name: str, values, expected: int) -> torch.Tensor:
    """Reward function ``name``'s output as a float64 tensor (the values as given), or
    :class:`RewardError` naming the function when it is not ``expected`` finite numbers (one
    per completion)."""
    try:
        rewards = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise RewardError(f"reward function {name!r} returned {type(values).__name__}, not "
                          f"{expected} numbers ({exc})") from None
    if rewards.numel() != expected:
        raise RewardError(f"reward function {name!r} returned {rewards.numel()} rewards for "
                          f"{expected} completions")
    bad = (~torch.isfinite(rewards)).nonzero().flatten().tolist()
    if bad:
        raise RewardError(f"reward function {name!r} returned {rewards[bad[0]].item()} for "
                          f"completion {bad[0]} (rewards must be finite numbers)")
    return rewards


def score_groups(completions: list, rows: dict[str, list], reward_funcs: dict[str, Callable],
                 weights: dict[str, float], G: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Weighted reward [B] and each function's rewards of ``completions`` (G per prompt of
    ``rows``); every column but ``question`` reaches the rewards as a keyword list, repeated G
    times (as in TRL). A function left out of ``weights`` is scored with weight 0.

    The weighted sum is :func:`grpo_course.core.rewards.weighted_sum`'s, of the values as the
    functions returned them, rounded to float32 once: the very rewards of a step written out
    with ``score_completions`` and ``weighted_sum`` (chapter 3). One float32 ulp apart, the two
    steps' advantages differ in the last float32 place, and a frozen base held in bf16 turns that
    into different bf16 roundings and visibly different gradients."""
    columns = {k: [v for v in values for _ in range(G)] for k, values in rows.items()
               if k != "question"}
    per_func = {n: checked_rewards(n, fn(completions, **columns), len(completions))
                for n, fn in reward_funcs.items()}
    total = weighted_sum({n: r.tolist() for n, r in per_func.items()}, weights)
    return (torch.tensor(total, dtype=torch.float32),
            {n: r.float() for n, r in per_func.items()})


def correct_completions(per_func: dict[str, torch.Tensor]) -> int | None:
    """How many sampled completions the ``correctness`` reward scored as exactly right (its top
    tier: the only ones that can teach correctness), or ``None`` when the run has no
    ``correctness`` reward."""
    scores = per_func.get("correctness")
    return None if scores is None else int((scores >= EXACT_REWARD).sum())


def correct_mixed_groups(per_func: dict[str, torch.Tensor], group_size: int) -> int | None:
    """How many sampled groups hold both an exactly right answer and a wrong one (the groups
    whose correctness reward teaches), or ``None`` when the run has no ``correctness`` reward."""
    scores = per_func.get("correctness")
    if scores is None:
        return None
    right = (scores >= EXACT_REWARD).float().view(-1, group_size).mean(1)
    return int(((right > 0) & (right < 1)).sum())


def run_rewards(config: GRPOConfig, reward_funcs: dict[str, Callable] | None = None) -> dict[str, Callable]:
    """A run's reward functions by name: ``reward_funcs``, or the course's that
    ``config.reward_weights`` names, and ``config.dynamic_sampling_reward``'s (scored for DAPO's
    filter with weight 0). A name that is neither is a :class:`~grpo_course.config.ConfigError`."""
    funcs = dict(reward_funcs or default_rewards(config.reward_weights))
    name = config.dynamic_sampling_reward
    if name is not None and name not in funcs:
        if name not in REWARD_FUNCTIONS:
            raise ConfigError(f"dynamic_sampling_reward {name!r} is neither one of the run's "
                              f"rewards ({', '.join(funcs)}) nor a course reward "
                              f"({', '.join(REWARD_FUNCTIONS)}); or none")
        funcs[name] = REWARD_FUNCTIONS[name]
    missing = [n for n in config.reward_weights if n not in funcs]
    if missing:
        raise ConfigError(f"reward_weights names {missing}, absent from reward_funcs")
    return funcs
