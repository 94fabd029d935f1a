"""The four equality predicates (CLHS 5.3): eq, eql, equal and equalp. equal and equalp take
a charge function, so comparing circular structure ends at the step budget."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Callable, Optional

from .checks import is_num
from .objects import BitVector, HashTable, LispArray, StructInstance
from .types import Char, Cons


def eq(a: Any, b: Any) -> bool:
    if a is b:
        return True
    ta = type(a)
    if ta is int and type(b) is int:
        return bool(a == b)
    if ta is Char and type(b) is Char:
        return a.ch == b.ch
    return False


def eql(a: Any, b: Any) -> bool:
    if a is b:
        return True
    ta = type(a)
    if ta is not type(b):
        return False
    if ta in (int, float, Fraction):
        return bool(a == b) and (ta is not float or math.copysign(1, a) == math.copysign(1, b))
    if ta is Char:
        return a.ch == b.ch
    return False


def equal(a: Any, b: Any, charge: Optional[Callable[[int], None]] = None) -> bool:
    """equal: conses by structure, strings by contents, else eql. CHARGE, when given, is
    charged a step per cons compared (so a circular list stops at the budget)."""
    pending = [(a, b)]
    n = 0
    while pending:
        a, b = pending.pop()
        while a is not b:
            ta = type(a)
            if ta is Cons and type(b) is Cons:
                pending.append((a.car, b.car))
                a, b = a.cdr, b.cdr
                n += 1
                if charge is not None and n >= 4096:
                    charge(n)
                    n = 0
                continue
            if ta is str and type(b) is str:
                if a != b:
                    return False
                break
            if ta is BitVector and type(b) is BitVector:  # equal looks into bit vectors, as into strings
                if a != b:
                    return False
                break
            if not eql(a, b):
                return False
            break
    if charge is not None and n:
        charge(n)
    return True


def equalp(a: Any, b: Any, charge: Optional[Callable[[int], None]] = None) -> bool:
    """equalp: numbers by =, characters and strings ignoring case, conses, arrays,
    structures and hash tables element by element."""
    pending = [(a, b)]
    n = 0
    while pending:
        a, b = pending.pop()
        n += 1
        if charge is not None and n >= 4096:
            charge(n)
            n = 0
        if a is b:
            continue
        ta, tb = type(a), type(b)
        if is_num(a) and is_num(b):
            if a != b:
                return False
        elif ta is Char and tb is Char:
            if a.ch.lower() != b.ch.lower():
                return False
        elif ta is str and tb is str:
            if a.lower() != b.lower():
                return False
        elif ta is Cons and tb is Cons:
            pending.append((a.cdr, b.cdr))
            pending.append((a.car, b.car))
        elif ta in (str, list, BitVector) and tb in (str, list, BitVector):
            if len(a) != len(b):
                return False
            pending.extend(zip(_elements(a), _elements(b)))
        elif ta is LispArray and tb is LispArray:
            if a.dims != b.dims:
                return False
            pending.extend(zip(a.data, b.data))
        elif ta is StructInstance and tb is StructInstance:
            if a.stype is not b.stype:
                return False
            pending.extend(zip(a.values, b.values))
        elif ta is HashTable and tb is HashTable:
            if a.test != b.test or len(a.entries) != len(b.entries):
                return False
            for k, v in a.entries.items():
                other = b.entries.get(k)
                if other is None:
                    return False
                pending.append((v[1], other[1]))
        elif not eql(a, b):
            return False
    if charge is not None and n:
        charge(n)
    return True


def _elements(x: Any) -> list[Any]:
    return [Char(c) for c in x] if type(x) is str else x
