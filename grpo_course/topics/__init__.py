"""One chapter's subject each, built on :mod:`grpo_course.core`: TRL's trainer and its loss check
(chapter 4), curriculum and EWC (chapter 5), INT8 quantization (chapter 6)."""
