"""Where the training pass keeps its precision: a bf16 frozen base, norms cast once, the frozen
output layer's gradient formed in the forward pass; each against the plain path it replaces."""
from __future__ import annotations

import pytest
import torch

from grpo_course.config import GRPOConfig
from grpo_course.core.policy import _frozen_output_weight, add_lora, norms_cast_once, per_token_logps
from grpo_course.core.precision import (
    FrozenLowPrecisionLinear,
    frozen_linear_weights_as,
    hold_frozen_weights_in,
)
from tests.helpers import tiny_model, tiny_tokenizer
from tests.helpers import tiny_trainer as _trainer

TARGETS = ("q_proj", "v_proj", "up_proj")


def _lora_model(seed: int = 0):
    model = add_lora(tiny_model(seed), GRPOConfig(lora_target_modules=TARGETS, lora_r=4,
                                                  lora_alpha=8))
    with torch.no_grad():       # non-zero adapters, so that they change the outputs
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn_like(p) * 0.1)
    return model


def _batch():
    tok = tiny_tokenizer()
    enc = tok(["<s>what is 2+3?<s>", "<s>7*8<s>"], return_tensors="pt", padding=True)
    comp = torch.randint(4, 50, (4, 6), generator=torch.Generator().manual_seed(3))
    cmask = torch.ones(4, 6, dtype=torch.long)
    cmask[1, 4:] = 0
    return enc["input_ids"], enc["attention_mask"], comp, cmask


def _logps_and_grads(model, batch, *contexts):
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for ctx in contexts:
            ctx.__enter__()
        try:
            logps = per_token_logps(model, *batch)
        finally:
            for ctx in reversed(contexts):
                ctx.__exit__(None, None, None)
    (logps * batch[3] * torch.linspace(-1, 1, logps.numel()).view_as(logps)).sum().backward()
    return logps.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                            if p.requires_grad}


def test_frozen_base_held_in_bf16_for_good():
    model = _lora_model()
    keys = set(model.state_dict())
    n = hold_frozen_weights_in(model, torch.bfloat16)
    layer = model.base_model.model.model.layers[0]
    assert n == 2 * 7                                   # every frozen Linear of the 2 layers
    assert layer.self_attn.q_proj.base_layer.weight.dtype == torch.bfloat16
    assert isinstance(layer.self_attn.q_proj.base_layer, FrozenLowPrecisionLinear)
    assert isinstance(layer.mlp.down_proj, FrozenLowPrecisionLinear)   # no adapter: frozen too
    for name, p in model.named_parameters():
        if p.requires_grad or "embed" in name or "norm" in name:     # adapters, tied embedding
            assert p.dtype == torch.float32, name
    assert set(model.state_dict()) == keys                           # same keys: saves as before
    assert hold_frozen_weights_in(model, torch.bfloat16) == 0        # nothing left to convert


def test_bf16_base_trains_like_a_per_step_bf16_copy():
    """Under autocast the bf16 base gives the log-probs and gradients of the fp32 base with its
    weights cast once per step (:func:`frozen_linear_weights_as`), bit for bit."""
    batch = _batch()
    per_step = _lora_model()
    a, ga = _logps_and_grads(per_step, batch, frozen_linear_weights_as(per_step, torch.bfloat16))
    held = _lora_model()
    hold_frozen_weights_in(held, torch.bfloat16)
    b, gb = _logps_and_grads(held, batch)
    assert torch.equal(a, b)
    for name in ga:
        assert torch.equal(ga[name], gb[name]), name


def test_bf16_base_runs_fp32_inputs_outside_autocast():
    """Outside autocast (evaluation, the reference pass, the Fisher pass) a converted layer takes
    the fp32 activations, computes in bf16 and hands fp32 back: close to the fp32 model."""
    batch = _batch()
    fp32 = _lora_model()
    held = _lora_model()
    hold_frozen_weights_in(held, torch.bfloat16)
    with torch.no_grad():
        a = per_token_logps(fp32, *batch)
        b = per_token_logps(held, *batch)
        logits = held(input_ids=batch[0], attention_mask=batch[1]).logits
    assert b.dtype == logits.dtype == torch.float32
    m = batch[3] == 1
    assert not torch.equal(a[m], b[m])                                   # it did use bf16
    torch.testing.assert_close(a[m], b[m], atol=0.05, rtol=0.02)


def test_trainer_holds_its_base_in_bf16_only_when_every_pass_trains_in_bf16():
    def base_dtype(trainer):
        return trainer.model.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight.dtype
    bf16 = _trainer(train_dtype="bfloat16", sft_dtype="bfloat16", beta=0.05, max_steps=1)
    assert base_dtype(bf16) == torch.bfloat16
    row = bf16.train()[-1]                   # beta > 0: a reference pass outside autocast too
    assert row["train_dtype"] == "bfloat16" and row["kl"] >= 0.0
    assert base_dtype(_trainer(train_dtype="float32", sft_dtype="bfloat16")) == torch.float32
    assert base_dtype(_trainer(train_dtype="bfloat16", sft_dtype="float32")) == torch.float32


def test_norms_cast_once_same_logps_and_close_gradients():
    """Casting each RMSNorm's output once gives the same log-probs as autocast's cast per
    consumer (the same values reach every product), and gradients that differ only by their sum
    in bf16; the hooks and peft's input cast are back after it."""
    batch = _batch()
    model = _lora_model()
    seen = []
    q = model.base_model.model.model.layers[0].self_attn.q_proj
    handle = q.lora_A["default"].register_forward_pre_hook(lambda m, a: seen.append(a[0].dtype))
    a, ga = _logps_and_grads(model, batch)
    b, gb = _logps_and_grads(model, batch, norms_cast_once(model))
    c, _ = _logps_and_grads(model, batch, norms_cast_once(model, enabled=False))
    handle.remove()
    # two calls a pass (the prompts, then the completions on their cache): cast at the norm, then not
    assert seen == [torch.float32] * 2 + [torch.bfloat16] * 2 + [torch.float32] * 2
    assert torch.equal(a, b) and torch.equal(a, c)
    for name in ga:   # bf16 sums in another order: each gradient within 2 % of the other's norm
        assert float((ga[name] - gb[name]).norm() / ga[name].norm()) < 0.02, name
    assert q.cast_input_dtype_enabled                              # peft's own cast is back


@pytest.mark.heavy
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_frozen_output_layer_gradient_formed_in_the_forward_pass(monkeypatch, temperature):
    """With the output layer frozen (LoRA), each token's log-prob gradient with respect to its
    hidden state is formed with the logits and kept, instead of the logits being made again in
    the backward pass. In fp32: autograd's log-probs, entropies and gradients (through
    log-softmax) to rounding, over one chunk and over several. Under bf16 autocast: no farther
    from the fp32 gradients than autograd's own bf16 pass."""
    import grpo_course.core.policy as grpo
    model, batch = _lora_model(), _batch()
    assert _frozen_output_weight(model) is not None
    with torch.autocast("cpu", dtype=torch.bfloat16):               # one bf16 copy under autocast
        assert _frozen_output_weight(model).dtype == torch.bfloat16

    def run(path: str, chunk: int, autocast: bool):
        with monkeypatch.context() as m:
            m.setattr(grpo, "LOGITS_CHUNK", chunk)
            if path == "autograd":
                m.setattr(grpo, "_frozen_output_weight", lambda model: None)
            model.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logps, entropy = per_token_logps(model, *batch, temperature=temperature,
                                                 return_entropy=True)
            (logps * batch[3] * torch.linspace(-1, 1, logps.numel()).view_as(logps)).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])
        return logps.detach(), entropy, grads

    logps, entropy, grads = run("autograd", 10_000, autocast=False)
    assert model.get_output_embeddings().weight.grad is None
    for chunk in (10_000, 5):                                         # one chunk, several
        formed = run("formed", chunk, autocast=False)
        torch.testing.assert_close(formed[0], logps, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(formed[1], entropy, atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(formed[2], grads, atol=1e-6, rtol=1e-5)
    gap = lambda g: float((g - grads).norm() / grads.norm())
    autograd_bf16, formed_bf16 = run("autograd", 5, True)[2], run("formed", 5, True)[2]
    assert gap(formed_bf16) <= 1.25 * gap(autograd_bf16) + 1e-3, (gap(formed_bf16), gap(autograd_bf16))


def test_trainable_output_layer_takes_autograd():
    """A trainable output layer (full fine-tuning) needs its own gradient: autograd's path."""
    model = tiny_model()
    assert model.get_output_embeddings().weight.requires_grad
    assert _frozen_output_weight(model) is None

