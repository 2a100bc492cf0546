"""The answer checker of the whole course: numbers, the answer slot, and one correctness rule.

:func:`normalize_number` turns what a model or GSM8K writes (``"$1,000.50"``, ``"3/4"``) into a
canonical string; :func:`extract_answer` reads the number in a completion's answer slot
(:class:`AnswerFormat`; the course's is GSM8K's last line ``#### N``); :func:`answers_match` says
whether two answers are the same number. Evaluation (:mod:`grpo_course.measure.evaluate`), the rewards
(:mod:`grpo_course.core.rewards`), curricula and GSM8K loading (:mod:`grpo_course.core.data`) all use these
and import nothing else from the package, so scoring and training never disagree.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

#: two answers are the same number when they differ by at most ABS_TOL, or by at most REL_TOL
#: of the larger one (``math.isclose``'s rule, in exact decimal arithmetic)
ABS_TOL = Decimal("1e-6")
REL_TOL = Decimal("1e-9")


# ---------------------------------------------------------------- numbers
def normalize_number(text: str) -> str | None:
    """Canonical string of the number in ``text`` or ``None``.

    ``"1,000.50" -> "1000.5"``, ``"$-3" -> "-3"``, ``"7.0" -> "7"``, ``"3/4" -> "0.75"``,
    ``"1e5" -> "100000"``. Thousands commas, currency, percent signs and spaces are ignored.
    """
    if text is None:
        return None
    s = str(text).strip().replace(",", "").replace("$", "").replace("%", "")
    s = s.replace("\u2212", "-").replace(" ", "").rstrip(".")
    if not s:
        return None
    try:
        if re.fullmatch(r"-?\d+/\d+", s):
            num, den = s.split("/")
            if int(den) == 0:
                return None
            value = Decimal(num) / Decimal(den)
        elif re.fullmatch(r"-?(\d+\.?\d*|\.\d+)(e[+-]?\d{1,3})?", s, flags=re.I):
            value = Decimal(s)
        else:
            return None
    except (InvalidOperation, ValueError):
        return None
    if not value.is_finite():
        return None
    text_value = format(value.normalize(), "f")
    if "." in text_value:
        text_value = text_value.rstrip("0").rstrip(".")
    return "0" if text_value in ("-0", "") else text_value


def answers_match(predicted: str | None, gold: str | None) -> bool:
    """The course's one correctness rule: ``predicted`` and ``gold`` (numbers as text, normalized
    or not) are the same number within ``max(REL_TOL * max(|a|, |b|), ABS_TOL)``, i.e. 1e-6 for
    every answer below 1000. A repeating decimal cut at 7 or 8 digits is therefore the same
    answer (``"0.3333333"`` and ``"0.33333333"``), a cut at 3 digits is not (``"0.333"``), and
    integers match exactly (GSM8K's answers are integers below 1e9). ``None`` or text that is no
    number never matches."""
    a, b = _decimal(predicted), _decimal(gold)
    if a is None or b is None:
        return False
    return abs(a - b) <= max(REL_TOL * max(abs(a), abs(b)), ABS_TOL)


def _decimal(text: str | None) -> Decimal | None:
    value = normalize_number(text) if text is not None else None
    return Decimal(value) if value is not None else None


# ---------------------------------------------------------------- the answer slot
@dataclass(frozen=True)
class AnswerFormat:
    """Where the reasoning and the final answer go. Empty strings mean "no tag".

    With an empty ``solution_end`` the answer slot ends at the end of its line.
    """

    reasoning_start: str = ""
    reasoning_end: str = ""
    solution_start: str = "####"
    solution_end: str = ""

    def __post_init__(self) -> None:
        if not self.solution_start:
            raise ValueError("AnswerFormat.solution_start must be a non-empty marker, "
                             "e.g. '####' or '<answer>'")

    @property
    def tags(self) -> tuple[str, ...]:
        """The non-empty markers, in the order they must appear."""
        return tuple(t for t in (self.reasoning_start, self.reasoning_end,
                                 self.solution_start, self.solution_end) if t)

    def render(self, reasoning: str, answer: str) -> str:
        """A perfectly formatted completion (useful for tests and SFT targets)."""
        sep = "\n" if not self.solution_end else ""
        return (f"{self.reasoning_start}{reasoning}{self.reasoning_end}{sep}"
                f"{self.solution_start} {answer}{self.solution_end}")


#: The course's format: GSM8K's own last line ``#### 42``.
HASH_FORMAT = AnswerFormat()
#: The tag format of many GRPO notebooks.
TAG_FORMAT = AnswerFormat("<reasoning>", "</reasoning>", "<answer>", "</answer>")


def answer_slot(text: str, fmt: AnswerFormat = HASH_FORMAT) -> tuple[str, str] | None:
    """``(slot, trailing)`` after the last solution marker, or ``None`` if it is absent.

    The slot ends at ``solution_end`` (or at its line's end when the format has none);
    ``trailing`` is everything after it.
    """
    if fmt.solution_start not in text:
        return None
    tail = text.rsplit(fmt.solution_start, 1)[1]
    if fmt.solution_end and fmt.solution_end in tail:
        slot, trailing = tail.split(fmt.solution_end, 1)
    elif fmt.solution_end:  # unclosed tag: everything is the slot
        slot, trailing = tail, ""
    else:
        first = tail.lstrip(" \t")
        slot, _, trailing = first.partition("\n")
    return slot.strip(), trailing


def parse_answer(slot: str) -> str | None:
    """The normalized number in an answer slot: the whole slot (``3/4``, ``1e5``,
    ``$1,000.50``) or else its first word that is a number (``18 dollars``)."""
    value = normalize_number(slot)
    if value is not None:
        return value
    for word in slot.split():
        value = normalize_number(word.strip(".,;:!?()[]{}*\"'"))
        if value is not None:
            return value
    return None


def extract_answer(text: str, fmt: AnswerFormat = HASH_FORMAT) -> str | None:
    """The normalized number written in the answer slot of ``text`` (``None`` if none)."""
    found = answer_slot(text, fmt)
    return parse_answer(found[0]) if found else None


def extract_hash_answer(text: str) -> str | None:
    """The normalized number on the last ``#### ...`` line of ``text`` (``None`` if absent):
    :func:`extract_answer` with GSM8K's ``####`` format."""
    return extract_answer(text or "", HASH_FORMAT)
