"""The printer: CL's prin1/princ text with *print-case* :downcase and
*read-default-float-format* double-float (so doubles print without an exponent marker)."""

from __future__ import annotations

import math
import re
import sys
from fractions import Fraction
from typing import Any, Callable, NamedTuple, Optional

from .charnames import char_name
from .objects import BitVector, Builtin, LispArray
from .types import FUNCTION, NIL, QUASIQUOTE, QUOTE, UNQUOTE, UNQUOTE_SPLICING, Char, Cons, Symbol


_WRAPPERS = {QUOTE: "'", FUNCTION: "#'", QUASIQUOTE: "`", UNQUOTE: ",", UNQUOTE_SPLICING: ",@"}
_NUMBER_LIKE = re.compile(r"[+-]?(?:[0-9]+\.?|[0-9]+/[0-9]+|[0-9]*\.[0-9]+(?:[esfdl][+-]?[0-9]+)?|[0-9]+(?:\.[0-9]*)?[esfdl][+-]?[0-9]+)\Z", re.I)
_SYMBOL_SAFE = re.compile(r"[^\s()'\";`,|\\#:a-z]+\Z")
MAX_PRINTED_CELLS = 2_000_000
MAX_PRINTED_DIGITS = 100_000  # a longer integer is refused: Python's int-to-text is quadratic
_MAX_PRINTED_BITS = int(MAX_PRINTED_DIGITS / math.log10(2))
# Python refuses to convert integers of more than 4300 digits to text (or back); SexpGPU's
# integers go up to MAX_INTEGER_BITS, and its own limits are the printer's and the reader's
sys.set_int_max_str_digits(MAX_PRINTED_DIGITS)


class PrintTooLarge(Exception):
    """The object is circular or too large to print."""


class PrintOptions(NamedTuple):
    """The printer variables that change the text (CLHS 22.1.1): *print-base*, *print-radix*,
    *print-level*, *print-length* and *print-case* (the suite's :downcase by default)."""

    base: int = 10
    radix: bool = False
    level: Optional[int] = None
    length: Optional[int] = None
    case: str = "DOWNCASE"
    # *print-pretty*: as in the suite's SBCL, whose pretty printer prints conses on one line
    # without abbreviating them (only vectors and arrays honour *print-level*/*print-length*);
    # with it nil, lists are abbreviated too and (quote x) is printed as a list
    pretty: bool = True


DEFAULT_OPTIONS = PrintOptions()
_DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_RADIX_PREFIX = {2: "#b", 8: "#o", 16: "#x"}


def integer_in_base(n: int, base: int) -> str:
    if base == 10:
        return str(n)
    if n == 0:
        return "0"
    sign, n = ("-", -n) if n < 0 else ("", n)
    out = []
    while n:
        n, d = divmod(n, base)
        out.append(_DIGITS[d])
    return sign + "".join(reversed(out))


def rational_text(x: Any, options: PrintOptions) -> str:
    for part in (x,) if type(x) is int else (x.numerator, x.denominator):
        check_printable(part)
    base = options.base
    if type(x) is int:
        text = integer_in_base(x, base)
        if not options.radix:
            return text
        return text + "." if base == 10 else _RADIX_PREFIX.get(base, f"#{base}r") + text
    text = f"{integer_in_base(x.numerator, base)}/{integer_in_base(x.denominator, base)}"
    return _RADIX_PREFIX.get(base, f"#{base}r") + text if options.radix else text


def _case_name(name: str, case: str) -> str:
    """A symbol name without lower-case letters, as *print-case* prints it."""
    if case == "UPCASE":
        return name
    if case == "CAPITALIZE":
        return re.sub(r"[A-Za-z0-9]+", lambda m: m.group(0)[0] + m.group(0)[1:].lower(), name)
    return name.lower()


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


def symbol_text(sym: Symbol, escape: bool, case: str = "DOWNCASE") -> str:
    name = sym.name
    if not escape:
        return _case_name(name, case) if name == name.upper() else name
    body = _escaped_symbol_name(name, case)
    if sym.package == "KEYWORD":
        return ":" + body
    if sym.package is None:
        return "#:" + body
    if sym.package:
        return f"{sym.package.lower()}:{body}"
    return body


def potential_number(name: str) -> bool:
    """CLHS 2.3.1.1: digits, signs, ratio markers, points, ^ _ and letters (no two
    adjacent), with a digit, starting with a digit, sign, point, ^ or _, not ending in a sign."""
    if not name or name[-1] in "+-" or name[0] not in "0123456789+-.^_" or not any(c.isdigit() for c in name):
        return False
    previous_letter = False
    for c in name:
        letter = c.isalpha()
        if not (letter or c in "0123456789+-/.^_") or (letter and previous_letter):
            return False
        previous_letter = letter
    return True


def _escaped_symbol_name(name: str, case: str = "DOWNCASE") -> str:
    lowered = name.lower()
    if name and _SYMBOL_SAFE.match(name) and not _NUMBER_LIKE.match(lowered) and not potential_number(name) and set(name) != {"."}:
        return _case_name(name, case)
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


def check_printable(n: int) -> None:
    if n.bit_length() > _MAX_PRINTED_BITS:
        digits = int(n.bit_length() * math.log10(2)) + 1
        raise PrintTooLarge(f"an integer of about {digits} digits is too large to print (the limit is {MAX_PRINTED_DIGITS} digits)")


def number_text(x: Any) -> str:
    t = type(x)
    if t is int:
        check_printable(x)
        return str(x)
    if t is float:
        return format_float(x)
    if t is Fraction:
        check_printable(x.numerator)
        check_printable(x.denominator)
        return f"{x.numerator}/{x.denominator}"
    return str(x)


class Printer:
    """Writes objects as text. `other` prints host objects the printer does not know
    (functions, hash tables, structures) and is supplied by the evaluator."""

    def __init__(self, escape: bool, other: Callable[[Any, "Printer"], str] | None = None, options: PrintOptions = DEFAULT_OPTIONS) -> None:
        self.escape = escape
        self.other = other
        self.options = options
        self.plain = options == DEFAULT_OPTIONS
        self.budget = MAX_PRINTED_CELLS
        self.level = 0  # how many abbreviable containers the object being printed is inside

    def spend(self) -> None:
        self.budget -= 1
        if self.budget < 0:
            raise PrintTooLarge("object too large or circular to print")

    def text(self, x: Any, depth: int = 0) -> str:
        if depth > 10_000:
            raise PrintTooLarge("object nested too deeply to print")
        t = type(x)
        if t is Symbol:
            return symbol_text(x, self.escape, self.options.case)
        if t is Cons:
            return self.list_text(x, depth)
        if t is str:
            return string_text(x, self.escape)
        if t in (int, Fraction) and not self.plain:
            return rational_text(x, self.options)
        if t in (int, float, Fraction):
            return number_text(x)
        if t is Char:
            return char_text(x, self.escape)
        if t is list:
            self.spend()
            return "#(" + self.elements_text(x, depth) + ")"
        if t is BitVector:
            self.spend()
            return "#*" + "".join("1" if b else "0" for b in x)
        if t is LispArray:
            return f"#{len(x.dims)}A" + self.array_text(x.dims, x.data, depth)
        if t is bool:
            return "t" if x else "nil"
        if self.other is not None:
            return self.other(x, self)
        return f"#<{t.__name__.lower()}>"

    def too_deep(self) -> bool:
        """*print-level*: a container this deep prints as #."""
        return self.options.level is not None and self.level >= self.options.level

    def elements_text(self, items: list[Any], depth: int) -> str:
        if self.too_deep():
            raise _Abbreviated
        limit = self.options.length
        shown = items if limit is None else items[:limit]
        self.level += 1
        try:
            parts = [self.sub_text(e, depth) for e in shown]
        finally:
            self.level -= 1
        if len(shown) < len(items):
            parts.append("...")
        return " ".join(parts)

    def sub_text(self, x: Any, depth: int) -> str:
        try:
            return self.text(x, depth + 1)
        except _Abbreviated:
            return "#"

    def array_text(self, dims: tuple[int, ...], data: list[Any], depth: int) -> str:
        """The nested contents of an array as #nA prints them, row-major DATA split by DIMS."""
        if not dims:
            return self.text(data[0], depth)
        self.spend()
        if len(dims) == 1:
            return "(" + self.elements_text(data, depth) + ")"
        if self.too_deep():
            raise _Abbreviated
        step = len(data) // dims[0] if dims[0] else 0
        rows = [data[i * step : (i + 1) * step] for i in range(dims[0])]
        limit = self.options.length
        parts = []
        self.level += 1
        try:
            for row in rows if limit is None else rows[:limit]:
                try:
                    parts.append(self.array_text(dims[1:], row, depth + 1))
                except _Abbreviated:
                    parts.append("#")
        finally:
            self.level -= 1
        if limit is not None and len(rows) > limit:
            parts.append("...")
        return "(" + " ".join(parts) + ")"

    def list_text(self, x: Cons, depth: int) -> str:
        head = x.car
        pretty = self.options.pretty
        if pretty and type(head) is Symbol and head in _WRAPPERS and type(x.cdr) is Cons and x.cdr.cdr is NIL:
            return _WRAPPERS[head] + self.text(x.cdr.car, depth)
        if not pretty and self.too_deep():
            raise _Abbreviated
        parts: list[str] = []
        cell: Any = x
        limit = None if pretty else self.options.length
        self.level += 0 if pretty else 1
        try:
            while type(cell) is Cons:
                self.spend()
                if limit is not None and len(parts) >= limit:
                    parts.append("...")
                    cell = NIL
                    break
                parts.append(self.sub_text(cell.car, depth))
                cell = cell.cdr
            if cell is not NIL:
                parts.append(".")
                parts.append(self.sub_text(cell, depth))
        finally:
            self.level -= 0 if pretty else 1
        return "(" + " ".join(parts) + ")"


class _Abbreviated(Exception):
    """A list or vector beyond *print-level*: its parent prints # in its place."""


def print_to_string(x: Any, escape: bool, other: Callable[[Any, Printer], str] | None = None, options: PrintOptions = DEFAULT_OPTIONS) -> str:
    try:
        return Printer(escape, other, options).text(x)
    except _Abbreviated:
        return "#"


def prin1_to_string(x: Any, other: Callable[[Any, Printer], str] | None = None) -> str:
    return Printer(True, other).text(x)


def princ_to_string(x: Any, other: Callable[[Any, Printer], str] | None = None) -> str:
    return Printer(False, other).text(x)


def function_name(fn: Any) -> str:
    """A function's name as messages give it: a builtin's, a named closure's printed, or lambda."""
    if isinstance(fn, Builtin):
        return fn.name
    name = getattr(fn, "name", None)
    if name is None or name is NIL:
        return "lambda"
    return prin1_to_string(name)
