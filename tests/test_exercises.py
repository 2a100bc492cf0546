"""The exercise checker: a right answer passes, a wrong one fails with the case, a stub is 'not yet'."""
import pytest
import torch

from grpo_course.book import exercises as ex
from grpo_course.core.answers import extract_hash_answer
from grpo_course.core.grpo import group_advantages, zero_std_groups
from grpo_course.topics.curriculum import ewc_penalty


def stub(*args, **kwargs):
    raise NotImplementedError


def written_out(r, G):
    g = r.view(-1, G)
    std = g.std(1, keepdim=True) if G > 1 else torch.zeros_like(g)
    return ((g - g.mean(1, keepdim=True)) / (std + 1e-4)).reshape(-1)


def test_check_reports_pass_fail_and_not_yet(capsys):
    cases = ex.reward_group_cases()
    assert ex.check(written_out, group_advantages, cases) is True
    assert f"all {len(cases)} cases pass" in capsys.readouterr().out
    # a classic slip: the population std instead of the sample std (TRL and the course use Bessel)
    def biased(r, G):
        g = r.view(-1, G)
        return ((g - g.mean(1, keepdim=True)) / (g.std(1, unbiased=False, keepdim=True) + 1e-4)).view(-1)
    assert ex.check(biased, group_advantages, cases, name="biased") is False
    out = capsys.readouterr().out
    assert "biased: case" in out and "expected" in out
    assert ex.check(stub, group_advantages, cases, name="stub") is None
    assert "not written yet" in capsys.readouterr().out
    def crashes(r, G):
        raise KeyError("oops")
    assert ex.check(crashes, group_advantages, cases) is False
    assert "KeyError" in capsys.readouterr().out


def test_a_wrapper_around_the_reference_fails_by_any_name(capsys):
    import grpo_course.core.grpo as grpo
    from grpo_course.core.grpo import group_advantages as imported_name
    for wrapper in (lambda r, G: group_advantages(r, G), lambda r, G: grpo.group_advantages(r, G),
                    lambda r, G: imported_name(r, G, scale="group")):
        assert ex.check(wrapper, group_advantages, ex.reward_group_cases()) is False
        assert "calls the course's version (`group_advantages`)" in capsys.readouterr().out
    # and the reference works again afterwards
    assert group_advantages(torch.tensor([1.0, 3.0]), 2).tolist() == pytest.approx([-0.70706, 0.70706], abs=1e-4)


def test_reference_hidden_puts_the_code_back_even_on_an_error():
    with pytest.raises(KeyError):
        with ex.reference_hidden(ewc_penalty):
            with pytest.raises(ex.ReferenceHidden):
                ewc_penalty({}, {}, {}, 1.0)
            raise KeyError("interrupted")
    assert float(ewc_penalty({"w": torch.ones(1)}, {"w": torch.zeros(1)}, {"w": torch.ones(1)}, 2.0)) == 1.0


def test_cases_cover_the_edges():
    rewards = [args[0] for args, _ in ex.reward_group_cases()]
    Gs = [args[1] for args, _ in ex.reward_group_cases()]
    assert any(zero_std_groups(r, G).any() for r, G in zip(rewards, Gs, strict=False))       # tied groups
    assert any((~zero_std_groups(r, G)).any() for r, G in zip(rewards, Gs, strict=False))
    texts = [args[0] for args, _ in ex.answer_cases()]
    answers = [extract_hash_answer(t) for t in texts]
    assert None in answers and any(a and "." in a for a in answers) and any(a and a.startswith("-") for a in answers)
    assert any("," in t for t in texts) and any("$" in t for t in texts)


def test_every_exercise_reference_is_consistent_with_the_course():
    # chapter 2: integer answers
    scores = ex.integer_answer(["x #### 42", "x #### 3.5", "x #### 1,200", "no answer", "#### ten", None])
    assert scores == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    # chapter 4: TRL's frac_reward_zero_std
    def by_hand(r, G):
        g = r.view(-1, G)
        return float(((g.max(1).values - g.min(1).values) == 0).float().mean()) if g.numel() else 0.0
    assert ex.check(by_hand, ex.frac_reward_zero_std, ex.reward_group_cases()) is True
    # chapter 5: EWC written out equals the course's penalty
    def ewc_by_hand(params, anchors, fisher, lam):
        return lam / 2 * sum((fisher[n] * (params[n] - anchors[n]) ** 2).sum() for n in fisher)
    assert ex.check(ewc_by_hand, ewc_penalty, ex.ewc_cases()) is True
    # chapter 6: per-channel fake quantization keeps every row's error under half a step
    for (w,), _ in ex.weight_cases():
        step = w.abs().amax(1, keepdim=True) / 127
        assert ((ex.fake_quant_per_channel(w) - w).abs() <= step / 2 + 1e-7).all()
        per_tensor = torch.round(w / (w.abs().max() / 127)) * (w.abs().max() / 127)
        assert (ex.fake_quant_per_channel(w) - w).abs().mean() <= (per_tensor - w).abs().mean()
    # chapter 7: min(peak, intensity * bandwidth)
    assert ex.roofline_bound(1.0, 100.0, 10.0) == 10.0 and ex.roofline_bound(100.0, 100.0, 10.0) == 100.0
    assert ex.check(lambda i, p, b: min(p, i * b), ex.roofline_bound, ex.roofline_cases()) is True


# ------------------------------------------------ the second exercise of every chapter
def test_second_exercises_pass_a_written_out_solution_and_cover_their_edges():
    from decimal import Decimal, InvalidOperation

    from grpo_course.core.answers import normalize_number
    from grpo_course.core.grpo import aggregate_loss
    from grpo_course.core.rewards import correctness

    def my_normalize(text):                                   # chapter 1
        s = (text or "").strip().replace(",", "").replace("$", "").replace("%", "")
        s = s.replace("\u2212", "-").replace(" ", "").rstrip(".")
        try:
            if "/" in s:
                num, den = s.split("/")
                value = Decimal(num) / Decimal(den) if int(den) else None
            else:
                value = Decimal(s) if s else None
        except (InvalidOperation, ValueError):
            return None
        if value is None or not value.is_finite():
            return None
        out = format(value.normalize(), "f")
        out = out.rstrip("0").rstrip(".") if "." in out else out
        return "0" if out in ("-0", "") else out
    assert ex.check(my_normalize, normalize_number, ex.number_cases()) is True

    def my_loss(per_token, mask, loss_type, max_len):          # chapter 3
        m = mask.float()
        total = (per_token * m).sum()
        if loss_type == "grpo":
            return ((per_token * m).sum(1) / m.sum(1).clamp(min=1)).mean()
        if loss_type == "dr_grpo":
            return total / (per_token.shape[0] * max_len)
        return total / m.sum().clamp(min=1)
    assert ex.check(my_loss, aggregate_loss, ex.loss_cases()) is True
    assert any(args[1].sum(1).eq(0).any() for args, _ in ex.loss_cases())   # a row with no token

    def my_fisher(grads):                                      # chapter 5
        return {k: (g ** 2).sum(0) / g.shape[0] for k, g in grads.items()}
    assert ex.check(my_fisher, ex.fisher_from_gradients, ex.gradient_cases()) is True

    def my_quantize(w):                                        # chapter 6
        scale = w.abs().max(1, keepdim=True).values / 127
        scale[scale == 0] = 1.0
        return (w / scale).round().clamp(-127, 127).to(torch.int8), scale
    assert ex.check(my_quantize, ex.quantize_per_channel, ex.int8_weight_cases()) is True

    def my_intensity(m, n, k, b):                              # chapter 7
        return 2 * m * n * k / (b * (m * k + k * n + m * n))
    assert ex.check(my_intensity, ex.matmul_intensity, ex.matmul_cases()) is True

    # chapters 2 and 4 need the answer slot; the course's extractor is not what they test
    from grpo_course.core.answers import extract_hash_answer
    from grpo_course.core.rewards import completion_text

    def my_correctness(completions, answer, **kwargs):        # chapter 2
        out = []
        for c, gold in zip(completions, answer, strict=False):
            guess = extract_hash_answer(completion_text(c))
            if guess is None:
                out.append(-1.0)
                continue
            ratio = float(guess) / float(gold)
            out.append(3.0 if float(guess) == float(gold) else 1.5 if 0.9 <= ratio <= 1.1
                       else 0.5 if 0.8 <= ratio <= 1.2 else -0.5)
        return out
    from grpo_course.core.rewards import answer_tier
    allowed = [extract_hash_answer, completion_text]
    assert ex.check(my_correctness, correctness, ex.tiered_completion_cases(),
                    hide=[answer_tier], allow=allowed) is True
    cheat = lambda completions, answer, **kw: [answer_tier(extract_hash_answer(completion_text(c)), g)
                                               for c, g in zip(completions, answer, strict=False)]
    assert ex.check(cheat, correctness, ex.tiered_completion_cases(), hide=[answer_tier],
                    allow=allowed) is False

    def my_exact(completions, answer, **kwargs):              # chapter 4
        return [1.0 if extract_hash_answer(m[0]["content"]) is not None
                and float(extract_hash_answer(m[0]["content"])) == float(g) else 0.0
                for m, g in zip(completions, answer, strict=False)]
    assert ex.check(my_exact, ex.exact_answer_reward, ex.conversational_cases(),
                    allow=[extract_hash_answer]) is True


def test_fake_quant_is_the_quantize_dequantize_round_trip():
    for (w,), _ in ex.int8_weight_cases():
        q, scale = ex.quantize_per_channel(w)
        assert q.dtype == torch.int8 and q.abs().max() <= 127
        assert torch.equal(ex.fake_quant_per_channel(w), q.float() * scale)


# ------------------------------------------------ routes a level down (issue 56)
def test_calling_into_the_package_a_level_down_fails(capsys):
    from grpo_course.core.answers import extract_answer, normalize_number
    from grpo_course.core.grpo import group_advantages
    from grpo_course.measure.profiling import Limits, RooflinePoint

    # chapter 1, exercise 1: the reference is switched off, the function it calls is not
    assert ex.check(lambda text: extract_answer(text), extract_hash_answer, ex.answer_cases(),
                    name="final_answer", allow=[normalize_number]) is False
    out = capsys.readouterr().out
    assert "calls `grpo_course.core.answers.extract_answer`, from the course's package" in out
    assert out.count("\n") == 1
    # chapter 4, exercise 1: tied groups are the groups whose advantages are all 0
    def via_advantages(r, G):
        return float((group_advantages(r, G).view(-1, G) == 0).all(1).float().mean()) if r.numel() else 0.0
    assert ex.check(via_advantages, ex.frac_reward_zero_std, ex.reward_group_cases(),
                    hide=[zero_std_groups]) is False
    assert "calls `grpo_course.core.grpo.group_advantages`" in capsys.readouterr().out
    # chapter 7, exercise 1: the course's roofline class
    def via_roofline(i, p, b):
        return RooflinePoint("x", flops=i, bytes=1.0, seconds=1e-9).bound(Limits(gflops=p, bandwidth=b))
    assert ex.check(via_roofline, ex.roofline_bound, ex.roofline_cases()) is False
    assert "calls `grpo_course.measure.profiling." in capsys.readouterr().out


def test_a_forbidden_library_function_fails_by_name(capsys):
    def via_torch(W):                                  # chapter 6, exercise 1: torch does the work
        scale = W.abs().amax(1)
        scale = torch.where(scale > 0, scale / 127, torch.ones_like(scale))
        return torch.fake_quantize_per_channel_affine(W, scale, torch.zeros(len(scale), dtype=torch.int32),
                                                      0, -127, 127)
    cases = ex.int8_weight_cases()
    assert ex.check(via_torch, ex.fake_quant_per_channel, cases) is True      # right, and not forbidden
    capsys.readouterr()
    assert ex.check(via_torch, ex.fake_quant_per_channel, cases, forbid=ex.TORCH_QUANTIZERS) is False
    out = capsys.readouterr().out
    assert "calls `torch.fake_quantize_per_channel_affine`, a library function" in out
    assert ex.check(via_torch, ex.fake_quant_per_channel, cases,
                    forbid=[torch.fake_quantize_per_channel_affine]) is False     # or as a function
    assert "calls `torch.fake_quantize_per_channel_affine`" in capsys.readouterr().out
    def via_ops(W):                                    # the same op through the dispatcher's name
        scale = W.abs().amax(1)
        scale = torch.where(scale > 0, scale / 127, torch.ones_like(scale))
        return torch.ops.aten.fake_quantize_per_channel_affine.default(
            W, scale, torch.zeros(len(scale), dtype=torch.int32), 0, -127, 127)
    assert ex.check(via_ops, ex.fake_quant_per_channel, cases, forbid=ex.TORCH_QUANTIZERS) is False
    assert "`torch.fake_quantize_per_channel_affine`" in capsys.readouterr().out


def test_a_caught_error_does_not_hide_the_call_and_the_profiler_is_put_back(capsys):
    import sys

    from grpo_course.core.grpo import group_advantages

    def swallows(r, G):
        try:
            return group_advantages(r, G)
        except Exception:
            return written_out(r, G)
    def marker(frame, event, arg):
        return None
    sys.setprofile(marker)
    try:
        assert ex.check(swallows, group_advantages, ex.reward_group_cases()) is False
        assert sys.getprofile() is marker
        def crashes(r, G):
            raise KeyError("oops")
        assert ex.check(crashes, group_advantages, ex.reward_group_cases()) is False
        assert sys.getprofile() is marker
    finally:
        sys.setprofile(None)
    assert "calls the course's version (`group_advantages`)" in capsys.readouterr().out


def test_switching_the_tracing_off_fails(capsys):
    import sys

    from grpo_course.core.grpo import group_advantages

    def unwatched(r, G):                               # then a level down, unseen
        sys.setprofile(None)
        return float((group_advantages(r, G).view(-1, G) == 0).all(1).float().mean()) if r.numel() else 0.0
    assert ex.check(unwatched, ex.frac_reward_zero_std, ex.reward_group_cases()) is False
    assert "calls `sys.setprofile`, which switches the check's call tracing off" in capsys.readouterr().out
    assert sys.getprofile() is None


def test_allowed_functions_may_call_into_the_package(capsys):
    from grpo_course.core.answers import normalize_number

    def final_answer(text):                             # chapter 1's solution
        answers = [line.split("####", 1)[1] for line in (text or "").splitlines() if "####" in line]
        return normalize_number(answers[-1]) if answers else None
    assert ex.check(final_answer, extract_hash_answer, ex.answer_cases()) is False
    assert "calls `grpo_course.core.answers.normalize_number`" in capsys.readouterr().out
    assert ex.check(final_answer, extract_hash_answer, ex.answer_cases(), allow=[normalize_number]) is True


# ------------------------------------------------ where a failure differs (issue 56)
def test_a_failure_points_at_the_first_differing_position(capsys):
    def biased(r, G):                                   # the population std instead of the sample std
        g = r.view(-1, G)
        return ((g - g.mean(1, keepdim=True)) / (g.std(1, unbiased=False, keepdim=True) + 1e-4)).view(-1)
    cases = ex.reward_group_cases()
    assert ex.check(biased, group_advantages, cases, name="biased") is False
    out = capsys.readouterr().out
    where = next(line for line in out.splitlines() if line.strip().startswith("where:"))
    k = int(out.split("case ")[1].split()[0])
    (rewards, G), _ = cases[k - 1]
    got, expected = biased(rewards, G), group_advantages(rewards, G)
    i = int((~torch.isclose(got, expected, atol=1e-5, rtol=1e-4)).nonzero()[0])
    assert f"first difference at index {i}: returned {got[i].item():.6g}, expected {expected[i].item():.6g}" in where
    assert f"shapes {tuple(expected.shape)} and {tuple(expected.shape)}" in where and "tolerance" in where


def test_difference_names_the_shape_the_list_index_and_the_dict_key():
    assert ex._difference(torch.zeros(3), torch.zeros(4)) == "shapes differ: returned (3,), expected (4,)"
    assert "index (1, 0)" in ex._difference(torch.tensor([[1.0], [2.0]]), torch.tensor([[1.0], [3.0]]))
    assert ex._difference([1.0, 0.0, 1.0], [1.0, 0.0, 0.0]).startswith("first difference at index 2: returned 1.0, expected 0.0")
    assert ex._difference([1.0], [1.0, 0.0]) == "lengths differ: returned 1 items, expected 2"
    diff = ex._difference({"a": torch.ones(2), "b": torch.ones(2)}, {"a": torch.ones(2), "b": torch.tensor([1.0, 5.0])})
    assert diff.startswith("first difference at key 'b': first difference at index 1: returned 1, expected 5")
    assert ex._difference({"a": 1}, {"b": 1}) == "keys differ: missing ['b'], unexpected ['a']"
    assert ex._difference(torch.ones(2), torch.ones(2)) is None


def test_yours_or_course_picks_a_function_only_after_its_check_passed(capsys):
    from grpo_course.book import exercises

    def my_part(logits, ids, mask, temperature):
        logps = torch.log_softmax(logits.float() / temperature, dim=-1)
        return logps.gather(-1, ids[..., None]).squeeze(-1) * mask

    def course(*a):
        return "course"

    assert exercises.yours_or_course(my_part, course, "part") is course      # not checked yet
    assert "its check has not run" in capsys.readouterr().out
    assert exercises.check(my_part, exercises.completion_token_logps, exercises.token_logp_cases())
    assert exercises.yours_or_course(my_part, course, "part") is my_part
    assert "part: yours" in capsys.readouterr().out

    def my_part(logits, ids, mask, temperature):  # redefined after its check
        return torch.zeros(ids.shape)

    assert exercises.yours_or_course(my_part, course, "part") is course
    assert "changed after its check" in capsys.readouterr().out
    assert exercises.check(my_part, exercises.completion_token_logps, exercises.token_logp_cases()) is False
    assert exercises.yours_or_course(my_part, course, "part") is course
    assert "did not pass" in capsys.readouterr().out


def test_the_loop_parts_references_match_the_package():
    from grpo_course.book import exercises
    from grpo_course.core import grpo

    for (logps, old, adv, lo, hi), _ in exercises.surrogate_cases():
        loss, ratio = grpo.clipped_surrogate(logps, old, adv, lo, hi)
        assert torch.equal(exercises.clipped_surrogate_loss(logps, old, adv, lo, hi), loss)
    for (logits, ids, mask, t), _ in exercises.token_logp_cases():
        got = exercises.completion_token_logps(logits, ids, mask, t)
        assert got.shape == ids.shape and torch.all(got[mask == 0] == 0) and torch.all(got <= 0)
        assert torch.isfinite(got).all()                      # large logits do not overflow


def test_a_python_library_function_named_in_forbid_fails(capsys):
    """A forbidden Python function (not only a C builtin or a whole module) is caught: chapter 3's
    per-token log-probabilities through TRL's selective_log_softmax."""
    from trl.trainer.utils import selective_log_softmax

    from grpo_course.book import exercises

    def my_token_logps(logits, ids, mask, temperature):
        return selective_log_softmax(logits.float() / temperature, ids) * mask

    assert exercises.check(my_token_logps, exercises.completion_token_logps, exercises.token_logp_cases(),
                           forbid=exercises.TOKEN_LOGP_SHORTCUTS) is False
    out = capsys.readouterr().out
    assert "calls `trl.trainer.utils.selective_log_softmax`, a library function" in out, out
    assert exercises.check(my_token_logps, exercises.completion_token_logps,
                           exercises.token_logp_cases()) is True          # allowed where not forbidden


def test_page_5b_exercises_pass_written_out_and_catch_a_slip(capsys):
    """Page 5b: the calculator's spans and its forced text, written out with calculate() alone."""
    import re

    from grpo_course.core.calculator import calculate, forced_text, tool_spans

    def my_tool_spans(text):
        return [(m.start(2), m.end()) for m in re.finditer(r"<<([^<>]*)=([^<>=]*)>>", text)
                if calculate(m.group(1)) is not None]

    def my_forced_text(prefix):
        start = prefix.rfind("<<")
        if start < 0 or not prefix.endswith("=") or ">>" in prefix[start:]:
            return None
        expression = prefix[start + 2:-1]
        if any(c in expression for c in "=<>"):
            return None
        result = calculate(expression)
        return None if result is None else result + ">>"

    cases = ex.tool_text_cases()
    assert ex.check(my_tool_spans, tool_spans, cases, allow=[calculate]) is True
    assert ex.check(my_forced_text, forced_text, cases, allow=[calculate]) is True
    # a slip: masking the whole annotation instead of the result the tool writes
    whole = lambda text: [(m.start(), m.end()) for m in re.finditer(r"<<([^<>]*)=([^<>=]*)>>", text)
                          if calculate(m.group(1)) is not None]
    assert ex.check(whole, tool_spans, cases, allow=[calculate]) is False
    # the cases hold prefixes the tool completes, and ones it leaves to the model
    outs = [forced_text(args[0]) for args, _ in cases]
    assert any(outs) and outs.count(None) > 5 and any(tool_spans(args[0]) for args, _ in cases)
    capsys.readouterr()
