"""The transformers side of the training pass: GRPO's per-token log-probs of a causal language
model (:func:`per_token_logps`, step 2 of :mod:`grpo_course.core.grpo`), made fast and small on a CPU.

- :func:`per_token_logps`: log p of each sampled completion token ``[B, T]``, differentiable;
- :func:`completion_hidden_states`: the last hidden states that predict each completion token
  (each prompt run once and its key/value cache shared by its G completions, or one pass per
  row where a prompt has one completion or under activation checkpointing);
- :func:`head_token_logps`: log p(token) and the entropy from those states, a chunk of the
  vocabulary-wide logits at a time (with the gradient rows known in closed form for a frozen
  output layer, as under LoRA);
- :func:`course_attention` and :func:`norms_cast_once`: the training pass's written-out attention
  and its bf16 casts made once per norm;
- :func:`add_lora`, :func:`enable_activation_checkpointing`, :func:`activation_checkpointing`:
  the adapters and the recomputation the trainers switch on; :func:`adapter_state` and
  :func:`set_adapter_state` copy the adapters' weights out and back.
"""
from __future__ import annotations

import contextlib

import torch
import torch.utils.checkpoint

from grpo_course.config import ConfigError, GRPOConfig
from grpo_course.core.loading import peft_quietly

# completion positions whose [chunk, vocab] logits exist at one time. An fp32 chunk of 128 rows
# of the bundled model's vocabulary stays under glibc's largest mmap threshold (32 MiB): freed,
# its memory is reused for the next chunk instead of being mapped and page-faulted afresh
# (larger chunks cross it and run slower; chapter 7 profiles the training pass).
LOGITS_CHUNK = 128


def _token_logps(head: torch.nn.Module, hidden: torch.Tensor, tokens: torch.Tensor,
                 temperature: float, with_entropy: bool = True, softcap: float | None = None,
                 chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(token) (and the entropy) for each row of ``hidden`` [N, H] under ``head``.

    The vocabulary is large (49k for the bundled model), so the logits are made ``chunk``
    rows at a time; with autograd on, each chunk is checkpointed: its logits are recomputed
    in the backward pass instead of kept, so memory holds one chunk of logits, not N.
    For a frozen output layer, :func:`_frozen_head_token_logps` does the same with less work.
    """
    def piece(h: torch.Tensor, tok: torch.Tensor):
        logits = head(h).float()
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        if temperature != 1.0:
            logits = logits / temperature
        logps = torch.log_softmax(logits, dim=-1)
        picked = logps.gather(-1, tok[:, None]).squeeze(-1)
        entropy = None
        if with_entropy:
            with torch.no_grad():
                entropy = -(logps.exp() * logps).sum(-1)
        return picked, entropy

    chunk = chunk or LOGITS_CHUNK
    grad = torch.is_grad_enabled() and hidden.requires_grad
    parts = [torch.utils.checkpoint.checkpoint(piece, h, t, use_reentrant=False) if grad
             else piece(h, t) for h, t in zip(hidden.split(chunk), tokens.split(chunk), strict=False)]
    picked = torch.cat([p for p, _ in parts])
    return picked, torch.cat([e for _, e in parts]) if with_entropy else None


class _RowwiseGradient(torch.autograd.Function):
    """``values`` [N] as a differentiable function of ``hidden`` [N, H] whose gradient is known
    already: ``values[i]`` depends on row ``i`` of ``hidden`` only, with gradient ``grads[i]``."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, values: torch.Tensor, grads: torch.Tensor):
        ctx.save_for_backward(grads)
        ctx.hidden_dtype = hidden.dtype
        return values.clone()

    @staticmethod
    def backward(ctx, grad_values: torch.Tensor):
        (grads,) = ctx.saved_tensors
        return (grad_values[:, None] * grads).to(ctx.hidden_dtype), None, None


def _frozen_head_token_logps(weight: torch.Tensor, hidden: torch.Tensor, tokens: torch.Tensor,
                             temperature: float, with_entropy: bool = True,
                             chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`_token_logps` for an output layer with a frozen weight ``weight`` [V, H] (LoRA's).

    log p(token_i) = z_i[token_i] - logsumexp(z_i) with z_i = W h_i / T depends on row i of the
    hidden states only, so its gradient with respect to that row is one vector,
    (W[token_i] - sum_v p_i(v) W[v]) / T, known as soon as the probabilities are: each chunk
    of logits is made once, turned into the log-probs, the entropy and these gradient rows, and
    freed. Autograd's way keeps nothing of it either, but makes each chunk again in the backward
    pass and goes through log-softmax and gather backward there: three products with the 49k x H
    output layer per chunk instead of two, so this way is faster (chapter 7 profiles it)."""
    chunk = chunk or LOGITS_CHUNK
    grad = torch.is_grad_enabled() and hidden.requires_grad
    picked, entropies, grads = [], [], []
    # dtypes by hand (autocast would run the entropy's dot products in bf16). Only the
    # passes that need the whole [chunk, V] block touch it: log p(token) is z[token] - log(total),
    # the entropy log(total) - sum(e z) / total, the gradient row (W[token] - e @ W / total) / T
    # with e = exp(z - max) and total = sum(e): the normalising is done on [chunk] and [chunk, H]
    # (faster than normalising p, log p and onehot - p over the whole block)
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        for h, tok in zip(hidden.detach().split(chunk), tokens.split(chunk), strict=False):
            z = torch.nn.functional.linear(h.to(weight.dtype), weight).float()
            if temperature != 1.0:
                z /= temperature
            z -= z.amax(-1, keepdim=True)
            e = z.exp()
            total = e.sum(-1)
            log_total = total.log()
            picked.append(z.gather(-1, tok[:, None]).squeeze(-1) - log_total)
            if with_entropy:
                entropies.append(log_total - torch.linalg.vecdot(e, z) / total)
            if grad:                              # d log p(token) / d z = onehot(token) - p
                row = weight[tok].float() - (e.to(weight.dtype) @ weight).float() / total[:, None]
                if temperature != 1.0:
                    row /= temperature
                grads.append(row.to(weight.dtype))                          # [n, H]
    values = torch.cat(picked)
    if grad:
        values = _RowwiseGradient.apply(hidden, values, torch.cat(grads))
    return values, torch.cat(entropies) if with_entropy else None


def grouped_query_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, scaling: float,
                            dropout: float = 0.0, **kwargs) -> tuple[torch.Tensor, None]:
    """softmax(q k^T * scaling + mask) v for transformers' attention layers, written out.

    ``query`` [B, H, L, D] against ``key``/``value`` [B, K, S, D] (K key/value heads, each
    shared by H/K query heads, read in place instead of repeated H/K times), ``attention_mask``
    a boolean [B, 1, L, S] (True = may attend). The probabilities stay in the query's dtype,
    so the backward pass keeps one [B, H, L, S] tensor per layer. For the training pass on a
    CPU, where sequences are a few hundred tokens, it timed faster than the fused (flash) kernel
    when it was written; time both on your machine before you trust either."""
    B, H, L, D = query.shape
    K, S = key.shape[1], key.shape[2]
    q = (query * scaling).reshape(B, K, H // K * L, D)
    scores = torch.matmul(q, key.transpose(2, 3)).view(B, K, H // K, L, S)
    if attention_mask is not None:      # rows with nothing to attend to (padding) stay finite
        scores = scores.masked_fill(~attention_mask[:, :, None, :, -S:],
                                    torch.finfo(scores.dtype).min)
    probs = torch.nn.functional.dropout(scores.softmax(-1), dropout, module.training)
    out = torch.matmul(probs.view(B, K, H // K * L, S), value).view(B, H, L, D)
    return out.transpose(1, 2).contiguous(), None


COURSE_ATTENTION = "course_gqa"


def _register_course_attention() -> None:
    # imported on first use, as peft is (see add_lora): transformers' modeling code imports torchao
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    def boolean_mask(*args, **kwargs):     # always a mask: the attention above is not causal itself
        kwargs["allow_is_causal_skip"] = False
        return sdpa_mask(*args, **kwargs)
    AttentionInterface.register(COURSE_ATTENTION, grouped_query_attention)
    AttentionMaskInterface.register(COURSE_ATTENTION, boolean_mask)


@contextlib.contextmanager
def course_attention(model, enabled: bool = True):
    """Run ``model``'s attention layers with :func:`grouped_query_attention` for a while (models
    whose layers call transformers' SDPA attention; others are left as they are)."""
    config = getattr(model, "config", None)
    if not enabled or getattr(config, "_attn_implementation", None) != "sdpa":
        yield
        return
    _register_course_attention()
    config._attn_implementation = COURSE_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"


def _cast_to_autocast_dtype(module, args, output):
    if isinstance(output, torch.Tensor) and torch.is_autocast_enabled("cpu"):
        return output.to(torch.get_autocast_dtype("cpu"))
    return None


@contextlib.contextmanager
def norms_cast_once(model, enabled: bool = True):
    """Under autocast, hand each RMSNorm's output on in the autocast dtype for a while.

    Autocast casts the input of every matrix product it runs: a decoder layer's normed hidden
    state feeds q, k and v (and, with LoRA, each one's ``lora_A``), so it is cast to bf16 six
    times, and each copy is kept for the backward pass; the MLP's input four times. Cast at the
    norm, it is cast once: the same values, fewer kernels, one saved copy for the backward pass
    instead of six. The gradients
    of its consumers then add up in bf16 before the cast back to fp32. peft's own cast of a LoRA
    layer's input to its fp32 ``lora_A`` weight is off meanwhile."""
    if not enabled:
        yield
        return
    handles = [m.register_forward_hook(_cast_to_autocast_dtype)
               for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    try:
        # peft casts a LoRA layer's input to its (fp32) lora_A weight: that would undo the cast
        with _peft_input_casts_off(model):
            yield
    finally:
        for handle in handles:
            handle.remove()


def _peft_input_casts_off(model):
    from peft.helpers import disable_input_dtype_casting  # peft loads on first use: see add_lora

    return disable_input_dtype_casting(model)


def uses_activation_checkpointing(model) -> bool:
    """Whether ``model`` recomputes activations in its backward pass (transformers 5 calls it
    activation checkpointing; the old name still works there, with a deprecation warning)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        value = getattr(model, name, None)
        if value is not None:
            return bool(value)
    return False


def head_token_logps(model, hidden: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0,
                     with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(token) ``[N]`` (and the entropy, no grad) of ``tokens`` [N] from ``hidden`` [N, H]
    under ``model``'s output layer: :func:`_frozen_head_token_logps` where that layer is frozen
    and plain (LoRA's), else :func:`_token_logps` (softcapped logits too)."""
    softcap = getattr(model.config, "final_logit_softcapping", None)
    weight = None if softcap else _frozen_output_weight(model)
    if weight is not None:
        return _frozen_head_token_logps(weight, hidden, tokens, temperature, with_entropy)
    return _token_logps(model.get_output_embeddings(), hidden, tokens, temperature,
                        with_entropy=with_entropy, softcap=softcap)


def completion_hidden_states(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                             completion_ids: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """The last hidden states ``[B, T, H]`` that predict each completion token. ``prompt_ids`` is
    ``[B, Lp]`` or ``[P, Lp]`` with ``B = P * G``: each prompt then runs once and its key/value
    cache is shared by its G completions (gradients still flow through the prompt positions).
    With one completion a prompt (G = 1: the warm-up's solutions, a gold continuation) there is
    nothing to share, and one pass over prompt + completion is faster than two (``bench/sft_step.py``)."""
    B, P = completion_ids.shape[0], prompt_ids.shape[0]
    if B % P:
        raise ValueError(f"{B} completions do not split over {P} prompts")
    G = B // P
    decoder = model.get_decoder()
    prompt_mask = prompt_mask.to(completion_mask.dtype)
    if G == 1 or (uses_activation_checkpointing(model) and model.training):
        # one completion a prompt: no cache to share. Activation checkpointing recomputes each
        # layer in the backward pass, which a key/value cache cannot survive. Either way: one
        # pass over prompt + completion per row
        return _hidden_without_cache(decoder, prompt_ids.repeat_interleave(G, 0),
                                     prompt_mask.repeat_interleave(G, 0), completion_ids,
                                     completion_mask)
    return _hidden_with_shared_prompt(decoder, prompt_ids, prompt_mask, completion_ids,
                                      completion_mask, G)


def _frozen_output_weight(model) -> torch.Tensor | None:
    """The weight to multiply by when the output layer is a bias-free Linear whose weight is
    frozen (LoRA's; the bundled model's is tied to its frozen embedding) -- under autocast one
    copy in the autocast dtype -- else ``None``."""
    head = model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    if not (isinstance(head, torch.nn.Linear) and head.bias is None and weight is not None
            and not weight.requires_grad):
        return None
    weight = weight.detach()
    if torch.is_autocast_enabled("cpu"):
        weight = weight.to(torch.get_autocast_dtype("cpu"))
    return weight


def _hidden_without_cache(decoder, prompt_ids, prompt_mask, completion_ids, completion_mask):
    """Last hidden states ``[B, T, H]`` that predict each completion token, from one forward pass
    over ``prompt + completion[:-1]`` (the prompt's last position predicts the first token)."""
    Lp, T = prompt_ids.shape[1], completion_ids.shape[1]
    ids = torch.cat([prompt_ids, completion_ids[:, :-1]], 1)
    mask = torch.cat([prompt_mask, completion_mask[:, :-1]], 1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = decoder(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
    return out.last_hidden_state[:, Lp - 1:Lp - 1 + T]


def _hidden_with_shared_prompt(decoder, prompt_ids, prompt_mask, completion_ids, completion_mask,
                               G: int):
    """The same hidden states, with each prompt run once and its key/value cache shared by its
    ``G`` completions."""
    B, T = completion_ids.shape
    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    # the prompt once; its last hidden state predicts the first completion token
    out = decoder(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions,
                  use_cache=True)
    first = out.last_hidden_state[:, -1:].repeat_interleave(G, 0)          # [B, 1, H]
    cache = out.past_key_values
    if G > 1:
        cache.batch_repeat_interleave(G)
    mask = torch.cat([prompt_mask.repeat_interleave(G, 0), completion_mask], 1)
    # completions: tokens 0..T-2 predict 1..T-1 (the last token predicts nothing we need)
    comp_pos = positions[:, -1:].repeat_interleave(G, 0) + 1 + torch.arange(T - 1)
    hidden = first
    if T > 1:
        out = decoder(input_ids=completion_ids[:, :-1], attention_mask=mask[:, :-1],
                      position_ids=comp_pos, past_key_values=cache, use_cache=True)
        hidden = torch.cat([first, out.last_hidden_state], 1)               # [B, T, H]
    return hidden


def add_lora(model, config: GRPOConfig):
    """Wrap ``model`` with fresh LoRA adapters (a no-op for a model that has them)."""
    if hasattr(model, "peft_config"):
        return model
    # peft imported here, not at the top: it imports torchao, which prints "Failed to load" lines
    # for its CUDA kernels, and a CLI's one-line error must come before any model is adapted
    with peft_quietly():
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha,
                          lora_dropout=config.lora_dropout,
                          target_modules=list(config.lora_target_modules), task_type="CAUSAL_LM")
        return get_peft_model(model, lora)


def enable_activation_checkpointing(model) -> None:
    """Recompute each layer's activations in the backward pass instead of keeping them (the
    binder profile's ``gradient_checkpointing``); it acts in train mode only, so the sampler
    (eval mode) keeps its cache."""
    if hasattr(model, "activation_checkpointing_enable"):     # transformers 5's name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


@contextlib.contextmanager
def activation_checkpointing(model, on: bool = True):
    """Activation checkpointing on ``model`` for a while (in train mode, where it acts), as it was
    after: chapter 3's loop recomputes each layer's activations in its backward pass instead of
    keeping them, and hands the policy back to the fast trainer as it found it."""
    was_on, was_training = uses_activation_checkpointing(model), model.training
    if on and not was_on:
        enable_activation_checkpointing(model)
    if on:
        model.train()           # also where it was on already, but the model was in eval mode
    try:
        yield model
    finally:
        if on and not was_on:
            if hasattr(model, "activation_checkpointing_disable"):     # transformers 5's name
                model.activation_checkpointing_disable()
            else:
                model.gradient_checkpointing_disable()
        if on:
            model.train(was_training)


def adapter_state(model) -> dict[str, torch.Tensor]:
    """A copy of ``model``'s trainable (LoRA) weights, by parameter name."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def set_adapter_state(model, state: dict[str, torch.Tensor]) -> None:
    """Copy ``state`` (parameter name -> tensor, as :func:`adapter_state` gives) into ``model``."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state.items():
            params[name].copy_(value)


def adapter_disabled(model):
    """``model`` without its LoRA adapter for a while: the reference policy of ``beta > 0``."""
    if hasattr(model, "disable_adapter"):
        return model.disable_adapter()
    raise ConfigError("beta > 0 needs a reference: train with use_lora=True "
                      "(the reference is the model with its adapter disabled)")


def per_token_logps(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                    completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                    temperature: float = 1.0, return_entropy: bool = False):
    """Log-probs ``[B, T]`` of ``completion_ids`` under ``model`` (differentiable).

    ``prompt_ids`` is either ``[B, Lp]`` (one row per completion) or ``[P, Lp]`` with
    ``B = P * G``: then each prompt runs through the model once and its key/value cache
    is shared by its G completions (:func:`completion_hidden_states`).
    Logits are computed only for the positions that predict completion tokens, a chunk at
    a time (:func:`head_token_logps`): log p = logit - logsumexp(logits),
    at ``temperature``. With ``return_entropy`` also returns the per-token entropy ``[B, T]``
    (no grad).
    """
    B, T = completion_ids.shape
    hidden = completion_hidden_states(model, prompt_ids, prompt_mask, completion_ids, completion_mask)
    logps, entropy = head_token_logps(model, hidden.reshape(B * T, -1), completion_ids.reshape(-1),
                                      temperature, with_entropy=return_entropy)
    logps = logps.view(B, T)
    return (logps, entropy.view(B, T)) if return_entropy else logps
