"""Argument checks and the list walks every builtin shares: what a wrong argument is called
(describe, short), the type-error naming it, need_* for each kind, &key parsing, and the
walks of a list that notice a circular one. A leaf: it imports only the objects, the printer
and the conditions, and nothing below the builtins reaches up past it."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from .conditions import Condition, LispError, lisp_error
from .objects import BitVector, Builtin, Closure, HashTable, StructInstance
from .printer import Printer, PrintTooLarge, prin1_to_string
from .types import NIL, T, Char, Cons, Symbol


def describe(x: Any) -> str:
    t = type(x)
    if t is int:
        return "an integer"
    if t is float:
        return "a float"
    if t is Fraction:
        return "a ratio"
    if t is str:
        return "a string"
    if t is Char:
        return "a character"
    if t is Cons:
        return "a cons"
    if x is NIL:
        return "nil"
    if t is Symbol:
        return "a symbol"
    if t is list:
        return "a vector"
    if t is BitVector:
        return "a bit vector"
    if t in (Closure, Builtin):
        return "a function"
    if t is HashTable:
        return "a hash table"
    if t is StructInstance:
        return f"a {x.stype.name.name.lower()}"
    if t is Condition:
        return "a condition"
    return "a " + t.__name__.lower()


def short(x: Any) -> str:
    if type(x) is int and x.bit_length() > 3000:  # not worth converting only to cut it short
        return f"an integer of about {int(x.bit_length() * 0.30103) + 1} digits"
    try:
        text = prin1_to_string(x, _print_fallback)
    except PrintTooLarge:
        text = "#<too large to print>"
    return text if len(text) <= 60 else text[:57] + "..."


def _print_fallback(x: Any, printer: Printer) -> str:
    return f"#<{describe(x)[2:] if describe(x).startswith('a ') else describe(x)}>"


def type_error(fn: str, pos: int, expected: str, value: Any) -> LispError:
    return lisp_error("E103", f"`{fn}`: argument {pos} must be {expected}, got {short(value)} ({describe(value)})", "TYPE-ERROR", value)


def is_num(x: Any) -> bool:
    t = type(x)
    return t is int or t is float or t is Fraction


def is_real_rational(x: Any) -> bool:
    t = type(x)
    return t is int or t is Fraction


def need_number(fn: str, pos: int, x: Any) -> Any:
    if not is_num(x):
        raise type_error(fn, pos, "a number", x)
    return x


def need_integer(fn: str, pos: int, x: Any) -> int:
    if type(x) is not int:
        raise type_error(fn, pos, "an integer", x)
    return x


def need_index(fn: str, pos: int, x: Any) -> int:
    if type(x) is not int or x < 0:
        raise type_error(fn, pos, "a non-negative integer", x)
    return x


def need_list(fn: str, pos: int, x: Any) -> Any:
    if x is not NIL and type(x) is not Cons:
        raise type_error(fn, pos, "a list", x)
    return x


def need_string(fn: str, pos: int, x: Any) -> str:
    if type(x) is not str:
        raise type_error(fn, pos, "a string", x)
    return x


def need_symbol(fn: str, pos: int, x: Any) -> Symbol:
    if type(x) is not Symbol:
        raise type_error(fn, pos, "a symbol", x)
    return x


def need_char(fn: str, pos: int, x: Any) -> Char:
    if type(x) is not Char:
        raise type_error(fn, pos, "a character", x)
    return x


def bits_of(fn: str, items: list[Any]) -> BitVector:
    """ITEMS as a bit vector: a type-error names FN when one of them is not 0 or 1."""
    for x in items:
        if not (type(x) is int and (x == 0 or x == 1)):
            raise lisp_error("E103", f"`{fn or 'a bit vector'}`: a bit vector holds only 0 and 1, not {short(x)}", "TYPE-ERROR", x)
    return BitVector(items)


def need_sequence(fn: str, pos: int, x: Any) -> Any:
    if not (x is NIL or type(x) in (Cons, str, list, BitVector)):
        raise type_error(fn, pos, "a sequence (list, vector or string)", x)
    return x


def norm(x: Any) -> Any:
    if type(x) is Fraction and x.denominator == 1:
        return x.numerator
    return x


def lbool(b: bool) -> Any:
    return T if b else NIL


class _Circular:
    def __repr__(self) -> str:
        return "CIRCULAR"


CIRCULAR: Any = _Circular()
"""What ends a list whose conses come round again (list_cells, list_cars)."""


def list_cells(x: Any) -> tuple[list[Cons], Any]:
    """The conses of X in order, and what ends them: nil for a proper list, the atom of a
    dotted one, CIRCULAR for a circular one. Brent's cycle test (a mark moved to the walk's
    head at each power of two, the head compared with it) stops the walk within a few times
    the number of distinct conses, so a circular list costs what its conses are, not
    memory until the host runs out."""
    out: list[Cons] = []
    cell = x
    mark: Any = None
    n, power = 0, 1
    while type(cell) is Cons:
        out.append(cell)
        cell = cell.cdr
        if cell is mark:
            return out, CIRCULAR
        n += 1
        if n == power:
            mark, power = cell, power << 1
    return out, cell


def list_cars(x: Any) -> tuple[list[Any], Any]:
    """The elements of X, and what ends it, as list_cells walks it."""
    out: list[Any] = []
    cell = x
    mark: Any = None
    n, power = 0, 1
    while type(cell) is Cons:
        out.append(cell.car)
        cell = cell.cdr
        if cell is mark:
            return out, CIRCULAR
        n += 1
        if n == power:
            mark, power = cell, power << 1
    return out, cell


def circular_error(fn: str, pos: int) -> LispError:
    return lisp_error("E103", f"`{fn}`: argument {pos} must be a proper list, got a circular list", "TYPE-ERROR")


def list_items(fn: str, pos: int, x: Any) -> list[Any]:
    """The elements of a proper list, with a type error naming the argument (a circular
    list included: no step budget is at hand here)."""
    items, end = list_cars(x)
    if end is CIRCULAR:
        raise circular_error(fn, pos)
    if end is not NIL:
        raise type_error(fn, pos, "a proper list", x)
    return items


def seq_items(fn: str, pos: int, x: Any) -> list[Any]:
    t = type(x)
    if t is str:
        return [Char(c) for c in x]
    if t is list or t is BitVector:
        return list(x)
    if x is NIL or t is Cons:
        return list_items(fn, pos, x)
    raise type_error(fn, pos, "a sequence (list, vector or string)", x)


def from_items(items: list[Any], like: Any) -> Any:
    """A sequence of the same kind as LIKE holding ITEMS."""
    t = type(like)
    if t is str:
        return "".join(c.ch if type(c) is Char else str(c) for c in items)
    if t is list:
        return items
    if t is BitVector:
        return bits_of("", items)
    result: Any = NIL
    for item in reversed(items):
        result = Cons(item, result)
    return result


def to_lisp_list(items: Any) -> Any:
    result: Any = NIL
    for item in reversed(list(items)):
        result = Cons(item, result)
    return result


def parse_keys(fn: str, args: tuple[Any, ...], allowed: set[str], first_pos: int) -> dict[str, Any]:
    """&key arguments of a builtin (CLHS 3.4.1.4): a dict from keyword name (upper case) to
    value. An odd number of arguments, a key that is not a symbol, or an unknown key is a
    program-error, unless the first :allow-other-keys argument is true; the first occurrence
    of a key counts."""
    if len(args) % 2:
        raise lisp_error("E102", f"`{fn}`: odd number of keyword arguments", "PROGRAM-ERROR")
    out: dict[str, Any] = {}
    allow_other: Any = None
    unknown: Any = None
    for i in range(0, len(args), 2):
        k = args[i]
        if type(k) is not Symbol:
            raise lisp_error("E102", f"`{fn}`: argument {first_pos + i} must be a keyword, got {short(k)} ({describe(k)})", "PROGRAM-ERROR")
        name = k.name if k.package == "KEYWORD" else None
        if name == "ALLOW-OTHER-KEYS":
            if allow_other is None:
                allow_other = args[i + 1]
            continue
        if name is None or name not in allowed:
            if unknown is None:
                unknown = k
            continue
        out.setdefault(name, args[i + 1])
    if unknown is not None and (allow_other is None or allow_other is NIL):
        expected = " ".join(":" + a.lower() for a in sorted(allowed))
        raise lisp_error("E102", f"`{fn}`: unknown keyword argument {prin1_to_string(unknown)}; expected one of: {expected}", "PROGRAM-ERROR")
    return out
