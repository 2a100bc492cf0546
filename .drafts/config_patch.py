"""To add to grpo_course/config.py when the tool page lands (a test holds every profile field to a
reader, so they wait for the page that reads them)."""
# smoke:  tool=ToolSizes(group=2, max_completion_length=32, steps=1, per_step_completions=4, pool_prompts=4, live_problems=4),
# binder: tool=replace(full.tool, per_step_completions=8, live_problems=0),
# Profile: tool: ToolSizes = field(default_factory=ToolSizes)               # page 5b, GRPO with a tool
# CALCULATOR_RUN: dict[str, Any] = load_recipe(RECIPES_DIR / "calculator_run.yaml")

# @dataclass(frozen=True)
# class ToolSizes:
#     """Page 5b, GRPO with a tool: GSM8K's calculator in the sampler, from the calculator's warm
#     start (``data/runs/calculator/sft``): one group shown token by token, a few live GRPO steps on
#     whole problems with the tool, a live re-check of the shipped run's sampled test, TRL's way."""
#     group: int = 4                       # completions of one problem shown with the tool's tokens
#     max_completion_length: int = 256     # a whole answer with annotations (the shipped run's)
#     steps: int = 3                       # live GRPO steps on whole problems, the tool on
#     per_step_completions: int = 16       # completions a live step trains on (2 groups of 8)
#     pool_prompts: int = 32               # whole problems the warm start screens for mixed groups
#     live_problems: int = 8               # test (b)'s first rows sampled again live (whole sampling
#                                          # blocks of 4; 0: none, the benchmark's numbers alone)
#     trl_steps: int = 1                   # steps of TRL's GRPOTrainer with the calculator's rollout
#
#
#     @property
#     def tool_run(self) -> GRPOConfig:
#         """Page 5b's live GRPO steps: the calculator run's recipe (whole problems, the tool on, its
#         warm start's LoRA shape) at the page's sizes, a sampling round of two steps' prompts."""
#         t = self.tool
#         return replace(self.grpo, **{**CALCULATOR_RUN, "max_steps": t.steps,
#                                      "per_step_completions": t.per_step_completions,
#                                      "generation_batch_size": 2 * t.per_step_completions,
#                                      "pool_prompts": t.pool_prompts,
#                                      "max_completion_length": t.max_completion_length,
#                                      "save_every": 0, "snapshot_every": 0})
#
