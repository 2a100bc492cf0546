"""The exercise checker: a right answer passes, a wrong one fails with the case, a stub is 'not yet'."""
import torch

from grpo_course import exercises as ex
from grpo_course.answers import extract_hash_answer
from grpo_course.curriculum import ewc_penalty
from grpo_course.grpo import group_advantages, zero_std_groups


def stub(*args, **kwargs):
    raise NotImplementedError


def test_check_reports_pass_fail_and_not_yet(capsys):
    cases = ex.reward_group_cases()
    assert ex.check(lambda r, G: group_advantages(r, G), group_advantages, cases) is True
    assert "all 30 cases pass" in capsys.readouterr().out
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


def test_cases_cover_the_edges():
    rewards = [args[0] for args, _ in ex.reward_group_cases()]
    Gs = [args[1] for args, _ in ex.reward_group_cases()]
    assert any(zero_std_groups(r, G).any() for r, G in zip(rewards, Gs))       # tied groups
    assert any((~zero_std_groups(r, G)).any() for r, G in zip(rewards, Gs))
    texts = [args[0] for args, _ in ex.answer_cases()]
    answers = [extract_hash_answer(t) for t in texts]
    assert None in answers and any(a and "." in a for a in answers) and any(a and a.startswith("-") for a in answers)
    assert any("," in t for t in texts) and any("$" in t for t in texts)


def test_every_exercise_reference_is_consistent_with_the_course():
    # chapter 1: the course's own extractor passes its own cases
    assert ex.check(extract_hash_answer, extract_hash_answer, ex.answer_cases()) is True
    # chapter 2: integer answers
    scores = ex.integer_answer(["x #### 42", "x #### 3.5", "x #### 1,200", "no answer", "#### ten", None])
    assert scores == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    # chapter 4: TRL's frac_reward_zero_std
    by_hand = lambda r, G: float((r.view(-1, G).std(1) == 0).float().mean())
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
