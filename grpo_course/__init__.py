"""grpo_course: the helper package of the course "GRPO on a CPU".

Five layers, one folder each (CONTRIBUTING.md's module map): ``infra`` (paths, the machine, memory,
atomic files, cache keys), ``core`` (the algorithm), ``measure`` (evaluation and statistics),
``topics`` (one chapter's subject each) and ``book`` (the book's own tooling), with ``config``
beside them. Import what you need from its home, e.g.
``from grpo_course.core.data import load_gsm8k``.
"""
__version__ = "0.1.0"

from grpo_course.infra.memory import cap_kernel_caches

cap_kernel_caches()     # before the first matrix product: oneDNN reads its cache sizes once
