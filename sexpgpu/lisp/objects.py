"""Runtime objects of the evaluator: environments, functions, macros, structures, hash
tables, and the signals used for non-local exits."""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Callable, Optional

from .lambda_list import LambdaList
from .types import NIL, Char, Cons, Symbol


class Env:
    """One lexical frame. `funs` exists only on frames made by flet/labels/macrolet;
    `fenv` points at the nearest such frame so function lookup skips variable frames."""

    __slots__ = ("vars", "funs", "parent", "fenv")

    def __init__(self, parent: Optional["Env"] = None, vars: Optional[dict[Any, Any]] = None, funs: Optional[dict[Symbol, Any]] = None) -> None:
        self.vars: dict[Any, Any] = vars if vars is not None else {}
        self.funs = funs
        self.parent = parent
        self.fenv: Optional[Env] = self if funs is not None else (parent.fenv if parent is not None else None)


class SymbolMacro:
    __slots__ = ("expansion",)

    def __init__(self, expansion: Any) -> None:
        self.expansion = expansion


class Closure:
    """A function made by lambda, defun, flet or labels."""

    __slots__ = ("name", "params", "body", "env", "simple")

    def __init__(self, name: Any, params: LambdaList, body: Any, env: Optional[Env]) -> None:
        self.name = name
        self.params = params
        self.body = body
        self.env = env
        # only required parameters: bound with one dict, the common fast path
        self.simple = not (params.optional or params.rest or params.has_key or params.aux)


class Builtin:
    """A function written in Python. `fn` checks its own argument types."""

    __slots__ = ("name", "fn", "min_args", "max_args")

    def __init__(self, name: str, fn: Callable[..., Any], min_args: int, max_args: Optional[int]) -> None:
        self.name = name
        self.fn = fn
        self.min_args = min_args
        self.max_args = max_args


class Macro:
    __slots__ = ("name", "params", "body", "env")

    def __init__(self, name: Any, params: LambdaList, body: Any, env: Optional[Env]) -> None:
        self.name = name
        self.params = params
        self.body = body
        self.env = env


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
