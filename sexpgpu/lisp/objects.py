"""Runtime objects of the evaluator: environments, functions, macros, structures, hash
tables, and the signals used for non-local exits."""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any, Callable, Optional

from .types import NIL, Char, Cons, Symbol

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


class LispArray:
    """An array of rank other than one (vectors are Python lists, strings Python str): its
    dimensions and its elements in row-major order."""

    __slots__ = ("dims", "data")

    def __init__(self, dims: tuple[int, ...], data: list[Any]) -> None:
        self.dims = dims
        self.data = data

    def row_major(self, subscripts: tuple[int, ...]) -> int:
        index = 0
        for d, i in zip(self.dims, subscripts):
            index = index * d + i
        return index


class StructType:
    __slots__ = ("name", "slots", "parent")

    def __init__(self, name: Symbol, slots: list[Symbol], parent: Optional["StructType"]) -> None:
        self.name = name
        self.slots = slots
        self.parent = parent

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


class HashTable:
    """A CL hash table. Keys are mapped to Python keys by the table's test."""

    __slots__ = ("test", "entries")

    def __init__(self, test: str) -> None:
        self.test = test  # "EQ" "EQL" "EQUAL" "EQUALP"
        self.entries: dict[Any, tuple[Any, Any]] = {}

    def key(self, k: Any) -> Any:
        if self.test in ("EQ", "EQL"):
            return eql_key(k)
        if self.test == "EQUAL":
            return equal_key(k, 0)
        return equalp_key(k, 0)


def eql_key(k: Any) -> Any:
    t = type(k)
    if t in (int, float, Fraction):
        return (t, k)
    if t is Char:
        return (Char, k.ch)
    return ("id", id(k))


def equal_key(k: Any, depth: int) -> Any:
    t = type(k)
    if depth > 1000:
        return ("deep",)
    if t is Cons:
        return ("cons", equal_key(k.car, depth + 1), equal_key(k.cdr, depth + 1))
    if t is str:
        return ("str", k)
    return eql_key(k)


def equalp_key(k: Any, depth: int) -> Any:
    t = type(k)
    if depth > 1000:
        return ("deep",)
    if t in (int, float, Fraction):
        return ("num", k)
    if t is Char:
        return ("char", k.ch.lower())
    if t is str:
        return ("seq", tuple(("char", c.lower()) for c in k))
    if t is list:
        return ("seq", tuple(equalp_key(e, depth + 1) for e in k))
    if t is Cons:
        return ("cons", equalp_key(k.car, depth + 1), equalp_key(k.cdr, depth + 1))
    if t is StructInstance:
        return ("struct", id(k.stype), tuple(equalp_key(v, depth + 1) for v in k.values))
    return eql_key(k)


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


def function_name(fn: Any) -> str:
    from .printer import prin1_to_string

    if isinstance(fn, Builtin):
        return fn.name
    name = getattr(fn, "name", None)
    if name is None or name is NIL:
        return "lambda"
    return prin1_to_string(name)
