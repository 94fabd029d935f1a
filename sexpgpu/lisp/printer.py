"""The printer: CL's prin1/princ text with *print-case* :downcase and
*read-default-float-format* double-float (so doubles print without an exponent marker)."""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any, Callable

from .charnames import char_name
from .types import FUNCTION, NIL, QUASIQUOTE, QUOTE, UNQUOTE, UNQUOTE_SPLICING, Char, Cons, Symbol


_WRAPPERS = {QUOTE: "'", FUNCTION: "#'", QUASIQUOTE: "`", UNQUOTE: ",", UNQUOTE_SPLICING: ",@"}
_NUMBER_LIKE = re.compile(r"[+-]?(?:[0-9]+\.?|[0-9]+/[0-9]+|[0-9]*\.[0-9]+(?:[esfdl][+-]?[0-9]+)?|[0-9]+(?:\.[0-9]*)?[esfdl][+-]?[0-9]+)\Z", re.I)
_SYMBOL_SAFE = re.compile(r"[^\s()'\";`,|\\#:a-z]+\Z")
MAX_PRINTED_CELLS = 2_000_000


class PrintTooLarge(Exception):
    """The object is circular or too large to print."""


def format_float(x: float) -> str:
    """A double as SBCL prints it when the default float format is double-float."""
    if math.isnan(x):
        return "#<double-float quiet NaN>"
    if math.isinf(x):
        return "#.double-float-positive-infinity" if x > 0 else "#.double-float-negative-infinity"
    if x == 0.0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    sign = "-" if x < 0 else ""
    digits, exponent = _shortest_digits(abs(x))
    # value = 0.DIGITS * 10**exponent
    if 1e-3 <= abs(x) < 1e7:
        if exponent <= 0:
            return f"{sign}0.{'0' * -exponent}{digits}"
        if exponent >= len(digits):
            return f"{sign}{digits}{'0' * (exponent - len(digits))}.0"
        return f"{sign}{digits[:exponent]}.{digits[exponent:]}"
    mantissa = digits[0] + "." + (digits[1:] or "0")
    return f"{sign}{mantissa}e{exponent - 1}"


def _shortest_digits(x: float) -> tuple[str, int]:
    """Shortest round-tripping decimal digits of a positive float, and the exponent E such
    that x = 0.DIGITS * 10**E."""
    text = repr(x)
    if "e" in text:
        mant, exp_text = text.split("e")
        exp = int(exp_text)
    else:
        mant, exp = text, 0
    if "." in mant:
        int_part, frac_part = mant.split(".")
    else:
        int_part, frac_part = mant, ""
    digits = (int_part + frac_part).lstrip("0")
    leading_zeros = len(int_part + frac_part) - len((int_part + frac_part).lstrip("0"))
    point = len(int_part) + exp - leading_zeros
    digits = digits.rstrip("0") or "0"
    return digits, point


def symbol_text(sym: Symbol, escape: bool) -> str:
    name = sym.name
    if not escape:
        return name.lower() if name == name.upper() else name
    body = _escaped_symbol_name(name)
    if sym.package == "KEYWORD":
        return ":" + body
    if sym.package is None:
        return "#:" + body
    if sym.package:
        return f"{sym.package.lower()}:{body}"
    return body


def _escaped_symbol_name(name: str) -> str:
    lowered = name.lower()
    if name and _SYMBOL_SAFE.match(name) and not _NUMBER_LIKE.match(lowered) and set(name) != {"."}:
        return lowered
    return "|" + name.replace("\\", "\\\\").replace("|", "\\|") + "|"


def char_text(c: Char, escape: bool) -> str:
    """#\\a, and as SBCL prints them: #\\  for a space, the control and non-ASCII
    characters by name (#\\Newline, #\\Soh, #\\GREEK_SMALL_LETTER_LAMDA)."""
    if not escape:
        return c.ch
    code = ord(c.ch)
    if code == 32:
        return "#\\ "
    if code < 32 or code >= 127:
        return "#\\" + (char_name(c.ch) or c.ch)
    return "#\\" + c.ch


def string_text(s: str, escape: bool) -> str:
    if not escape:
        return s
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def number_text(x: Any) -> str:
    t = type(x)
    if t is int:
        return str(x)
    if t is float:
        return format_float(x)
    if t is Fraction:
        return f"{x.numerator}/{x.denominator}"
    return str(x)


class Printer:
    """Writes objects as text. `other` prints host objects the printer does not know
    (functions, hash tables, structures) and is supplied by the evaluator."""

    def __init__(self, escape: bool, other: Callable[[Any, "Printer"], str] | None = None) -> None:
        self.escape = escape
        self.other = other
        self.budget = MAX_PRINTED_CELLS

    def spend(self) -> None:
        self.budget -= 1
        if self.budget < 0:
            raise PrintTooLarge("object too large or circular to print")

    def text(self, x: Any, depth: int = 0) -> str:
        if depth > 10_000:
            raise PrintTooLarge("object nested too deeply to print")
        t = type(x)
        if t is Symbol:
            return symbol_text(x, self.escape)
        if t is Cons:
            return self.list_text(x, depth)
        if t is str:
            return string_text(x, self.escape)
        if t in (int, float, Fraction):
            return number_text(x)
        if t is Char:
            return char_text(x, self.escape)
        if t is list:
            self.spend()
            return "#(" + " ".join(self.text(e, depth + 1) for e in x) + ")"
        if t is bool:
            return "t" if x else "nil"
        if self.other is not None:
            return self.other(x, self)
        return f"#<{t.__name__.lower()}>"

    def list_text(self, x: Cons, depth: int) -> str:
        head = x.car
        if type(head) is Symbol and head in _WRAPPERS and type(x.cdr) is Cons and x.cdr.cdr is NIL:
            return _WRAPPERS[head] + self.text(x.cdr.car, depth + 1)
        parts: list[str] = []
        cell: Any = x
        while type(cell) is Cons:
            self.spend()
            parts.append(self.text(cell.car, depth + 1))
            cell = cell.cdr
        if cell is not NIL:
            parts.append(".")
            parts.append(self.text(cell, depth + 1))
        return "(" + " ".join(parts) + ")"


def prin1_to_string(x: Any, other: Callable[[Any, Printer], str] | None = None) -> str:
    return Printer(True, other).text(x)


def princ_to_string(x: Any, other: Callable[[Any, Printer], str] | None = None) -> str:
    return Printer(False, other).text(x)
