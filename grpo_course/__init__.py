"""grpo_course: the helper package of the course "GRPO on a CPU".

One module per chapter topic (see the README's module map). Import what you
need, e.g. ``from grpo_course.core.data import load_gsm8k``.
"""
__version__ = "0.1.0"

from grpo_course.infra.memory import cap_kernel_caches

cap_kernel_caches()     # before the first matrix product: oneDNN reads its cache sizes once
