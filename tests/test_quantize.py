"""INT8 variants: sizes drop ~4x on Linear weights, logits stay close, save/load round-trips."""
from __future__ import annotations

import warnings

import pytest
import torch

from grpo_course.topics import quantize as Q
from tests import helpers


def tiny_llama(seed: int = 0):
    """Wide enough for fbgemm's int8 kernels."""
    return helpers.tiny_llama(seed, vocab_size=128, hidden_size=256, intermediate_size=512,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                              tie_word_embeddings=True).eval()


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))


@torch.inference_mode()
def logits(model, ids):
    return model(input_ids=ids).logits.float()


@pytest.mark.parametrize("variant", ["dynamic", "torchao"])
def test_linear_weight_bytes_drop_about_4x(variant):
    model = tiny_llama()
    fp32 = Q.storage_bytes(model)
    q = Q.quantize(model, variant)
    int8 = Q.storage_bytes(q)
    ratio = fp32["linear"] / int8["linear"]
    assert 3.5 < ratio <= 4.0, ratio           # 1 byte per weight + a scale per output row
    assert int8["other"] == fp32["other"]      # embeddings and norms stay fp32
    assert fp32["head"] == 0                   # the tied head is the embedding
    assert Q.storage_bytes(model) == fp32      # quantize() copies by default


@pytest.mark.parametrize("variant", ["dynamic", "torchao"])
def test_quantized_logits_close_to_fp32(variant, ids):
    model = tiny_llama()
    ref, out = logits(model, ids), logits(Q.quantize(model, variant), ids)
    agree = Q.logits_agreement(ref.flatten(0, 1), out.flatten(0, 1))
    assert agree["cosine_mean"] > 0.99
    assert agree["top1_agreement"] > 0.8
    assert not torch.equal(ref, out)           # it really is quantized


@pytest.mark.parametrize("variant", ["fp32", "dynamic", "torchao"])
def test_save_load_round_trip_identical(variant, ids, tmp_path):
    q = Q.quantize(tiny_llama(), variant)
    folder = Q.save_quantized(q, None, tmp_path / variant, variant)
    assert (folder / Q.WEIGHTS_FILE).is_file() and Q.folder_bytes(folder) > 0
    loaded, _ = Q.load_quantized(folder)
    assert torch.equal(logits(q, ids), logits(loaded, ids))
    assert Q.storage_bytes(loaded) == Q.storage_bytes(q)


def test_dynamic_skip_keeps_named_layers_float_and_round_trips(ids, tmp_path):
    q = Q.quantize(tiny_llama(), "dynamic", skip=("lm_head", "down_proj"))
    assert type(q.lm_head) is torch.nn.Linear and type(q.model.layers[0].mlp.down_proj) is torch.nn.Linear
    assert Q._is_dynamic_linear(q.model.layers[0].mlp.up_proj)
    loaded, _ = Q.load_quantized(Q.save_quantized(q, None, tmp_path / "d", "dynamic"))
    assert torch.equal(logits(q, ids), logits(loaded, ids))


@pytest.mark.parametrize("variant,skip", [("dynamic", ()), ("dynamic", ("down_proj",)),
                                          ("torchao", ())])
def test_quantize_copies_nothing_it_replaces_and_shares_nothing_it_keeps(variant, skip, ids):
    """quantize() makes no fp32 copy of the weights it turns into int8 (the copy shares them
    until they are replaced), leaves the original untouched, and shares no weight with it."""
    model = tiny_llama()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ref = logits(model, ids)
    copies = []
    real_deepcopy = Q.copy.deepcopy

    def counting_deepcopy(obj, memo=None):           # (copy.deepcopy recurses through itself)
        out = real_deepcopy(obj, memo)
        if obj is model:                                 # the model's copy: the values it copied
            copies.append(sum(p.numel() for p in out.parameters() if id(p) not in (memo or {})))
        return out

    Q.copy.deepcopy = counting_deepcopy
    try:
        q = Q.quantize(model, variant, skip=skip)
    finally:
        Q.copy.deepcopy = real_deepcopy
    embed = model.model.embed_tokens.weight.numel()
    norms = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    assert copies == [embed + norms]                  # copied: the embedding (= tied head) and norms
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert torch.equal(logits(model, ids), ref)
    originals = {p.data_ptr() for p in model.parameters()}
    assert not any(p.data_ptr() in originals for p in q.parameters() if not p.is_quantized)
    if skip:
        assert type(q.model.layers[0].mlp.down_proj) is torch.nn.Linear
        assert torch.equal(q.model.layers[0].mlp.down_proj.weight, model.model.layers[0].mlp.down_proj.weight)


def test_safetensors_refuses_quantized_state_dicts(tmp_path):
    from safetensors.torch import save_file

    q = Q.quantize(tiny_llama(), "dynamic")
    with pytest.raises((ValueError, TypeError, RuntimeError)):
        save_file(q.state_dict(), tmp_path / "raw.safetensors")


def test_dynamic_api_is_deprecated():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Q.quantize(tiny_llama(), "dynamic")
    assert any(issubclass(w.category, DeprecationWarning) and "deprecated" in str(w.message)
               for w in caught)


def test_fast_sampler_is_skipped_for_quantized_models():
    from grpo_course.core import sampling

    fp32, q = tiny_llama(), Q.quantize(tiny_llama(), "dynamic")
    assert Q.has_plain_weights(fp32) and not Q.has_plain_weights(q)
    assert sampling.supports_fast_path(fp32) and not sampling.supports_fast_path(q)


def test_bad_input_is_readable(tmp_path):
    with pytest.raises(Q.QuantizeError, match="unknown variant"):
        Q.quantize(tiny_llama(), "int4")
    with pytest.raises(Q.QuantizeError, match="not written by save_quantized"):
        Q.load_quantized(tmp_path)
    with pytest.raises(ValueError, match="shapes differ"):
        Q.logits_agreement(torch.zeros(2, 3), torch.zeros(3, 3))


@pytest.mark.slow
def test_real_model_dynamic_int8_agrees_on_a_gsm8k_prompt():
    from grpo_course.core.data import chat_prompt
    from grpo_course.core.loading import load_model

    model, tok = load_model()
    prompt = chat_prompt("Tom has 3 apples and buys 4 more. How many apples does he have?", tok)
    ref = Q.prompt_logits(model, tok, [prompt], last_k=4)
    q = Q.quantize(model, "dynamic", skip=("lm_head",))
    agree = Q.logits_agreement(ref, Q.prompt_logits(q, tok, [prompt], last_k=4))
    # per-tensor activation scales meet outlier activations: the top token survives, the tail
    # of the logit vector does not (chapter 6 measures this on more prompts)
    assert agree["top1_agreement"] >= 0.5 and agree["cosine_mean"] > 0.6
    sizes_fp32, sizes_q = Q.storage_bytes(model), Q.storage_bytes(q)
    assert 3.5 < sizes_fp32["linear"] / sizes_q["linear"] <= 4.0


# ---------------------------------------------------------------- chapter 6: variants paired against fp32
#: (question, a, op, b, a op b): three one-step problems; each row gets its GSM8K-style solution
_PROBLEMS = [("Tom has 12 apples and buys 30 more. How many?", 12, "+", 30, 42),
             ("A box holds 6 pens. How many pens are in 4 boxes?", 6, "*", 4, 24),
             ("Ann reads 15 pages a day for 2 days. How many pages?", 15, "*", 2, 30)]
_PAIRED_ROWS = [{"idx": i, "question": q, "answer": str(c),
                 "solution": f"{x}{op}{y}=<<{x}{op}{y}={c}>>{c}\n#### {c}"}
                for i, (q, x, op, y, c) in enumerate(_PROBLEMS)]


def _answers(texts):
    from grpo_course.core.answers import answers_match, extract_hash_answer
    from grpo_course.measure.evaluate import EvalResult

    records = []
    for row, text in zip(_PAIRED_ROWS, texts, strict=False):
        guess = extract_hash_answer(text)
        records.append({"idx": row["idx"], "completion": text, "formatted": guess is not None,
                        "correct": answers_match(guess, row["answer"])})
    return EvalResult.from_records(records)


def test_paired_rows_compare_each_variant_with_fp32_problem_by_problem():
    from grpo_course.measure.attribution import held_out_rewards

    fp32 = _answers(["12+30 = 42\n#### 42", "6*4 = 24\n#### 24", "15*2 = 30\n#### 30"])
    worse = _answers(["12+30 = 42\n#### 42", "I do not know", "15*2 = 31"])
    weights = {"correctness": 1.0, "exact_format": 0.5}
    (row,) = Q.paired_rows({"fp32": fp32, "int8": worse}, _PAIRED_ROWS, weights)
    assert row["variant"] == "int8" and row["n"] == 3
    assert (row["format % (fp32)"], row["format %"]) == (100.0, pytest.approx(100 / 3))
    assert row["format lost / gained"] == "2 / 0" and row["accuracy lost / gained"] == "2 / 0"
    a, b = held_out_rewards(fp32, _PAIRED_ROWS, weights), held_out_rewards(worse, _PAIRED_ROWS, weights)
    assert row["reward (fp32)"] == pytest.approx(sum(a) / 3)
    assert row["reward change"] == pytest.approx((sum(b) - sum(a)) / 3) and row["reward change"] < 0
    assert row["reward_lo"] <= row["reward change"] <= row["reward_hi"]
    same = Q.paired_rows({"fp32": fp32, "copy": fp32}, _PAIRED_ROWS, weights)[0]
    assert same["reward change"] == 0 and same["format p"] == 1.0 and same["accuracy p"] == 1.0


def test_activation_outliers_finds_a_planted_outlier_channel_and_leaves_no_hook():
    model, tok = helpers.tiny_model(), helpers.tiny_tokenizer()
    prompts = ["12+30=", "7*6 is 42"]
    before = Q.activation_outliers(model, tok, prompts)
    assert set(before) == {"q_proj", "o_proj", "gate_proj", "down_proj", "lm_head"}
    with torch.no_grad():                  # the last layer: one channel of down_proj's input 1000x
        model.model.layers[-1].mlp.up_proj.weight[3] *= 1000
    after = Q.activation_outliers(model, tok, prompts)
    assert after["down_proj"] > 10 * before["down_proj"]
    assert after["q_proj"] == pytest.approx(before["q_proj"])     # upstream of the plant: unchanged
    assert not any(m._forward_pre_hooks for m in model.modules())


def test_outlier_sentences_name_near_ties_together_and_the_kept_layers():
    ratios, widest = Q.outlier_sentences({"q_proj": 3.0, "down_proj": 20.0, "lm_head": 4.0})
    assert ratios == "`q_proj` 3.0×; `down_proj` 20.0×; `lm_head` 4.0×"
    assert widest == "`down_proj`'s input has the largest ratio"            # one of the kept layers
    _, widest = Q.outlier_sentences({"q_proj": 19.0, "o_proj": 20.0, "down_proj": 5.0})
    assert widest == ("`o_proj`'s and `q_proj`'s inputs have the largest ratios, within 10 % of each other, "
                      "none of them one of the two layers kept in fp32 below")
    assert Q.outlier_sentences({"gate_proj": 9.0, "down_proj": 2.0})[1].endswith(
        ", not one of the two layers kept in fp32 below")
    # the words follow ``kept``: one layer, or three
    assert Q.outlier_sentences({"gate_proj": 9.0}, kept=("lm_head",))[1].endswith(
        ", not the layer kept in fp32 below")
    assert Q.outlier_sentences({"gate_proj": 9.0}, kept=("lm_head", "down_proj", "up_proj"))[1].endswith(
        ", not one of the three layers kept in fp32 below")
    with pytest.raises(ValueError, match="no Linear layers"):
        Q.outlier_sentences({})


def test_peak_change_names_the_side_of_fp32_it_lies_on():
    assert Q.peak_change(880, 1000) == "12 % below fp32's"
    assert Q.peak_change(1120, 1000) == "12 % above fp32's"
    assert Q.peak_change(1004, 1000) == "level with fp32's (within 0.5 %)"


def test_cosine_change_is_paired_over_prompts():
    """Chapter 6 says one variant's logits are closer to fp32's only where the paired interval of
    the cosines' difference lies above 0; a prompt's positions count once, as one prompt."""
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(32, 50, generator=g)
    near, far = ref + 0.01 * torch.randn(32, 50, generator=g), ref + 1.0 * torch.randn(32, 50, generator=g)
    closer = Q.cosine_change(ref, far, near, positions_per_prompt=4)
    assert closer["n"] == 8 and closer["lo"] > 0
    assert Q.cosine_change(ref, near, far, positions_per_prompt=4)["hi"] < 0
    # each prompt's mean, not its positions: the same cosines as 32 one-position prompts give a
    # narrower interval than as 2 prompts of 16
    by_position = Q.cosine_change(ref, far, near, positions_per_prompt=1)
    by_prompt = Q.cosine_change(ref, far, near, positions_per_prompt=16)
    assert by_prompt["difference"] == pytest.approx(by_position["difference"], rel=1e-5)
    assert by_prompt["n"] == 2 and by_prompt["hi"] - by_prompt["lo"] > by_position["hi"] - by_position["lo"]
    with pytest.raises(ValueError, match="whole prompts of 5"):
        Q.cosine_change(ref, far, near, positions_per_prompt=5)


def test_a_slow_one_token_run_does_not_inflate_the_decoding_rate(monkeypatch):
    """The decode time is a full run less the prefill; the prefill is the fastest 1-token run, so
    a 1-token run slowed by another process does not shrink a full run's decode time."""
    from types import SimpleNamespace
    clock = iter([0.0, 10.0, 10.0, 21.0,     # repeat 1: 1-token run 10 s (disturbed), full run 11 s
                  30.0, 31.0, 40.0, 51.0])    # repeat 2: 1-token run 1 s, full run 11 s
    monkeypatch.setattr(Q.time, "perf_counter", lambda: next(clock))
    out = SimpleNamespace(completion_ids=torch.zeros(2, 11), completion_mask=torch.ones(2, 11))
    monkeypatch.setattr(Q, "sample_completions", lambda *a, **k: out)
    timed = Q.time_decoding(None, None, ["a", "b"], batch_size=2, max_new_tokens=11, repeats=2)
    assert timed["ttft_s"] == 1.0
    assert timed["rates"] == [2.0, 2.0] and timed["decode_tok_s"] == 2.0    # 2 x 10 tokens in 10 s
    assert timed["new_tokens"] == 22                                      # what the run decoded
