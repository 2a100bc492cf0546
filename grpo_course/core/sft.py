"""The supervised warm-up (SFT) that makes the shared warm start: a few hundred steps on GSM8K
solutions, so that GRPO starts from a policy that already writes the ``#### N`` line.

:class:`SFTWarmup` is the part of :class:`~grpo_course.core.train.CourseTrainer` that runs it (loss on
the solution tokens only, bf16 autocast where native, rows sorted by length within a window);
:func:`grpo_course.core.warmstart.warm_start` trains it once per recipe and caches the adapter.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Self

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from grpo_course.core.calculator import tool_spans, tool_token_mask
from grpo_course.core.checkpoints import load_adapter_state
from grpo_course.core.cli import CHECKPOINT
from grpo_course.core.data import sft_text
from grpo_course.core.policy import per_token_logps
from grpo_course.core.precision import frozen_linear_weights_as
from grpo_course.core.sampling import resolve_sampling_dtype
from grpo_course.infra.memory import trim_heap
from grpo_course.infra.progress import tqdm

SFT_MAX_TOKENS = 256
SFT_SNAPSHOTS = "sft_steps"     # a run folder's kept warm-up adapters (sft_save_every)
SFT_SORT_WINDOW = 8      # SFT steps whose rows are sorted by length together (less padding)


class SFTWarmup:
    """Mixed into :class:`~grpo_course.core.train.CourseTrainer`: it reads the trainer's ``model``,
    ``tokenizer``, ``config``, ``dataset`` and shuffled ``order``, and logs through it."""

    def _make_sft_optimizer(self):
        return torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad],
                                 lr=self.config.sft_learning_rate)

    def sft_step(self, rows: dict[str, list], optimizer) -> dict[str, Any]:
        """One supervised step on GSM8K solutions (loss on the solution tokens only)."""
        start = time.perf_counter()
        calc = self.config.calculator
        pairs = [sft_text(q, s, self.tokenizer, calculator=calc)
                 for q, s in zip(rows["question"], rows["solution"], strict=False)]
        self.tokenizer.padding_side = "left"
        enc = self.tokenizer([p for p, _ in pairs], return_tensors="pt", padding=True,
                             add_special_tokens=False)
        self.tokenizer.padding_side = "right"
        tgt = self.tokenizer([t for _, t in pairs], return_tensors="pt", padding=True,
                             add_special_tokens=False, truncation=True, max_length=SFT_MAX_TOKENS,
                             return_offsets_mapping=calc)
        self.tokenizer.padding_side = "left"
        self.model.train()
        # bf16 autocast (``sft_dtype``): matmuls in bf16, weights, log-softmax and AdamW in fp32
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self._sft_in_bf16()):
            logps = per_token_logps(self.model, enc["input_ids"], enc["attention_mask"],
                                    tgt["input_ids"], tgt["attention_mask"])
        mask = tgt["attention_mask"].float()
        if calc:     # the results the calculator writes are read, not learned (nanochat's mask)
            mask = mask * tool_token_mask(tgt["offset_mapping"], [tool_spans(t) for _, t in pairs])
        loss = -(logps * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        trim_heap()                     # low-memory mode only: the step's freed blocks go back
        return {"phase": "sft", "sft_step": self.sft_done, "loss": float(loss.detach()),
                "step_seconds": time.perf_counter() - start}

    @contextlib.contextmanager
    def sft_kernels(self):
        """The warm-up's CPU kernels for a while: two speed-ups for short sequences (bench/throughput.py
        and bench/sft_step.py time the steps): the frozen base weights cast to bf16 once instead of
        on every product (where the warm-up runs in bf16), and the plain ("math") attention kernel,
        whose backward beats the flash kernel's at ~200 tokens. (per_token_logps takes one pass over
        prompt + solution here.)"""
        with frozen_linear_weights_as(self.model, torch.bfloat16 if self._sft_in_bf16() else None), \
                sdpa_kernel(SDPBackend.MATH):
            yield

    def _sft_in_bf16(self) -> bool:
        """Whether the warm-up's matrix products run in bf16 (``sft_dtype``, resolved)."""
        return resolve_sampling_dtype(self.config.sft_dtype) == torch.bfloat16

    def _sft_rows(self, step: int, window: int = SFT_SORT_WINDOW) -> list[dict]:
        """The rows of SFT step ``step``. SFT draws from the end of the shuffled order (GRPO
        from the start), ``window`` steps' rows at a time, sorted by length and cut into batches:
        rows of similar length share a batch, so little of it is padding."""
        bs, first = self.config.sft_batch_size, (step // window) * window
        ids = [self.order[-1 - ((first * bs + i) % len(self.order))] for i in range(window * bs)]
        rows = list(self.dataset.select(ids)) if hasattr(self.dataset, "select") \
            else [self.dataset[i] for i in ids]
        rows.sort(key=lambda r: len(r["question"]) + len(r["solution"]))
        k = step - first
        return rows[k * bs:(k + 1) * bs]

    def sft(self, steps: int | None = None) -> list[dict]:
        """The supervised warm-up (``config.sft_steps`` steps, resumable)."""
        steps = self.config.sft_steps if steps is None else steps
        if self.sft_done >= steps:
            return []
        if self.sft_optimizer is None:
            self.sft_optimizer = self._make_sft_optimizer()
        optimizer = self.sft_optimizer
        rows_out = []
        with self.sft_kernels():
            for _ in tqdm(range(self.sft_done, steps), desc="sft", leave=False):
                with self._one_step():
                    picked = self._sft_rows(self.sft_done)
                    row = self.sft_step({k: [r[k] for r in picked] for k in picked[0]}, optimizer)
                    self.sft_done += 1
                    self._log(row)
                rows_out.append(row)
                self._sft_save_point(self.config.sft_steps)
        return rows_out

    def _sft_save_point(self, steps: int) -> None:
        """Every ``sft_save_every`` steps of a run with a folder (not at its last, ``steps``, which
        the run saves as ``sft/``): the adapter kept in ``sft_steps/<step>`` and a checkpoint to resume
        from. With a constant learning rate a snapshot is what a warm-up of that many steps
        gives, so validation can choose the number of epochs among them."""
        every, out = self.config.sft_save_every, self.out_dir
        if every and out is not None and self.sft_done % every == 0 and self.sft_done < steps:
            self.save_model(out / SFT_SNAPSHOTS / str(self.sft_done))
            self.save_checkpoint(out / CHECKPOINT)

    def start_from(self, warm_dir) -> Self:
        """Load the adapter weights of a warm start (:func:`grpo_course.core.warmstart.warm_start`)
        and count its SFT steps as done, so :meth:`~grpo_course.core.checkpoints.TrainingRun.train` goes straight to GRPO."""
        load_adapter_state(self.model, warm_dir)
        self.sft_done = self.config.sft_steps
        self.warm_started = True        # train() saves it as OUT/sft, whatever sft_steps says
        return self
