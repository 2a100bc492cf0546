"""The package's own errors and how its command lines report them.

Every error that ``grpo_course`` raises on purpose subclasses :class:`CourseError` (the
built-in base each also has, ``ValueError`` or ``RuntimeError``, stays for callers that
catch those). A command line (``train``, ``evaluate``, ``quantize``, ``bench/*.py``) answers
bad input with one line on stderr, ``error: <what, naming the bad value>``, and exit status 2:
never a traceback, never a silent empty result.
"""
from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class CourseError(Exception):
    """Base of every error the package raises on purpose (one readable message)."""


class RewardError(CourseError, ValueError):
    """A reward function returned the wrong number of rewards or a non-finite one."""


def error_line(exc: BaseException | str) -> str:
    """``exc`` as the single line a command prints: ``error: message`` (newlines folded)."""
    return "error: " + " ".join(str(exc).split())


def report(exc: BaseException | str) -> int:
    """Print :func:`error_line` to stderr; the exit status of a bad input (2)."""
    print(error_line(exc), file=sys.stderr)
    return 2


class OneLineArgumentParser(argparse.ArgumentParser):
    """``argparse`` whose usage errors are one ``error:`` line (no usage dump), exit 2."""

    def error(self, message: str) -> NoReturn:
        report(message)
        raise SystemExit(2)
