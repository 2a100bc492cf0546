"""The machine and the files, beneath everything else: paths and the cache, CPU flags and threads,
memory, atomic writes, cache keys, one-line errors. Imports nothing above :mod:`grpo_course.config`."""
