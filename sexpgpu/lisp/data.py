"""Lisp values as plain data: the one converter from Lisp to JSON-shaped Python values, for
what leaves the Lisp (knob values, source and prepare options, defrun :meta) and for the
literals the pre-read of defvariant/defsweep takes from source text."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from .objects import BitVector
from .printer import prin1_to_string
from .types import NIL, T, Cons, Symbol


def as_data(x: Any, *, form: bool = False) -> Any:
    """X as plain data: nil is None, t True, a keyword ":name", another symbol "name", a
    ratio a float, a list or vector a list, a list shaped (:key value ...) a dict, and any
    other object its printed text.

    FORM reads X as a form of source text that was read but not evaluated (the pre-read):
    'x stands for x, a list stays a list even when it looks like a plist (a sweep axis such
    as (:adam :sgd) is a list of choices), and other atoms stay Lisp objects, since these
    values go back into the Lisp as knob values."""
    if x is NIL:
        return None
    if x is T:
        return True
    t = type(x)
    if t is Symbol:
        return ":" + x.name.lower() if x.is_keyword else x.name.lower()
    if t is Cons:
        return _list_data(x, form)
    if t is list or t is BitVector:
        return [as_data(i, form=form) for i in x]
    if t is Fraction:
        return float(x)
    if form or t in (int, float, str, bool):
        return x
    return prin1_to_string(x)


def _list_data(x: Cons, form: bool) -> Any:
    if form:
        if type(x.car) is Symbol and x.car.name == "QUOTE" and type(x.cdr) is Cons:
            return as_data(x.cdr.car, form=True)
        return [as_data(i, form=True) for i in x]
    items = list(x)
    if items and len(items) % 2 == 0 and all(type(k) is Symbol and k.is_keyword for k in items[::2]):
        return {k.name.lower(): as_data(v) for k, v in zip(items[::2], items[1::2])}
    return [as_data(i) for i in items]
