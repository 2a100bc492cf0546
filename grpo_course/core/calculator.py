"""GSM8K's calculator: the tool the data set was written with, in the sampler and out of the loss.

GSM8K's solutions annotate each result with the calculation that gives it: ``48/2 = <<48/2=24>>24``.
Its authors trained on the annotations and, when sampling, let a calculator write the result
whenever the model opened one and reached ``=`` (Cobbe et al. 2021, §4; ``calculator.py`` in
openai/grade-school-math); nanochat does the same with tool-call tokens and leaves the tool's
tokens out of the loss (``nanochat/engine.py``, ``scripts/chat_rl.py``). This module is that tool:

* :func:`calculate` evaluates an annotation's expression safely: numbers, ``+ - * /``,
  parentheses and decimals, exact (fractions), of bounded size. Anything else (names, ``**``,
  a division by zero, a 10,000-digit number) gives ``None``, and the model's own tokens go on.
* :class:`Calculator` follows each sampled row by its tokens: a vocabulary-sized table of flags
  says which tokens open an annotation (``<<``), close one (``>>``) or end in ``=``, so a decoding
  step costs a table lookup and one test unless a flagged token was drawn. When a row's open
  annotation reaches ``=``, its expression is decoded once, evaluated, and the result and
  ``>>`` are queued as the row's next tokens: the sampler forces them (``tool_mask`` 0 there).
* :func:`tool_spans` and :func:`calculator_solution` give supervised fine-tuning the same view:
  the gold annotations rewritten to the calculator's own result text, and the characters the
  calculator would have written, which SFT leaves out of its loss.
"""
from __future__ import annotations

import re
from fractions import Fraction

import torch

#: the longest expression the calculator reads (characters); GSM8K's longest is far shorter
MAX_EXPRESSION_CHARS = 120
#: the most digits in one number of an expression, and in a result's integer part
MAX_DIGITS = 15
#: decimals of a result that does not end (1/3 -> 0.3333)
RESULT_DECIMALS = 4
#: parentheses nested deeper than this are not read (the parser recurses once per level)
MAX_DEPTH = 8

OPEN, CLOSE = "<<", ">>"
ANNOTATION = re.compile(r"<<([^<>]*)=([^<>=]*)>>")
_TOKENS = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+|[-+*/()])")
_ALLOWED = set("0123456789.+-*/() ,")


class _Parser:
    """Recursive descent over one expression's tokens, exact in :class:`~fractions.Fraction`."""

    def __init__(self, tokens: list[str]):
        self.tokens, self.i, self.depth = tokens, 0, 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> str:
        self.i += 1
        return self.tokens[self.i - 1]

    def expression(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while self.peek() in ("*", "/"):
            if self.take() == "*":
                value *= self.factor()
            else:
                value /= self.factor()        # ZeroDivisionError: caught by calculate()
            _check_size(value)
        return value

    def factor(self) -> Fraction:
        tok = self.peek()
        if tok == "-":
            self.take()
            return -self.factor()
        if tok == "(":
            self.take()
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise ValueError("nested too deep")
            value = self.expression()
            if self.peek() != ")":
                raise ValueError("unclosed parenthesis")
            self.take()
            self.depth -= 1
            return value
        if tok is None or not (tok[0].isdigit() or tok[0] == "."):
            raise ValueError(f"expected a number, got {tok!r}")
        self.take()
        if len(tok.replace(".", "")) > MAX_DIGITS:
            raise ValueError("number too long")
        return Fraction(tok)


def _check_size(value: Fraction) -> None:
    """Results past ``MAX_DIGITS`` integer digits, or fractions that would keep growing, stop."""
    if abs(value) >= 10 ** MAX_DIGITS or value.denominator >= 10 ** MAX_DIGITS:
        raise ValueError("result too large")


def format_result(value: Fraction) -> str:
    """The calculator's text of a result: an integer as such (``24``), else a decimal of at most
    ``RESULT_DECIMALS`` places, trailing zeros dropped (``2.5``, ``0.3333``)."""
    if value.denominator == 1:
        return str(value.numerator)
    scaled = round(value * 10 ** RESULT_DECIMALS)
    sign = "-" if scaled < 0 else ""
    whole, frac = divmod(abs(scaled), 10 ** RESULT_DECIMALS)
    frac_text = f"{frac:0{RESULT_DECIMALS}d}".rstrip("0")
    return f"{sign}{whole}.{frac_text}" if frac_text else f"{sign}{whole}"


def calculate(expression: str) -> str | None:
    """The result text of an annotation's expression (``"48/2"`` -> ``"24"``), or ``None`` for
    anything that is not a bounded arithmetic expression of numbers, ``+ - * /``, parentheses
    and decimals (thousands commas are dropped). Never raises, never evaluates code.

    >>> calculate("(3+4)*2.5"), calculate("1/0"), calculate("__import__('os')")
    ('17.5', None, None)
    """
    if not isinstance(expression, str) or len(expression) > MAX_EXPRESSION_CHARS \
            or not expression.strip() or not set(expression) <= _ALLOWED or "**" in expression:
        return None
    text = expression.replace(",", "")
    tokens, pos = [], 0
    for match in _TOKENS.finditer(text):
        if match.start() != pos:
            return None
        tokens.append(match.group(1))
        pos = match.end()
    if text[pos:].strip():
        return None
    try:
        parser = _Parser(tokens)
        value = parser.expression()
        if parser.peek() is not None:
            return None
        _check_size(value)
    except (ValueError, ZeroDivisionError, IndexError):
        return None
    return format_result(value)


def forced_text(prefix: str) -> str | None:
    """What the calculator writes next after ``prefix``, a completion so far, in text: where it
    ends inside an annotation at its ``=`` (``"... <<48/2="``), the result and the closing
    ``>>`` (``"24>>"``); else, or where the expression is not one it evaluates, ``None`` (the
    model's own tokens continue). The sampler does the same token by token (:class:`CalculatorRows`).

    >>> forced_text("Half of 48 is <<48/2="), forced_text("<<48/2=24>> so"), forced_text("<<x=")
    ('24>>', None, None)
    """
    start = prefix.rfind(OPEN)
    if start < 0 or not prefix.endswith("=") or CLOSE in prefix[start:]:
        return None
    expression = prefix[start + len(OPEN):-1]
    if "=" in expression or "<" in expression or ">" in expression:
        return None
    result = calculate(expression)
    return None if result is None else result + CLOSE


# ---------------------------------------------------------------- supervised targets
def calculator_solution(solution: str) -> str:
    """A GSM8K solution with each annotation's result written as the calculator writes it
    (``<<8*18=144.00>>`` -> ``<<8*18=144>>``), so SFT shows the model the tokens that sampling
    will force; an annotation the calculator cannot evaluate is kept as written."""

    def rewrite(match: re.Match) -> str:
        result = calculate(match.group(1))
        return match.group(0) if result is None else f"{OPEN}{match.group(1)}={result}{CLOSE}"
    return ANNOTATION.sub(rewrite, solution)


def tool_spans(text: str) -> list[tuple[int, int]]:
    """The character spans ``[start, end)`` the calculator writes in ``text``: each evaluable
    annotation's result and its closing ``>>`` (what SFT leaves out of its loss)."""
    spans = []
    for match in ANNOTATION.finditer(text):
        if calculate(match.group(1)) is not None:
            spans.append((match.start(2), match.end()))
    return spans


def tool_token_mask(offsets: torch.Tensor, spans_per_row: list[list[tuple[int, int]]]) -> torch.Tensor:
    """``[B, T]`` long: 0 where a token's characters (``offsets`` [B, T, 2], a fast tokenizer's
    ``offset_mapping``) overlap a span the calculator writes, else 1 (TRL's ``tool_mask``)."""
    mask = torch.ones(offsets.shape[:2], dtype=torch.long)
    for b, spans in enumerate(spans_per_row):
        for lo, hi in spans:
            start, end = offsets[b, :, 0], offsets[b, :, 1]
            mask[b] &= ~((start < hi) & (end > lo) & (end > start))
    return mask


# ---------------------------------------------------------------- the sampler's tool
_OPEN, _CLOSE, _EQUALS = 1, 2, 4
# a token that ends or starts with one "<" or ">": "<<" or ">>" split over two tokens
_ENDS_LT, _STARTS_LT, _ENDS_GT, _STARTS_GT = 8, 16, 32, 64


class Calculator:
    """The calculator for one tokenizer: the vocabulary's flags, built once (a decode of every
    token), and the text of a result as token ids. :meth:`rows` makes the per-call state."""

    def __init__(self, tokenizer, vocab_size: int | None = None):
        self.tokenizer = tokenizer
        size = max(len(tokenizer), vocab_size or 0)
        texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
        flags = torch.zeros(size, dtype=torch.uint8)
        for i, text in enumerate(texts):
            opened, closed = text.rfind(OPEN), text.rfind(CLOSE)
            bits = 0
            if opened >= 0 and opened > closed:
                bits |= _OPEN
            elif closed >= 0:
                bits |= _CLOSE
            if text.endswith("="):
                bits |= _EQUALS
            bits |= (_ENDS_LT if text.endswith("<") else 0) | (_STARTS_LT if text.startswith("<") else 0)
            bits |= (_ENDS_GT if text.endswith(">") else 0) | (_STARTS_GT if text.startswith(">") else 0)
            flags[i] = bits
        self.flags = flags

    def result_ids(self, expression: str) -> list[int] | None:
        """The token ids the tool writes after ``expression=`` (its result and ``>>``), or
        ``None`` where :func:`calculate` cannot evaluate it."""
        result = calculate(expression)
        if result is None:
            return None
        return self.tokenizer(result + CLOSE, add_special_tokens=False)["input_ids"]

    def rows(self, batch: int) -> CalculatorRows:
        return CalculatorRows(self, batch)


_CACHE: dict[int, Calculator] = {}


def calculator_for(tokenizer, vocab_size: int | None = None) -> Calculator:
    """One :class:`Calculator` per tokenizer object (its vocabulary table is built once)."""
    key = id(tokenizer)
    calc = _CACHE.get(key)
    if calc is None or calc.tokenizer is not tokenizer or len(calc.flags) < (vocab_size or 0):
        calc = _CACHE[key] = Calculator(tokenizer, vocab_size)
    return calc


class CalculatorRows:
    """The tool's state over one sampler call's rows (indexed by original row): where each
    row's open annotation began (``-1``: none) and the forced tokens it still has to emit."""

    def __init__(self, calc: Calculator, batch: int):
        self.calc = calc
        self.open_at = [-1] * batch
        self.pending: dict[int, list[int]] = {}
        self.halves: dict[int, str] = {}       # rows whose last token ended in one "<" or ">"

    def force(self, rows: torch.Tensor, tokens: torch.Tensor, logps: torch.Tensor) -> torch.Tensor | None:
        """Put each decoding row's next forced token into ``tokens`` (its log-prob 0: the model
        did not choose it). Returns ``[len(rows)]`` bool, True where forced, or ``None``."""
        if not self.pending:
            return None
        where = {int(r): i for i, r in enumerate(rows.tolist())}
        forced = torch.zeros(len(rows), dtype=torch.bool)
        for row in list(self.pending):
            queue, i = self.pending[row], where.get(row)
            if i is None:                      # the row left the batch (it cannot, but be safe)
                del self.pending[row]
                continue
            tokens[i] = queue.pop(0)
            logps[i] = 0.0
            forced[i] = True
            if not queue:
                del self.pending[row]
        return forced

    def observe(self, step: int, rows: torch.Tensor, tokens: torch.Tensor,
                history: torch.Tensor, forced: torch.Tensor | None) -> None:
        """Follow the tokens just written at ``step`` (``history``: every row's tokens so far,
        ``[B, max_new_tokens]``). A drawn token that ends an open annotation's expression with
        ``=`` queues the calculator's result; forced tokens change no state."""
        flags = self.calc.flags[tokens]
        if forced is not None:
            flags = flags.masked_fill(forced, 0)
        halves, self.halves = self.halves, {}
        if not bool(flags.any()):
            return
        for i in flags.nonzero().squeeze(1).tolist():
            row, flag = int(rows[i]), int(flags[i])
            half = halves.get(row)
            if flag & _OPEN or (half == "<" and flag & _STARTS_LT):
                self.open_at[row] = step - (not flag & _OPEN)
            elif flag & _CLOSE or (half == ">" and flag & _STARTS_GT):
                self.open_at[row] = -1
            if flag & (_ENDS_LT | _ENDS_GT):
                self.halves[row] = "<" if flag & _ENDS_LT else ">"
            if flag & _EQUALS and self.open_at[row] >= 0:
                if step - self.open_at[row] > MAX_EXPRESSION_CHARS:   # never closed: let it go
                    self.open_at[row] = -1
                    continue
                text = self.calc.tokenizer.decode(history[row, self.open_at[row]:step + 1])
                expression = text[text.rfind(OPEN) + len(OPEN):-1]
                ids = self.calc.result_ids(expression)
                if ids:
                    self.pending[row] = ids
                    self.open_at[row] = -1       # the forced ">>" closes it
