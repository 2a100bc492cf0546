"""Batched G-per-prompt sampling with the KV cache.

Each prompt is run through the model once (prefill); its key/value cache is then
copied G times and the G completions decode together, one token per forward
pass over the whole batch. The sampler keeps the log-probability of every token
it drew, so a trainer that uses each batch once needs no extra forward pass for
``old_per_token_logps``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


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

    @property
    def completion_lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(1)


def _choose(logits: torch.Tensor, temperature: float, top_p: float,
            generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; return (tokens, their log-probs under the sampling dist)."""
    if temperature <= 0:  # greedy
        logps = torch.log_softmax(logits.float(), dim=-1)
        tokens = logps.argmax(-1)
        return tokens, logps.gather(-1, tokens[:, None]).squeeze(-1)
    logps = torch.log_softmax(logits.float() / temperature, dim=-1)
    probs = logps.exp()
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, logps.gather(-1, tokens[:, None]).squeeze(-1)


@torch.no_grad()
def sample_completions(model, tokenizer, prompts: list[str], num_generations: int = 1,
                       max_new_tokens: int = 128, temperature: float = 1.0,
                       top_p: float = 1.0, seed: int | None = None) -> SampleBatch:
    """Sample ``num_generations`` completions for each prompt text (``temperature=0``
    is greedy). Stops each sequence at the tokenizer's EOS and the loop when all did."""
    if num_generations < 1 or max_new_tokens < 1:
        raise ValueError("num_generations and max_new_tokens must be >= 1")
    generator = None
    if seed is not None:
        generator = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    tokenizer.padding_side = "left"
    enc = tokenizer(list(prompts), return_tensors="pt", padding=True,
                    add_special_tokens=False).to(device)
    prompt_ids, prompt_mask = enc["input_ids"], enc["attention_mask"]
    eos_ids = {tokenizer.eos_token_id}
    if getattr(model.generation_config, "eos_token_id", None) is not None:
        extra = model.generation_config.eos_token_id
        eos_ids |= set(extra if isinstance(extra, list) else [extra])
    eos = torch.tensor(sorted(i for i in eos_ids if i is not None), device=device)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else int(eos[0])

    # prefill: each prompt once, only the last position's logits
    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions,
                use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    logits = out.logits[:, -1]
    if num_generations > 1:  # share the prompt: copy its cache G times
        cache.batch_repeat_interleave(num_generations)
        logits = logits.repeat_interleave(num_generations, 0)
    mask = prompt_mask.repeat_interleave(num_generations, 0)
    next_pos = positions[:, -1].repeat_interleave(num_generations, 0) + 1

    batch = mask.shape[0]
    tokens_out, logps_out, live_out = [], [], []
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    for step in range(max_new_tokens):
        tokens, logps = _choose(logits, temperature, top_p, generator)
        tokens = torch.where(alive, tokens, torch.full_like(tokens, pad_id))
        tokens_out.append(tokens)
        logps_out.append(torch.where(alive, logps, torch.zeros_like(logps)))
        live_out.append(alive.clone())
        alive = alive & ~torch.isin(tokens, eos)
        if not alive.any() or step == max_new_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones(batch, 1, dtype=mask.dtype, device=device)], 1)
        out = model(input_ids=tokens[:, None], attention_mask=mask,
                    position_ids=next_pos[:, None], past_key_values=cache, use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1]
        next_pos = next_pos + 1
    completion_ids = torch.stack(tokens_out, 1)
    completion_mask = torch.stack(live_out, 1).long()
    if was_training:
        model.train()
    texts = tokenizer.batch_decode(completion_ids * completion_mask + pad_id * (1 - completion_mask),
                                   skip_special_tokens=True)
    return SampleBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                       completion_ids=completion_ids, completion_mask=completion_mask,
                       sampling_logps=torch.stack(logps_out, 1), completions=texts,
                       num_generations=num_generations, truncated=alive.clone())
