"""The algorithm: GSM8K and its answers, rewards, sampling, the policy's log-probabilities, GRPO's
advantages and loss (:mod:`~grpo_course.core.grpo`, pure mathematics), and the trainer that runs them
(warm start, prompt pool, checkpoints, the run folder and its command line)."""
