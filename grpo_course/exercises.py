"""Coding exercises: test a student's function against the course's on random inputs.

Each chapter has one exercise whose check cell calls :func:`check` with the student's
function, the course's function and cases from one of the ``*_cases`` generators below.
The check prints one line: passed, not written yet (the stub still raises
``NotImplementedError``), or the first case that fails with what was expected, so the
notebook runs top to bottom before the exercise is done and never shows a solution.
"""
from __future__ import annotations

import math
import random
from typing import Any, Callable, Sequence

import torch

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
            all(_same(g, e, atol, rtol) for g, e in zip(got, expected))
    return got == expected


def _short(value: Any, limit: int = 160) -> str:
    if isinstance(value, torch.Tensor):
        text = f"tensor{tuple(value.shape)} {value.flatten()[:8].tolist()}"
    elif isinstance(value, dict):
        text = "{" + ", ".join(f"{k}: {_short(v, 40)}" for k, v in list(value.items())[:4]) + "}"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check(candidate: Callable, reference: Callable, cases: Sequence[Case],
          name: str | None = None, compare: Callable[[Any, Any], bool] = _same) -> bool | None:
    """Run ``candidate`` and ``reference`` on every case ``(args, kwargs)`` and print one line.

    Returns True when every case agrees, False at the first disagreement or exception, and
    None while the candidate still raises ``NotImplementedError``."""
    name = name or getattr(candidate, "__name__", "your function")
    for k, (args, kwargs) in enumerate(cases, 1):
        expected = reference(*args, **kwargs)
        try:
            got = candidate(*args, **kwargs)
        except NotImplementedError:
            print(f"{name}: not written yet - replace `raise NotImplementedError` and run the "
                  f"check again")
            return None
        except Exception as err:  # noqa: BLE001 - the student sees the error, not a traceback
            print(f"{name}: case {k} raised {type(err).__name__}: {err}\n  inputs: "
                  f"{_short(args)} {_short(kwargs) if kwargs else ''}")
            return False
        if not compare(got, expected):
            print(f"{name}: case {k} of {len(cases)} differs\n  inputs:   {_short(args)} "
                  f"{_short(kwargs) if kwargs else ''}\n  returned: {_short(got)}\n"
                  f"  expected: {_short(expected)}")
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
    from .answers import extract_hash_answer
    from .rewards import completion_text

    out = []
    for c in completions:
        try:
            answer = extract_hash_answer(completion_text(c))
            out.append(1.0 if answer is not None and float(answer) == int(float(answer)) else 0.0)
        except Exception:  # noqa: BLE001
            out.append(0.0)
    return out


def reward_group_cases(n: int = 30, seed: int = 0) -> list[Case]:
    """Rewards ``[P * G]`` with G in {2, 4, 8}, some groups tied, and the group size G."""
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
    return cases


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
    scale = weight.abs().amax(1, keepdim=True).clamp(min=1e-12) / 127
    return torch.clamp(torch.round(weight / scale), -127, 127) * scale


def roofline_cases(n: int = 20, seed: int = 0) -> list[Case]:
    """``(intensity, peak_gflops, bandwidth)``: FLOP/byte, GFLOP/s and GB/s on both sides of
    the ridge."""
    rng = random.Random(seed)
    return [((10 ** rng.uniform(-1, 3), rng.uniform(50, 3000), rng.uniform(5, 200)), {})
            for _ in range(n)]


def roofline_bound(intensity: float, peak_gflops: float, bandwidth: float) -> float:
    """Chapter 7's exercise, the course's version: the GFLOP/s the roofline allows."""
    from .profiling import Limits, RooflinePoint

    return RooflinePoint("x", flops=intensity, bytes=1.0, seconds=1e-9).bound(
        Limits(gflops=peak_gflops, bandwidth=bandwidth))


def frac_reward_zero_std(rewards: torch.Tensor, group_size: int) -> float:
    """Chapter 4's exercise, the course's version: the share of groups whose rewards all tie
    (TRL logs it as ``frac_reward_zero_std``)."""
    from .grpo import zero_std_groups

    return float(zero_std_groups(rewards, group_size).float().mean())
