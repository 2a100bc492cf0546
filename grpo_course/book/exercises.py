"""Coding exercises: test a student's function against the course's on random and edge cases.

Each exercise's check cell calls :func:`check` with the student's function, the course's
function (the reference) and cases from one of the ``*_cases`` generators below, each of which
mixes random cases with the edge cases (tied groups, G = 1, padded rows, empty input). The
reference's answers are computed first; while the student's function runs, the reference is
switched off (:func:`reference_hidden`: calling it, by any name, raises), so a function that just
calls the course's cannot pass. The calls are traced as well
(:class:`CallWatch`, a ``sys.setprofile`` hook): a candidate that calls any function of the
``grpo_course`` package at any depth (other than the ones an exercise allows) or a library function
that does the exercise's work (``forbid``, e.g. :data:`TORCH_QUANTIZERS`) fails, with a line naming
it. The check prints one line: passed, not written yet (the stub still raises
``NotImplementedError``), or the first case that fails with its inputs, what came back, the value
expected and where the two first differ - never code - so the notebook runs top to bottom before
the exercise is done.
"""
from __future__ import annotations

import contextlib
import math
import os
import random
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import CodeType, FrameType
from typing import Any

import torch

from grpo_course.core.answers import answers_match, extract_hash_answer
from grpo_course.core.grpo import clipped_surrogate, zero_std_groups
from grpo_course.core.rewards import completion_text
from grpo_course.measure.profiling import Limits, RooflinePoint
from grpo_course.measure.stats import linear_trend, mcnemar_test, paired_difference

Case = tuple[tuple, dict]


def _same(got: Any, expected: Any, atol: float = 1e-5, rtol: float = 1e-4) -> bool:
    if isinstance(expected, torch.Tensor):
        return isinstance(got, torch.Tensor) and got.shape == expected.shape and \
            torch.allclose(got.float(), expected.float(), atol=atol, rtol=rtol)
    if isinstance(expected, float) or isinstance(got, float):
        try:
            return math.isclose(float(got), float(expected), abs_tol=atol, rel_tol=rtol)
        except (TypeError, ValueError):
            return False
    if isinstance(expected, (list, tuple)):
        return isinstance(got, (list, tuple)) and len(got) == len(expected) and \
            all(_same(g, e, atol, rtol) for g, e in zip(got, expected, strict=False))
    if isinstance(expected, dict):
        return isinstance(got, dict) and set(got) == set(expected) and \
            all(_same(got[k], e, atol, rtol) for k, e in expected.items())
    return got == expected


def _short(value: Any, limit: int = 160) -> str:
    if isinstance(value, torch.Tensor):
        text = f"tensor{tuple(value.shape)} {value.flatten()[:8].tolist()}"
    elif isinstance(value, dict):
        text = "{" + ", ".join(f"{k}: {_short(v, 40)}" for k, v in list(value.items())[:4]) + "}"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _at(value: Any, index: tuple[int, ...]) -> str:
    return f"{value[index].item():.6g}" if value.dim() else f"{value.item():.6g}"


def _difference(got: Any, expected: Any, atol: float = 1e-5, rtol: float = 1e-4) -> str | None:
    """Where ``got`` first differs from ``expected`` (as :func:`_same` compares them): the index of
    a tensor or a list, the key of a dict; None when they agree or there is nothing to point at."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"returned a {type(got).__name__}, expected a tensor of shape {tuple(expected.shape)}"
        if got.shape != expected.shape:
            return f"shapes differ: returned {tuple(got.shape)}, expected {tuple(expected.shape)}"
        close = torch.isclose(got.float(), expected.float(), atol=atol, rtol=rtol)
        if bool(close.all()):
            return None
        index = tuple(int(i) for i in (~close).nonzero()[0]) if close.dim() else ()
        where = f"index {index[0] if len(index) == 1 else index}" if index else "the value"
        return (f"first difference at {where}: returned {_at(got, index)}, expected "
                f"{_at(expected, index)} (shapes {tuple(got.shape)} and {tuple(expected.shape)}, "
                f"tolerance atol={atol:g}, rtol={rtol:g})")
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)):
            return f"returned a {type(got).__name__}, expected a {type(expected).__name__}"
        if len(got) != len(expected):
            return f"lengths differ: returned {len(got)} items, expected {len(expected)}"
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            if not _same(g, e, atol, rtol):
                inner = _difference(g, e, atol, rtol)
                return (f"at item {i}: {inner}" if inner and isinstance(e, (torch.Tensor, list, tuple, dict))
                        else f"first difference at index {i}: returned {_short(g, 60)}, expected "
                             f"{_short(e, 60)} (length {len(expected)}, tolerance atol={atol:g}, "
                             f"rtol={rtol:g})")
        return None
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return f"returned a {type(got).__name__}, expected a dict"
        if set(got) != set(expected):
            missing, extra = sorted(map(str, set(expected) - set(got))), sorted(map(str, set(got) - set(expected)))
            return f"keys differ: missing {missing}, unexpected {extra}"
        for key, e in expected.items():
            if not _same(got[key], e, atol, rtol):
                inner = _difference(got[key], e, atol, rtol)
                return f"first difference at key {key!r}: " + (
                    inner or f"returned {_short(got[key], 60)}, expected {_short(e, 60)}")
    return None


class ReferenceHidden(RuntimeError):
    """The exercise's reference was called while the student's function ran."""


def _blocked(*args, **kwargs):
    # runs as the reference's code, so with the reference module's globals: import by name
    hidden = __import__("grpo_course.book.exercises", fromlist=["ReferenceHidden"]).ReferenceHidden
    raise hidden("the course's version is switched off while your function runs")


@contextlib.contextmanager
def reference_hidden(*functions: Callable) -> Iterator[None]:
    """Within the block, calling any of ``functions`` by any name raises
    :class:`ReferenceHidden`: each one's code is swapped for one that raises (plain functions
    without a closure; others are left as they are), and put back on the way out."""
    saved = {}
    try:
        for fn in functions:
            code = getattr(fn, "__code__", None)
            if code is not None and not code.co_freevars and fn not in saved:
                saved[fn] = code
                fn.__code__ = _blocked.__code__
        yield
    finally:
        for fn, code in saved.items():
            fn.__code__ = code


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep   # grpo_course/

#: library functions that compute chapter 3's per-token log-probabilities for you (TRL's)
TOKEN_LOGP_SHORTCUTS = ("trl.trainer.utils.selective_log_softmax",)

#: torch functions that quantize for you: chapter 6's exercises forbid them
TORCH_QUANTIZERS = ("torch.fake_quantize_per_channel_affine", "torch.fake_quantize_per_tensor_affine",
                    "torch.quantize_per_channel", "torch.quantize_per_tensor",
                    "torch.quantize_per_tensor_dynamic", "torch.fused_moving_avg_obs_fake_quant",
                    "torch.ao.quantization.fake_quantize", "torch.ao.quantization.observer")


def _short_name(fn: Callable | str) -> str:
    return fn.rsplit(".", 1)[-1] if isinstance(fn, str) else getattr(fn, "__name__", repr(fn))


def _dotted(fn: Callable) -> str:
    module = getattr(fn, "__module__", None)
    return f"{module}.{_short_name(fn)}" if module else _short_name(fn)


class CallWatch:
    """A ``sys.setprofile`` hook that records the first call the candidate must not make: into the
    ``grpo_course`` package (any depth, except inside the ``allow``ed functions), of the hidden
    reference, or of a ``forbid``den library function (C builtins arrive as ``c_call`` events;
    ``torch.ops`` calls, and Python functions of a forbidden module prefix, as ``call`` events)."""

    def __init__(self, allow: Iterable[Callable] = (), forbid: Iterable[Callable | str] = ()) -> None:
        self.allowed: set[CodeType] = {f.__code__ for f in allow if hasattr(f, "__code__")}
        self.forbidden = {_short_name(f): f if isinstance(f, str) else _dotted(f) for f in forbid}
        self.inside: FrameType | None = None          # an allowed call in progress: not watched
        self.found: str | None = None                 # what was called, for the message
        self.reference = False                        # the hidden reference itself was called

    def _flag(self, what: str) -> None:
        if self.found is None:
            self.found = what

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.found is not None:
            return
        if self.inside is not None:
            if event == "return" and frame is self.inside:
                self.inside = None
            return
        if event == "c_call":
            name = getattr(arg, "__name__", None)
            if name in self.forbidden:
                self._flag(self.forbidden[name])
            elif arg is sys.setprofile and frame.f_code is not _watched.__code__:
                self._flag("sys.setprofile")          # switching the watch off
            return
        if event != "call":
            return
        code = frame.f_code
        if code in self.allowed:
            self.inside = frame
        elif code is _blocked.__code__:
            self.reference = True
            self._flag("the course's version")
        elif code.co_filename.startswith(_PACKAGE):
            self._flag(f"{frame.f_globals.get('__name__', 'grpo_course')}.{code.co_qualname}")
        elif self.forbidden:
            module = str(frame.f_globals.get("__name__", ""))
            if module == "torch._ops" and code.co_name == "__call__":
                op = getattr(frame.f_locals.get("self"), "__name__", "")
                if op.split(".")[0] in self.forbidden:
                    self._flag(self.forbidden[op.split(".")[0]])
            else:                                     # a forbidden module, or one Python function
                qualified = f"{module}.{code.co_qualname}"
                hit = next((f for f in self.forbidden.values()
                            if qualified == f or qualified.startswith(f + ".")), None)
                if hit is not None:
                    self._flag(hit)


def _watched(watch: CallWatch, fn: Callable, args: tuple, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)`` with ``watch`` as the profiler; the previous one is put back, also on
    errors (nothing of this package runs in between, so nothing of it is seen)."""
    previous = sys.getprofile()
    sys.setprofile(watch)
    try:
        return fn(*args, **kwargs)
    finally:
        sys.setprofile(previous)


#: the last verdict of :func:`check` for each function it checked, by name: (function, verdict)
_VERDICTS: dict[str, tuple[Callable, bool | None]] = {}


def check(candidate: Callable, reference: Callable, cases: Sequence[Case],
          name: str | None = None, compare: Callable[[Any, Any], bool] = _same,
          hide: Sequence[Callable] = (), allow: Sequence[Callable] = (),
          forbid: Sequence[Callable | str] = ()) -> bool | None:
    """Run ``candidate`` on every case ``(args, kwargs)`` against ``reference``'s answer and print
    one line. ``reference`` and the helpers in ``hide`` (course functions that would do the
    exercise's work) are switched off while ``candidate`` runs, and its calls are traced: calling
    into ``grpo_course`` (except the functions in ``allow`` and what they call) or any of
    ``forbid`` (callables or dotted names, e.g. :data:`TORCH_QUANTIZERS`) fails the case.

    Returns True when every case agrees, False at the first disagreement, exception or forbidden
    call, and None while the candidate still raises ``NotImplementedError``. The verdict is kept
    for :func:`yours_or_course`."""
    name = name or getattr(candidate, "__name__", "your function")
    verdict = _run_cases(candidate, reference, cases, name, compare, hide, allow, forbid)
    _VERDICTS[getattr(candidate, "__name__", name)] = (candidate, verdict)
    return verdict


def yours_or_course(yours: Callable, course: Callable, part: str) -> Callable:
    """``yours`` where its last :func:`check` passed and it is still the function checked, else the
    course's ``course``; prints one line saying which one runs as ``part`` (chapter 3's loop runs
    the student's parts this way)."""
    name = getattr(yours, "__name__", "your function")
    checked, verdict = _VERDICTS.get(name, (None, None))
    if checked is yours and verdict:
        print(f"{part}: yours ({name}, its check passed)")
        return yours
    why = ("its check has not run" if checked is None
           else "it changed after its check: run the check again" if checked is not yours
           else "not written yet" if verdict is None else "its check did not pass")
    print(f"{part}: the course's version ({name}: {why})")
    return course


def _run_cases(candidate: Callable, reference: Callable, cases: Sequence[Case], name: str,
               compare: Callable[[Any, Any], bool], hide: Sequence[Callable],
               allow: Sequence[Callable], forbid: Sequence[Callable | str]) -> bool | None:
    expected_all = [reference(*args, **kwargs) for args, kwargs in cases]
    hidden_names = ", ".join(f"`{_short_name(f)}`" for f in (reference, *hide))
    with reference_hidden(reference, *hide):
        for k, ((args, kwargs), expected) in enumerate(zip(cases, expected_all, strict=False), 1):
            watch = CallWatch(allow, forbid)
            error: Exception | None = None
            try:
                got = _watched(watch, candidate, args, kwargs)
            except Exception as err:  # the student sees the error, not a traceback
                error = err
            if watch.reference or isinstance(error, ReferenceHidden):
                print(f"{name}: it calls the course's version ({hidden_names}), the work this "
                      f"exercise asks you to write - compute the result yourself")
                return False
            if watch.found is not None:
                where = ("from the course's package" if watch.found.startswith("grpo_course")
                         else "which switches the check's call tracing off"
                         if watch.found == "sys.setprofile"
                         else "a library function that does this exercise's work")
                print(f"{name}: case {k} calls `{watch.found}`, {where} - write the exercise "
                      f"without it")
                return False
            if isinstance(error, NotImplementedError):
                print(f"{name}: not written yet - replace `raise NotImplementedError` and run the "
                      f"check again")
                return None
            if error is not None:
                print(f"{name}: case {k} raised {type(error).__name__}: {error}\n  inputs: "
                      f"{_short(args)} {_short(kwargs) if kwargs else ''}")
                return False
            if not compare(got, expected):
                where = _difference(got, expected) if compare is _same else None
                print(f"{name}: case {k} of {len(cases)} differs\n  inputs:   {_short(args)} "
                      f"{_short(kwargs) if kwargs else ''}\n  returned: {_short(got)}\n"
                      f"  expected: {_short(expected)}" + (f"\n  where:    {where}" if where else ""))
                return False
    print(f"{name}: all {len(cases)} cases pass")
    return True


# ---------------------------------------------------------------- case generators
def answer_cases(n: int = 30, seed: int = 0) -> list[Case]:
    """GSM8K-style texts ending in ``#### <number>`` (commas, dollars, decimals, negatives),
    and some with no answer line."""
    rng = random.Random(seed)
    cases = []
    for k in range(n):
        value = rng.choice([rng.randint(0, 99), rng.randint(1000, 999999), -rng.randint(1, 50),
                            round(rng.uniform(0, 100), 2)])
        text = f"{value:,}" if isinstance(value, int) and abs(value) >= 1000 and rng.random() < 0.7 \
            else str(value)
        if rng.random() < 0.3:
            text = "$" + text
        body = f"She buys {rng.randint(2, 9)} boxes.\nEach costs {rng.randint(2, 9)} dollars."
        cases.append(((body if k % 7 == 6 else f"{body}\n#### {text}",), {}))
    return cases


def completion_cases(n: int = 24, seed: int = 0) -> list[Case]:
    """Batches of completions whose answer slot holds an integer, a decimal, a word or nothing
    (as lists of strings, TRL's standard format)."""
    rng = random.Random(seed)
    endings = ["#### 42", "#### 3.5", "#### 1,200", "#### -7", "#### ten", "", "#### 0.25", "#### 18"]
    return [(([f"Step {i}: ... {rng.choice(endings)}" for i in range(rng.randint(1, 6))],), {})
            for _ in range(n)]


def integer_answer(completions, **kwargs) -> list[float]:
    """Chapter 2's exercise, the course's version: 1.0 when the answer slot holds a whole
    number, else 0.0; never raises."""

    out = []
    for c in completions:
        try:
            answer = extract_hash_answer(completion_text(c))
            out.append(1.0 if answer is not None and float(answer) == int(float(answer)) else 0.0)
        except Exception:
            out.append(0.0)
    return out


def reward_group_cases(n: int = 30, seed: int = 0) -> list[Case]:
    """Rewards ``[P * G]`` with G in {2, 4, 8}, some groups tied, and the group size G; then the
    edges: G = 1 (every group a tie), a whole batch tied, and no rewards at all."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        G, P = rng.choice([2, 4, 8]), rng.randint(1, 4)
        rewards = torch.randint(0, 4, (P, G), generator=gen).float() * 0.5
        for p in range(P):
            if rng.random() < 0.3:
                rewards[p] = rewards[p, 0]              # a tied group: no learning signal
        cases.append(((rewards.view(-1), G), {}))
    return cases + [((torch.tensor([1.0, 2.0, 3.0]), 1), {}), ((torch.full((8,), 2.5), 4), {}),
                    ((torch.zeros(0), 4), {})]


def ewc_cases(n: int = 10, seed: int = 0) -> list[Case]:
    """``(params, anchor_params, fisher, lam)`` with a few named tensors of random shapes."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        names = [f"layer{k}.lora_A" for k in range(rng.randint(1, 3))]
        shapes = {m: (rng.randint(1, 4), rng.randint(1, 5)) for m in names}
        params = {m: torch.randn(s, generator=gen) for m, s in shapes.items()}
        anchors = {m: torch.randn(s, generator=gen) for m, s in shapes.items()}
        fisher = {m: torch.rand(s, generator=gen) for m, s in shapes.items()}
        cases.append(((params, anchors, fisher, rng.choice([0.0, 1.0, 10.0, 1e3])), {}))
    return cases


def weight_cases(n: int = 10, seed: int = 0) -> list[Case]:
    """Weight matrices ``[out, in]`` whose rows have very different ranges (as real layers do)."""
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for k in range(n):
        rows, cols = 2 + k % 5, 3 + k
        scale = torch.logspace(-3, 0, rows)[:, None]
        cases.append(((torch.randn(rows, cols, generator=gen) * scale,), {}))
    return cases


def fake_quant_per_channel(weight: torch.Tensor) -> torch.Tensor:
    """Chapter 6's exercise, the course's version: symmetric INT8 per output row (scale = the
    row's largest |w| / 127), rounded, clamped to [-127, 127], and mapped back to floats."""
    q, scale = quantize_per_channel(weight)
    return q.to(weight.dtype) * scale


def roofline_cases(n: int = 20, seed: int = 0) -> list[Case]:
    """``(intensity, peak_gflops, bandwidth)``: FLOP/byte, GFLOP/s and GB/s on both sides of
    the ridge."""
    rng = random.Random(seed)
    return [((10 ** rng.uniform(-1, 3), rng.uniform(50, 3000), rng.uniform(5, 200)), {})
            for _ in range(n)]


def roofline_bound(intensity: float, peak_gflops: float, bandwidth: float) -> float:
    """Chapter 7's exercise, the course's version: the GFLOP/s the roofline allows."""

    return RooflinePoint("x", flops=intensity, bytes=1.0, seconds=1e-9).bound(
        Limits(gflops=peak_gflops, bandwidth=bandwidth))


def frac_reward_zero_std(rewards: torch.Tensor, group_size: int) -> float:
    """Chapter 4's exercise, the course's version: the share of groups whose rewards all tie
    (TRL logs it as ``frac_reward_zero_std``); 0.0 for no groups."""

    tied = zero_std_groups(rewards, group_size)
    return float(tied.float().mean()) if tied.numel() else 0.0


# ---------------------------------------------------------------- more exercises (two a chapter)
def number_cases(n: int = 24, seed: int = 0) -> list[Case]:
    """Chapter 1: answer strings as models and GSM8K write them - thousands commas, dollars,
    percent signs, trailing zeros and dots, fractions, exponents, a Unicode minus - and the
    edges: empty, blank, a word, a zero denominator."""
    rng = random.Random(seed)
    fixed = ["1,200", "$3.50", "-7", "7.0", "0.250", "12.", "3/4", "-0", "45%", "  18 ", "",
             "   ", "ten", "5/0", "1e3", "\u22124", "$1,000.50"]
    drawn = []
    for _ in range(max(n - len(fixed), 0)):
        value = rng.choice([rng.randint(0, 10 ** 6), -rng.randint(1, 99),
                            round(rng.uniform(0, 500), rng.randint(1, 3))])
        text = f"{value:,}" if rng.random() < 0.5 else str(value)
        drawn.append(("$" if rng.random() < 0.3 else "") + text)
    return [((text,), {}) for text in fixed + drawn]


def tiered_completion_cases(n: int = 20, seed: int = 0) -> list[Case]:
    """Chapter 2: batches of completions (plain strings and TRL's conversational message lists)
    with their gold answers as the ``answer`` keyword: exact, within 10 % and 20 % of the gold,
    wrong, with no answer - and an empty batch."""
    rng = random.Random(seed)
    cases: list[Case] = [(([],), {"answer": []})]
    for _ in range(n):
        size = rng.randint(1, 5)
        golds = [str(rng.randint(10, 500)) for _ in range(size)]
        completions = []
        for gold in golds:
            g = int(gold)
            guess = rng.choice([gold, f"{g * 1.05:.2f}", f"{g * 1.15:.2f}", str(g * 3 + 1),
                                f"{g:,}", None])
            text = f"{g // 2} + {g - g // 2} = {g}\n" + (f"#### {guess}" if guess else "so done")
            completions.append([{"role": "assistant", "content": text}] if rng.random() < 0.4
                               else text)
        cases.append(((completions,), {"answer": golds}))
    return cases


def loss_cases(n: int = 24, seed: int = 0) -> list[Case]:
    """Chapter 3: ``(per_token_loss [B, T], completion_mask [B, T], loss_type,
    max_completion_length)`` for every loss type, with padded rows (some with no real token)
    and a batch of one."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    cases = []
    for k in range(n):
        B, T = rng.choice([1, 2, 4, 6]), rng.randint(1, 7)
        per_token = torch.randn(B, T, generator=gen)
        lengths = torch.tensor([rng.randint(0 if k % 5 == 4 else 1, T) for _ in range(B)])
        mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
        loss_type = ("grpo", "bnpo", "dapo", "dr_grpo")[k % 4]
        cases.append(((per_token, mask, loss_type, T), {}))
    return cases


def exact_answer_reward(completions, answer=None, **kwargs) -> list[float]:
    """Chapter 4's second exercise, the course's version: a TRL reward function for
    conversational completions - 1.0 when the ``####`` answer is the gold number, else 0.0."""

    return [1.0 if answers_match(extract_hash_answer(completion_text(c)), str(gold)) else 0.0
            for c, gold in zip(completions, answer or [], strict=False)]


def conversational_cases(n: int = 16, seed: int = 0) -> list[Case]:
    """Chapter 4: what ``GRPOTrainer`` passes a reward function for a conversational dataset:
    ``completions`` as one-message lists, the dataset's ``answer`` column as a keyword, and
    other keywords (``prompts``, ``completion_ids``, ``trainer_state``) to ignore; with an
    empty message, a missing answer line and an empty batch."""
    rng = random.Random(seed)
    cases: list[Case] = [(([],), {"answer": [], "prompts": [], "completion_ids": []})]
    for _ in range(n):
        size = rng.randint(1, 4)
        golds = [str(rng.randint(1, 300)) for _ in range(size)]
        texts = [rng.choice([f"work\n#### {g}", f"work\n#### {int(g) + 1}", "no answer", "",
                             f"#### {int(g):,}.00"]) for g in golds]
        completions = [[{"role": "assistant", "content": t}] for t in texts]
        prompts = [[{"role": "user", "content": "a question"}] for _ in golds]
        cases.append(((completions,), {"answer": golds, "prompts": prompts,
                                       "completion_ids": [[1, 2, 3]] * size,
                                       "trainer_state": None}))
    return cases


def fisher_from_gradients(per_example_grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Chapter 5's second exercise, the course's version: the diagonal Fisher from per-example
    gradients ``{name: [N, ...]}`` - the mean over the N examples of each gradient squared."""
    return {name: (g.float() ** 2).mean(0) for name, g in per_example_grads.items()}


def gradient_cases(n: int = 10, seed: int = 0) -> list[Case]:
    """Chapter 5: ``{name: [N, ...]}`` per-example gradients of a few parameters, N = 1 included."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    cases = []
    for k in range(n):
        N = 1 if k == 0 else rng.randint(2, 6)
        shapes = {f"layer{j}.lora_{ab}": (rng.randint(1, 4), rng.randint(1, 5))
                  for j in range(rng.randint(1, 3)) for ab in "AB"}
        cases.append((({m: torch.randn(N, *s, generator=gen) for m, s in shapes.items()},), {}))
    return cases


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Chapter 6's second exercise, the course's version: symmetric per-row INT8 - ``q`` (int8,
    in [-127, 127]) and ``scale`` ([out, 1]: the row's largest |w| / 127, or 1 for a row of
    zeros), so that ``q * scale`` approximates ``weight``."""
    peak = weight.abs().amax(1, keepdim=True)
    scale = torch.where(peak > 0, peak / 127, torch.ones_like(peak))
    return torch.clamp(torch.round(weight / scale), -127, 127).to(torch.int8), scale


def int8_weight_cases(n: int = 10, seed: int = 0) -> list[Case]:
    """Chapter 6: :func:`weight_cases` plus the edges: a row of zeros, one column, one row."""
    gen = torch.Generator().manual_seed(seed + 1)
    zero_row = torch.randn(3, 4, generator=gen)
    zero_row[1] = 0.0
    return weight_cases(n, seed) + [((zero_row,), {}), ((torch.randn(5, 1, generator=gen),), {}),
                                    ((torch.randn(1, 6, generator=gen),), {})]


def matmul_intensity(m: int, n: int, k: int, bytes_per_element: int) -> float:
    """Chapter 7's second exercise, the course's version: the arithmetic intensity (FLOP per
    byte) of ``[m, k] @ [k, n]``: ``2 m n k`` FLOPs over reading both operands and writing the
    result once."""
    return 2 * m * n * k / (bytes_per_element * (m * k + k * n + m * n))


def matmul_cases(n: int = 20, seed: int = 0) -> list[Case]:
    """Chapter 7: products from a decode step (m = 1) to a training batch, fp32 and bf16."""
    rng = random.Random(seed)
    fixed = [(1, 576, 576, 4), (1, 49152, 576, 2), (2048, 576, 1536, 2), (1, 1, 1, 4)]
    drawn = [(rng.choice([1, 8, 64, 512]), rng.randint(1, 4096), rng.randint(1, 4096),
              rng.choice([2, 4])) for _ in range(n - len(fixed))]
    return [(args, {}) for args in fixed + drawn]


# ---------------------------------------------------------------- chapter 3's loop parts
def completion_token_logps(logits: torch.Tensor, completion_ids: torch.Tensor,
                           completion_mask: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p of each completion token ``[B, T]`` from the logits ``[B, T, V]`` that predict it, at
    ``temperature`` (log-softmax, then the sampled token's entry), 0 where the mask is 0."""
    logps = torch.log_softmax(logits.float() / temperature, dim=-1)              # [B, T, V]
    return logps.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1) * completion_mask


def token_logp_cases(n: int = 16, seed: int = 0) -> list[Case]:
    """Chapter 3: ``(logits [B, T, V], completion_ids [B, T], completion_mask [B, T],
    temperature)`` with padded rows (one with no real token), temperatures 1 and below, large
    logits (a log-softmax must not overflow), and a batch of one."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    cases = []
    for k in range(n):
        B, T, V = rng.choice([1, 2, 4]), rng.randint(1, 6), rng.choice([3, 7, 50])
        logits = torch.randn(B, T, V, generator=gen) * (40.0 if k % 7 == 6 else 2.0)
        ids = torch.randint(0, V, (B, T), generator=gen)
        lengths = torch.tensor([rng.randint(0 if k % 5 == 4 else 1, T) for _ in range(B)])
        mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
        cases.append(((logits, ids, mask, rng.choice([1.0, 1.0, 0.7])), {}))
    return cases


def clipped_surrogate_loss(per_token_logps: torch.Tensor, old_per_token_logps: torch.Tensor,
                           advantages: torch.Tensor, epsilon_low: float,
                           epsilon_high: float) -> torch.Tensor:
    """The per-token loss ``[B, T]`` of :func:`grpo_course.core.grpo.clipped_surrogate` (not its ratio)."""
    return clipped_surrogate(per_token_logps, old_per_token_logps, advantages, epsilon_low,
                             epsilon_high)[0]


def surrogate_cases(n: int = 24, seed: int = 0) -> list[Case]:
    """Chapter 3: ``(logps [B, T], old_logps [B, T], advantages [B, 1], epsilon_low,
    epsilon_high)``: ratios inside and far outside the clip range, advantages of both signs and
    zero, DAPO's clip-higher (epsilon_high above epsilon_low), and the first update (ratio 1)."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    cases = []
    for k in range(n):
        B, T = rng.choice([1, 2, 4]), rng.randint(1, 5)
        old = -torch.rand(B, T, generator=gen) * 3
        logps = old if k % 6 == 0 else old + torch.randn(B, T, generator=gen) * 0.5
        advantages = torch.randn(B, 1, generator=gen)
        if k % 4 == 3:
            advantages[0] = 0.0
        eps_low, eps_high = rng.choice([(0.2, 0.2), (0.2, 0.28), (0.1, 0.3)])
        cases.append(((logps, old, advantages, eps_low, eps_high), {}))
    return cases


def pass_at_k_cases(n: int = 30, seed: int = 0) -> list[Case]:
    """``(n, c, k)``: ``n`` samples of which ``c`` are right, and ``k <= n``; then the edges: no
    right sample, every sample right, ``k = n`` and ``k = 1``."""
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        total = rng.choice([4, 8, 16, 32])
        cases.append(((total, rng.randint(0, total), rng.randint(1, total)), {}))
    return cases + [((8, 0, 4), {}), ((8, 8, 4), {}), ((16, 3, 16), {}), ((16, 5, 1), {}),
                    ((16, 15, 2), {})]


def pool_cases(n: int = 20, seed: int = 0) -> list[Case]:
    """``(ids, correct, samples)``: screened prompt ids and each one's right answers among
    ``samples``, some never and some always right; then the edges: none mixed, all mixed, none."""
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        samples, size = rng.choice([2, 4, 8]), rng.randint(1, 12)
        ids = rng.sample(range(1000), size)
        correct = [rng.choice([0, 0, samples, rng.randint(0, samples)]) for _ in ids]
        cases.append(((ids, correct, samples), {}))
    return cases + [(([3, 1], [0, 8], 8), {}), (([5, 2, 9], [1, 7, 4], 8), {}), (([], [], 8), {})]


def mcnemar_p(a_correct: Sequence[bool], b_correct: Sequence[bool]) -> float:
    """The exact two-sided McNemar p-value of two models' answers (:func:`mcnemar_test`)."""
    return mcnemar_test(a_correct, b_correct)["p_value"]


def mcnemar_cases(n: int = 24, seed: int = 0) -> list[Case]:
    """``(a_correct, b_correct)``: two models' right/wrong answers to the same problems; then the
    edges: no discordant problem, all discordant one way, one discordant problem."""
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        size = rng.randint(1, 60)
        a = [rng.random() < 0.3 for _ in range(size)]
        b = [x if rng.random() < 0.8 else not x for x in a]
        cases.append(((a, b), {}))
    return cases + [(([True, False], [True, False]), {}), (([False] * 7, [True] * 7), {}),
                    (([False, True, True], [True, True, True]), {})]


def trend_slope(values: Sequence[float]) -> float:
    """The least-squares slope of ``values`` against their index (:func:`linear_trend`)."""
    return linear_trend(values)["slope"]


def trend_cases(n: int = 20, seed: int = 0) -> list[Case]:
    """``(values,)``: a noisy line of 3 to 40 points; then a flat and an exactly straight one."""
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        size, slope = rng.randint(3, 40), rng.uniform(-0.2, 0.2)
        cases.append((([slope * i + rng.gauss(0, 1) for i in range(size)],), {}))
    return cases + [(([1.0, 1.0, 1.0, 1.0],), {}), (([0.0, 0.5, 1.0, 1.5, 2.0],), {})]


def wilson_cases(n: int = 24, seed: int = 0) -> list[Case]:
    """``(successes, n)``; then the edges: none right, all right, n = 1 and n = 0."""
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        total = rng.choice([8, 64, 128, 512, 1319])
        cases.append(((rng.randint(0, total), total), {}))
    return cases + [((0, 128), {}), ((128, 128), {}), ((1, 1), {}), ((0, 0), {})]


def paired_interval(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """The mean of ``b - a`` and its 95 % paired t interval (:func:`paired_difference`)."""
    d = paired_difference(a, b)
    return (d["difference"], d["lo"], d["hi"])


def paired_cases(n: int = 20, seed: int = 0) -> list[Case]:
    """``(a, b)``: each problem's share of right samples before and after (of 8), 2 to 256
    problems, with differences that vary."""
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        size = rng.randint(2, 256)
        a = [rng.randint(0, 8) / 8 for _ in range(size)]
        b = [min(1.0, max(0.0, x + rng.choice([-1, 0, 0, 1, 2]) / 8)) for x in a]
        cases.append(((a, b), {}))
    return cases + [(([0.0, 0.5], [0.5, 0.5]), {}), (([0.25, 0.5, 0.75], [0.5, 0.5, 1.0]), {})]


def tool_text_cases(n: int = 24, seed: int = 0) -> list[Case]:
    """Page 5b: ``(text,)``: GSM8K-like work with annotations the calculator evaluates, ones it
    does not (a name, ``**``, a division by 0, an unclosed one), and none; for
    :func:`~grpo_course.core.calculator.tool_spans` and
    :func:`~grpo_course.core.calculator.forced_text` (a prefix ending at an annotation's ``=``)."""
    rng = random.Random(seed)
    ops = ["+", "-", "*", "/"]
    cases = []
    for k in range(n):
        parts = []
        for _ in range(rng.randint(0, 3)):
            a, b = rng.randint(1, 400), rng.randint(1, 60)
            expression = f"{a}{rng.choice(ops)}{b}" if k % 5 else f"({a}+{b})*{rng.randint(2, 9)}.5"
            result = rng.choice(["", str(rng.randint(0, 999))])
            parts.append(f"So {a} and {b} give <<{expression}={result}>>{result} then")
        text = " ".join(parts) + f"\n#### {rng.randint(0, 999)}"
        if k % 3 == 0:                                         # a prefix cut at an annotation's "="
            text = f"{text[:rng.randint(0, len(text))]} <<{rng.randint(1, 99)}*{rng.randint(2, 9)}="
        cases.append(((text,), {}))
    odd = ["", "no tool here\n#### 5", "<<__import__('os')=>>", "<<9**9**9=", "<<1/0=", "<<3+4=7>>7 <<",
           "<<12/5=", "<<1,200*3=3,600>>3,600", "a <<2+2=5>>5 b <<7*6=42>>42", "<<48/2=24>> so <<24+"]
    return cases + [((t,), {}) for t in odd]
