"""Batched G-per-prompt sampling with a key/value cache.

Each prompt runs through the model once (prefill) and its keys/values are kept once: its G
completions share them (:func:`shared_prefix_attention`), and only their new tokens' keys/values
are per row, in a buffer allocated once for the whole completion budget. The completions decode
together, one token per step; a sequence that has emitted EOS leaves the batch (its cache rows
are dropped once a quarter of the batch has finished), so the long tail of a batch is decoded at
the width it really has. The sampler keeps the log-probability of every token it drew, so a
trainer that uses each batch once needs no extra forward pass for ``old_per_token_logps``.

For Llama-style models (the bundled SmolLM2) decoding runs a compact re-implementation
of the forward pass over a snapshot of the weights (LoRA deltas merged in, q/k/v and
gate/up fused into one matrix each): fewer, larger matrix products, no cache
concatenation and no per-step framework overhead. Other architectures use the
transformers model with its own cache (slower, same results).

Decoding G x P rows multiplies every weight by a few dozen rows per step: almost all of its time
is in those products. The snapshot's weights are reordered once per call into oneDNN's blocked
layout (fp32 and bf16), which a plain product redoes or streams around on every step (not in
low-memory mode, where that second copy of the weights does not fit:
:func:`grpo_course.infra.memory.use_low_memory`). ``sampling_dtype="bfloat16"`` snapshots the
weights in bf16 (half the bytes, and the CPU's AVX512-BF16 or AMX instructions where it has
them); ``"auto"`` picks bf16 only on CPUs with native bf16 support (elsewhere bf16 matrix products
are emulated and slower). Everything between the products (the residual stream, norms, rotary
embeddings, attention) stays in fp32. A bf16 sampler draws from a very slightly different
distribution, so its log-probs are a diagnostic, not the trainer's ``old_per_token_logps`` (see
:mod:`grpo_course.core.train`). ``bench/sampler.py`` times it against transformers' ``generate``
and llama.cpp.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from grpo_course.config import SAMPLING_DTYPES
from grpo_course.core.calculator import CalculatorRows, calculator_for
from grpo_course.infra import hardware, memory
from grpo_course.infra.progress import tqdm


@dataclass
class SampleBatch:
    """Completions of ``P`` prompts x ``G`` generations, grouped contiguously."""

    prompt_ids: torch.Tensor        # [P, Lp] left-padded
    prompt_mask: torch.Tensor       # [P, Lp]
    completion_ids: torch.Tensor    # [P*G, T] (pad after EOS)
    completion_mask: torch.Tensor   # [P*G, T] 1 for real tokens, EOS included
    sampling_logps: torch.Tensor    # [P*G, T] log-prob of each drawn token (0 where masked)
    completions: list[str]          # decoded text, special tokens removed
    num_generations: int
    truncated: torch.Tensor         # [P*G] True where the length limit came before EOS
    sampling_dtype: torch.dtype = torch.float32   # precision of the weights that drew the tokens
    # [P*G, T] TRL's name: 1 where the model chose the token, 0 where the calculator forced it
    # (no sampling log-prob there; the loss leaves it out). None: all the model's.
    tool_mask: torch.Tensor | None = None

    @property
    def model_mask(self) -> torch.Tensor:
        """[P*G, T] 1 on the tokens the model chose (``completion_mask`` times ``tool_mask``):
        the tokens the loss counts."""
        return self.completion_mask if self.tool_mask is None else self.completion_mask * self.tool_mask

    @property
    def completion_lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(1)

    def select_groups(self, groups: torch.Tensor) -> SampleBatch:
        """The batch of the prompts where ``groups`` ([P] bool) is True, all G completions each."""
        G = self.num_generations
        rows = groups.repeat_interleave(G)
        picked = [t for t, keep in zip(self.completions, rows.tolist(), strict=False) if keep]
        T = max(int(self.completion_mask[rows].sum(1).max()), 1) if rows.any() else 1
        return SampleBatch(self.prompt_ids[groups], self.prompt_mask[groups],
                           self.completion_ids[rows, :T], self.completion_mask[rows, :T],
                           self.sampling_logps[rows, :T], picked, G, self.truncated[rows],
                           self.sampling_dtype,
                           None if self.tool_mask is None else self.tool_mask[rows, :T])


def _pad(t: torch.Tensor, width: int, left: bool) -> torch.Tensor:
    """``t`` [N, L] padded with zeros to [N, width] (on the left for prompts)."""
    fill = t.new_zeros(t.shape[0], width - t.shape[1])
    return torch.cat([fill, t] if left else [t, fill], 1)


def concat_batches(batches: list[SampleBatch]) -> SampleBatch:
    """One batch of the groups of ``batches`` (same G), prompts left-padded and completions
    right-padded to the widest (padding is masked out, so it changes no log-prob)."""
    if len({b.num_generations for b in batches}) != 1:
        raise ValueError("batches to concatenate must share num_generations")
    if len(batches) == 1:
        return batches[0]
    Lp = max(b.prompt_ids.shape[1] for b in batches)
    T = max(b.completion_ids.shape[1] for b in batches)
    return SampleBatch(
        torch.cat([_pad(b.prompt_ids, Lp, True) for b in batches]),
        torch.cat([_pad(b.prompt_mask, Lp, True) for b in batches]),
        torch.cat([_pad(b.completion_ids, T, False) for b in batches]),
        torch.cat([_pad(b.completion_mask, T, False) for b in batches]),
        torch.cat([_pad(b.sampling_logps, T, False) for b in batches]),
        [t for b in batches for t in b.completions], batches[0].num_generations,
        torch.cat([b.truncated for b in batches]), batches[0].sampling_dtype,
        None if all(b.tool_mask is None for b in batches)
        else torch.cat([_pad(torch.ones_like(b.completion_mask) if b.tool_mask is None else b.tool_mask,
                        T, False) for b in batches]))


def _choose(logits: torch.Tensor, temperature: float, top_p: float,
            uniform: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; return (tokens, their log-probs under the sampling dist).

    Sampling inverts the cumulative distribution with one uniform number per row
    (``uniform`` [rows, 1]; ``torch.multinomial`` draws one exponential per vocabulary
    entry: slower). The distribution is left unnormalised (the uniform number is scaled by its
    sum instead), which skips a logsumexp and a normalised copy of the probabilities.
    """
    if temperature <= 0:  # greedy
        logps = torch.log_softmax(logits.float(), dim=-1)
        tokens = logps.argmax(-1)
        return tokens, logps.gather(-1, tokens[:, None]).squeeze(-1)
    # row-major (the compact decoder's head gives [V, B].T): the ops below keep a layout, and
    # searchsorted would copy non-contiguous boundaries on every call, with a warning
    scaled = (logits.float() if temperature == 1.0 else logits.float() / temperature).contiguous()
    top = scaled.amax(-1, keepdim=True)
    weights = (scaled - top).exp_()       # unnormalised probabilities: u is scaled by their sum
    if top_p < 1.0:     # draw within the nucleus; the log-prob stays the whole distribution's
        total = weights.sum(-1, keepdim=True)
        sorted_w, order = weights.sort(dim=-1, descending=True)
        keep = sorted_w.cumsum(-1) - sorted_w < top_p * total
        weights = torch.zeros_like(weights).scatter(-1, order, sorted_w * keep)
    cdf = weights.cumsum_(-1)             # contiguous, as searchsorted wants its boundaries
    if top_p >= 1.0:
        total = cdf[:, -1:]
    tokens = torch.searchsorted(cdf, uniform.to(cdf.dtype) * cdf[:, -1:], right=True)
    tokens = tokens.squeeze(-1).clamp_(max=cdf.shape[-1] - 1)
    return tokens, (scaled.gather(-1, tokens[:, None]) - top - total.log()).squeeze(-1)


# ---------------------------------------------------------------- the fast Llama decoder
def _weight(module: torch.nn.Module) -> torch.Tensor:
    """The effective weight of a Linear, with active (unmerged) LoRA deltas added."""
    if hasattr(module, "base_layer") and hasattr(module, "get_delta_weight"):
        weight = module.base_layer.weight
        if not getattr(module, "merged", False) and not module.disable_adapters:
            for name in module.active_adapters:
                if name in module.lora_A:
                    weight = weight + module.get_delta_weight(name)
        return weight
    return module.weight


def _lora_factors(module: torch.nn.Module) -> list[tuple[torch.Tensor, torch.Tensor, float]] | None:
    """``(B, A, scaling)`` of each active adapter of a plain LoRA Linear (delta = scaling * B @ A);
    ``[]`` for a plain Linear; ``None`` for anything else (other LoRA variants: :func:`_weight`)."""
    if not hasattr(module, "base_layer"):
        return [] if isinstance(module, torch.nn.Linear) else None
    if not hasattr(module, "get_delta_weight") or getattr(module, "fan_in_fan_out", False):
        return None
    if getattr(module, "merged", False) or module.disable_adapters:
        return []
    factors = []
    for name in module.active_adapters:
        if name not in module.lora_A:
            continue
        if getattr(module, "lora_variant", {}).get(name) is not None \
                or not isinstance(module.lora_A[name], torch.nn.Linear):
            return None
        factors.append((module.lora_B[name].weight, module.lora_A[name].weight,
                        module.scaling[name]))
    return factors


def _stacked_weight(modules: list[torch.nn.Module], dtype: torch.dtype) -> torch.Tensor:
    """The effective weights of ``modules`` (Linears, LoRA or not, with the same input size)
    stacked by rows, in ``dtype``: each is copied once into one buffer and its LoRA delta added
    there in place (``addmm_``: the base, plus scaling * B @ A in ``dtype``'s matrix product,
    rounded once). Merging in fp32 and casting made three full-size temporaries per weight.
    A single plain weight already in
    ``dtype`` is used as it is, not copied."""
    weights = [m.base_layer.weight if hasattr(m, "base_layer") else m.weight for m in modules]
    adapters = [_lora_factors(m) for m in modules]
    if len(modules) == 1 and weights[0].dtype == dtype and adapters[0] == []:
        return weights[0].detach()
    out = torch.empty(sum(w.shape[0] for w in weights), weights[0].shape[1], dtype=dtype)
    pieces = out.split([w.shape[0] for w in weights])
    for module, weight, factors, piece in zip(modules, weights, adapters, pieces, strict=False):
        if factors is None:
            piece.copy_(_weight(module).detach())
            continue
        piece.copy_(weight.detach())
        for B, A, scaling in factors:
            piece.addmm_(B.detach().to(dtype), A.detach().to(dtype), alpha=scaling)
    return out


def _base(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def has_plain_linear_weights(model: torch.nn.Module) -> bool:
    """True when every Linear holds a plain float tensor (not a quantized one)."""
    for module in model.modules():
        if isinstance(module, torch.ao.nn.quantized.dynamic.Linear):
            return False          # dynamic INT8: packed params, `.weight` is a method
        if isinstance(module, torch.nn.Linear):
            w = module.weight.data
            if type(w) not in (torch.Tensor, torch.nn.Parameter) or w.is_quantized:
                return False      # e.g. torchao's Int8Tensor (no aten.cat)
    return True


def resolve_sampling_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    """``"auto"`` -> bf16 on CPUs with native bf16 matrix support
    (:func:`grpo_course.infra.hardware.native_bf16`), else ``None`` (the model's
    own dtype); ``"float32"``/``"bfloat16"`` or a torch dtype as given."""
    if name is None or isinstance(name, torch.dtype):
        return name
    if name == "auto":
        return torch.bfloat16 if hardware.native_bf16() else None
    if name in SAMPLING_DTYPES:
        return getattr(torch, name)
    raise ValueError(f"sampling_dtype must be one of {', '.join(SAMPLING_DTYPES)}; got {name!r}")


def sampler_dtype(model, sampling_dtype: str | torch.dtype | None,
                  fast: bool | None = None) -> torch.dtype:
    """The weight precision :func:`sample_completions` decodes ``model`` at: the resolved
    ``sampling_dtype`` on the compact decoder, else the model's own dtype."""
    use_fast = supports_fast_path(_base(model)) if fast is None else fast
    return (resolve_sampling_dtype(sampling_dtype) if use_fast else None) \
        or next(model.parameters()).dtype


def supports_fast_path(model) -> bool:
    """True for Llama-style decoders without biases whose Linear weights are plain float
    tensors (the bundled model, with or without LoRA); quantized models take the
    transformers path."""
    cfg = getattr(model, "config", None)
    return (getattr(cfg, "model_type", None) in ("llama", "mistral")
            and not getattr(cfg, "attention_bias", False) and not getattr(cfg, "mlp_bias", False)
            and getattr(cfg, "hidden_act", "silu") == "silu"
            and has_plain_linear_weights(model))


def _prepack(weight: torch.Tensor, rows: int) -> torch.Tensor | None:
    """``weight`` (fp32 or bf16) reordered once into oneDNN's blocked layout, or ``None`` where
    that op is not available. A plain product reorders (bf16) or streams (fp32, MKL's layout) the
    weight on every call; decoding calls each weight once per token, so once pays."""
    op = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None)
    if weight.dtype not in (torch.float32, torch.bfloat16) or op is None \
            or not torch.backends.mkldnn.is_available():
        return None
    try:
        return op(weight, rows)
    except RuntimeError:
        return None


def _linear(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor | None) -> torch.Tensor:
    if packed is not None:
        return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    return F.linear(x, weight)


def shared_prefix_attention(q: torch.Tensor, prompt_k: torch.Tensor, prompt_v: torch.Tensor,
                            prompt_bias: torch.Tensor, new_k: torch.Tensor, new_v: torch.Tensor,
                            slots: torch.Tensor, width: int) -> torch.Tensor:
    """Attention of one new position per row, in fp32, over its prompt's keys and values (held
    once per prompt, shared by the prompt's G rows) and over the row's own new tokens.

    ``q`` [B, K, R, D] (R = H/K query heads per key/value head); ``prompt_k``/``prompt_v``
    [P, K, Lp, D]; ``prompt_bias`` [P*K, 1, Lp] (0, or -inf at the prompt's left padding);
    ``new_k``/``new_v`` [B, K, T, D], every slot a real token; ``slots`` [B]: each row's place in
    a [P, width] layout of the prompts' rows (row-major, as rows leave a group has fewer).

    The prompt part is one product per prompt and key/value head with width x R query rows,
    rather than B products that each read a copy of the prompt (Hydragen, arXiv 2402.05099;
    vLLM's cascade attention). Both parts' scores meet in one softmax, so the result is
    attention over the concatenated keys."""
    B, K, R, D = q.shape
    P, Lp = prompt_k.shape[0], prompt_k.shape[2]
    scale = D ** -0.5

    full = B == P * width        # every prompt has all its rows: the layout is the rows' order

    def to_groups(x: torch.Tensor) -> torch.Tensor:      # [B, K, R, n] -> [P*K, width*R, n]
        grouped = x
        if not full:
            grouped = x.new_zeros(P * width, *x.shape[1:])
            grouped[slots] = x
        return grouped.reshape(P, width, K, R, -1).transpose(1, 2).reshape(P * K, width * R, -1)

    def from_groups(x: torch.Tensor) -> torch.Tensor:    # [P*K, width*R, n] -> [B, K, R, n]
        n = x.shape[-1]
        grouped = x.view(P, K, width, R, n).transpose(1, 2).reshape(P * width, K, R, n)
        # contiguous: with one prompt or one row a prompt, the reshape may stay a strided view
        return grouped.contiguous() if full else grouped[slots]

    scores_prompt = torch.baddbmm(prompt_bias, to_groups(q), prompt_k.flatten(0, 1).transpose(1, 2),
                                  alpha=scale)                                # [P*K, width*R, Lp]
    scores_new = torch.bmm(q.reshape(B * K, R, D), new_k.flatten(0, 1).transpose(1, 2))
    scores = torch.cat([from_groups(scores_prompt).view(B * K, R, Lp),
                        scores_new.mul_(scale)], -1).softmax(-1)              # [B*K, R, Lp+T]
    probs_prompt, probs_new = scores.split([Lp, scores.shape[-1] - Lp], -1)
    out = from_groups(torch.bmm(to_groups(probs_prompt.reshape(B, K, R, Lp)),
                                prompt_v.flatten(0, 1)))                      # [B, K, R, D]
    return out.view(B * K, R, D).baddbmm_(probs_new, new_v.flatten(0, 1)).view(B, K, R, D)


def _rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding over the last dim: ``x * cos + rotate_half(x) * sin``, with
    rotate_half's sign folded into ``signed_sin`` (:func:`_signed_sin`) so that the rotation is
    one ``roll``."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), signed_sin)


def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], -1)


class FastLlama:
    """A weight snapshot of a Llama model with its key/value cache, for sampling.

    The weights are in the snapshot's ``dtype`` (its matrix products); the residual stream, the
    norms' statistics, rotary embeddings and attention stay in fp32, so nothing is cast back and
    forth between products. The cache holds each prompt's keys and values once
    (:func:`shared_prefix_attention`) and each row's new tokens in a buffer allocated once for
    the whole completion budget."""

    def __init__(self, model, dtype: torch.dtype | None = None):
        base = _base(model)
        cfg = base.config
        self.dtype = dtype or next(model.parameters()).dtype
        stack = lambda *modules: _stacked_weight(list(modules), self.dtype)
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.rotary = base.model.rotary_emb
        # the embedding is gathered from the model's own weight and cast per token: no second copy
        self.embed = base.model.embed_tokens.weight.detach()
        self.norm = self._rms_norm(base.model.norm)
        self.lm_head = stack(base.lm_head)
        self.layers = []
        for layer in base.model.layers:
            att, mlp = layer.self_attn, layer.mlp
            self.layers.append((
                self._rms_norm(layer.input_layernorm),
                stack(att.q_proj, att.k_proj, att.v_proj),
                stack(att.o_proj),
                self._rms_norm(layer.post_attention_layernorm),
                stack(mlp.gate_proj, mlp.up_proj),
                stack(mlp.down_proj),
            ))
        self.inter = self.layers[0][4].shape[0] // 2

    def _rms_norm(self, norm: torch.nn.Module):
        """Llama's RMSNorm of the fp32 residual stream, returning the snapshot's dtype."""
        weight = norm.weight.detach().float()
        eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))
        dtype = self.dtype      # not ``self``: a closure over it would keep the snapshot alive

        def apply(h: torch.Tensor) -> torch.Tensor:
            return F.rms_norm(h, weight.shape, weight, eps).to(dtype)
        return apply

    def allocate(self, batch: int, max_new_tokens: int) -> None:
        # one buffer per layer for the new tokens' keys/values: dropping finished rows (select)
        # then copies one layer at a time, so the cache never exists twice over
        # (left uninitialised: attention reads only the slots written so far, so the pages of the
        # slots still to come take no memory until decoding reaches them)
        shape = (batch, self.n_kv, max_new_tokens, self.head_dim)
        self.k = [torch.empty(shape) for _ in self.layers]
        self.v = [torch.empty(shape) for _ in self.layers]
        self.written = 0            # new-token slots 0..written-1 hold keys and values
        # decoding multiplies every weight by a few rows per step: reorder the weights once (a
        # second copy of them: not in low-memory mode, where each product reads its weight as is)
        pack = (lambda w: None) if memory.low_memory() else (lambda w: _prepack(w, batch))
        self.packed = [tuple(pack(w) for w in (wqkv, wo, wgu, wd))
                       for _, wqkv, wo, _, wgu, wd in self.layers]
        self.packed_head = pack(self.lm_head)

    def _rotary(self, h: torch.Tensor, positions: torch.Tensor):
        cos, sin = self.rotary(h, positions)
        return cos, _signed_sin(sin)

    def _set_rows(self, prompt_of: torch.Tensor) -> None:
        """Each row's prompt (rows in order, a prompt's rows together) and its slot in the
        [prompts, width] layout of :func:`shared_prefix_attention`."""
        counts = torch.bincount(prompt_of, minlength=self.prompt_k[0].shape[0])
        self.width = int(counts.max())
        first = counts.cumsum(0) - counts
        self.prompt_of = prompt_of
        self.slots = prompt_of * self.width + torch.arange(len(prompt_of)) - first[prompt_of]

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                repeat: int) -> torch.Tensor:
        """Run the prompts [P, L] once and keep their keys/values once; the last logits of each
        prompt for each of its ``repeat`` rows, [P*repeat, V].

        The matrix products run over the prompts' real tokens only, packed into one [N, d]
        batch (left padding is a third of a batch of GSM8K prompts, and those products are
        almost all of a prefill's work); attention scatters them into the padded [P, L] layout,
        where each prompt's keys and values stay for decoding."""
        P, L = ids.shape
        real = mask.bool()
        h = F.embedding(ids[real], self.embed).float()              # [N, d]
        cos, sin = self._rotary(h[None], positions[real][None])
        cos, sin = cos[0, :, None], sin[0, :, None]                 # [N, 1, D]
        keep = torch.ones(L, L, dtype=torch.bool).tril()[None, None] & real[:, None, None, :]
        keep = keep | torch.eye(L, dtype=torch.bool)  # pad rows attend to themselves: no NaN
        H, K, D = self.n_heads, self.n_kv, self.head_dim
        N = h.shape[0]
        padded = torch.zeros(P, L, H + 2 * K, D)      # pads stay zero: masked keys, unused rows
        self.prompt_k, self.prompt_v = [], []
        for i, (n1, wqkv, wo, n2, wgu, wd) in enumerate(self.layers):
            p_qkv, p_o, p_gu, p_d = self.packed[i]
            qkv = _linear(n1(h), wqkv, p_qkv).float().view(N, H + 2 * K, D)
            qkv[:, :H + K] = _rope(qkv[:, :H + K], cos, sin)        # q and k heads together
            padded[real] = qkv
            q, k, v = padded.transpose(1, 2).split([H, K, K], 1)
            self.prompt_k.append(k.contiguous())
            self.prompt_v.append(v.contiguous())
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)
            h = h + _linear(a.transpose(1, 2)[real].reshape(N, H * D).to(self.dtype), wo, p_o)
            g, u = _linear(n2(h), wgu, p_gu).split(self.inter, -1)
            h = h + _linear(F.silu(g) * u, wd, p_d)
        bias = torch.zeros(P, L).masked_fill_(~real, float("-inf"))
        self.prompt_bias_rows = bias                                 # [P, Lp]
        self._set_prompt_bias()
        self._set_rows(torch.arange(P).repeat_interleave(repeat))
        self.written = 0
        last = real.sum(1).cumsum(0) - 1          # each prompt's last token (left padding)
        return self._logits(h[last]).repeat_interleave(repeat, 0)

    def _set_prompt_bias(self) -> None:
        P, L = self.prompt_bias_rows.shape
        self.prompt_bias = self.prompt_bias_rows[:, None, None].expand(P, self.n_kv, 1, L) \
            .reshape(P * self.n_kv, 1, L)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        if self.packed_head is not None:
            return _linear(self.norm(h), self.lm_head, self.packed_head).float()
        # [V, d] @ [d, B]: the vocabulary as the long side beats F.linear at small B
        return (self.lm_head @ self.norm(h).T).T.float()

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the rows ``rows`` (sequences still decoding, in order) and the prompts they
        belong to; only the new-token slots written so far are copied (the others stay
        untouched, so they take no memory yet)."""
        for cache in (self.k, self.v):
            for i in range(len(cache)):
                kept = torch.empty((len(rows), *cache[i].shape[1:]))
                kept[:, :, :self.written] = cache[i][rows, :, :self.written]
                cache[i] = kept
        prompt_of = self.prompt_of[rows]
        prompts = torch.unique(prompt_of)                             # sorted
        if len(prompts) < self.prompt_k[0].shape[0]:
            self.prompt_k = [k[prompts] for k in self.prompt_k]
            self.prompt_v = [v[prompts] for v in self.prompt_v]
            self.prompt_bias_rows = self.prompt_bias_rows[prompts]
            self._set_prompt_bias()
            prompt_of = torch.searchsorted(prompts, prompt_of)
        self._set_rows(prompt_of)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, t: int) -> torch.Tensor:
        """One token per row, written at new-token slot ``t``; the next logits [B, V]."""
        B = tokens.shape[0]
        H, K, D = self.n_heads, self.n_kv, self.head_dim
        h = F.embedding(tokens, self.embed).float()                # [B, d]
        cos, sin = self._rotary(h[:, None], positions[:, None])    # [B, 1, D]
        for i, (n1, wqkv, wo, n2, wgu, wd) in enumerate(self.layers):
            p_qkv, p_o, p_gu, p_d = self.packed[i]
            qkv = _linear(n1(h), wqkv, p_qkv).float().view(B, H + 2 * K, D)
            qk = _rope(qkv[:, :H + K], cos, sin)                    # q and k heads together
            self.k[i][:, :, t] = qk[:, H:]
            self.v[i][:, :, t] = qkv[:, H + K:]
            # grouped-query attention: the H/K query heads of a KV head act as K query rows
            a = shared_prefix_attention(
                qk[:, :H].reshape(B, K, H // K, D), self.prompt_k[i], self.prompt_v[i],
                self.prompt_bias, self.k[i][:, :, :t + 1], self.v[i][:, :, :t + 1],
                self.slots, self.width)
            h = h + _linear(a.view(B, H * D).to(self.dtype), wo, p_o)
            g, u = _linear(n2(h), wgu, p_gu).split(self.inter, -1)
            h = h + _linear(F.silu(g) * u, wd, p_d)
        self.written = t + 1
        return self._logits(h)


# ---------------------------------------------------------------- the sampler
def _eos_ids(model, tokenizer) -> torch.Tensor:
    eos_ids = {tokenizer.eos_token_id}
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if extra is not None:
        eos_ids |= set(extra if isinstance(extra, list) else [extra])
    return torch.tensor(sorted(i for i in eos_ids if i is not None))


class _HFDecoder:
    """The same interface over a transformers model and its own cache (any architecture)."""

    def __init__(self, model):
        self.model = model

    def allocate(self, batch, max_new_tokens):
        pass

    def prefill(self, ids, mask, positions, repeat):
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                         use_cache=True, logits_to_keep=1)
        self.cache, self.mask = out.past_key_values, mask.repeat_interleave(repeat, 0)
        if repeat > 1:
            self.cache.batch_repeat_interleave(repeat)
        return out.logits[:, -1].repeat_interleave(repeat, 0)

    def decode(self, tokens, positions, t):
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], 1)
        out = self.model(input_ids=tokens[:, None], attention_mask=self.mask,
                         position_ids=positions[:, None], past_key_values=self.cache,
                         use_cache=True)
        self.cache = out.past_key_values
        return out.logits[:, -1]


def _decode_into(decoder, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, G: int,
                 out: tuple[torch.Tensor, ...], temperature: float,
                 top_p: float, generator, eos: torch.Tensor, pad_id: int, bar=None,
                 tool: CalculatorRows | None = None):
    """Prefill the prompts, then pick and decode one token per step into ``out`` (the chosen
    tokens, their sampling log-probs, the live mask and the tool mask, ``[B, max_new_tokens]``)
    until every row reached an EOS or the budget (``bar``, a tqdm bar, advances a token a step).
    With ``tool`` (the calculator's rows), a row's forced tokens replace its drawn ones. Returns
    the last step, the original row of each row still decoding and whether it was still alive
    (cut at the budget)."""
    tokens_out, logps_out, live_out, tool_out = out
    B, max_new_tokens = tokens_out.shape
    decoder.allocate(B, max_new_tokens)

    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    logits = decoder.prefill(prompt_ids, prompt_mask, positions, G)
    next_pos = positions[:, -1].repeat_interleave(G, 0) + 1

    # Rows that reached EOS leave the batch (``rows``: the original row of each decoding row)
    # once a quarter of it has finished: the steps after that multiply smaller matrices.
    rows = torch.arange(B)
    alive = torch.ones(B, dtype=torch.bool)
    for step in range(max_new_tokens):
        # one uniform number per original row and step, decoding or not: the draws, hence
        # the samples, do not depend on when rows left the batch
        uniform = torch.rand(B, 1, generator=generator)[rows] if temperature > 0 else None
        tokens, logps = _choose(logits, temperature, top_p, uniform)
        # the calculator's result: forced in place of the draw (the draw is still made, so the
        # rows' later draws do not depend on where the tool wrote)
        forced = tool.force(rows, tokens, logps) if tool is not None else None
        tokens = torch.where(alive, tokens, torch.full_like(tokens, pad_id))
        tokens_out[rows, step] = tokens
        logps_out[rows, step] = torch.where(alive, logps, torch.zeros_like(logps))
        live_out[rows, step] = alive.long()
        if forced is not None:
            tool_out[rows, step] = (~forced).long()
        if tool is not None:
            tool.observe(step, rows, tokens, tokens_out, forced)
        alive = alive & ~torch.isin(tokens, eos)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(decoding=int(alive.sum()), refresh=False)
        if not alive.any() or step == max_new_tokens - 1:
            break
        if hasattr(decoder, "select") and int(alive.sum()) <= 0.75 * len(rows):
            idx = alive.nonzero().squeeze(1)
            decoder.select(idx)
            rows, alive, tokens, next_pos = rows[idx], alive[idx], tokens[idx], next_pos[idx]
        logits = decoder.decode(tokens, next_pos, step)
        next_pos = next_pos + 1
    return step, rows, alive


@torch.no_grad()
def sample_completions(model, tokenizer, prompts: list[str], num_generations: int = 1,
                       max_new_tokens: int = 128, temperature: float = 1.0,
                       top_p: float = 1.0, seed: int | None = None,
                       fast: bool | None = None,
                       sampling_dtype: str | torch.dtype | None = None,
                       progress: str | None = None, calculator: bool = False) -> SampleBatch:
    """Sample ``num_generations`` completions for each prompt text (``temperature=0``
    is greedy). Stops each sequence at the tokenizer's EOS and the loop when all did.
    ``fast=None`` picks the compact decoder when the model supports it;
    ``sampling_dtype`` (``None`` = the model's dtype, ``"auto"``, ``"bfloat16"``) sets the
    compact decoder's weight precision. ``progress``, a description, shows a bar of the tokens
    decoded (for a call long enough to need one). ``calculator`` turns on GSM8K's calculator
    (:mod:`grpo_course.core.calculator`): where an annotation ``<<48/2=`` is open, the tool writes
    ``24>>`` and the batch's ``tool_mask`` is 0 on those tokens."""
    if num_generations < 1 or max_new_tokens < 1:
        raise ValueError("num_generations and max_new_tokens must be >= 1")
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    was_training = model.training
    model.eval()
    tokenizer.padding_side = "left"
    enc = tokenizer(list(prompts), return_tensors="pt", padding=True, add_special_tokens=False)
    prompt_ids, prompt_mask = enc["input_ids"], enc["attention_mask"]
    eos = _eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else int(eos[0])
    use_fast = supports_fast_path(_base(model)) if fast is None else fast
    dtype = sampler_dtype(model, sampling_dtype, use_fast)
    B = len(prompts) * num_generations
    tokens_out = torch.full((B, max_new_tokens), pad_id, dtype=torch.long)
    logps_out = torch.zeros(B, max_new_tokens)
    live_out = torch.zeros(B, max_new_tokens, dtype=torch.long)
    tool_out = torch.ones(B, max_new_tokens, dtype=torch.long)
    tool = calculator_for(tokenizer, _vocab_size(model)).rows(B) if calculator else None
    # inference mode: cheaper per decoding step than no_grad (no version counters,
    # no view tracking); what leaves it is written into these three ordinary tensors, which the
    # training pass may save for its backward pass (an inference tensor may not be)
    with torch.inference_mode():
        decoder = FastLlama(model, dtype) if use_fast else _HFDecoder(model)
        bar = tqdm(total=max_new_tokens, desc=progress, unit="token") if progress else None
        try:
            step, rows, alive = _decode_into(decoder, prompt_ids, prompt_mask,
                                             num_generations,
                                             (tokens_out, logps_out, live_out, tool_out),
                                             temperature, top_p, generator, eos, pad_id, bar, tool)
        finally:
            if bar is not None:
                bar.close()
    T = step + 1
    truncated = torch.zeros(B, dtype=torch.bool)
    truncated[rows] = alive
    completion_ids, completion_mask = tokens_out[:, :T], live_out[:, :T]
    if was_training:
        model.train()
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    return SampleBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                       completion_ids=completion_ids, completion_mask=completion_mask,
                       sampling_logps=logps_out[:, :T], completions=texts,
                       num_generations=num_generations, truncated=truncated,
                       sampling_dtype=dtype, tool_mask=tool_out[:, :T])


def _vocab_size(model) -> int | None:
    return getattr(getattr(model, "config", None), "vocab_size", None)
