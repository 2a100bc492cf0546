"""The sampler: deterministic under a seed, honours EOS, fast path == transformers path."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from grpo_course.core.sampling import FastLlama, sample_completions, supports_fast_path
from tests.helpers import tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def tiny():
    return tiny_model(), tiny_tokenizer()


PROMPTS = ["what is 2+3?", "a much longer prompt, 7*8=?"]


@pytest.mark.heavy
def test_fast_path_matches_transformers(tiny):
    model, tok = tiny
    assert supports_fast_path(model)
    a = sample_completions(model, tok, PROMPTS, 3, 20, temperature=1.0, seed=5, fast=True)
    b = sample_completions(model, tok, PROMPTS, 3, 20, temperature=1.0, seed=5, fast=False)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.completion_mask, b.completion_mask)
    torch.testing.assert_close(a.sampling_logps, b.sampling_logps, atol=1e-4, rtol=1e-4)


@pytest.mark.heavy
def test_deterministic_under_seed(tiny):
    model, tok = tiny
    a = sample_completions(model, tok, PROMPTS, 4, 16, seed=123)
    b = sample_completions(model, tok, PROMPTS, 4, 16, seed=123)
    c = sample_completions(model, tok, PROMPTS, 4, 16, seed=124)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert a.completions == b.completions
    assert not torch.equal(a.completion_ids, c.completion_ids)


def test_shapes_and_grouping(tiny):
    model, tok = tiny
    s = sample_completions(model, tok, PROMPTS, 4, 12, seed=0)
    assert s.completion_ids.shape[0] == 8 and s.completion_ids.shape[1] <= 12
    assert s.prompt_ids.shape[0] == 2 and s.num_generations == 4
    assert len(s.completions) == 8
    assert (s.sampling_logps <= 0).all()
    assert (s.sampling_logps[s.completion_mask == 0] == 0).all()


@pytest.mark.heavy
def test_honours_eos():
    """Bias the head towards EOS: every row stops there, the mask ends with it, pads follow."""
    model, tok = tiny_model(seed=1), tiny_tokenizer()
    prompts = ["abc", "hello world"]
    s = sample_completions(model, tok, prompts, 4, 40, temperature=1.0, seed=0)
    eos = tok.eos_token_id
    for ids, mask, trunc in zip(s.completion_ids, s.completion_mask, s.truncated, strict=False):
        n = int(mask.sum())
        assert mask[:n].all() and not mask[n:].any()       # contiguous real tokens
        hits = (ids[:n] == eos).nonzero().flatten().tolist()
        if trunc:
            assert hits == []
        else:
            assert hits == [n - 1]                          # EOS is the last real token
    # a head that always says EOS stops after one token
    with torch.no_grad():
        model.lm_head = torch.nn.Linear(32, 64, bias=True)
        model.lm_head.weight.zero_()
        model.lm_head.bias.fill_(-30.0)
        model.lm_head.bias[eos] = 30.0
    model.config.tie_word_embeddings = False
    s = sample_completions(model, tok, prompts, 2, 40, seed=0, fast=False)
    assert s.completion_ids.shape[1] == 1 and (s.completion_ids == eos).all()
    assert not s.truncated.any()


def test_finished_rows_leave_the_batch_without_changing_the_samples(monkeypatch):
    """Rows that emitted EOS are dropped from the fast decoder's batch; the samples, masks,
    log-probs and truncation flags are those of the transformers path, which keeps them."""
    model, tok = tiny_model(seed=1), tiny_tokenizer()
    widths = []
    select = FastLlama.select

    def spy(self, rows):
        widths.append(len(rows))
        select(self, rows)
    monkeypatch.setattr(FastLlama, "select", spy)
    for temperature in (1.0, 0.0):
        a = sample_completions(model, tok, PROMPTS, 8, 60, temperature=temperature, seed=3, fast=True)
        b = sample_completions(model, tok, PROMPTS, 8, 60, temperature=temperature, seed=3, fast=False)
        assert torch.equal(a.completion_ids, b.completion_ids)
        assert torch.equal(a.completion_mask, b.completion_mask)
        assert torch.equal(a.truncated, b.truncated)
        torch.testing.assert_close(a.sampling_logps, b.sampling_logps, atol=1e-4, rtol=1e-4)
    assert widths and min(widths) < 16          # the batch did shrink


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prepacked_weights_give_the_same_samples(monkeypatch, dtype):
    """Decoding from weights reordered once (oneDNN) draws what the plain products draw, in
    both precisions, also after finished rows left the batch."""
    import grpo_course.core.sampling as sampling
    model, tok = tiny_model(seed=1), tiny_tokenizer()
    decoder = FastLlama(model, getattr(torch, dtype))
    decoder.allocate(4, 16)
    if dtype == "float32" and torch.backends.mkldnn.is_available():
        assert decoder.packed_head is not None   # bf16 is reordered only where oneDNN has it
    packed = sample_completions(model, tok, PROMPTS, 8, 60, temperature=1.0, seed=3,
                                fast=True, sampling_dtype=dtype)
    monkeypatch.setattr(sampling, "_prepack", lambda weight, rows: None)
    plain = sample_completions(model, tok, PROMPTS, 8, 60, temperature=1.0, seed=3,
                               fast=True, sampling_dtype=dtype)
    assert torch.equal(packed.completion_ids, plain.completion_ids)
    assert torch.equal(packed.completion_mask, plain.completion_mask)
    torch.testing.assert_close(packed.sampling_logps, plain.sampling_logps, atol=1e-3, rtol=1e-3)


def test_low_memory_mode_keeps_one_copy_of_the_weights(monkeypatch):
    """In low-memory mode the decoder keeps no re-ordered second copy of its weights, and
    draws the same samples."""
    from grpo_course.infra import memory

    model, tok = tiny_model(seed=1), tiny_tokenizer()
    decoder = FastLlama(model, torch.bfloat16)
    monkeypatch.setattr(memory, "_low_memory", True)
    decoder.allocate(4, 16)
    assert decoder.packed_head is None and all(p is None for ps in decoder.packed for p in ps)
    lean = sample_completions(model, tok, PROMPTS, 8, 60, temperature=1.0, seed=3,
                              fast=True, sampling_dtype="bfloat16")
    monkeypatch.setattr(memory, "_low_memory", False)
    usual = sample_completions(model, tok, PROMPTS, 8, 60, temperature=1.0, seed=3,
                               fast=True, sampling_dtype="bfloat16")
    assert torch.equal(lean.completion_ids, usual.completion_ids)


def test_greedy_and_left_padding(tiny):
    """Greedy completions of a prompt do not depend on the padding its batch needs."""
    model, tok = tiny
    alone = sample_completions(model, tok, PROMPTS[:1], 1, 10, temperature=0)
    padded = sample_completions(model, tok, PROMPTS, 1, 10, temperature=0)
    n = int(alone.completion_mask[0].sum())
    assert torch.equal(alone.completion_ids[0, :n], padded.completion_ids[0, :n])


@pytest.mark.heavy
def test_lora_delta_is_used(tiny):
    """The fast path sees the LoRA adapter's weights (and not when it is disabled)."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_model(seed=3), LoraConfig(r=4, target_modules=["q_proj", "up_proj"]))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    from grpo_course.core.sampling import _stacked_weight

    q_proj = model.base_model.model.model.layers[0].self_attn.q_proj
    assert not torch.allclose(_stacked_weight([q_proj], torch.float32), q_proj.base_layer.weight)
    with model.disable_adapter():
        assert torch.equal(_stacked_weight([q_proj], torch.float32), q_proj.base_layer.weight)
    tok = tiny_tokenizer()
    a = sample_completions(model, tok, PROMPTS, 2, 12, seed=9, fast=True)
    b = sample_completions(model, tok, PROMPTS, 2, 12, seed=9, fast=False)
    assert torch.equal(a.completion_ids, b.completion_ids)


def test_bad_arguments(tiny):
    model, tok = tiny
    with pytest.raises(ValueError):
        sample_completions(model, tok, PROMPTS, 0, 10)
    with pytest.raises(ValueError):
        sample_completions(model, tok, PROMPTS, 2, 0)


@pytest.mark.heavy
def test_bf16_sampler_stays_close_to_fp32(tiny):
    """The bf16 weight snapshot (the fast CPU default) decodes the same model: greedy tokens
    agree, and the per-token log-probs differ by bf16 rounding only."""
    model, tok = tiny
    a = sample_completions(model, tok, PROMPTS, 1, 12, temperature=0.0, fast=True)
    b = sample_completions(model, tok, PROMPTS, 1, 12, temperature=0.0, fast=True,
                           sampling_dtype="bfloat16")
    assert b.sampling_logps.dtype == torch.float32
    assert (a.sampling_dtype, b.sampling_dtype) == (torch.float32, torch.bfloat16)
    agree = (a.completion_ids == b.completion_ids).float().mean()
    assert agree >= 0.75, agree
    first = a.sampling_logps[:, 0] - b.sampling_logps[:, 0]
    assert first.abs().max() < 0.1, first
    s1 = sample_completions(model, tok, PROMPTS, 2, 8, seed=3, sampling_dtype="bfloat16")
    s2 = sample_completions(model, tok, PROMPTS, 2, 8, seed=3, sampling_dtype="bfloat16")
    assert torch.equal(s1.completion_ids, s2.completion_ids)


def test_sampling_dtype_names(monkeypatch):
    from grpo_course.core.sampling import resolve_sampling_dtype
    from grpo_course.infra import hardware
    assert resolve_sampling_dtype(None) is None
    assert resolve_sampling_dtype("float32") is torch.float32
    assert resolve_sampling_dtype("bfloat16") is torch.bfloat16
    assert resolve_sampling_dtype(torch.float16) is torch.float16
    monkeypatch.setattr(hardware, "native_bf16", lambda: True)
    assert resolve_sampling_dtype("auto") is torch.bfloat16
    monkeypatch.setattr(hardware, "native_bf16", lambda: False)
    assert resolve_sampling_dtype("auto") is None
    with pytest.raises(ValueError, match="sampling_dtype"):
        resolve_sampling_dtype("fp8")


@pytest.mark.parametrize(("P", "G", "dead"), [(3, 4, False), (3, 4, True), (1, 4, False),
                                              (3, 1, False), (1, 1, False)])
def test_shared_prefix_attention_is_attention_over_prompt_and_new_tokens(P, G, dead):
    """Each prompt's keys/values held once, shared by its rows (some of which may have left the
    batch), give SDPA over that row's prompt (left padding masked) followed by its new tokens;
    also with one prompt, or one row a prompt (greedy evaluation)."""
    from grpo_course.core.sampling import shared_prefix_attention
    K, R, Lp, T, D = 3, 3, 7, 5, 8
    g = torch.Generator().manual_seed(0)
    prompt_k, prompt_v = (torch.randn(P, K, Lp, D, generator=g) for _ in range(2))
    pad = torch.tensor([0, 2, 4])[:P]                      # left padding of each prompt
    prompt_mask = torch.arange(Lp)[None] >= pad[:, None]   # [P, Lp]
    prompt_of = torch.arange(P).repeat_interleave(G)
    if dead:                                               # rows that left: prompt 1 keeps 1 row
        prompt_of = prompt_of[torch.tensor([0, 1, 2, 3, 5, 8, 10])]
    B = len(prompt_of)
    counts = torch.bincount(prompt_of, minlength=P)
    width = int(counts.max())
    slots = prompt_of * width + torch.arange(B) - (counts.cumsum(0) - counts)[prompt_of]
    q = torch.randn(B, K, R, D, generator=g)
    new_k, new_v = (torch.randn(B, K, T + 2, D, generator=g)[:, :, :T] for _ in range(2))
    bias = torch.zeros(P, Lp).masked_fill_(~prompt_mask, float("-inf"))
    bias = bias[:, None, None].expand(P, K, 1, Lp).reshape(P * K, 1, Lp)
    out = shared_prefix_attention(q, prompt_k, prompt_v, bias, new_k, new_v, slots, width)
    keys = torch.cat([prompt_k[prompt_of], new_k], 2)      # [B, K, Lp+T, D]
    values = torch.cat([prompt_v[prompt_of], new_v], 2)
    keep = torch.cat([prompt_mask[prompt_of], torch.ones(B, T, dtype=torch.bool)], 1)
    expected = F.scaled_dot_product_attention(q, keys, values, attn_mask=keep[:, None, None])
    assert out.shape == (B, K, R, D)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_snapshot_adds_the_lora_delta_in_place():
    """The decoder's stacked weights are peft's merged weights: in fp32 to rounding, in bf16
    within bf16's rounding of the terms (the delta's product runs in bf16 there); other LoRA
    variants (DoRA) are left to peft's own delta."""
    from peft import LoraConfig, get_peft_model

    from grpo_course.core.sampling import _lora_factors, _stacked_weight, _weight

    model = get_peft_model(tiny_model(seed=4),
                           LoraConfig(r=4, target_modules=["q_proj", "v_proj", "up_proj"]))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    att = model.base_model.model.model.layers[0].self_attn
    qkv = [att.q_proj, att.k_proj, att.v_proj]
    merged = torch.cat([_weight(m) for m in qkv]).detach()
    torch.testing.assert_close(_stacked_weight(qkv, torch.float32), merged, atol=1e-6, rtol=1e-6)
    # bf16: the factors and the sum are rounded, so within 2^-7 of the sum of the terms' sizes
    size = []
    for m in qkv:
        w = getattr(m, "base_layer", m).weight.abs()
        for name in (n for n in getattr(m, "active_adapters", ()) if n in m.lora_A):
            w = w + m.scaling[name] * m.lora_B[name].weight.abs() @ m.lora_A[name].weight.abs()
        size.append(w.detach())
    stacked = _stacked_weight(qkv, torch.bfloat16).float()
    assert ((stacked - merged).abs() <= torch.cat(size) * 2 ** -7).all()
    assert len(_lora_factors(att.q_proj)) == 1 and _lora_factors(att.k_proj) == []
    dora = get_peft_model(tiny_model(seed=4), LoraConfig(r=4, target_modules=["q_proj"],
                                                         use_dora=True))
    assert _lora_factors(dora.base_model.model.model.layers[0].self_attn.q_proj) is None


def test_choose_inverts_the_distribution_and_returns_its_log_probs():
    """Uniform numbers on a fine grid draw each token as often as its probability (at the
    temperature, within the nucleus for top_p); the log-probs are those of the temperature-scaled
    distribution; temperature 0 is the argmax."""
    from grpo_course.core.sampling import _choose

    logits = torch.tensor([[2.0, 0.5, -1.0, 1.0, 0.0]])
    n = 20_000
    u = (torch.arange(n, dtype=torch.float32)[:, None] + 0.5) / n
    for temperature, top_p in ((1.0, 1.0), (0.7, 1.0), (1.0, 0.8)):
        tokens, logps = _choose(logits.expand(n, -1), temperature, top_p, u)
        full = torch.log_softmax(logits[0] / temperature, -1)
        p = full.exp()
        if top_p < 1.0:        # the nucleus: tokens by probability until top_p is covered
            order = p.argsort(descending=True)
            inside = torch.zeros_like(p, dtype=torch.bool)
            inside[order] = p[order].cumsum(0) - p[order] < top_p
            p = torch.where(inside, p, torch.zeros_like(p)) / p[inside].sum()
        freq = torch.bincount(tokens, minlength=5).float() / n
        torch.testing.assert_close(freq, p, atol=2e-4, rtol=0)
        torch.testing.assert_close(logps, full[tokens], atol=1e-5, rtol=1e-5)
    tokens, logps = _choose(logits, 0.0, 1.0, None)
    assert int(tokens) == 0 and torch.allclose(logps, torch.log_softmax(logits, -1)[:, 0])


def test_snapshot_shares_a_plain_weight_already_in_its_dtype():
    """A weight the sampler would only copy (no adapter, already in the sampling dtype) is read
    in place: the snapshot holds no second copy of it."""
    model = tiny_model(seed=5)
    layer = model.model.layers[0]
    fast = FastLlama(model, model.dtype)
    _, qkv, o_proj, _, gate_up, down_proj = fast.layers[0]
    assert o_proj.data_ptr() == layer.self_attn.o_proj.weight.data_ptr()
    assert down_proj.data_ptr() == layer.mlp.down_proj.weight.data_ptr()
    assert qkv.data_ptr() != layer.self_attn.q_proj.weight.data_ptr()   # q, k, v stacked


def test_fast_decoder_computes_the_models_logits():
    """In fp32 the decoder's logits are the model's, at the prompt (left-padded) and at every
    decoded position, with norm weights that are not all 1 (a fresh model's are)."""
    model, tok = tiny_model(seed=6), tiny_tokenizer()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
    enc = tok(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    fast = FastLlama(model, torch.float32)
    steps = 5
    fast.allocate(len(PROMPTS), steps)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = [fast.prefill(ids, mask, positions, 1)]
    new = torch.randint(4, 64, (len(PROMPTS), steps), generator=g)
    for t in range(steps - 1):
        logits.append(fast.decode(new[:, t], positions[:, -1] + 1 + t, t))
    all_ids = torch.cat([ids, new[:, :steps - 1]], 1)
    all_mask = torch.cat([mask, torch.ones_like(new[:, :steps - 1])], 1)
    with torch.no_grad():
        expected = model(input_ids=all_ids, attention_mask=all_mask,
                         position_ids=(all_mask.cumsum(-1) - 1).clamp(min=0)).logits
    torch.testing.assert_close(torch.stack(logits, 1), expected[:, ids.shape[1] - 1:],
                               atol=1e-4, rtol=1e-4)


def test_progress_bar_counts_tokens_and_leaves_the_samples_alone(tiny, capsys):
    model, tok = tiny
    a = sample_completions(model, tok, PROMPTS, 2, 12, seed=7)
    b = sample_completions(model, tok, PROMPTS, 2, 12, seed=7, progress="sampling")
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.sampling_logps, b.sampling_logps)
    err = capsys.readouterr().err
    assert "sampling" in err and f"{b.completion_ids.shape[1]}/12" in err


@pytest.mark.slow
def test_real_model_sampler_logps_are_the_training_pass_logps():
    """On the bundled model and GSM8K-style prompts, the sampler's log-probs of the tokens it
    drew are the training pass's on those tokens (what ``sampler_logp_gap`` logs): in fp32 to
    fp32 rounding; in bf16 within bf16 rounding, i.e. no further from the bf16 training pass
    than that pass is from the fp32 one (with room for the two roundings to add up)."""
    from grpo_course.core.data import chat_prompt
    from grpo_course.core.loading import load_model
    from grpo_course.core.policy import per_token_logps

    model, tok = load_model()
    prompts = [chat_prompt(q, tok) for q in (
        "Tom has 3 apples and buys 4 more. How many apples does he have?",
        "A pen costs $2 and a book costs 5 times as much. What do 3 books and 2 pens cost?")]

    def training_logps(s, bf16: bool) -> torch.Tensor:
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            return per_token_logps(model, s.prompt_ids, s.prompt_mask, s.completion_ids,
                                   s.completion_mask).float()

    fp32 = sample_completions(model, tok, prompts, 4, 24, seed=0, sampling_dtype="float32")
    m = fp32.completion_mask == 1
    gap32 = (fp32.sampling_logps - training_logps(fp32, False))[m].abs().max()
    assert gap32 < 1e-3

    bf16 = sample_completions(model, tok, prompts, 4, 24, seed=0, sampling_dtype="bfloat16")
    m = bf16.completion_mask == 1
    train32, train16 = training_logps(bf16, False), training_logps(bf16, True)
    rounding = (train16 - train32)[m].abs()
    gap16 = (bf16.sampling_logps - train16)[m].abs()
    assert 0 < rounding.max() < 1.0
    assert gap16.max() <= 2.5 * rounding.max() and gap16.mean() <= 2.5 * rounding.mean()
