"""Chapter 4: the course's ``grpo_loss`` against TRL's own ``GRPOTrainer._compute_loss``.

One fixed batch (log-probs, old and reference log-probs, advantages from fixed rewards, a ragged
completion mask) goes through TRL's ``_compute_loss`` on a real ``GRPOTrainer`` built around a tiny
random Llama, with only the model forward (``_get_per_token_logps_and_entropies``) replaced by the
fixed log-probs; the same batch goes through :func:`grpo_course.core.grpo.grpo_loss`. The chapter glues
the largest differences of loss, gradient and clip ratios per loss type; the tests hold them to
the tolerances below. Offline: the tiny model and its tokenizer are built here.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from grpo_course.config import GRPOConfig
from grpo_course.core.grpo import group_advantages, grpo_loss
from grpo_course.infra.progress import tqdm
from grpo_course.topics import trl_bridge

G, PROMPTS, T, MAX_LEN = 4, 2, 6, 8     # 8 completions of <= 6 tokens, max_completion_length 8
#: (loss_type, beta, epsilon_high) of every checked case: all four losses, with and without KL,
#: symmetric and asymmetric clipping
CASES: list[tuple[str, float, float | None]] = [
    (lt, beta, eps_hi) for lt in ("grpo", "bnpo", "dr_grpo", "dapo")
    for beta in (0.0, 0.04) for eps_hi in (None, 0.28)]
CLIP_KEYS = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")


def tiny_llama(folder: str | Path):
    """A randomly initialised 1-layer Llama and a word-level tokenizer, saved in ``folder``;
    returns (folder, tokenizer)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i + 2 for i in range(30)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(vocab), hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))
    folder = Path(folder)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, tok


def constant_reward(completions, **kwargs) -> list[float]:
    """The trainer needs a reward function; the cross-check never samples."""
    return [0.0] * len(completions)


def trl_trainer(folder: str | Path, tok, out_dir: str | Path, trl_overrides: dict | None = None,
                **course: Any):
    """A real ``GRPOTrainer`` on the tiny model, its arguments from the course config ``course``
    through the bridge."""
    from datasets import Dataset
    from trl import GRPOTrainer

    cfg = GRPOConfig(num_generations=G, per_step_completions=G * PROMPTS,
                     max_completion_length=MAX_LEN, max_steps=1,
                     reward_weights={"exact_format": 1.0}, use_lora=False, **course)
    args = trl_bridge.grpo_config_from_course(cfg, Path(out_dir) / "out", **(trl_overrides or {}))
    trainer = GRPOTrainer(model=str(folder), reward_funcs=constant_reward, args=args,
                          train_dataset=Dataset.from_dict({"prompt": ["t1 t2", "t3 t4"]}),
                          processing_class=tok)
    trainer.model.train()                       # _compute_loss reads the mode
    trainer.current_gradient_accumulation_steps = 1   # what train() sets for this config
    return trainer


def fixed_batch() -> dict[str, torch.Tensor]:
    """One fixed batch whose ratios spread on both sides of every clipping bound."""
    gen = torch.Generator().manual_seed(1)
    lengths = torch.tensor([6, 3, 5, 1, 6, 2, 4, 6])
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    old = -torch.rand(G * PROMPTS, T, generator=gen) * 3 - 0.1
    logps = old + torch.randn(G * PROMPTS, T, generator=gen) * 0.4
    ref = old + torch.randn(G * PROMPTS, T, generator=gen) * 0.3
    rewards = torch.tensor([3.0, -1.0, 0.5, 1.5, 0.0, 2.0, 2.0, -0.5])
    return {"logps": logps, "old": old, "ref": ref, "mask": mask, "rewards": rewards}


def trl_loss(trainer, batch: dict, advantages: torch.Tensor, num_items_in_batch: float):
    """TRL's loss, its gradient w.r.t. the log-probs and its logged metrics for ``batch``."""
    logps = batch["logps"].clone().requires_grad_(True)
    B = logps.shape[0]

    def fixed_logps(model, input_ids, attention_mask, logits_to_keep, **kwargs):
        assert logits_to_keep == logps.shape[1] and input_ids.shape[0] == B
        return logps, torch.zeros_like(logps), None

    trainer._get_per_token_logps_and_entropies = fixed_logps
    inputs = {"prompt_ids": torch.ones(B, 2, dtype=torch.long),
              "prompt_mask": torch.ones(B, 2, dtype=torch.long),
              "completion_ids": torch.full(tuple(logps.shape), 2, dtype=torch.long),
              "completion_mask": batch["mask"], "advantages": advantages,
              "old_per_token_logps": batch["old"], "ref_per_token_logps": batch["ref"],
              "num_items_in_batch": torch.as_tensor(float(num_items_in_batch))}
    trainer._metrics["train"].clear()
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    return loss.detach(), logps.grad, metrics


def course_loss(batch: dict, advantages: torch.Tensor, num_items_in_batch: float, **kw: Any):
    """The course's ``grpo_loss``, its gradient w.r.t. the log-probs and its metrics for ``batch``."""
    logps = batch["logps"].clone().requires_grad_(True)
    loss, metrics = grpo_loss(logps, batch["old"], advantages, batch["mask"],
                              ref_per_token_logps=batch["ref"], max_completion_length=MAX_LEN,
                              num_items_in_batch=num_items_in_batch, **kw)
    loss.backward()
    return loss.detach(), logps.grad, metrics


def compare_case(folder: Path, tok, out_dir: Path, batch: dict, loss_type: str, beta: float,
                 epsilon_high: float | None) -> dict[str, Any]:
    """One case: both losses on ``batch``; the absolute differences of loss, gradient, clip ratios
    and KL."""
    trainer = trl_trainer(folder, tok, out_dir, loss_type=loss_type, beta=beta, epsilon_low=0.2,
                          epsilon_high=epsilon_high)
    advantages = group_advantages(batch["rewards"], G, scale="group")
    # dapo divides by the real tokens of the whole generation batch: pretend it held a second
    # micro-batch of 7 more tokens, so that its normalizer differs from bnpo's
    items = float(batch["mask"].sum()) + (7 if loss_type == "dapo" else 0)
    trl_value, trl_grad, trl_metrics = trl_loss(trainer, batch, advantages, items)
    value, grad, metrics = course_loss(batch, advantages, items, loss_type=loss_type, beta=beta,
                                       epsilon_low=0.2, epsilon_high=epsilon_high)
    return {"loss_type": loss_type, "beta": beta, "epsilon_high": epsilon_high or 0.2,
            "trl_loss": float(trl_value), "course_loss": float(value),
            "loss_diff": abs(float(value) - float(trl_value)),
            "grad_diff": float((grad - trl_grad).abs().max()),
            "clip_diff": max(abs(metrics[k] - trl_metrics[k]) for k in CLIP_KEYS),
            "kl_diff": abs(metrics["kl"] - trl_metrics["kl"]) if beta else 0.0,
            "clipped_tokens": metrics["clip_ratio/region_mean"]}


def crosscheck(cases=CASES, progress: bool = False) -> list[dict[str, Any]]:
    """Every case of ``cases`` on the fixed batch: one row each (see :func:`compare_case`)."""

    trl_bridge.quiet_trl()
    batch = fixed_batch()
    with tempfile.TemporaryDirectory(prefix="loss-check-") as tmp:
        folder, tok = tiny_llama(Path(tmp) / "tiny_llama")
        return [compare_case(folder, tok, Path(tmp) / f"case{i}", batch, *case)
                for i, case in enumerate(tqdm(cases, desc="TRL vs course loss", disable=not progress))]
