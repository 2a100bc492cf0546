"""GRPO's math against hand-computed numbers, and the trainer's persistence."""
from __future__ import annotations

import json
import math

import pytest
import torch

from grpo_course.config import ConfigError, GRPOConfig
from grpo_course.core.grpo import group_advantages, grpo_loss, kl_k3, reinforce_loss, zero_std_groups
from grpo_course.core.policy import per_token_logps
from tests.helpers import ADDITION_ROWS as ROWS
from tests.helpers import length_reward, tiny_model, tiny_tokenizer
from tests.helpers import tiny_trainer as _trainer

EPS = 1e-4


# ---------------------------------------------------------------- advantages
def test_group_advantages_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0])
    # group 1: mean 0.25, unbiased std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    a = group_advantages(r, 4)
    expected = torch.tensor([0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0]) / torch.tensor(
        [0.5 + EPS] * 4 + [EPS] * 4)
    torch.testing.assert_close(a, expected)
    assert torch.isfinite(a).all() and (a[4:] == 0).all()        # zero-std group
    torch.testing.assert_close(group_advantages(r, 4, "none"),
                               torch.tensor([0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0]))
    batch_std = float(r.std())                                   # unbiased over all 8
    torch.testing.assert_close(group_advantages(r, 4, "batch"),
                               torch.tensor([0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0]) / (batch_std + EPS))
    assert zero_std_groups(r, 4).tolist() == [False, True]


def test_group_advantages_all_equal_is_zero_not_nan():
    for scale in ("group", "batch", "none"):
        a = group_advantages(torch.full((6,), 0.5), 3, scale)
        assert torch.isfinite(a).all() and (a == 0).all()


def test_group_advantages_errors():
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="scale"):
        group_advantages(torch.zeros(4), 2, "global")


# ---------------------------------------------------------------- loss aggregations
def _batch():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    logps = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.2, 0.3, 0.3]]))
    return logps, logps.clone(), torch.tensor([1.0, -1.0]), mask


@pytest.mark.parametrize("loss_type,expected", [
    ("grpo", (-1.0 + 1.0) / 2),            # row means -1 and +1, then their mean
    ("bnpo", (-1 - 1 + 1) / 3),            # token sum / 3 real tokens
    ("dr_grpo", (-1 - 1 + 1) / (2 * 4)),   # token sum / (B * max_completion_length)
    ("dapo", (-1 - 1 + 1) / 3),            # token sum / real tokens in the batch
])
def test_loss_types_by_hand(loss_type, expected):
    logps, old, adv, mask = _batch()
    loss, metrics = grpo_loss(logps, old, adv, mask, loss_type=loss_type, max_completion_length=4)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert metrics["clip_ratio/region_mean"] == 0 and metrics["kl"] == 0


def test_dapo_normalizes_by_generation_batch_tokens():
    logps, old, adv, mask = _batch()
    loss, _ = grpo_loss(logps, old, adv, mask, loss_type="dapo", num_items_in_batch=6)
    assert loss.item() == pytest.approx(-1 / 6)


def test_clipping_by_hand():
    mask = torch.ones(2, 2)
    old = torch.zeros(2, 2)
    # row 0 (A=+1): ratios 1.5 (clipped to 1.2) and 1.1; row 1 (A=-1): 0.5 (-> 0.8) and 1.5
    logps = torch.log(torch.tensor([[1.5, 1.1], [0.5, 1.5]]))
    adv = torch.tensor([1.0, -1.0])
    loss, m = grpo_loss(logps, old, adv, mask, epsilon_low=0.2)
    # per token: -min(rA, clip(r)A): [-1.2, -1.1], [0.8, 1.5]
    assert loss.item() == pytest.approx(((-1.2 - 1.1) / 2 + (0.8 + 1.5) / 2) / 2, abs=1e-6)
    assert m["clip_ratio/high_mean"] == pytest.approx(0.25)
    assert m["clip_ratio/low_mean"] == pytest.approx(0.25)
    assert m["clip_ratio/region_mean"] == pytest.approx(0.5)
    # DAPO's clip-higher: epsilon_high=0.6 leaves 1.5 unclipped
    loss2, m2 = grpo_loss(logps, old, adv, mask, epsilon_low=0.2, epsilon_high=0.6)
    assert loss2.item() == pytest.approx(((-1.5 - 1.1) / 2 + (0.8 + 1.5) / 2) / 2, abs=1e-6)
    assert m2["clip_ratio/high_mean"] == 0


def test_k3_kl_by_hand():
    logps = torch.log(torch.tensor([[0.5, 0.5]]))
    ref = torch.log(torch.tensor([[0.25, 0.5]]))
    kl = kl_k3(logps, ref)
    assert kl[0, 0].item() == pytest.approx(0.5 - math.log(0.5) - 1)  # e^d - d - 1, d=log .5
    assert kl[0, 1].item() == 0
    loss, m = grpo_loss(logps, logps.detach(), torch.tensor([0.0]), torch.ones(1, 2),
                        ref_per_token_logps=ref, beta=0.1)
    assert loss.item() == pytest.approx(0.1 * kl.mean().item())
    assert m["kl"] == pytest.approx(kl.mean().item())


def test_masked_tokens_do_not_matter():
    logps, old, adv, mask = _batch()
    logps.requires_grad_(True)
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        loss, _ = grpo_loss(logps, old, adv, mask, loss_type=loss_type, max_completion_length=3)
        changed = logps.detach().clone()
        changed[mask == 0] = -50.0
        loss2, _ = grpo_loss(changed, old, adv, mask, loss_type=loss_type, max_completion_length=3)
        assert loss.item() == pytest.approx(loss2.item())
        (grad,) = torch.autograd.grad(loss, logps)
        assert (grad[mask == 0] == 0).all() and (grad[mask == 1] != 0).all()


def test_ratio_one_gradient_is_reinforce_with_group_baseline():
    torch.manual_seed(0)
    logits = torch.randn(4, 5, 7, requires_grad=True)
    tokens = torch.randint(0, 7, (4, 5))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]])
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0])
    adv = group_advantages(rewards, 2)
    logps = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
    loss, _ = grpo_loss(logps, logps.detach(), adv, mask)
    (g_grpo,) = torch.autograd.grad(loss, logits)
    logps = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
    (g_reinforce,) = torch.autograd.grad(reinforce_loss(logps, adv, mask), logits)
    torch.testing.assert_close(g_grpo, g_reinforce)
    assert g_grpo.abs().sum() > 0


def test_loss_errors():
    logps, old, adv, mask = _batch()
    with pytest.raises(ValueError, match="loss_type"):
        grpo_loss(logps, old, adv, mask, loss_type="ppo")
    with pytest.raises(ValueError, match="max_completion_length"):
        grpo_loss(logps, old, adv, mask, loss_type="dr_grpo")
    with pytest.raises(ValueError, match="ref_per_token_logps"):
        grpo_loss(logps, old, adv, mask, beta=0.1)
    with pytest.raises(ValueError, match="shape"):
        grpo_loss(logps[:, :2], old, adv, mask)


# ---------------------------------------------------------------- per-token log-probs
def test_per_token_logps_shared_prompt_equals_full_forward():
    model, tok = tiny_model(), tiny_tokenizer()
    enc = tok(["<s>what is 2+3?<s>", "<s>7*8<s>"], return_tensors="pt", padding=True)
    G, T = 3, 5
    torch.manual_seed(1)
    comp = torch.randint(4, 50, (2 * G, T))
    cmask = torch.ones(2 * G, T, dtype=torch.long)
    cmask[1, 3:] = 0
    shared = per_token_logps(model, enc["input_ids"], enc["attention_mask"], comp, cmask, 0.7)
    # naive: every completion with its own copy of the prompt, full logits
    ids = torch.cat([enc["input_ids"].repeat_interleave(G, 0), comp], 1)
    am = torch.cat([enc["attention_mask"].repeat_interleave(G, 0), cmask], 1)
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=am, position_ids=pos).logits[:, -T - 1:-1]
    naive = torch.log_softmax(logits / 0.7, -1).gather(-1, comp[..., None]).squeeze(-1)
    torch.testing.assert_close(shared[cmask == 1], naive[cmask == 1], atol=1e-5, rtol=1e-5)
    repeated = per_token_logps(model, enc["input_ids"].repeat_interleave(G, 0),
                               enc["attention_mask"].repeat_interleave(G, 0), comp, cmask, 0.7)
    # one row a prompt takes one pass over prompt + completion: the same log-probs where the
    # completion mask is 1 (its padded positions are never read)
    torch.testing.assert_close(shared[cmask == 1], repeated[cmask == 1], atol=1e-5, rtol=1e-5)


def test_one_completion_a_prompt_takes_one_pass_and_a_group_two():
    """G = 1 (the warm-up's solutions): one decoder pass over prompt + completion; G > 1: the
    prompt once, then its completions on its shared key/value cache."""
    model, tok = tiny_model(), tiny_tokenizer()
    enc = tok(["<s>what is 2+3?<s>", "<s>7*8<s>"], return_tensors="pt", padding=True)
    calls = []
    handle = model.get_decoder().register_forward_hook(lambda *_: calls.append(1))
    try:
        for G in (1, 3):
            calls.clear()
            comp = torch.randint(4, 50, (2 * G, 5), generator=torch.Generator().manual_seed(G))
            per_token_logps(model, enc["input_ids"], enc["attention_mask"], comp, torch.ones_like(comp))
            assert len(calls) == (1 if G == 1 else 2), G
    finally:
        handle.remove()


@pytest.mark.heavy
def test_chunked_logps_give_the_full_logits_gradient(monkeypatch):
    """Logits made a few rows at a time (checkpointed) give the same values and gradients."""
    import grpo_course.core.policy as G_
    model, tok = tiny_model(), tiny_tokenizer()
    enc = tok(["<s>what is 2+3?<s>", "<s>7*8<s>"], return_tensors="pt", padding=True)
    comp = torch.randint(4, 50, (4, 6), generator=torch.Generator().manual_seed(3))
    cmask = torch.ones(4, 6, dtype=torch.long)
    results = []
    for chunk in (3, 10_000):                      # several chunks vs one
        monkeypatch.setattr(G_, "LOGITS_CHUNK", chunk)
        model.zero_grad()
        logps, entropy = per_token_logps(model, enc["input_ids"], enc["attention_mask"], comp,
                                         cmask, 0.8, return_entropy=True)
        (logps * torch.linspace(-1, 1, logps.numel()).view_as(logps)).sum().backward()
        results.append((logps.detach(), entropy, [p.grad.clone() for p in model.parameters()]))
    (a, ea, ga), (b, eb, gb) = results
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(ea, eb)
    for x, y in zip(ga, gb, strict=False):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-5)


@pytest.mark.heavy
@pytest.mark.parametrize("shared_prompt", [True, False])
def test_course_attention_gives_sdpas_logps_and_gradients(shared_prompt):
    """The written-out grouped-query attention of the training pass: the same log-probs and
    gradients as transformers' SDPA, with left padding, and with the prompt's cache shared."""
    from grpo_course.core.policy import course_attention
    model, tok = tiny_model(), tiny_tokenizer()
    enc = tok(["<s>what is 2+3?<s>", "<s>7*8<s>"], return_tensors="pt", padding=True)
    assert (enc["attention_mask"] == 0).any()         # one prompt is left-padded
    G = 2
    comp = torch.randint(4, 50, (2 * G, 6), generator=torch.Generator().manual_seed(3))
    cmask = torch.ones(2 * G, 6, dtype=torch.long)
    cmask[1, 4:] = 0
    ids, am = enc["input_ids"], enc["attention_mask"]
    if not shared_prompt:
        ids, am = ids.repeat_interleave(G, 0), am.repeat_interleave(G, 0)
    results = []
    for written_out in (False, True):
        model.zero_grad()
        with course_attention(model, enabled=written_out):
            assert model.config._attn_implementation == ("course_gqa" if written_out else "sdpa")
            logps = per_token_logps(model, ids, am, comp, cmask, 0.8)
        (logps * cmask * torch.linspace(-1, 1, logps.numel()).view_as(logps)).sum().backward()
        results.append((logps.detach(), [p.grad.clone() for p in model.parameters()]))
    assert model.config._attn_implementation == "sdpa"       # put back
    (a, ga), (b, gb) = results
    torch.testing.assert_close(a[cmask == 1], b[cmask == 1], atol=1e-5, rtol=1e-5)
    for x, y in zip(ga, gb, strict=False):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)


def test_sampling_logps_match_training_logps():
    from grpo_course.core.sampling import sample_completions
    model, tok = tiny_model(), tiny_tokenizer()
    s = sample_completions(model, tok, ["abc", "hello"], 2, 8, temperature=0.9, seed=0)
    logps = per_token_logps(model, s.prompt_ids, s.prompt_mask, s.completion_ids,
                            s.completion_mask, 0.9)
    m = s.completion_mask == 1
    torch.testing.assert_close(logps[m], s.sampling_logps[m], atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------- trainer
class PhaseTimer:
    def __init__(self):
        self.seen = []

    def phase(self, name):
        import contextlib
        self.seen.append(name)
        return contextlib.nullcontext()


@pytest.mark.heavy
def test_trainer_logs_and_learns_something(tmp_path):
    trainer = _trainer(tmp_path)
    trainer.timer = PhaseTimer()
    rows = trainer.train(max_steps=2)
    assert len(rows) == 2
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [0, 1]
    for key in ("reward", "reward_std", "rewards/length", "frac_reward_zero_std",
                "completion_length", "clipped_ratio", "kl", "entropy", "loss",
                "step_seconds", "tokens_per_s", "clip_ratio/region_mean"):
        assert key in logged[0], key
    # no "logprobs" phase: with beta = 0 there is no reference policy to score
    assert set(trainer.timer.seen) == {"sampling", "rewards", "forward_backward", "optimizer"}
    lora = [p for n, p in trainer.model.named_parameters() if "lora_B" in n]
    assert any(p.abs().sum() > 0 for p in lora)          # B started at zero and moved
    import matplotlib
    matplotlib.use("Agg")
    from grpo_course.book.plotting import plot_metrics, series
    assert series(logged, "reward")[0] == [0, 1]
    fig = plot_metrics(tmp_path, keys=("reward", "loss", "not_logged"))
    assert [ax.get_title() for ax in fig.axes if ax.axison] == ["reward", "loss"]


def _trainable(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


@pytest.mark.heavy
def test_resume_reproduces_the_run(tmp_path):
    """Resuming from a checkpoint continues the same run: the same samples (rewards, lengths),
    the same gradients and, at the end, the same trainable weights. (On a batch's first update
    the clipped loss is 0 by construction, ratio 1 times advantages that average 0, so equal
    losses alone would prove nothing.)"""
    whole = _trainer()
    start = _trainable(whole)
    full = whole.train(max_steps=4)
    first = _trainer(tmp_path)
    first.train(max_steps=2)
    first.save_checkpoint(tmp_path / "ckpt")
    import datasets

    from grpo_course.core.train import CourseTrainer
    resumed = CourseTrainer.resume(tmp_path / "ckpt", tiny_model(), tiny_tokenizer(),
                                   datasets.Dataset.from_list(ROWS),
                                   reward_funcs={"length": length_reward})
    assert resumed.global_step == 2
    rest = resumed.train(max_steps=4)
    assert [r["step"] for r in rest] == [2, 3]
    for a, b in zip(full[2:], rest, strict=False):
        assert a["reward"] == pytest.approx(b["reward"], abs=1e-6)
        assert a["completion_length"] == b["completion_length"]
        assert a["grad_norm"] > 0 and a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    end, again = _trainable(whole), _trainable(resumed)
    assert set(end) == set(again)
    assert any(not torch.equal(end[n], start[n]) for n in end)       # the run did move them
    for n in end:
        torch.testing.assert_close(again[n], end[n], atol=1e-6, rtol=1e-5, msg=n)


@pytest.mark.heavy
def test_beta_uses_adapter_disabled_reference_and_penalty():
    """With beta > 0 the reference is the base (adapter off): KL 0 while the adapter is the
    identity, > 0 once it moved. A penalty is logged and added to the loss."""
    exact = dict(beta=0.05, sampling_dtype="float32", train_dtype="float32")
    trainer = _trainer(**exact)
    row = trainer.step(trainer._rows(0, 2))
    assert row["kl"] == pytest.approx(0.0, abs=1e-6)                  # lora_B starts at 0
    with torch.no_grad():
        for n, p in trainer.model.named_parameters():
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.5)
    assert trainer.step(trainer._rows(2, 2))["kl"] > 1e-4             # not the policy itself

    calls = []

    def penalty(model):
        calls.append(1)
        return 0.5 * sum((p ** 2).sum() for n, p in model.named_parameters() if "lora_" in n)
    plain, punished = _trainer(**exact), _trainer(**exact)
    punished.penalty = penalty
    with torch.no_grad():
        expected = float(penalty(punished.model))
    calls.clear()
    a, b = plain.step(plain._rows(0, 2)), punished.step(punished._rows(0, 2))
    assert calls == [1] and expected > 0
    assert b["penalty"] == pytest.approx(expected, rel=1e-6)
    assert b["loss"] == pytest.approx(a["loss"] + expected, rel=1e-5)
    assert b["grad_norm"] != pytest.approx(a["grad_norm"], rel=1e-3)   # its gradient is used


@pytest.mark.heavy
def test_sft_warmup_lowers_loss():
    trainer = _trainer(sft_steps=6, sft_batch_size=3, sft_learning_rate=5e-2, max_steps=0)
    rows = trainer.train()
    sft = [r["loss"] for r in rows if r["phase"] == "sft"]
    assert len(sft) == 6 and sft[-1] < sft[0]


def test_frozen_linear_weights_cast_once_and_restored_bit_for_bit():
    from grpo_course.core.policy import add_lora
    from grpo_course.core.precision import frozen_linear_weights_as
    model = add_lora(tiny_model(), GRPOConfig(lora_target_modules=("q_proj", "v_proj")))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    base_q = model.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight
    down = model.base_model.model.model.layers[0].mlp.down_proj.weight
    with frozen_linear_weights_as(model, torch.bfloat16):
        assert base_q.dtype == down.dtype == torch.bfloat16          # frozen Linear weights
        for n, p in model.named_parameters():
            if p.requires_grad or "embed" in n or "lm_head" in n:    # adapters, tied embedding
                assert p.dtype == torch.float32, n
    for n, p in model.named_parameters():
        assert p.dtype == torch.float32 and torch.equal(p, before[n]), n


@pytest.mark.parametrize("train_dtype", ["float32", "bfloat16"])
def test_sft_trains_only_the_adapter_and_keeps_the_base(train_dtype):
    """The warm-up in bf16 leaves the base as it was: fp32 when the GRPO pass trains in fp32,
    held in bf16 from the start when both train in bf16 (:mod:`grpo_course.core.precision`)."""
    trainer = _trainer(sft_steps=2, sft_batch_size=2, sft_learning_rate=5e-2, max_steps=0,
                       sft_dtype="bfloat16", train_dtype=train_dtype)
    base = {n: p.detach().clone() for n, p in trainer.model.named_parameters()
            if not p.requires_grad}
    assert base["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"].dtype == \
        getattr(torch, train_dtype)
    trainer.train()
    for n, p in trainer.model.named_parameters():
        if n in base:
            assert p.dtype == base[n].dtype and torch.equal(p, base[n]), n


def test_interrupt_saves_checkpoint(tmp_path):
    trainer = _trainer(tmp_path)

    def boom(rows=None):
        raise KeyboardInterrupt
    trainer.step = boom
    with pytest.raises(KeyboardInterrupt):
        trainer.train(max_steps=2)
    assert (tmp_path / "checkpoint" / "state.pt").is_file()
    assert json.loads((tmp_path / "checkpoint" / "trainer.json").read_text())["global_step"] == 0


def test_save_model_writes_adapter(tmp_path):
    trainer = _trainer()
    trainer.save_model(tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "adapter_config.json").read_text())
    assert meta["base_model_name_or_path"] == "smollm2-135m-instruct"


@pytest.mark.parametrize("changes,match", [
    (dict(num_generations=1), "num_generations"),
    (dict(num_generations=3, per_step_completions=8), "divisible"),
    (dict(max_completion_length=0), "max_completion_length"),
    (dict(loss_type="ppo"), "loss_type"),
])
def test_impossible_configs(changes, match):
    with pytest.raises(ConfigError, match=match):
        GRPOConfig(**changes)


def test_unknown_reward_name():
    import datasets

    from grpo_course.core.train import CourseTrainer
    with pytest.raises(ConfigError, match="unknown reward"):
        CourseTrainer(tiny_model(), tiny_tokenizer(), GRPOConfig(reward_weights={"nope": 1.0}),
                      datasets.Dataset.from_list(ROWS))


@pytest.mark.heavy
def test_zero_variance_batch_skips_backward_unless_asked():
    import datasets

    from grpo_course.core.train import CourseTrainer
    constant = {"const": lambda completions, **kw: [1.0] * len(completions)}
    cfg = GRPOConfig(num_generations=2, per_step_completions=4, max_completion_length=4,
                     lora_r=4, lora_alpha=8, reward_weights={"const": 1.0},
                     lora_target_modules=("q_proj", "v_proj"), sampling_dtype="float32",
                     train_dtype="float32")
    rows = datasets.Dataset.from_list(ROWS)
    lazy = CourseTrainer(tiny_model(), tiny_tokenizer(), cfg, rows, reward_funcs=constant)
    row = lazy.step(lazy._rows(0, 2))
    assert row["skipped"] and row["grad_norm"] == 0.0 and math.isnan(row["entropy"])
    assert row["frac_groups_dropped"] == 1.0
    eager = CourseTrainer(tiny_model(), tiny_tokenizer(), cfg, rows, reward_funcs=constant,
                          skip_zero_variance=False)
    row = eager.step(eager._rows(0, 2))
    assert not row["skipped"] and row["loss"] == pytest.approx(0.0, abs=1e-7)
    # sampled and trained in fp32: the sampler's log-probs are the policy's
    assert not math.isnan(row["entropy"]) and row["sampler_logp_gap"] < 1e-4
    assert row["frac_groups_dropped"] == 0.0


@pytest.mark.heavy
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_dropping_zero_variance_groups_leaves_the_update_unchanged(loss_type):
    """Group 0 has equal rewards (advantage 0), group 1 does not: computing only group 1
    (and rescaling) gives the same loss and the same parameters after two steps."""
    import datasets

    from grpo_course.core.train import CourseTrainer
    half = {"half": lambda completions, **kw: [1.0, 1.0, 0.0, 1.0][:len(completions)]}
    cfg = GRPOConfig(num_generations=2, per_step_completions=4, max_completion_length=6,
                     lora_r=4, lora_alpha=8, reward_weights={"half": 1.0}, learning_rate=1e-2,
                     lora_target_modules=("q_proj", "v_proj"), loss_type=loss_type,
                     sampling_dtype="float32")
    data = datasets.Dataset.from_list(ROWS)
    runs = {}
    for skip in (True, False):
        trainer = CourseTrainer(tiny_model(), tiny_tokenizer(), cfg, data, reward_funcs=half,
                                skip_zero_variance=skip)
        losses = [trainer.step(trainer._rows(i, 2)) for i in range(2)]
        params = {n: p.detach().clone() for n, p in trainer.model.named_parameters()
                  if p.requires_grad}
        runs[skip] = (losses, params)
    (lazy, p_lazy), (full, p_full) = runs[True], runs[False]
    assert [r["frac_groups_dropped"] for r in lazy] == [0.5, 0.5]
    assert [r["frac_groups_dropped"] for r in full] == [0.0, 0.0]
    for a, b in zip(lazy, full, strict=False):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4, abs=1e-7)
    for name in p_full:
        torch.testing.assert_close(p_lazy[name], p_full[name], rtol=1e-4, atol=1e-6)


@pytest.mark.heavy
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_micro_batches_take_the_same_update(loss_type):
    """Three groups (the first tied, so left out), two updates per sampled batch: trained one
    group per forward/backward pass (``train_micro_batch=G``) or all at once, the same losses,
    metrics and weights."""
    import datasets

    from grpo_course.core.train import CourseTrainer
    scores = {"s": lambda completions, **kw: [1.0, 1.0, 0.0, 1.0, 1.0, 0.0][:len(completions)]}
    data = datasets.Dataset.from_list(ROWS)
    runs = {}
    for micro in (None, 3):                   # 3 completions: one group of G = 2 per pass
        cfg = GRPOConfig(num_generations=2, per_step_completions=6, max_completion_length=6,
                         lora_r=4, lora_alpha=8, reward_weights={"s": 1.0}, learning_rate=1e-2,
                         lora_target_modules=("q_proj", "v_proj"), loss_type=loss_type,
                         num_iterations=2, sampling_dtype="float32", train_dtype="float32",
                         train_micro_batch=micro)
        trainer = CourseTrainer(tiny_model(), tiny_tokenizer(), cfg, data, reward_funcs=scores)
        rows = [trainer.step(trainer._rows(3 * i, 3)) for i in range(2)]
        params = {n: p.detach().clone() for n, p in trainer.model.named_parameters()
                  if p.requires_grad}
        runs[micro] = (rows, params)
    (whole, p_whole), (parts, p_parts) = runs[None], runs[3]
    assert [r["frac_groups_dropped"] for r in parts] == pytest.approx([1 / 3, 1 / 3])
    lengths = [r["completion_length"] for r in whole]
    assert lengths == [r["completion_length"] for r in parts]      # the same samples
    for a, b in zip(whole, parts, strict=False):
        for key in ("loss", "policy_loss", "kl", "entropy", "sampler_logp_gap",
                    "clip_ratio/region_mean"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4, abs=1e-7)
    assert any(r["clip_ratio/region_mean"] > 0 or r["loss"] != 0 for r in whole)
    for name in p_whole:
        torch.testing.assert_close(p_parts[name], p_whole[name], rtol=1e-4, atol=1e-6)


def test_train_micro_batch_is_at_least_one():
    for fine in (1, 4, 6, 64):            # rounded down to whole groups, at least one, per pass
        GRPOConfig(num_generations=4, per_step_completions=8, train_micro_batch=fine)
    for bad in (0, -4):
        with pytest.raises(ConfigError, match="train_micro_batch"):
            GRPOConfig(num_generations=4, per_step_completions=8, train_micro_batch=bad)


TIMING = ("step_seconds", "sampling_seconds", "tokens_per_s")


def _logged(folder) -> list[dict]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


@pytest.mark.heavy
def test_a_run_interrupted_during_sft_resumes_exactly(tmp_path, monkeypatch, capsys):
    """Ctrl-C in the middle of an SFT step (after it drew random numbers), then ``resume``:
    the same metrics rows (SFT losses, then GRPO rewards and gradients) and the same adapter
    weights as the run that was never stopped. The checkpoint holds the SFT optimizer (AdamW
    moments), the random states of the last step boundary (LoRA dropout) and the counters."""
    import datasets

    from grpo_course.core.train import CourseTrainer
    changes = dict(sft_steps=4, sft_batch_size=2, sft_learning_rate=1e-2, lora_dropout=0.1)
    whole = _trainer(tmp_path / "whole", **changes)
    start = _trainable(whole)
    whole.train(max_steps=3)
    first = _trainer(tmp_path / "cut", **changes)
    real_step, calls = CourseTrainer.sft_step, []

    def interrupted(self, rows, optimizer):
        calls.append(1)
        if len(calls) == 3:                  # two SFT steps done, the third one cut short
            torch.rand(7)                    # ... after it drew random numbers
            raise KeyboardInterrupt
        return real_step(self, rows, optimizer)
    monkeypatch.setattr(CourseTrainer, "sft_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        first.train(max_steps=3)
    monkeypatch.setattr(CourseTrainer, "sft_step", real_step)
    assert "interrupted: checkpoint saved" in capsys.readouterr().out
    torch.manual_seed(12345)                 # a fresh process: whatever state it starts in
    resumed = CourseTrainer.resume(tmp_path / "cut" / "checkpoint", tiny_model(), tiny_tokenizer(),
                                   datasets.Dataset.from_list(ROWS),
                                   reward_funcs={"length": length_reward}, out_dir=tmp_path / "cut")
    assert (resumed.sft_done, resumed.global_step) == (2, 0)
    resumed.train(max_steps=3)
    full, cut = _logged(tmp_path / "whole"), _logged(tmp_path / "cut")
    assert [r.get("sft_step", r.get("step")) for r in cut] == [0, 1, 2, 3, 0, 1, 2]
    assert len({r["loss"] for r in full[:4]}) == 4                   # SFT learned something
    assert sum(r["grad_norm"] > 0 for r in full[4:]) >= 2           # GRPO had gradients
    assert cut == full
    end, again = _trainable(whole), _trainable(resumed)
    assert any(not torch.equal(end[n], start[n]) for n in end)       # the run did move them
    for n in end:
        assert torch.equal(again[n], end[n]), n


@pytest.mark.heavy
@pytest.mark.parametrize("cut", ["sampling", "update"])
def test_a_run_interrupted_inside_a_grpo_step_resumes_exactly(tmp_path, monkeypatch, cut):
    """Ctrl-C in the middle of a GRPO step, after it drew its prompts (the cursor moved) and
    perhaps after it updated the weights, then ``resume``: the same metrics and weights as the
    run that was never stopped. (The interrupt's checkpoint once held the cursor of the cut
    step, so the resumed run skipped its prompts: the curriculum run diverged there.)"""
    import datasets

    from grpo_course.core.train import CourseTrainer
    whole = _trainer(tmp_path / "whole")
    whole.train(max_steps=3)
    first = _trainer(tmp_path / "cut")
    hook = "_generate_and_score_completions" if cut == "sampling" else "_update"
    real, calls = getattr(CourseTrainer, hook), []

    def interrupted(self, *args):
        out = real(self, *args)
        calls.append(1)
        if len(calls) == 2:                  # the second step, once it has drawn or updated
            raise KeyboardInterrupt
        return out
    monkeypatch.setattr(CourseTrainer, hook, interrupted)
    with pytest.raises(KeyboardInterrupt):
        first.train(max_steps=3)
    monkeypatch.setattr(CourseTrainer, hook, real)
    saved = json.loads((tmp_path / "cut" / "checkpoint" / "trainer.json").read_text())
    assert (saved["global_step"], saved["prompts_used"]) == (1, _logged(tmp_path / "whole")[0]["prompts_sampled"])
    resumed = CourseTrainer.resume(tmp_path / "cut" / "checkpoint", tiny_model(), tiny_tokenizer(),
                                   datasets.Dataset.from_list(ROWS),
                                   reward_funcs={"length": length_reward}, out_dir=tmp_path / "cut")
    resumed.train(max_steps=3)
    assert _logged(tmp_path / "cut") == _logged(tmp_path / "whole")
    end, again = _trainable(whole), _trainable(resumed)
    assert all(torch.equal(again[n], end[n]) for n in end)


@pytest.mark.heavy
def test_a_cell_interrupted_inside_a_step_and_run_again_ends_where_it_would(tmp_path, monkeypatch):
    """A student's path: Ctrl-C inside a GRPO step (after its update), then ``train`` again on
    the same trainer, in the same process. The cut step is undone, random states included, so
    the run ends with the weights of the run that was never stopped."""
    from grpo_course.core.train import CourseTrainer
    dropout = dict(lora_dropout=0.2)         # the update draws its dropout masks from torch's state
    whole = _trainer(tmp_path / "whole", **dropout)
    whole.train(max_steps=3)
    first = _trainer(tmp_path / "cut", **dropout)
    real, calls = CourseTrainer._update, []

    def interrupted(self, *args):
        out = real(self, *args)
        calls.append(1)
        if len(calls) == 2:
            torch.rand(7)                    # the cut step drew random numbers too
            raise KeyboardInterrupt
        return out
    monkeypatch.setattr(CourseTrainer, "_update", interrupted)
    with pytest.raises(KeyboardInterrupt):
        first.train(max_steps=3)
    monkeypatch.setattr(CourseTrainer, "_update", real)
    assert (first.global_step, len(first.history)) == (1, 1)
    first.train(max_steps=3)
    assert _logged(tmp_path / "cut") == _logged(tmp_path / "whole")
    end, again = _trainable(whole), _trainable(first)
    assert all(torch.equal(again[n], end[n]) for n in end)


@pytest.mark.heavy
def test_sft_checkpoint_without_the_sft_optimizer_would_differ(tmp_path, monkeypatch):
    """The check above can fail: resuming the same interruption with a fresh SFT optimizer
    (what checkpoints held before) ends with different weights."""
    import datasets

    from grpo_course.core.train import CourseTrainer
    changes = dict(sft_steps=4, sft_batch_size=2, sft_learning_rate=1e-2, lora_dropout=0.0)
    whole = _trainer(None, **changes)
    whole.sft()
    first = _trainer(None, **changes)
    first.sft(steps=2)
    first.save_checkpoint(tmp_path / "ckpt")
    resumed = CourseTrainer.resume(tmp_path / "ckpt", tiny_model(), tiny_tokenizer(),
                                   datasets.Dataset.from_list(ROWS),
                                   reward_funcs={"length": length_reward})
    resumed.sft_optimizer = None             # drop the saved AdamW moments
    resumed.sft()
    end, again = _trainable(whole), _trainable(resumed)
    assert any(not torch.equal(again[n], end[n]) for n in end)


def test_correct_completions_counts_only_the_exact_tier():
    from grpo_course.core.rewards import CLOSE_REWARD, EXACT_REWARD, WRONG_REWARD, correct_completions
    scores = torch.tensor([EXACT_REWARD, CLOSE_REWARD, WRONG_REWARD, EXACT_REWARD, -1.0])
    assert correct_completions({"correctness": scores, "exact_format": torch.full((5,), 3.0)}) == 2
    assert correct_completions({"exact_format": torch.full((5,), 3.0)}) is None
