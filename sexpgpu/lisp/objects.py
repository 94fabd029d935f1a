"""Runtime objects of the evaluator: environments, functions, macros, structures, hash
tables, and the signals used for non-local exits."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Callable, Optional

from .types import Char, Cons, Symbol

if TYPE_CHECKING:
    from .analyze import LambdaNode


Frame = dict[Any, Any]
"""A runtime lexical frame: the variables, local functions and exit tokens of one binding
form's activation, keyed by symbol or by the analyzer's own key objects; PARENT holds the
enclosing frame."""


class _ParentKey:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<parent>"


PARENT = _ParentKey()


def root_frame() -> Frame:
    """The frame of the null lexical environment (a top-level form, eval)."""
    return {PARENT: None}


class Closure:
    """A function made by lambda, defun, flet or labels: an analyzed lambda and the frame it
    closes over."""

    __slots__ = ("name", "lam", "env")

    def __init__(self, name: Any, lam: "LambdaNode", env: Optional[Frame]) -> None:
        self.name = name
        self.lam = lam
        self.env = env


class Undefined:
    """What a call finds under a name that has no function: the undefined-function error is
    signalled when it is called, once the arguments are evaluated (as SBCL does)."""

    __slots__ = ("name",)

    def __init__(self, name: Symbol) -> None:
        self.name = name


class Builtin:
    """A function written in Python. `fn` checks its own argument types. `accepts[n]` says
    whether n arguments are allowed, for n below ACCEPTS_KNOWN (the call nodes' fast test)."""

    __slots__ = ("name", "fn", "min_args", "max_args", "accepts")

    def __init__(self, name: str, fn: Callable[..., Any], min_args: int, max_args: Optional[int]) -> None:
        self.name = name
        self.fn = fn
        self.min_args = min_args
        self.max_args = max_args
        self.accepts = tuple(min_args <= n and (max_args is None or n <= max_args) for n in range(ACCEPTS_KNOWN))


ACCEPTS_KNOWN = 8


class Macro:
    """A macro: its expander is an analyzed lambda over a macro lambda list, called with the
    whole form."""

    __slots__ = ("name", "lam", "env")

    def __init__(self, name: Any, lam: "LambdaNode", env: Optional[Frame]) -> None:
        self.name = name
        self.lam = lam
        self.env = env


class LexicalEnvironment:
    """What a macro's &environment parameter holds: the static scope of the macro call, so
    that macroexpand and setf can see local macros and symbol macros."""

    __slots__ = ("scope",)

    def __init__(self, scope: Any) -> None:
        self.scope = scope

    def lisp_print(self) -> str:
        return "#<environment>"


class RandomState:
    """A random state: a seeded generator, so that a file checks the same way every time."""

    __slots__ = ("rng", "seed")

    def __init__(self, seed: int, state: Optional[object] = None) -> None:
        import random

        self.seed = seed
        self.rng = random.Random(seed)
        if state is not None:
            self.rng.setstate(state)  # type: ignore[arg-type]

    def copy(self) -> "RandomState":
        return RandomState(self.seed, self.rng.getstate())

    def lisp_print(self) -> str:
        return "#<random-state>"


class BitVector(list):  # type: ignore[type-arg]
    """A bit vector (`#*0101`, `(make-array n :element-type 'bit)`): a vector whose elements
    are the integers 0 and 1. A list, so that every sequence function reads it as a vector;
    the functions that build or store into one keep it a bit vector."""

    __slots__ = ()


def all_bits(items: Any) -> bool:
    return all(type(b) is int and (b == 0 or b == 1) for b in items)


class VectorHeader:
    """What a vector made with :fill-pointer or :adjustable has beyond its elements (CLHS
    15.1.2): the vector (a list) holds the active elements, BEYOND the ones past the fill
    pointer, so its dimension is their sum. Kept by the interpreter, keyed by the vector's id
    (the header holds the vector, so the id stays its own)."""

    __slots__ = ("vector", "beyond", "fill_pointer", "adjustable")

    def __init__(self, vector: list[Any], beyond: list[Any], fill_pointer: bool, adjustable: bool) -> None:
        self.vector = vector
        self.beyond = beyond
        self.fill_pointer = fill_pointer
        self.adjustable = adjustable


class LispArray:
    """An array of rank other than one (vectors are Python lists, strings Python str): its
    dimensions and its elements in row-major order. BITS: a bit array (element type bit),
    whose elements are 0 and 1."""

    __slots__ = ("dims", "data", "bits")

    def __init__(self, dims: tuple[int, ...], data: list[Any], bits: bool = False) -> None:
        self.dims = dims
        self.data = data
        self.bits = bits

    def row_major(self, subscripts: tuple[int, ...]) -> int:
        index = 0
        for d, i in zip(self.dims, subscripts):
            index = index * d + i
        return index


class StructType:
    """A defstruct type. PRINTER is its :print-function or :print-object function (and
    whether it is the latter), inherited by the types that include it."""

    __slots__ = ("name", "slots", "parent", "printer")

    def __init__(self, name: Symbol, slots: list[Symbol], parent: Optional["StructType"]) -> None:
        self.name = name
        self.slots = slots
        self.parent = parent
        self.printer: Optional[tuple[Any, bool]] = parent.printer if parent is not None else None

    def isa(self, other: "StructType") -> bool:
        t: Optional[StructType] = self
        while t is not None:
            if t is other:
                return True
            t = t.parent
        return False


class StructInstance:
    __slots__ = ("stype", "values")

    def __init__(self, stype: StructType, values: list[Any]) -> None:
        self.stype = stype
        self.values = values


class OutputStream:
    """A character output stream: a string output stream collects its text (PARTS); the
    standard streams pass theirs to SINK (the interpreter's output)."""

    __slots__ = ("parts", "sink", "fresh")

    def __init__(self, sink: Optional[Callable[[str], Any]] = None) -> None:
        self.parts: list[str] = []
        self.sink = sink
        self.fresh = True  # at the start of a line (fresh-line)

    def write(self, text: str) -> None:
        if text:
            (self.sink or self.parts.append)(text)
            self.fresh = text.endswith("\n")

    def take(self) -> str:
        text = "".join(self.parts)
        self.parts.clear()
        return text

    def lisp_print(self) -> str:
        return "#<string-output-stream>" if self.sink is None else "#<standard-output-stream>"


class InputStream:
    """A string input stream: TEXT read from POS up to END."""

    __slots__ = ("text", "pos", "end")

    def __init__(self, text: str, pos: int, end: int) -> None:
        self.text = text
        self.pos = pos
        self.end = end

    def lisp_print(self) -> str:
        return "#<string-input-stream>"


class HandlerCluster:
    """The handlers one handler-bind establishes: (type specifier, function) pairs."""

    __slots__ = ("bindings",)

    def __init__(self, bindings: list[tuple[Any, Any]]) -> None:
        self.bindings = bindings


class ConditionType:
    """A type made by define-condition. LINEAGE is its name and every supertype's; SLOTS are
    (slot name, initargs, initform thunk or None); REPORT a string, a function or None."""

    __slots__ = ("name", "lineage", "slots", "report")

    def __init__(self, name: str, lineage: tuple[str, ...], slots: list[tuple[str, list[Any], Any]], report: Any) -> None:
        self.name = name
        self.lineage = lineage
        self.slots = slots
        self.report = report


Same = Callable[[Any, Any, Optional[Callable[[int], None]]], bool]


class HashTable:
    """A CL hash table. Keys are mapped to Python keys by the table's test; SAME is the test
    itself for structured keys (equal or equalp, from equality.py), CHARGE pays for it."""

    __slots__ = ("test", "entries", "charge", "same")

    def __init__(self, test: str, charge: Optional[Callable[[int], None]] = None, same: Optional[Same] = None) -> None:
        self.test = test  # "EQ" "EQL" "EQUAL" "EQUALP"
        self.entries: dict[Any, tuple[Any, Any]] = {}
        self.charge = charge
        self.same = same

    def key(self, k: Any) -> Any:
        if self.test in ("EQ", "EQL"):
            return eql_key(k)
        t = type(k)
        # equal compares bit vectors by their elements (CLHS 5.3), as it does strings
        if t is Cons or t is str or t is BitVector or (self.test == "EQUALP" and t in (list, Char, StructInstance, LispArray, HashTable, int, float, Fraction)):
            if self.same is None:
                raise ValueError(f"an {self.test.lower()} hash table made without its test")
            return StructuredKey(k, self.test == "EQUALP", self.same, self.charge)
        return eql_key(k)


def eql_key(k: Any) -> Any:
    t = type(k)
    if t is float:
        return (float, math.copysign(1.0, k), k)  # 0.0 and -0.0 are not eql
    if t is int or t is Fraction:
        return (t, k)
    if t is Char:
        return (Char, k.ch)
    return ("id", id(k))


class StructuredKey:
    """A key of an equal or equalp table: hashed from a bounded part of the object, compared
    in full (equal or equalp)."""

    __slots__ = ("obj", "same", "charge", "hash")

    def __init__(self, obj: Any, loose: bool, same: Same, charge: Optional[Callable[[int], None]]) -> None:
        self.obj = obj
        self.same = same
        self.charge = charge
        self.hash = _bounded_hash(obj, loose, [64])

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        if type(other) is not StructuredKey:
            return False
        return self.same(self.obj, other.obj, self.charge)


def _bounded_hash(x: Any, loose: bool, budget: list[int]) -> int:
    """A hash that agrees with equal (equalp when LOOSE), looking at no more than the
    budget's number of parts."""
    budget[0] -= 1
    if budget[0] < 0:
        return 0
    t = type(x)
    if t is Cons:
        return hash(("cons", _bounded_hash(x.car, loose, budget), _bounded_hash(x.cdr, loose, budget)))
    if t is str:
        return hash(("str", x.lower() if loose else x))
    if t is BitVector and not loose:
        return hash(("bits", len(x), *x[:64]))
    if loose:
        if t in (int, float, Fraction):
            return hash(x)
        if t is Char:
            return hash(("char", x.ch.lower()))
        if t is list or t is BitVector:
            return hash(("vec", len(x), *(_bounded_hash(e, loose, budget) for e in x[:8])))
        if t is StructInstance:
            return hash(("struct", id(x.stype)))
        if t is LispArray:
            return hash(("array", x.dims))
        if t is HashTable:
            return hash(("table", len(x.entries)))
    return hash(eql_key(x))


class ReturnFromSignal(Exception):
    __slots__ = ("token", "value")

    def __init__(self, token: object, value: Any) -> None:
        self.token = token
        self.value = value


class GoSignal(Exception):
    __slots__ = ("token", "index")

    def __init__(self, token: object, index: int) -> None:
        self.token = token
        self.index = index


class ThrowSignal(Exception):
    __slots__ = ("tag", "value")

    def __init__(self, tag: Any, value: Any) -> None:
        self.tag = tag
        self.value = value
