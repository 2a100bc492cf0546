"""Where the frozen base weights of a LoRA model live in bf16.

Under bf16 autocast every matrix product casts an fp32 weight to bf16 on each call, forward
and backward. A LoRA model's base weights never change, so two cheaper ways exist:

* :func:`frozen_linear_weights_as` casts them once for a while (a training step) and puts the
  fp32 originals back on exit: fp32 and bf16 copies both in memory meanwhile;
* :func:`hold_frozen_weights_in` keeps them in bf16 for good (what TRL's ``bf16`` weights
  do): half the bytes of the base, one copy. Each such layer becomes a
  :class:`FrozenLowPrecisionLinear`, which still takes fp32 inputs outside autocast (it computes
  in bf16 and hands fp32 back), so every other forward pass of the course keeps working.

The tied output layer (the embedding's weight) and every weight that trains stay as they are.
"""
from __future__ import annotations

import contextlib

import torch


def _frozen_linear_weights(model: torch.nn.Module, dtype: torch.dtype):
    """``(module, weight)`` of each frozen ``nn.Linear`` not tied to an embedding and not yet
    in ``dtype``."""
    tied = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    for module in model.modules():
        w = getattr(module, "weight", None)
        if (isinstance(module, torch.nn.Linear) and isinstance(w, torch.Tensor)
                and not w.requires_grad and id(w) not in tied and w.dtype != dtype):
            yield module, w


@contextlib.contextmanager
def frozen_linear_weights_as(model: torch.nn.Module, dtype: torch.dtype | None):
    """Hold the frozen ``nn.Linear`` weights (a LoRA model's base) in ``dtype`` for a while.

    One cast up front instead of one per product; the originals are put back on exit, bit for
    bit. ``dtype=None`` does nothing."""
    saved = []
    if dtype is not None:
        for _, w in list(_frozen_linear_weights(model, dtype)):
            saved.append((w, w.data))
            w.data = w.data.to(dtype)
    try:
        yield
    finally:
        for w, data in saved:
            w.data = data


class FrozenLowPrecisionLinear(torch.nn.Linear):
    """An ``nn.Linear`` whose frozen weight is held in a lower precision than the activations.

    Under autocast it is a plain ``nn.Linear`` (autocast casts the input). Outside it, an input
    of another dtype is cast to the weight's, and the product back to the input's dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == self.weight.dtype or torch.is_autocast_enabled(x.device.type):
            return super().forward(x)
        return super().forward(x.to(self.weight.dtype)).to(x.dtype)


def hold_frozen_weights_in(model: torch.nn.Module, dtype: torch.dtype = torch.bfloat16) -> int:
    """Convert ``model``'s frozen ``nn.Linear`` weights (not the tied output layer) to ``dtype``
    for good; returns how many were converted. Each converted layer becomes a
    :class:`FrozenLowPrecisionLinear` (same parameters and state-dict keys); the other frozen
    parameters are copied out of the weights file's memory map, which is then released."""
    converted = list(_frozen_linear_weights(model, dtype))
    for module, w in converted:
        w.data = w.data.to(dtype)
        if type(module) is torch.nn.Linear:
            module.__class__ = FrozenLowPrecisionLinear
    if converted:
        # transformers maps the weights file into memory and its tensors point into that map:
        # while one of them (the embedding) does, the pages of every fp32 weight read so far stay
        # resident. The other frozen tensors get memory of their own, and the map is let go.
        done = {id(w) for _, w in converted}
        for param in model.parameters():
            if not param.requires_grad and id(param) not in done:
                param.data = param.data.clone()
    return len(converted)


def reuses_sampler_logps(train_in_bf16: bool, sampling_dtype: torch.dtype) -> bool:
    """Whether the first update of a batch takes the sampler's log-probs as its
    ``old_per_token_logps`` (the course trainer's ``compute_loss``): only where the sampler drew at
    the training pass's precision, fp32 both; else the policy's own, detached from its first pass
    (TRL's choice: ratio 1 on the first update, no extra forward pass)."""
    return not train_in_bf16 and sampling_dtype == torch.float32
