"""GRPO's mathematics, in the algorithm's order: advantages, per-token log-probs, the loss.

1. :func:`group_advantages` turns the rewards of G completions per prompt into
   advantages: reward minus the group's mean, divided by a spread.
2. :func:`per_token_logps` scores the sampled completion tokens under the policy
   (logits only for completion positions; each prompt is processed once and shared
   by its G completions through the key/value cache).
3. :func:`grpo_loss` is the clipped surrogate with the k3 KL, aggregated exactly as
   TRL's ``GRPOTrainer`` does for ``loss_type`` grpo, bnpo, dr_grpo and dapo.

The training loop that calls these lives in :mod:`grpo_course.train`.
"""
from __future__ import annotations

import contextlib

import torch
import torch.utils.checkpoint

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
SCALES = ("group", "batch", "none")


# ---------------------------------------------------------------- 1. advantages
def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group",
                     eps: float = 1e-4) -> torch.Tensor:
    """Advantages of ``rewards`` ([B], G = ``group_size`` contiguous completions per prompt).

    ``A_i = (r_i - mean(group)) / (std + eps)`` where std is the group's (``"group"``),
    the whole batch's (``"batch"``) or no division at all (``"none"``, Dr. GRPO). Stds are
    unbiased (Bessel), as in TRL. A group whose rewards are all equal gets zero advantage.
    """
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    grouped = rewards.view(-1, group_size)
    centred = (grouped - grouped.mean(1, keepdim=True)).view(-1)
    if scale == "none":
        return centred
    if scale == "group":
        std = grouped.std(1, keepdim=True).expand_as(grouped).reshape(-1) \
            if group_size > 1 and rewards.numel() else torch.zeros_like(rewards)
    else:
        std = rewards.std().expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    return centred / (std + eps)


def zero_std_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """[P] True where all G rewards of a prompt are equal (no learning signal)."""
    grouped = torch.as_tensor(rewards, dtype=torch.float32).view(-1, group_size)
    return (grouped.max(1).values - grouped.min(1).values).abs() < 1e-8


# ---------------------------------------------------------------- 2. log-probs
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
    try:
        from peft.helpers import disable_input_dtype_casting
    except ImportError:
        return contextlib.nullcontext()
    return disable_input_dtype_casting(model)


def uses_activation_checkpointing(model) -> bool:
    """Whether ``model`` recomputes activations in its backward pass (transformers 5 calls it
    activation checkpointing; the old name still works there, with a deprecation warning)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        value = getattr(model, name, None)
        if value is not None:
            return bool(value)
    return False


def per_token_logps(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                    completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                    temperature: float = 1.0, return_entropy: bool = False):
    """Log-probs ``[B, T]`` of ``completion_ids`` under ``model`` (differentiable).

    ``prompt_ids`` is either ``[B, Lp]`` (one row per completion) or ``[P, Lp]`` with
    ``B = P * G``: then each prompt runs through the model once and its key/value cache
    is shared by its G completions (gradients still flow through the prompt positions).
    Logits are computed only for the positions that predict completion tokens, a chunk at
    a time (:func:`_frozen_head_token_logps` when the output layer is frozen, as under LoRA,
    else :func:`_token_logps`).
    With ``return_entropy`` also returns the per-token entropy ``[B, T]`` (no grad).
    """
    B, T = completion_ids.shape
    P = prompt_ids.shape[0]
    if B % P:
        raise ValueError(f"{B} completions do not split over {P} prompts")
    G = B // P
    decoder = model.get_decoder()
    prompt_mask = prompt_mask.to(completion_mask.dtype)
    if uses_activation_checkpointing(model) and model.training:
        # activation checkpointing recomputes each layer in the backward pass, which a key/value
        # cache cannot survive: one pass over prompt + completion per row instead
        hidden = _hidden_without_cache(decoder, prompt_ids.repeat_interleave(G, 0),
                                       prompt_mask.repeat_interleave(G, 0), completion_ids,
                                       completion_mask)
    else:
        hidden = _hidden_with_shared_prompt(decoder, prompt_ids, prompt_mask, completion_ids,
                                            completion_mask, G)
    softcap = getattr(model.config, "final_logit_softcapping", None)
    weight = None if softcap else _frozen_output_weight(model)
    if weight is not None:
        logps, entropy = _frozen_head_token_logps(weight, hidden.reshape(B * T, -1),
                                                  completion_ids.reshape(-1), temperature,
                                                  with_entropy=return_entropy)
    else:
        logps, entropy = _token_logps(model.get_output_embeddings(), hidden.reshape(B * T, -1),
                                      completion_ids.reshape(-1), temperature,
                                      with_entropy=return_entropy, softcap=softcap)
    logps = logps.view(B, T)
    return (logps, entropy.view(B, T)) if return_entropy else logps


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


# ---------------------------------------------------------------- 3. the loss
def kl_k3(per_token_logps: torch.Tensor, ref_per_token_logps: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(policy || ref) per token: e^(r-p) - (r-p) - 1 >= 0."""
    d = ref_per_token_logps - per_token_logps
    return torch.exp(d) - d - 1


def clipped_surrogate(per_token_logps: torch.Tensor, old_per_token_logps: torch.Tensor,
                      advantages: torch.Tensor, epsilon_low: float = 0.2,
                      epsilon_high: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate per token, as a loss: ``-min(rho * A, clip(rho) * A)`` with
    ``rho = exp(logp - old_logp)``. ``advantages`` is [B, 1] (one per completion) or [B, T].
    Returns the per-token loss [B, T] and the ratio rho [B, T]."""
    epsilon_high = epsilon_low if epsilon_high is None else epsilon_high
    ratio = torch.exp(per_token_logps - old_per_token_logps)              # [B, T], 1 at first
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    return -torch.min(ratio * advantages, clipped * advantages), ratio


def aggregate_loss(per_token_loss: torch.Tensor, completion_mask: torch.Tensor,
                   loss_type: str = "grpo", max_completion_length: int | None = None,
                   num_items_in_batch: float | None = None) -> torch.Tensor:
    """Average ``per_token_loss`` [B, T] over the real tokens (``completion_mask``) the way
    ``loss_type`` says: this choice is each token's weight, and hence any length bias."""
    mask = completion_mask.to(per_token_loss.dtype)
    if loss_type == "grpo":      # each sequence's token mean, then the mean over sequences
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":      # every real token of the batch alike
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":   # a constant denominator: no length bias
        if max_completion_length is None:
            raise ValueError("loss_type='dr_grpo' needs max_completion_length")
        return (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_completion_length)
    if loss_type == "dapo":      # every real token of the whole generation batch alike
        n = mask.sum() if num_items_in_batch is None else torch.as_tensor(float(num_items_in_batch))
        return (per_token_loss * mask).sum() / n.clamp(min=1.0)
    raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")


def grpo_loss(per_token_logps: torch.Tensor, old_per_token_logps: torch.Tensor,
              advantages: torch.Tensor, completion_mask: torch.Tensor, *,
              ref_per_token_logps: torch.Tensor | None = None, beta: float = 0.0,
              epsilon_low: float = 0.2, epsilon_high: float | None = None,
              loss_type: str = "grpo", max_completion_length: int | None = None,
              num_items_in_batch: float | None = None) -> tuple[torch.Tensor, dict]:
    """The clipped GRPO surrogate (+ beta * k3 KL), aggregated as TRL 1.16 does.

    Per token: ``-min(rho * A, clip(rho, 1-eps_low, 1+eps_high) * A) + beta * KL`` with
    ``rho = exp(logp - old_logp)``. Aggregations over the real tokens (``mask``):

    * ``grpo``: mean over each sequence's tokens, then mean over sequences;
    * ``bnpo``: sum over all tokens / number of real tokens in the batch;
    * ``dr_grpo``: sum / (B * max_completion_length) — a constant, no length bias;
    * ``dapo``: sum / ``num_items_in_batch`` (real tokens in the whole generation batch;
      defaults to this batch's, which makes it equal to ``bnpo`` for one batch).
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    if per_token_logps.shape != old_per_token_logps.shape or \
            per_token_logps.shape != completion_mask.shape:
        raise ValueError("per_token_logps, old_per_token_logps and completion_mask must share "
                         f"one shape [B, T]; got {tuple(per_token_logps.shape)}, "
                         f"{tuple(old_per_token_logps.shape)}, {tuple(completion_mask.shape)}")
    if beta != 0.0 and ref_per_token_logps is None:
        raise ValueError("beta > 0 needs ref_per_token_logps")
    epsilon_high = epsilon_low if epsilon_high is None else epsilon_high
    mask = completion_mask.to(per_token_logps.dtype)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages

    per_token_loss, ratio = clipped_surrogate(per_token_logps, old_per_token_logps, adv,
                                              epsilon_low, epsilon_high)
    kl = None
    if beta != 0.0:
        kl = kl_k3(per_token_logps, ref_per_token_logps)
        per_token_loss = per_token_loss + beta * kl
    loss = aggregate_loss(per_token_loss, mask, loss_type, max_completion_length,
                          num_items_in_batch)

    with torch.no_grad():
        n_tok = mask.sum().clamp(min=1.0)
        low = ((ratio < 1 - epsilon_low) & (adv < 0)).to(mask.dtype)
        high = ((ratio > 1 + epsilon_high) & (adv > 0)).to(mask.dtype)
        metrics = {
            "clip_ratio/low_mean": float((low * mask).sum() / n_tok),
            "clip_ratio/high_mean": float((high * mask).sum() / n_tok),
            "clip_ratio/region_mean": float((((low + high) > 0).to(mask.dtype) * mask).sum() / n_tok),
            "kl": float((kl * mask).sum() / n_tok) if kl is not None else 0.0,
            "policy_loss": float(loss.detach()),
        }
    return loss, metrics


def reinforce_loss(per_token_logps: torch.Tensor, advantages: torch.Tensor,
                   completion_mask: torch.Tensor) -> torch.Tensor:
    """REINFORCE with the group baseline, token-mean per sequence: the gradient GRPO's
    ``grpo`` loss has when ``rho = 1`` and ``beta = 0`` (used in the tests and chapter 3)."""
    mask = completion_mask.to(per_token_logps.dtype)
    return (-(advantages[:, None] * per_token_logps * mask).sum(-1)
            / mask.sum(-1).clamp(min=1.0)).mean()
