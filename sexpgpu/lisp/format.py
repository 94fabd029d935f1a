"""CL `format` with destination nil: the directive language, with SBCL's exact output.

Supported directives: ~a ~s ~d ~b ~o ~x ~r ~f ~e ~c ~p ~% ~& ~~ ~* ~^ ~newline,
~{...~}, ~[...~;...~], ~(...~). Parameters may be given as numbers, 'c characters, v (taken
from the arguments) or # (the number of arguments left). Anything else is a FormatError.

The float directives follow SBCL's algorithms (Burger & Dybvig digit generation with a cut-off,
and SCALE-EXPONENT's floating point scaling for ~e), so that e.g. (format nil "~,2f" 0.125)
is "0.13" and (format nil "~e" 12345.0) is "1.2344999999999999e+4", as in SBCL. Rational
arguments of ~f and ~e are converted to single floats first, as SBCL does, and ~e marks single
floats with `f` because the default float format is double-float.
"""

from __future__ import annotations

import enum
import math
import struct
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Optional, Protocol, Union

from .charnames import char_name
from .printer import Printer, PrintTooLarge, check_printable
from .types import NIL, Char, Cons, Symbol, from_iter

PrintFunction = Callable[[Any], str]
Real = Union[int, float, Fraction]


class FormatError(Exception):
    """A bad control string, or arguments that do not fit it. The message names the
    directive and its index in the control string. CTYPE is the condition it becomes
    (SBCL signals a type-error for a ~{ argument, or an argument list, that is not a list)."""

    def __init__(self, message: str, ctype: str = "ERROR", datum: Any = None) -> None:
        super().__init__(message)
        self.ctype = ctype
        self.datum = datum  # a type-error's datum: the object that is not a list


class Budget(Protocol):
    """What format charges as it runs: a step per directive run, cells for its output."""

    def charge(self, n: int) -> None: ...

    def alloc(self, n: int) -> None: ...


# ---------------------------------------------------------------------------------------------
# Limits that keep a bad control string from hanging or exhausting memory.

MAX_OUTPUT_CHARS = 1 << 26
MAX_ITERATION_STEPS = 10_000_000
MAX_NESTING = 100
MAX_FLOAT_PARAM = 10_000


# ---------------------------------------------------------------------------------------------
# The parsed control string.


class _Special(enum.Enum):
    NEXT_ARG = "v"
    ARG_COUNT = "#"


ParamValue = Union[int, Char, _Special, None]


@dataclass
class _Directive:
    char: str  # upper case
    raw: str  # as written in the control string
    index: int  # of the tilde
    params: tuple[ParamValue, ...]
    colon: bool
    at: bool
    body: list["_Node"] = field(default_factory=list)  # ~{ and ~(
    clauses: list[list["_Node"]] = field(default_factory=list)  # ~[
    has_default: bool = False  # ~[ whose last separator is ~:;
    close_colon: bool = False  # ~{ closed by ~:}, ~< closed by ~:> (a logical block)
    first_colon: bool = False  # ~< whose first separator is ~:; (its first clause is the overflow prefix)
    first_params: tuple[ParamValue, ...] = ()  # that ~:;'s parameters
    name: str = ""  # ~/name/

    @property
    def label(self) -> str:
        return f"~{self.raw} at index {self.index}"


_Node = Union[str, _Directive]


@dataclass(frozen=True)
class _Rule:
    """What a directive accepts: how many parameters, and which modifiers."""

    max_params: int
    colon: bool = True
    at: bool = True
    both: bool = True


_RULES: dict[str, _Rule] = {
    "A": _Rule(4),
    "S": _Rule(4),
    "D": _Rule(4),
    "B": _Rule(4),
    "O": _Rule(4),
    "X": _Rule(4),
    "R": _Rule(5),
    "C": _Rule(0),
    "P": _Rule(0),
    "F": _Rule(5, colon=False),
    "E": _Rule(7, colon=False),
    "%": _Rule(1, colon=False, at=False),
    "&": _Rule(1, colon=False, at=False),
    "~": _Rule(1, colon=False, at=False),
    "\n": _Rule(0, both=False),
    "*": _Rule(1, both=False),
    "^": _Rule(3, at=False),
    "{": _Rule(1),
    "(": _Rule(0),
    "[": _Rule(1, both=False),
    ";": _Rule(2),
    "}": _Rule(0),
    ")": _Rule(0),
    "]": _Rule(0),
    "$": _Rule(4),
    "G": _Rule(7, colon=False),
    "|": _Rule(1, colon=False, at=False),
    "T": _Rule(2),
    "?": _Rule(0, colon=False),
    "<": _Rule(4),
    ">": _Rule(0),
    "W": _Rule(0),
    "_": _Rule(0),
    "I": _Rule(1, at=False),
    "/": _Rule(MAX_NESTING),
}

_CLOSERS = {"{": "}", "(": ")", "[": "]", "<": ">"}
_NEWLINE_WHITESPACE = " \t\n"


class _Parser:
    """Turns a control string into a tree of text and directives."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def parse(self, colon_iteration: bool = False) -> list[_Node]:
        nodes, closer = self.parse_until("", colon_iteration, 0)
        assert closer is None
        return nodes

    def parse_until(self, closers: str, colon_iteration: bool, depth: int) -> tuple[list[_Node], Optional[_Directive]]:
        """Nodes up to a directive whose character is in `closers` (returned with them)."""
        if depth > MAX_NESTING:
            raise FormatError(f"format: directives nested more than {MAX_NESTING} deep at index {self.pos}")
        nodes: list[_Node] = []
        while self.pos < len(self.text):
            tilde = self.text.find("~", self.pos)
            if tilde < 0:
                nodes.append(self.text[self.pos :])
                self.pos = len(self.text)
                break
            if tilde > self.pos:
                nodes.append(self.text[self.pos : tilde])
            directive = self.parse_directive(tilde)
            _check_rule(directive)
            if directive.char in closers:
                return nodes, directive
            self.add_directive(nodes, directive, colon_iteration, depth)
        return nodes, None

    def add_directive(self, nodes: list[_Node], directive: _Directive, colon_iteration: bool, depth: int) -> None:
        char = directive.char
        if char == "\n":
            nodes.extend(self.newline_text(directive))
        elif char in "}])>":
            opener = {"}": "~{", "]": "~[", ")": "~(", ">": "~<"}[char]
            raise FormatError(f"format: {directive.label} has no matching {opener}")
        elif char == ";":
            raise FormatError(f"format: {directive.label} is not inside ~[...~]")
        elif char == "^" and directive.colon and not colon_iteration:
            raise FormatError(f"format: {directive.label}: ~:^ may only be used inside ~:{{...~}}")
        elif char == "{":
            directive.body, close = self.parse_closed(directive, directive.colon, depth)
            directive.close_colon = close.colon
            nodes.append(directive)
        elif char == "(":
            directive.body, _ = self.parse_closed(directive, colon_iteration, depth)
            nodes.append(directive)
        elif char == "[":
            self.parse_clauses(directive, colon_iteration, depth)
            nodes.append(directive)
        elif char == "<":
            self.parse_segments(directive, colon_iteration, depth)
            nodes.append(directive)
        else:
            nodes.append(directive)

    def parse_segments(self, directive: _Directive, colon_iteration: bool, depth: int) -> None:
        """~<seg~;seg...~> (justification) or ~<prefix~;body~;suffix~:> (a logical block)."""
        while True:
            clause, close = self.parse_until(">;", colon_iteration, depth + 1)
            if close is None:
                raise FormatError(f"format: {directive.label} has no matching ~>")
            directive.clauses.append(clause)
            if close.char == ">":
                directive.close_colon = close.colon
                break
            if close.colon and len(directive.clauses) == 1:
                directive.first_colon = True
                directive.first_params = close.params
        if directive.close_colon and len(directive.clauses) > 3:
            raise FormatError(f"format: {directive.label}: a logical block has at most prefix, body and suffix")

    def parse_closed(self, directive: _Directive, colon_iteration: bool, depth: int) -> tuple[list[_Node], _Directive]:
        closer = _CLOSERS[directive.char]
        body, close = self.parse_until(closer, colon_iteration, depth + 1)
        if close is None:
            raise FormatError(f"format: {directive.label} has no matching ~{closer}")
        return body, close

    def parse_clauses(self, directive: _Directive, colon_iteration: bool, depth: int) -> None:
        while True:
            clause, close = self.parse_until("];", colon_iteration, depth + 1)
            if close is None:
                raise FormatError(f"format: {directive.label} has no matching ~]")
            directive.clauses.append(clause)
            if close.char == "]":
                break
            directive.has_default = close.colon
        if directive.at and len(directive.clauses) != 1:
            raise FormatError(f"format: {directive.label}: ~@[ takes exactly one clause")
        if directive.colon and len(directive.clauses) != 2:
            raise FormatError(f"format: {directive.label}: ~:[ takes exactly two clauses")
        if (directive.colon or directive.at) and directive.params:
            raise FormatError(f"format: {directive.label} takes no parameters")

    def newline_text(self, directive: _Directive) -> list[_Node]:
        """~newline: drop the newline (unless @) and the whitespace after it (unless :)."""
        if not directive.colon:
            while self.pos < len(self.text) and self.text[self.pos] in _NEWLINE_WHITESPACE:
                self.pos += 1
        # An empty string, not nothing: SBCL does not count ~{~newline~} as an empty body.
        return ["\n" if directive.at else ""]

    def char_at(self, pos: int, start: int) -> str:
        if pos >= len(self.text):
            raise FormatError(f"format: the control string ends inside the directive at index {start}")
        return self.text[pos]

    def parse_directive(self, start: int) -> _Directive:
        """Parse `~params modifiers char` at `start` (SBCL's PARSE-DIRECTIVE)."""
        pos = start + 1
        params: list[ParamValue] = []
        colon = at = False
        while True:
            char = self.char_at(pos, start)
            if char in "0123456789+-vV#',":
                if colon or at:
                    raise FormatError(f"format: parameters after the : or @ modifier in the directive at index {start}")
                if char == "'":
                    params.append(Char(self.char_at(pos + 1, start)))
                    pos += 2
                    if self.char_at(pos, start) == ",":
                        pos += 1
                    continue
                if char == ",":
                    params.append(None)
                    pos += 1
                    continue
                value, end = self.param_value(pos)
                params.append(value)
                pos = end
                follow = self.char_at(pos, start)
                if follow == ",":
                    pos += 1
                    continue
                if follow in ":@":
                    continue
                break
            if char == ":":
                if colon:
                    raise FormatError(f"format: too many : modifiers in the directive at index {start}")
                colon = True
                pos += 1
                continue
            if char == "@":
                if at:
                    raise FormatError(f"format: too many @ modifiers in the directive at index {start}")
                at = True
                pos += 1
                continue
            if self.text[pos - 1] == "," and not (pos >= start + 3 and self.text[pos - 2] == "'"):
                params.append(None)
            break
        raw = self.text[pos]
        self.pos = pos + 1
        if raw == "/":
            end = self.text.find("/", pos + 1)
            if end < 0:
                raise FormatError(f"format: the ~/ directive at index {start} has no closing /")
            self.pos = end + 1
            return _Directive("/", raw, start, tuple(params), colon, at, name=self.text[pos + 1 : end])
        return _Directive(raw.upper(), raw, start, tuple(params), colon, at)

    def param_value(self, pos: int) -> tuple[ParamValue, int]:
        char = self.text[pos]
        if char in "vV":
            return _Special.NEXT_ARG, pos + 1
        if char == "#":
            return _Special.ARG_COUNT, pos + 1
        end = pos + 1 if char in "+-" else pos
        while end < len(self.text) and self.text[end] in "0123456789":
            end += 1
        digits = self.text[pos:end]
        if digits in ("+", "-"):
            return None, end
        return int(digits), end


def _check_rule(directive: _Directive) -> None:
    rule = _RULES.get(directive.char)
    if rule is None:
        shown = "~newline" if directive.raw == "\n" else f"~{directive.raw}"
        raise FormatError(f"format: directive {shown} at index {directive.index} is not supported")
    if len(directive.params) > rule.max_params:
        raise FormatError(f"format: {directive.label} takes at most {rule.max_params} parameter{'' if rule.max_params == 1 else 's'}")
    if directive.colon and not rule.colon:
        raise FormatError(f"format: {directive.label} does not take the : modifier")
    if directive.at and not rule.at:
        raise FormatError(f"format: {directive.label} does not take the @ modifier")
    if directive.colon and directive.at and not rule.both:
        raise FormatError(f"format: {directive.label} does not take both the : and @ modifiers")


def parse_control(control: str) -> list[_Node]:
    """Parse a control string (raises FormatError on a syntax error)."""
    return _Parser(control).parse()


# ---------------------------------------------------------------------------------------------
# Arguments and output.


class _Args:
    """The argument list directives consume from, like SBCL's pair of ORIG-ARGS (the whole
    list) and ARGS (the tail not yet used, `pos` elements in). Both are Lisp lists, and as in
    SBCL they are only checked to be lists when an argument is actually taken."""

    __slots__ = ("orig", "tail", "pos")

    def __init__(self, orig: Any) -> None:
        self.orig = orig
        self.tail = orig
        self.pos = 0

    def empty(self) -> bool:
        return self.tail is NIL

    def pop(self, directive: _Directive) -> Any:
        cell = self.tail
        if type(cell) is not Cons:
            if cell is NIL:
                raise FormatError(f"format: not enough arguments for {directive.label}")
            if self.pos:
                raise FormatError(f"format: {directive.label}: the argument list is dotted: it ends in {_describe(cell)}", "TYPE-ERROR", cell)
            raise FormatError(f"format: {directive.label} needs a list of arguments, not {_describe(cell)}", "TYPE-ERROR", cell)
        self.tail = cell.cdr
        self.pos += 1
        return cell.car

    def remaining(self, directive: _Directive) -> int:
        return _list_length(self.tail, directive)

    def advance_to(self, rest: Any) -> None:
        """Make REST (what a function control returned) the arguments left."""
        tail, steps = self.tail, 0
        while type(tail) is Cons and tail is not rest:
            tail, steps = tail.cdr, steps + 1
        self.tail = rest
        self.pos += steps if tail is rest else 1

    def snapshot(self) -> tuple[Any, int]:
        return self.tail, self.pos

    def restore(self, state: tuple[Any, int]) -> None:
        self.tail, self.pos = state

    def previous(self, directive: _Directive) -> Any:
        if self.pos == 0:
            raise FormatError(f"format: {directive.label}: there is no previous argument")
        return _nth(self.orig, self.pos - 1)

    def goto(self, target: int, directive: _Directive) -> None:
        length = _list_length(self.orig, directive)
        if not 0 <= target <= length:
            raise FormatError(f"format: {directive.label}: argument index {target} is out of bounds (0 to {length})")
        tail = self.orig
        for _ in range(target):
            if type(tail) is not Cons:
                raise FormatError(f"format: {directive.label} needs a list of arguments, not {_describe(tail)}", "TYPE-ERROR", tail)
            tail = tail.cdr
        self.tail, self.pos = tail, target


def _list_length(x: Any, directive: _Directive) -> int:
    """CL's LENGTH of an argument list (which, as in SBCL, may also be a string or vector)."""
    if type(x) in (str, list):
        return len(x)
    count = 0
    while type(x) is Cons:
        count += 1
        x = x.cdr
        if count > MAX_ITERATION_STEPS:
            raise FormatError(f"format: {directive.label}: the argument list is too long or circular")
    if x is not NIL:
        raise FormatError(f"format: {directive.label} needs a proper list of arguments, not one that ends in {_describe(x)}", "TYPE-ERROR", x)
    return count


def _nth(x: Any, n: int) -> Any:
    for _ in range(n):
        x = x.cdr
    return x.car


class _UpAndOut(Exception):
    """~^ : leave the enclosing iteration step (or the whole format)."""


class _UpUpAndOut(Exception):
    """~:^ : leave the enclosing ~:{ iteration. Carries the sublist's arguments."""

    def __init__(self, sublist: _Args) -> None:
        super().__init__()
        self.sublist = sublist


class _CallbackFailure(Exception):
    """An exception raised by the caller's prin1/princ, passed through untouched."""

    def __init__(self, original: BaseException) -> None:
        super().__init__()
        self.original = original


class _Output:
    def __init__(self, budget: Optional[Budget] = None) -> None:
        self.parts: list[str] = []
        self.size = 0
        self.budget = budget
        self.charged = 0  # output characters already paid for

    def reserve(self, count: int) -> None:
        if self.size + count > MAX_OUTPUT_CHARS:
            raise FormatError(f"format: the output would be longer than {MAX_OUTPUT_CHARS} characters")
        if self.budget is not None and self.size + count - self.charged >= 4096:
            cells = (self.size + count - self.charged) // 8
            self.budget.alloc(cells)
            self.charged += cells * 8

    def write(self, text: str) -> None:
        if text:
            self.reserve(len(text))
            self.parts.append(text)
            self.size += len(text)

    def repeat(self, text: str, count: int) -> None:
        if count > 0:
            self.reserve(len(text) * count)
            self.write(text * count)

    def at_line_start(self) -> bool:
        return not self.parts or self.parts[-1].endswith("\n")

    def column(self) -> int:
        """The column the next character goes to (0 at the start of a line)."""
        width = 0
        for part in reversed(self.parts):
            newline = part.rfind("\n")
            if newline >= 0:
                return width + len(part) - newline - 1
            width += len(part)
        return width

    def mark(self) -> int:
        return len(self.parts)

    def transform_from(self, mark: int, convert: Callable[[str], str]) -> None:
        text = "".join(self.parts[mark:])
        del self.parts[mark:]
        self.size -= len(text)
        self.write(convert(text))

    def text(self) -> str:
        if self.budget is not None and self.size > self.charged:
            self.budget.alloc((self.size - self.charged) // 8)
            self.charged = self.size
        return "".join(self.parts)


def _is_false(x: Any) -> bool:
    return x is NIL or x is False or x is None


def _is_integer(x: Any) -> bool:
    return type(x) is int


# ---------------------------------------------------------------------------------------------
# Parameters.

INT = "integer"
REAL = "real number"  # only mincol, which SBCL just compares with
CHAR = "character"
ANY = "parameter"  # ~^ compares numbers or characters
_CONSUME = object()  # default that takes the next argument (the index of ~[)


@dataclass(frozen=True)
class _Spec:
    kind: str
    default: Any = None


def _bind_params(directive: _Directive, args: _Args, specs: list[_Spec]) -> list[Any]:
    """Parameter values in order, with v and # resolved and defaults filled in
    (SBCL's INTERPRET-BIND-DEFAULTS)."""
    if len(directive.params) > len(specs):
        raise FormatError(f"format: {directive.label} takes at most {len(specs)} parameters")
    values: list[Any] = []
    for i, spec in enumerate(specs):
        value = directive.params[i] if i < len(directive.params) else None
        if value is _Special.NEXT_ARG:
            value = args.pop(directive)
            if _is_false(value):
                value = None
        elif value is _Special.ARG_COUNT:
            value = args.remaining(directive)
        if value is None:
            value = args.pop(directive) if spec.default is _CONSUME else spec.default
            values.append(value)
            continue
        values.append(_check_param(directive, i, value, spec.kind))
    return values


def _check_param(directive: _Directive, i: int, value: Any, kind: str) -> Any:
    if kind == INT:
        ok = _is_integer(value)
    elif kind == REAL:
        ok = _is_integer(value) or type(value) in (float, Fraction)
    elif kind == ANY:
        ok = _is_integer(value) or type(value) is Char
    else:
        ok = type(value) is Char
    if not ok:
        raise FormatError(f"format: parameter {i + 1} of {directive.label} must be a{'n' if kind == INT else ''} {kind}, not {_describe(value)}")
    return value


def _param_key(value: Any) -> Any:
    return ("char", value.ch) if type(value) is Char else value


def _param_order(d: _Directive, a: Any, b: Any) -> bool:
    if type(a) is Char and type(b) is Char:
        return a.ch <= b.ch
    if _is_integer(a) and _is_integer(b):
        return bool(a <= b)
    raise FormatError(f"format: {d.label}: parameters of different kinds cannot be ordered")


def _describe(value: Any) -> str:
    if type(value) is Char:
        return f"the character {value.ch!r}"
    if type(value) is Symbol:
        return f"the symbol {value.name.lower()}"
    if type(value) is str:
        return "a string"
    if type(value) is float:
        return f"the float {value!r}"
    if type(value) is Fraction:
        return f"the ratio {value.numerator}/{value.denominator}"
    if _is_integer(value):
        return f"the integer {value}"
    if type(value) is Cons:
        return "a list"
    if type(value) is list:
        return "a vector"
    return f"a {type(value).__name__}"


# ---------------------------------------------------------------------------------------------
# Integers in a radix.

_DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def integer_text(n: int, base: int = 10) -> str:
    """An integer in `base` with upper-case digits, as CL prints it."""
    if n < 0:
        return "-" + integer_text(-n, base)
    try:
        check_printable(n)
    except PrintTooLarge as exc:
        raise FormatError(f"format: {exc}") from None
    if base == 10:
        return str(n)
    if base in (2, 8, 16):
        return format(n, {2: "b", 8: "o", 16: "X"}[base])
    return _digits_by_halves(n, base)


def _digits_by_halves(n: int, base: int) -> str:
    if n < base**32:
        out: list[str] = []
        while True:
            n, d = divmod(n, base)
            out.append(_DIGITS[d])
            if n == 0:
                return "".join(reversed(out))
    half = max(1, int(n.bit_length() / math.log2(base)) // 2)
    high, low = divmod(n, base**half)
    return _digits_by_halves(high, base) + _digits_by_halves(low, base).rjust(half, "0")


def _add_commas(digits: str, comma: str, interval: int) -> str:
    groups: list[str] = []
    end = len(digits)
    while end > interval:
        groups.append(digits[end - interval : end])
        end -= interval
    groups.append(digits[:end])
    return comma.join(reversed(groups))


class _RadixPrinter(Printer):
    """princ with *print-base* bound: integers and ratios inside lists and vectors are
    printed in the radix; everything else as the caller's princ prints it."""

    def __init__(self, base: int, princ: PrintFunction) -> None:
        super().__init__(False, lambda obj, _printer: princ(obj))
        self.base = base
        self.princ = princ

    def text(self, x: Any, depth: int = 0) -> str:
        if _is_integer(x):
            return integer_text(x, self.base)
        if type(x) is Fraction:
            return f"{integer_text(x.numerator, self.base)}/{integer_text(x.denominator, self.base)}"
        if type(x) in (Cons, list):
            return super().text(x, depth)
        return self.princ(x)


# ---------------------------------------------------------------------------------------------
# English and Roman numerals (~r).

_ONES = ["", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
_TEENS = ["ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_ORDINAL_ONES = ["", "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth"]
_ORDINAL_TENS = ["", "tenth", "twentieth", "thirtieth", "fortieth", "fiftieth", "sixtieth", "seventieth", "eightieth", "ninetieth"]
_PERIODS = [
    "", " thousand", " million", " billion", " trillion", " quadrillion", " quintillion", " sextillion",
    " septillion", " octillion", " nonillion", " decillion", " undecillion", " duodecillion", " tredecillion",
    " quattuordecillion", " quindecillion", " sexdecillion", " septendecillion", " octodecillion",
    " novemdecillion", " vigintillion",
]


def _small_cardinal(n: int) -> str:
    hundreds, rest = divmod(n, 100)
    words: list[str] = []
    if hundreds:
        words.append(_ONES[hundreds] + " hundred")
    if rest:
        tens, ones = divmod(rest, 10)
        if tens > 1:
            words.append(_TENS[tens] + ("-" + _ONES[ones] if ones else ""))
        elif tens == 1:
            words.append(_TEENS[ones])
        else:
            words.append(_ONES[ones])
    return " ".join(words)


def english_cardinal(n: int) -> str:
    if n == 0:
        return "zero"
    if n < 0:
        return "negative " + english_cardinal(-n)
    groups: list[str] = []
    period = 0
    while n:
        if period >= len(_PERIODS):
            raise FormatError("format: number too large to print in English")
        n, here = divmod(n, 1000)
        if here:
            groups.append(_small_cardinal(here) + _PERIODS[period])
        period += 1
    return " ".join(reversed(groups))


def english_ordinal(n: int) -> str:
    prefix = "negative " if n < 0 else ""
    number = abs(n)
    top, bottom = divmod(number, 100)
    text = english_cardinal(number - bottom) if top else ""
    if top and bottom:
        text += " "
    tens, ones = divmod(bottom, 10)
    if bottom == 12:
        text += "twelfth"
    elif tens == 1:
        text += _TEENS[ones] + "th"
    elif tens == 0 and ones:
        text += _ORDINAL_ONES[ones]
    elif ones == 0 and tens:
        text += _ORDINAL_TENS[tens]
    elif bottom:
        text += _TENS[tens] + "-" + _ORDINAL_ONES[ones]
    elif number:
        text += "th"
    else:
        text += "zeroth"
    return prefix + text


_ROMAN = [(1000, "M"), (500, "D"), (100, "C"), (50, "L"), (10, "X"), (5, "V"), (1, "I")]
_ROMAN_SUBTRACTIVE = [(900, "CM"), (400, "CD"), (90, "XC"), (40, "XL"), (9, "IX"), (4, "IV")]


def roman_numeral(n: int, old_style: bool) -> str:
    limit = 5000 if old_style else 4000
    if not 0 < n < limit:
        raise FormatError(f"format: {n} cannot be printed in {'old ' if old_style else ''}Roman numerals (it must be between 1 and {limit - 1})")
    table = _ROMAN if old_style else sorted(_ROMAN + _ROMAN_SUBTRACTIVE, reverse=True)
    out: list[str] = []
    for value, letters in table:
        count, n = divmod(n, value)
        out.append(letters * count)
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# Floats: SBCL's FLONUM-TO-DIGITS, FLONUM-TO-STRING and SCALE-EXPONENT.

_LOG10_2 = 0.30102999566398114  # SBCL's (log 2d0 10)
_SINGLE_1E_10 = struct.unpack("f", struct.pack("f", 1e-10))[0]  # SBCL's source literal 1.0e-10
_DOUBLE_MIN_NORMAL = 2.2250738585072014e-308
_SINGLE_MAX = 3.4028234663852886e38


def to_single(x: float) -> float:
    """Round a double to the nearest single float (returned as a Python float)."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


def rational_to_single(q: Union[int, Fraction]) -> float:
    """CL's (coerce q 'single-float) as SBCL computes it: rounded to 24 significant bits
    (ties to even), then, below the normal range, truncated to a multiple of 2**-149.
    Overflow is an error."""
    if q == 0:
        return 0.0
    negative = q < 0
    q = abs(Fraction(q))
    exponent = q.numerator.bit_length() - q.denominator.bit_length()
    if Fraction(2) ** exponent > q:
        exponent -= 1
    if exponent > 127:
        raise FormatError(f"format: {q} is too large to convert to a single float")
    # 2**exponent <= q < 2**(exponent + 1): keep 24 significant bits, q ~= mantissa * 2**-shift
    shift = 23 - exponent
    scaled = q * Fraction(2) ** shift
    mantissa, remainder = divmod(scaled.numerator, scaled.denominator)
    if 2 * remainder > scaled.denominator or (2 * remainder == scaled.denominator and mantissa % 2 == 1):
        mantissa += 1
    if shift > 149:  # subnormal: SBCL's SCALE-FLOAT-MAYBE-UNDERFLOW shifts the bits out
        mantissa >>= shift - 149
        shift = 149
    value = math.ldexp(mantissa, -shift)
    if value > _SINGLE_MAX:
        raise FormatError(f"format: {q} is too large to convert to a single float")
    return -value if negative else value


@dataclass(frozen=True)
class _FloatKind:
    precision: int  # FLOAT-DIGITS
    min_e: int
    single: bool


_DOUBLE = _FloatKind(53, -1073, False)
_SINGLE = _FloatKind(24, -148, True)


def _decode(x: float, kind: _FloatKind) -> tuple[int, int]:
    """INTEGER-DECODE-FLOAT of a positive float, with a subnormal's fraction left-aligned."""
    mantissa, exponent = math.frexp(x)
    return int(mantissa * (1 << kind.precision)), exponent - kind.precision


def _generate_digits(r: int, s: int, m_plus: Any, m_minus: Any, low_ok: bool, high_ok: bool) -> str:
    digits: list[str] = []
    while True:
        d, r = divmod(r * 10, s)
        m_plus *= 10
        m_minus *= 10
        tc1 = r < m_minus or (low_ok and r == m_minus)
        tc2 = r + m_plus > s or (high_ok and r + m_plus == s)
        if tc1 or tc2:
            break
        digits.append(_DIGITS[d])
    if tc2 and (not tc1 or r * 2 >= s):
        d += 1
    if d > 9:
        raise FormatError("format: internal error while printing a float")
    digits.append(_DIGITS[d])
    return "".join(digits)


def flonum_to_digits(x: float, kind: _FloatKind = _DOUBLE, position: Optional[int] = None, relative: bool = False) -> tuple[int, str]:
    """SBCL's FLONUM-TO-DIGITS: (k, digits) with x ~= 0.DIGITS * 10**k. Without `position`
    the digits are the shortest that read back as x; with it, digit generation stops at the
    10**position place (or after `position` significant digits when `relative`)."""
    if x == 0:
        return 0, "0"
    f, e = _decode(x, kind)
    high_ok = low_ok = f % 2 == 0
    hidden = 1 << (kind.precision - 1)
    m_plus: Any
    m_minus: Any
    if e >= 0:
        be = 1 << e
        if f != hidden:
            r, s, m_plus, m_minus = f << (e + 1), 2, be, be
        else:
            r, s, m_plus, m_minus = f << (e + 2), 4, be << 1, be
    elif e == kind.min_e or f != hidden:
        r, s, m_plus, m_minus = f * 2, 1 << (1 - e), 1, 1
    else:
        r, s, m_plus, m_minus = f * 4, 1 << (2 - e), 2, 1
    if position is None:
        return _free_format_digits(f, e, r, s, m_plus, m_minus, low_ok, high_ok)
    return _fixed_format_digits(r, s, m_plus, m_minus, position, relative)


def _free_format_digits(f: int, e: int, r: int, s: int, m_plus: int, m_minus: int, low_ok: bool, high_ok: bool) -> tuple[int, str]:
    k = math.ceil((e + f.bit_length() - 1) * _LOG10_2 - _SINGLE_1E_10)
    if k >= 0:
        s *= 10**k
    else:
        scale = 10**-k
        r, m_plus, m_minus = r * scale, m_plus * scale, m_minus * scale
    if (r + m_plus >= s) if high_ok else (r + m_plus > s):
        k += 1
        s *= 10
    return k, _generate_digits(r, s, m_plus, m_minus, low_ok, high_ok)


def _fixed_format_digits(r: int, s: int, m_plus: Any, m_minus: Any, position: int, relative: bool) -> tuple[int, str]:
    if relative:
        k, scale = 0, 1
        while s * scale < r + m_plus:
            k += 1
            scale *= 10
        if r + s * Fraction(10) ** (k - position) / 2 < s * scale:
            position = k - position
        else:
            position = k - position - 1
    cutoff = s * Fraction(10) ** position / 2
    m_minus = max(m_minus, cutoff)
    m_plus = max(m_plus, cutoff)
    k = 0
    r_plus_m = r + m_plus
    while r_plus_m >= s:
        k += 1
        s *= 10
    while r > m_minus and (r + m_plus) * 10 < s:
        k -= 1
        r, m_plus, m_minus = r * 10, m_plus * 10, m_minus * 10
    return k, _generate_digits(r, s, m_plus, m_minus, True, True)


@dataclass(frozen=True)
class _FloatText:
    text: str  # digits with a decimal point, e.g. "3.14", ".5", "100."
    leading_point: bool
    trailing_point: bool


def flonum_to_string(x: float, kind: _FloatKind = _DOUBLE, width: Optional[int] = None, fdigits: Optional[int] = None,
                     scale: Optional[int] = None, fmin: Optional[int] = None) -> _FloatText:
    """SBCL's FLONUM-TO-STRING for a non-negative float."""
    if fdigits is not None:
        k, digits = flonum_to_digits(x, kind, min(-(fdigits + (scale or 0)), -(fmin or 0)))
    elif width is not None and width > 1:
        by_width = flonum_to_digits(x, kind, max(1, width - 1 + (scale if scale is not None and scale < 0 else 0)), True)
        by_fmin = flonum_to_digits(x, kind, -((fmin or 0) + (scale or 0)))
        k, digits = by_width if len(by_width[1]) >= len(by_fmin[1]) else by_fmin
    else:
        k, digits = flonum_to_digits(x, kind)
    e = k if x == 0 else k + (scale or 0)
    n = len(digits)
    if e > 0:
        cut = min(n, e)
        text = digits[:cut] + "0" * (e - n) + "." + digits[cut:]
        if fdigits is not None:
            text += "0" * (fdigits - (n - cut))
    else:
        text = "." + "0" * -e
        if fdigits is None:
            text += digits
        else:
            end = min(n, max(fmin or 0, fdigits + e))
            if end < 0:  # SBCL fails here too (e.g. ~3,0,,2e of 0.0)
                raise FormatError(f"format: cannot print {x!r} with {fdigits} fraction digits")
            text += digits[:end] + "0" * (fdigits + e - n)
    return _FloatText(text, text[0] == ".", text[-1] == ".")


def scale_exponent(x: float, kind: _FloatKind = _DOUBLE) -> tuple[float, int]:
    """SBCL's SCALE-EXPONENT: (z, e) with z in [0.1, 1) and x ~= z * 10**e, computed in
    double-float arithmetic exactly as SBCL does (so it can be off in the last digit)."""
    if x == 0:
        return 0.0, 1
    _, exponent = math.frexp(x)
    ex = round(exponent * _LOG10_2)
    if ex < 0:
        if x < _DOUBLE_MIN_NORMAL:
            x = x * 1.0e16 * math.pow(10.0, -ex - 16)
        else:
            x = x * 10.0 * math.pow(10.0, -ex - 1)
    else:
        x = x / 10.0 / math.pow(10.0, ex - 1)
    d, y = 10.0, x
    while not y < 1.0:
        y, d, ex = x / d, d * 10.0, ex + 1
    m, z = 10.0, y
    while not z >= 0.1:
        z, m, ex = y * m, m * 10.0, ex - 1
    return (to_single(z) if kind.single else z), ex


@dataclass(frozen=True)
class _FixedParams:
    w: Optional[int]
    d: Optional[int]
    k: Optional[int]
    overflow: Optional[str]
    pad: str
    atsign: bool


def format_fixed_float(x: float, kind: _FloatKind, p: _FixedParams) -> str:
    """SBCL's FORMAT-FIXED-AUX for a finite float."""
    negative = math.copysign(1.0, x) < 0
    spaceleft = p.w
    if spaceleft is not None and (p.atsign or negative):
        spaceleft -= 1
    ft = flonum_to_string(abs(x), kind, spaceleft, p.d, p.k)
    lpoint, tpoint = ft.leading_point, ft.trailing_point and p.d != 0
    if spaceleft is not None:
        spaceleft -= len(ft.text)
        if lpoint:
            if spaceleft > 0 or tpoint:
                spaceleft -= 1
            else:
                lpoint = False
        if tpoint:
            if spaceleft > 0:
                spaceleft -= 1
            else:
                tpoint = False
        if spaceleft < 0 and p.overflow is not None:
            return p.overflow * (p.w or 0)
    sign = "-" if negative else "+" if p.atsign else ""
    padding = p.pad * spaceleft if spaceleft is not None and spaceleft > 0 else ""
    return padding + sign + ("0" if lpoint else "") + ft.text + ("0" if tpoint else "")


@dataclass(frozen=True)
class _ExpParams:
    w: Optional[int]
    d: Optional[int]
    e: Optional[int]
    k: int
    overflow: Optional[str]
    pad: str
    marker: Optional[str]
    atsign: bool


def format_exponential_float(x: float, kind: _FloatKind, p: _ExpParams) -> str:
    """SBCL's FORMAT-EXP-AUX for a finite float."""
    negative = math.copysign(1.0, x) < 0
    num, expt = scale_exponent(abs(x), kind)
    k = p.k - 1 if num == 1.0 else p.k
    expt -= k
    estr = str(abs(expt))
    elen = max(len(estr), p.e) if p.e is not None else len(estr)
    spaceleft: Optional[int] = None
    if p.w is not None:
        spaceleft = p.w - 2 - elen - (1 if p.atsign or negative else 0)
    if p.w is not None and p.overflow is not None and p.e is not None and elen > p.e:
        return p.overflow * p.w
    fdig = None if p.d is None else (p.d - k + 1 if k > 0 else p.d)
    fmin = 1 if k < 0 else fdig
    ft = flonum_to_string(num, kind, spaceleft, fdig, k, fmin)
    lpoint, tpoint = ft.leading_point, ft.trailing_point and fdig != 0
    if spaceleft is not None:
        spaceleft -= len(ft.text)
        if lpoint:
            if spaceleft > 0 or tpoint:
                spaceleft -= 1
            else:
                lpoint = False
        if tpoint:
            if spaceleft <= 0:
                tpoint = False
            else:
                spaceleft -= 1
        if spaceleft < 0 and p.overflow is not None:
            return p.overflow * (p.w or 0)
    marker = p.marker if p.marker is not None else ("f" if kind.single else "e")
    sign = "-" if negative else "+" if p.atsign else ""
    padding = p.pad * spaceleft if spaceleft is not None and spaceleft > 0 else ""
    exponent = ("-" if expt < 0 else "+") + "0" * ((p.e or 0) - len(estr)) + estr
    return padding + sign + ("0" if lpoint else "") + ft.text + ("0" if tpoint else "") + marker + exponent


# ---------------------------------------------------------------------------------------------
# Characters and case conversion.

def named_char_text(ch: str) -> str:
    """~:c : a printing character as itself, others by their name."""
    code = ord(ch)
    if code <= 32 or 127 <= code < 160:
        return char_name(ch) or ch
    return ch


def _char_upcase(ch: str) -> str:
    up = ch.upper()
    return up if len(up) == 1 else ch


def _char_downcase(ch: str) -> str:
    down = ch.lower()
    return down if len(down) == 1 else ch


def downcase(text: str) -> str:
    return "".join(_char_downcase(c) for c in text)


def upcase(text: str) -> str:
    return "".join(_char_upcase(c) for c in text)


def capitalize_words(text: str) -> str:
    """~:( : each run of alphanumerics starts upper case and continues lower case."""
    out: list[str] = []
    in_word = False
    for c in text:
        if c.isalnum():
            out.append(_char_downcase(c) if in_word else _char_upcase(c))
            in_word = True
        else:
            out.append(c)
            in_word = False
    return "".join(out)


def capitalize_first(text: str) -> str:
    """~@( : the first alphanumeric upper case, everything else lower case."""
    for i, c in enumerate(text):
        if c.isalnum():
            return text[:i] + _char_upcase(c) + downcase(text[i + 1 :])
    return text


def _case_converter(directive: _Directive) -> Callable[[str], str]:
    if directive.colon:
        return upcase if directive.at else capitalize_words
    return capitalize_first if directive.at else downcase


# ---------------------------------------------------------------------------------------------
# The interpreter.


def _pad_count(text: str, mincol: Real, colinc: int, minpad: int, directive: _Directive) -> int:
    """How many pad characters SBCL's FORMAT-WRITE-FIELD puts beside `text`: minpad, then
    colinc at a time until the field is at least mincol wide."""
    if colinc <= 0:
        raise FormatError(f"format: {directive.label}: colinc is {colinc}, it must be a positive integer")
    if type(mincol) is float and not math.isfinite(mincol):
        raise FormatError(f"format: {directive.label}: mincol is {mincol}, it must be a finite number")
    if mincol < 0:
        raise FormatError(f"format: {directive.label}: mincol is {mincol}, it must be a non-negative integer")
    count = max(minpad, 0)
    chars = len(text) + count
    if chars < mincol:
        count += math.ceil((Fraction(mincol) - chars) / colinc) * colinc
    return count


CallFunction = Callable[[str, Any, bool, bool, list[Any]], str]
# a format control that is a function (CLHS 22.3): called with a stream and the arguments (a
# Lisp list); what it wrote and the arguments it left, or None when CONTROL is no function
CallControl = Callable[[Any, Any], Optional[tuple[str, Any]]]


class _Formatter:
    def __init__(self, control: str, prin1: PrintFunction, princ: PrintFunction, budget: Optional[Budget],
                 call_function: Optional[CallFunction] = None, call_control: Optional[CallControl] = None) -> None:
        self.control = control
        self.call_function = call_function
        self.call_control = call_control
        self.rest: Any = NIL  # the arguments the control string did not consume
        self.blocks = 0  # logical blocks (~<...~:>) being printed
        self.prin1_fn = prin1
        self.princ_fn = princ
        self.out = _Output(budget)
        self.steps = 0
        self.budget = budget

    # -- running --------------------------------------------------------------------------

    def run(self, args: list[Any]) -> str:
        nodes = parse_control(self.control)
        top = _Args(from_iter(args))
        try:
            self.interpret(nodes, top, None)
        except _UpAndOut:
            pass
        self.rest = top.tail
        return self.out.text()

    def interpret(self, nodes: list[_Node], args: _Args, outside: Optional[_Args]) -> None:
        """Run directives. `outside` is the enclosing ~:{'s list of sublists (for ~:^)."""
        if self.budget is not None:
            self.budget.charge(len(nodes))
        for node in nodes:
            if type(node) is str:
                self.out.write(node)
            else:
                assert isinstance(node, _Directive)
                _HANDLERS[node.char](self, node, args, outside)

    def prin1(self, x: Any) -> str:
        try:
            return self.prin1_fn(x)
        except Exception as exc:
            raise _CallbackFailure(exc) from exc

    def princ(self, x: Any) -> str:
        try:
            return self.princ_fn(x)
        except Exception as exc:
            raise _CallbackFailure(exc) from exc

    def write_padded(self, text: str, count: int, padchar: str, pad_left: bool) -> None:
        if not pad_left:
            self.out.write(text)
        self.out.repeat(padchar, count)
        if pad_left:
            self.out.write(text)

    # -- ~a ~s --------------------------------------------------------------------------

    def do_print(self, d: _Directive, args: _Args, outside: Optional[_Args]) -> None:
        print_fn = self.princ if d.char == "A" else self.prin1
        if d.params:
            mincol, colinc, minpad, padchar = _bind_params(d, args, [_Spec(REAL, 0), _Spec(INT, 1), _Spec(INT, 0), _Spec(CHAR, Char(" "))])
            arg = args.pop(d)
            text = "()" if d.colon and arg is NIL else print_fn(arg)
            count = _pad_count(text, mincol, colinc, minpad, d)
            self.write_padded(text, count, padchar.ch, d.at)
        else:
            arg = args.pop(d)
            self.out.write("()" if d.colon and arg is NIL else print_fn(arg))

    # -- ~d ~b ~o ~x ~r -----------------------------------------------------------------

    def do_integer(self, d: _Directive, args: _Args, outside: Optional[_Args]) -> None:
        base = {"D": 10, "B": 2, "O": 8, "X": 16}[d.char]
        if not (d.colon or d.at or d.params):
            self.out.write(self.radix_princ(args.pop(d), base))
            return
        params = _bind_params(d, args, [_Spec(REAL, 0), _Spec(CHAR, Char(" ")), _Spec(CHAR, Char(",")), _Spec(INT, 3)])
        self.print_integer(d, args.pop(d), base, *params)

    def print_integer(self, d: _Directive, number: Any, base: int, mincol: Real, padchar: Char, commachar: Char, interval: int) -> None:
        """SBCL's FORMAT-PRINT-INTEGER: a non-integer is printed with princ, unpadded."""
        if not _is_integer(number):
            self.out.write(self.radix_princ(number, base))
            return
        digits = integer_text(abs(number), base)
        if d.colon:
            if interval <= 0:
                raise FormatError(f"format: {d.label}: the comma interval is {interval}, it must be positive")
            digits = _add_commas(digits, commachar.ch, interval)
        signed = ("-" if number < 0 else "+" if d.at else "") + digits
        self.write_padded(signed, _pad_count(signed, mincol, 1, 0, d), padchar.ch, True)

    def radix_princ(self, x: Any, base: int) -> str:
        if _is_integer(x):
            return integer_text(x, base)
        if base == 10 or type(x) not in (Fraction, Cons, list):
            return self.princ(x)
        try:
            return _RadixPrinter(base, self.princ).text(x)
        except _CallbackFailure:
            raise
        except Exception as exc:  # the printer's own limits (too large, circular)
            raise _CallbackFailure(exc) from exc

    def do_radix(self, d: _Directive, args: _Args, outside: Optional[_Args]) -> None:
        base, mincol, padchar, commachar, interval = _bind_params(
            d, args, [_Spec(INT, None), _Spec(REAL, 0), _Spec(CHAR, Char(" ")), _Spec(CHAR, Char(",")), _Spec(INT, 3)]
        )
        arg = args.pop(d)
        if base is not None:
            if not 2 <= base <= 36:
                raise FormatError(f"format: {d.label}: the radix {base} is not between 2 and 36")
            self.print_integer(d, arg, base, mincol, padchar, commachar, interval)
            return
        if not _is_integer(arg):
            raise FormatError(f"format: {d.label} needs an integer argument, not {_describe(arg)}")
        if d.at:
            self.out.write(roman_numeral(arg, old_style=d.colon))
        else:
            self.out.write(english_ordinal(arg) if d.colon else english_cardinal(arg))

    # -- ~f ~e --------------------------------------------------------------------------

    def float_argument(self, d: _Directive, arg: Any) -> Optional[tuple[float, _FloatKind]]:
        """A float and its kind for ~f/~e, converting rationals to single floats as SBCL does;
        None for a non-number."""
        if type(arg) is float:
            return arg, _DOUBLE
        if _is_integer(arg) or type(arg) is Fraction:
            try:
                return rational_to_single(arg), _SINGLE
            except FormatError:
                raise FormatError(f"format: {d.label}: the argument is too large to convert to a single float") from None
        return None

    def do_fixed(self, d: _Directive, args: _Args, outside: Optional[_Args]) -> None:
        w, digits, k, ovf, pad = _bind_params(d, args, [_Spec(INT), _Spec(INT), _Spec(INT), _Spec(CHAR), _Spec(CHAR, Char(" "))])
        _check_float_params(d, w, digits, k)
        arg = args.pop(d)
        number = self.float_argument(d, arg)
        if number is None:
            self.write_non_number(d, arg, w, pad)
            return
        x, kind = number
        if math.isinf(x) or math.isnan(x):
            self.out.write(self.prin1(x))
            return
        self.out.write(format_fixed_float(x, kind, _FixedParams(w, digits, k, ovf.ch if ovf else None, pad.ch, d.at)))

    def do_exponential(self, d: _Directive, args: _Args, outside: Optional[_Args]) -> None:
        specs = [_Spec(INT), _Spec(INT), _Spec(INT), _Spec(INT, 1), _Spec(CHAR), _Spec(CHAR, Char(" ")), _Spec(CHAR)]
        w, digits, e, k, ovf, pad, mark = _bind_params(d, args, specs)
        _check_float_params(d, w, digits, e, k)
        arg = args.pop(d)
        number = self.float_argument(d, arg)
        if number is None:
            self.write_non_number(d, arg, w, pad)
            return
        x, kind = number
        if math.isinf(x) or math.isnan(x):
            self.out.write(self.prin1(x))
            return
        params = _ExpParams(w, digits, e, k, ovf.ch if ovf else None, pad.ch, mark.ch if mark else None, d.at)
        self.out.write(format_exponential_float(x, kind, params))

    def write_non_number(self, d: _Directive, arg: Any, w: Optional[int], pad: Char) -> None:
        """~f/~e of a non-number: princ, padded on the right to w."""
        text = self.princ(arg)
        if w is None:
            self.out.write(text)
            return
        self.write_padded(text, _pad_count(text, w, 1, 0, d), pad.ch, False)

    # -- ~c ~p --------------------------------------------------------------------------

    def do_char(self, d: _Directive, args: _Args, outside: Optional[_Args]) -> None:
        arg = args.pop(d)
        if type(arg) is not Char:
            raise FormatError(f"format: {d.label} needs a character argument, not {_describe(arg)}")
        if d.colon:
            self.out.write(named_char_text(arg.ch))
        elif d.at:
            self.out.write(self.prin1(arg))
        else:
            self.out.write(arg.ch)

    def do_plural(self, d: _Directive, args: _Args, outside: Optional[_Args]) -> None:
        if d.colon:
            arg = args.previous(d)
        else:
            arg = args.pop(d)
        one = _is_integer(arg) and arg == 1
        if d.at:
            self.out.write("y" if one else "ies")
        elif not one:
            self.out.write("s")

    # -- ~% ~& ~~ -----------------------------------------------------------------------

    def do_repeat(self, d: _Directive, args: _Args, outside: Optional[_Args]) -> None:
        (count,) = _bind_params(d, args, [_Spec(INT, 1)])
        if d.char == "&":
            if count <= 0:
                return
            if not self.out.at_line_start():
                self.out.write("\n")
            count -= 1
        self.out.repeat("~" if d.char == "~" else "\n", count)

    # -- ~* -----------------------------------------------------------------------------

    def do_goto(self, d: _Directive, args: _Args, outside: Optional[_Args]) -> None:
        if d.at:
            (target,) = _bind_params(d, args, [_Spec(INT, 0)])
        elif d.colon:
            (n,) = _bind_params(d, args, [_Spec(INT, 1)])
            target = args.pos - n
        else:
            (n,) = _bind_params(d, args, [_Spec(INT, 1)])
            for _ in range(n):
                args.pop(d)
            return
        args.goto(target, d)

    # -- ~^ -----------------------------------------------------------------------------

    def do_escape(self, d: _Directive, args: _Args, outside: Optional[_Args]) -> None:
        """~^ : leave when no arguments are left; with parameters (numbers or characters),
        when the one is zero, the two are the same, or the three are in order."""
        p1, p2, p3 = _bind_params(d, args, [_Spec(ANY), _Spec(ANY), _Spec(ANY)])
        if p3 is not None:
            if p1 is None or p2 is None:
                raise FormatError(f"format: {d.label}: three parameters need the first two as well")
            leave = _param_order(d, p1, p2) and _param_order(d, p2, p3)
        elif p2 is not None:
            leave = _param_key(p1) == _param_key(p2)
        elif p1 is not None:
            leave = p1 == 0 and type(p1) is int
        elif d.colon:
            leave = outside is None or outside.empty()
        else:
            leave = args.empty()
        if leave:
            raise _UpUpAndOut(args) if d.colon else _UpAndOut()

    # -- ~[ -----------------------------------------------------------------------------

    def do_conditional(self, d: _Directive, args: _Args, outside: Optional[_Args]) -> None:
        if d.at:
            before = args.snapshot()
            if _is_false(args.pop(d)):
                return
            args.restore(before)
            self.interpret(d.clauses[0], args, outside)
            return
        if d.colon:
            chosen = d.clauses[0] if _is_false(args.pop(d)) else d.clauses[1]
            self.interpret(chosen, args, outside)
            return
        (index,) = _bind_params(d, args, [_Spec(INT, _CONSUME)])
        if not _is_integer(index):
            raise FormatError(f"format: {d.label} needs an integer argument, not {_describe(index)}")
        clauses = d.clauses[:-1] if d.has_default else d.clauses
        if 0 <= index < len(clauses):
            self.interpret(clauses[index], args, outside)
        elif d.has_default:
            self.interpret(d.clauses[-1], args, outside)

    # -- ~( -----------------------------------------------------------------------------

    def do_case(self, d: _Directive, args: _Args, outside: Optional[_Args]) -> None:
        mark = self.out.mark()
        try:
            self.interpret(d.body, args, outside)
        finally:
            self.out.transform_from(mark, _case_converter(d))

    # -- ~{ -----------------------------------------------------------------------------

    def do_iterate(self, d: _Directive, args: _Args, outside: Optional[_Args]) -> None:
        (max_count,) = _bind_params(d, args, [_Spec(INT)])
        body = _IterationBody(d, args.pop(d) if not d.body else None)
        if d.at:
            loop_args = args
        else:
            items = args.pop(d)
            if items is not NIL and type(items) is not Cons:
                raise FormatError(f"format: {d.label} needs a list argument, not {_describe(items)}", "TYPE-ERROR", items)
            loop_args = _Args(items)
        try:
            self.iteration_loop(d, body, loop_args, max_count)
        except _UpAndOut:
            if d.colon:
                raise
        except _UpUpAndOut as exc:
            if not d.colon:
                raise
            if d.at:  # as in SBCL, the arguments left are the sublist's
                args.tail = exc.sublist.tail

    def iteration_loop(self, d: _Directive, body: "_IterationBody", loop_args: _Args, max_count: Optional[int]) -> None:
        """SBCL's DO-LOOP: stop when no arguments are left (checked after the first step when
        closed with ~:}), or after max_count steps."""
        seen: set[int] = set()
        while True:
            if not d.close_colon and loop_args.empty():
                return
            if max_count is not None:
                max_count -= 1
                if max_count < 0:
                    return
            elif not d.colon:
                if loop_args.pos in seen:
                    raise FormatError(f"format: {d.label} would loop forever: its body does not use up any arguments")
                seen.add(loop_args.pos)
            self.count_step(d)
            if self.budget is not None:
                self.budget.charge(1)  # each iteration is an element visited, whatever its body costs
            if d.colon:
                sublist = _Args(loop_args.pop(d))
                try:
                    self.run_body(body, sublist, loop_args)
                except _UpAndOut:
                    pass
            else:
                self.run_body(body, loop_args, None)
            if d.close_colon and loop_args.empty():
                return

    def run_body(self, body: "_IterationBody", args: _Args, outside: Optional[_Args]) -> None:
        if body.directive.body:
            self.interpret(body.directive.body, args, outside)
            return
        if type(body.control) is not str and self.call_control is not None:
            try:
                called = self.call_control(body.control, args.tail)
            except Exception as exc:
                raise _CallbackFailure(exc) from exc
            if called is not None:  # a function: it consumes what it does not return
                text, rest = called
                self.out.write(text)
                args.advance_to(rest)
                return
        try:  # a control string argument runs like a nested format call
            self.interpret(body.nodes(), args, outside)
        except _UpAndOut:
            pass
        except FormatError as exc:
            raise FormatError(f"{exc} (in the control string argument of {body.directive.label})", exc.ctype, exc.datum) from None

    def count_step(self, d: _Directive) -> None:
        self.steps += 1
        if self.steps > MAX_ITERATION_STEPS:
            raise FormatError(f"format: {d.label}: more than {MAX_ITERATION_STEPS} iteration steps")


    # -- ~$ ~g --------------------------------------------------------------------------

    def do_dollars(self, d: _Directive, args: _Args, outside: Optional[_Args]) -> None:
        """SBCL's FORMAT-DOLLARS: d digits after the point, at least n before it, padded to w."""
        digits, n, w, pad = _bind_params(d, args, [_Spec(INT, 2), _Spec(INT, 1), _Spec(INT, 0), _Spec(CHAR, Char(" "))])
        _check_float_params(d, digits, n, w)
        arg = args.pop(d)
        number = self.float_argument(d, arg)
        if number is None:
            self.write_non_number(d, arg, w, pad)
            return
        x, kind = number
        if math.isinf(x) or math.isnan(x):
            self.out.write(self.prin1(x))
            return
        sign = "-" if math.copysign(1.0, x) < 0 else "+" if d.at else ""
        text = flonum_to_string(abs(x), kind, None, digits).text
        point = text.index(".")
        if d.colon:
            self.out.write(sign)
        self.out.repeat(pad.ch, w - len(sign) - max(n, point) - 1 - digits)
        if not d.colon:
            self.out.write(sign)
        self.out.repeat("0", n - point)
        self.out.write(text)

    def do_general(self, d: _Directive, args: _Args, outside: Optional[_Args]) -> None:
        """SBCL's FORMAT-GENERAL-AUX: ~f when the exponent fits the digits, else ~e."""
        specs = [_Spec(INT), _Spec(INT), _Spec(INT), _Spec(INT), _Spec(CHAR), _Spec(CHAR, Char(" ")), _Spec(CHAR)]
        w, digits, e, k, ovf, pad, mark = _bind_params(d, args, specs)
        _check_float_params(d, w, digits, e, k)
        arg = args.pop(d)
        number = self.float_argument(d, arg)
        if number is None:
            self.write_non_number(d, arg, w, pad)
            return
        x, kind = number
        if math.isinf(x) or math.isnan(x):
            self.out.write(self.prin1(x))
            return
        _, n = scale_exponent(abs(x), kind)
        if digits is None:
            length = len(flonum_to_string(abs(x), kind).text)
            digits = max(1 if length == 1 else length - 1, min(n, 7))
        ee = e + 2 if e is not None else 4
        dd = digits - n
        if 0 <= dd <= digits:
            text = format_fixed_float(x, kind, _FixedParams(w - ee if w is not None else None, dd, None, ovf.ch if ovf else None, pad.ch, d.at))
            overflowed = ovf is not None and w is not None and text == ovf.ch * (w - ee)
            self.out.write(text)
            self.out.repeat(ovf.ch if overflowed and ovf else " ", ee)
            return
        params = _ExpParams(w, digits, e, k if k is not None else 1, ovf.ch if ovf else None, pad.ch, mark.ch if mark else None, d.at)
        self.out.write(format_exponential_float(x, kind, params))

    # -- ~| ~t --------------------------------------------------------------------------

    def do_page(self, d: _Directive, args: _Args, outside: Optional[_Args]) -> None:
        (count,) = _bind_params(d, args, [_Spec(INT, 1)])
        self.out.repeat("\f", count)

    def do_tab(self, d: _Directive, args: _Args, outside: Optional[_Args]) -> None:
        """SBCL's absolute (~colnum,colinct) and relative (~colrel,colinc@t) tabulation."""
        first, colinc = _bind_params(d, args, [_Spec(INT, 1), _Spec(INT, 1)])
        if d.colon:  # a pretty-printing section tab: nothing to align to here
            return
        current = self.out.column()
        if d.at:
            spaces = first
            if colinc > 0:
                spaces = -((current + first) // -colinc) * colinc - current
        elif current < first:
            spaces = first - current
        else:
            spaces = colinc - (current - first) % colinc if colinc else 0
        self.out.repeat(" ", spaces)

    # -- ~? -----------------------------------------------------------------------------

    def do_indirect(self, d: _Directive, args: _Args, outside: Optional[_Args]) -> None:
        control = args.pop(d)
        if type(control) is not str:
            inner = args if d.at else _Args(args.pop(d))
            try:
                called = None if self.call_control is None else self.call_control(control, inner.tail)
            except Exception as exc:
                raise _CallbackFailure(exc) from exc
            if called is None:
                raise FormatError(f"format: {d.label} needs a control string or function argument, not {_describe(control)}")
            self.out.write(called[0])
            inner.advance_to(called[1])
            return
        nodes = _Parser(control).parse()
        inner = args if d.at else _Args(args.pop(d))
        try:
            self.interpret(nodes, inner, None)
        except _UpAndOut:
            pass

    # -- ~< ~> --------------------------------------------------------------------------

    def segment_text(self, nodes: list[_Node], args: _Args, outside: Optional[_Args]) -> str:
        saved = self.out
        self.out = _Output(self.budget)
        try:
            self.interpret(nodes, args, outside)
            return self.out.text()
        finally:
            self.out = saved

    def do_justify(self, d: _Directive, args: _Args, outside: Optional[_Args]) -> None:
        if d.close_colon:
            self.logical_block(d, args, outside)
            return
        mincol, colinc, minpad, padchar = _bind_params(d, args, [_Spec(INT, 0), _Spec(INT, 1), _Spec(INT, 0), _Spec(CHAR, Char(" "))])
        segments = d.clauses[1:] if d.first_colon else d.clauses
        strings: list[str] = []
        try:
            for segment in segments:
                strings.append(self.segment_text(segment, args, outside))
        except _UpAndOut:
            pass
        self.out.write(justify(strings, d.colon, d.at, mincol, colinc, minpad, padchar.ch, d))

    def logical_block(self, d: _Directive, args: _Args, outside: Optional[_Args]) -> None:
        """~<prefix~;body~;suffix~:>: with no line to break (the margin is unbounded) the
        prefix, the body run over the argument list, and the suffix."""
        clauses = d.clauses
        prefix, suffix = ("(", ")") if d.colon else ("", "")
        if len(clauses) > 1 and not all(type(node) is str for clause in (clauses[0], clauses[-1]) for node in clause):
            raise FormatError(f"format: {d.label}: the prefix and suffix of a logical block must be plain text")
        if len(clauses) == 3:
            prefix, body, suffix = "".join(map(str, clauses[0])), clauses[1], "".join(map(str, clauses[2]))
        elif len(clauses) == 2:
            prefix, body = "".join(map(str, clauses[0])), clauses[1]
        else:
            body = clauses[0]
        if d.at:
            inner = args
        else:
            items = args.pop(d)
            if items is not NIL and type(items) is not Cons:
                self.out.write(self.prin1(items))
                return
            inner = _Args(items)
        self.out.write(prefix)
        self.blocks += 1
        try:
            self.interpret(body, inner, None)
        except _UpAndOut:
            pass
        finally:
            self.blocks -= 1
        self.out.write(suffix)

    # -- ~w ~_ ~i ~/ --------------------------------------------------------------------

    def do_write(self, d: _Directive, args: _Args, outside: Optional[_Args]) -> None:
        self.out.write(self.prin1(args.pop(d)))

    def do_conditional_newline(self, d: _Directive, args: _Args, outside: Optional[_Args]) -> None:
        if d.colon and d.at and self.blocks:  # a mandatory newline, inside a logical block only
            self.out.write("\n")

    def do_indent(self, d: _Directive, args: _Args, outside: Optional[_Args]) -> None:
        _bind_params(d, args, [_Spec(INT, 0)])

    def do_call(self, d: _Directive, args: _Args, outside: Optional[_Args]) -> None:
        params = [p for p in _bind_params(d, args, [_Spec(ANY)] * len(d.params))]
        arg = args.pop(d)
        if self.call_function is None:
            raise FormatError(f"format: {d.label}: ~/name/ is not available here")
        try:
            self.out.write(self.call_function(d.name, arg, d.colon, d.at, params))
        except Exception as exc:
            raise _CallbackFailure(exc) from exc


def justify(strings: list[str], pad_left: bool, pad_right: bool, mincol: int, colinc: int, minpad: int, padchar: str, d: _Directive) -> str:
    """SBCL's FORMAT-JUSTIFICATION: the segments spread over at least mincol columns."""
    if colinc <= 0:
        raise FormatError(f"format: {d.label}: colinc is {colinc}, it must be a positive integer")
    gaps = len(strings) - 1 + (1 if pad_left else 0) + (1 if pad_right else 0)
    chars = gaps * minpad + sum(len(x) for x in strings)
    length = mincol + -((mincol - chars) // colinc) * colinc if chars > mincol else mincol
    padding = length - chars + gaps * minpad
    out: list[str] = []

    def pad() -> None:
        nonlocal padding, gaps
        width = padding if gaps == 0 else padding // gaps
        padding -= width
        gaps -= 1
        out.append(padchar * width)

    if pad_left or (not pad_right and len(strings) <= 1):
        pad()
    for i, text in enumerate(strings):
        if i:
            pad()
        out.append(text)
    if pad_right:
        pad()
    return "".join(out)


class _IterationBody:
    """The body of a ~{: its own directives or, when it has none, a control string taken
    from the arguments and parsed when first run (as SBCL does)."""

    def __init__(self, directive: _Directive, control: Any) -> None:
        self.directive = directive
        self.control = control
        self.parsed: Optional[list[_Node]] = None

    def nodes(self) -> list[_Node]:
        if self.parsed is None:
            if type(self.control) is not str:
                raise FormatError(
                    f"format: {self.directive.label} has an empty body, so its argument must be a control string "
                    f"or a function, not {_describe(self.control)}",
                    "TYPE-ERROR",
                    self.control,
                )
            self.parsed = _Parser(self.control).parse(colon_iteration=self.directive.colon)
        return self.parsed


def _check_float_params(d: _Directive, *values: Optional[int]) -> None:
    for value in values:
        if value is not None and abs(value) > MAX_FLOAT_PARAM:
            raise FormatError(f"format: {d.label}: the parameter {value} is too large")


_Handler = Callable[[_Formatter, _Directive, _Args, Optional[_Args]], None]

_HANDLERS: dict[str, _Handler] = {
    "A": _Formatter.do_print,
    "S": _Formatter.do_print,
    "D": _Formatter.do_integer,
    "B": _Formatter.do_integer,
    "O": _Formatter.do_integer,
    "X": _Formatter.do_integer,
    "R": _Formatter.do_radix,
    "F": _Formatter.do_fixed,
    "E": _Formatter.do_exponential,
    "C": _Formatter.do_char,
    "P": _Formatter.do_plural,
    "%": _Formatter.do_repeat,
    "&": _Formatter.do_repeat,
    "~": _Formatter.do_repeat,
    "*": _Formatter.do_goto,
    "^": _Formatter.do_escape,
    "[": _Formatter.do_conditional,
    "(": _Formatter.do_case,
    "{": _Formatter.do_iterate,
    "$": _Formatter.do_dollars,
    "G": _Formatter.do_general,
    "|": _Formatter.do_page,
    "T": _Formatter.do_tab,
    "?": _Formatter.do_indirect,
    "<": _Formatter.do_justify,
    "W": _Formatter.do_write,
    "_": _Formatter.do_conditional_newline,
    "I": _Formatter.do_indent,
    "/": _Formatter.do_call,
}


def lisp_format(control: str, args: list[Any], prin1: PrintFunction, princ: PrintFunction, budget: Optional[Budget] = None,
                call_function: Optional[CallFunction] = None, call_control: Optional[CallControl] = None) -> str:
    """(format nil control . args). Raises FormatError for a bad control string or arguments
    that do not fit it; exceptions raised by prin1/princ (and by the budget) pass through."""
    return lisp_format_rest(control, args, prin1, princ, budget, call_function, call_control)[0]


def lisp_format_rest(control: str, args: list[Any], prin1: PrintFunction, princ: PrintFunction, budget: Optional[Budget] = None,
                     call_function: Optional[CallFunction] = None, call_control: Optional[CallControl] = None) -> tuple[str, Any]:
    """lisp_format, and the arguments (a Lisp list) the control string did not consume: what
    a function made by `formatter` returns."""
    if type(control) is not str:
        raise FormatError("format: the control string must be a string")
    try:
        formatter = _Formatter(control, prin1, princ, budget, call_function, call_control)
        text = formatter.run(args)
        return text, formatter.rest
    except FormatError:
        raise
    except _CallbackFailure as failure:
        raise failure.original from None
    except (_UpUpAndOut, _UpAndOut):  # pragma: no cover - the parser rules these out
        raise FormatError("format: ~^ used outside any iteration") from None
    except RecursionError:
        raise FormatError("format: the control string or its arguments are nested too deeply") from None
    except (ArithmeticError, ValueError, TypeError, IndexError, KeyError, MemoryError) as exc:
        raise FormatError(f"format: cannot format these arguments with {control!r}: {exc}") from None
