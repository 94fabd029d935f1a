"""The static side of the analyzing evaluator: what a form's lexical environment holds while
the form is analyzed, and the lambda lists made ready to bind.

A Scope is one lexical contour. A runtime scope corresponds to one runtime Frame (a dict); an
extension scope (runtime=False) only adds names, held in the frame of the nearest runtime scope
above it, or nothing at run time (macros, symbol macros, special declarations). Looking a name
up gives its entry and the number of runtime frames to climb from the place of the reference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from .objects import Frame, Macro
from .types import Cons, Loc, Symbol

Node = Callable[[Frame], Any]


class Lexical:
    """A variable bound in a frame under its symbol."""

    __slots__ = ()


LEXICAL = Lexical()


class Special:
    """A variable declared special here: references mean its global (dynamic) value."""

    __slots__ = ()


SPECIAL = Special()


class SymbolMacroEntry:
    __slots__ = ("expansion",)

    def __init__(self, expansion: Any) -> None:
        self.expansion = expansion


VarEntry = Union[Lexical, Special, SymbolMacroEntry, Any]  # Any: codegen's LocalParam


class LocalFunction:
    """A function bound by flet or labels; the entry itself is its key in the frame."""

    __slots__ = ("name",)

    def __init__(self, name: Any) -> None:
        self.name = name


FunEntry = Union[LocalFunction, Macro]


class BlockInfo:
    """A block. Only a block that some return-from names keeps an exit token, in its home
    frame under this object while it is active."""

    __slots__ = ("name", "used")

    def __init__(self, name: Symbol) -> None:
        self.name = name
        self.used = False


class TagbodyInfo:
    """A tagbody. A go that is not one of its own statements leaves by an exception carrying
    the activation's token, kept in its home frame under this object."""

    __slots__ = ("nested",)

    def __init__(self) -> None:
        self.nested = False


class Scope:
    __slots__ = ("parent", "runtime", "vars", "funs", "blocks", "tags")

    def __init__(
        self,
        parent: Optional["Scope"],
        runtime: bool = False,
        vars: Optional[dict[Symbol, VarEntry]] = None,
        funs: Optional[dict[Any, FunEntry]] = None,
        blocks: Optional[dict[Symbol, BlockInfo]] = None,
        tags: Optional[dict[Any, tuple[TagbodyInfo, int]]] = None,
    ) -> None:
        self.parent = parent
        self.runtime = runtime
        self.vars = vars
        self.funs = funs
        self.blocks = blocks
        self.tags = tags

    def find_var(self, sym: Symbol) -> tuple[Optional[VarEntry], int]:
        depth = 0
        s: Optional[Scope] = self
        while s is not None:
            if s.vars is not None and sym in s.vars:
                return s.vars[sym], depth
            if s.runtime:
                depth += 1
            s = s.parent
        return None, 0

    def find_fun(self, name: Any) -> tuple[Optional[FunEntry], int]:
        depth = 0
        s: Optional[Scope] = self
        while s is not None:
            if s.funs is not None and name in s.funs:
                return s.funs[name], depth
            if s.runtime:
                depth += 1
            s = s.parent
        return None, 0

    def find_block(self, name: Symbol) -> tuple[Optional[BlockInfo], int]:
        depth = 0
        s: Optional[Scope] = self
        while s is not None:
            if s.blocks is not None and name in s.blocks:
                return s.blocks[name], depth
            if s.runtime:
                depth += 1
            s = s.parent
        return None, 0

    def find_tag(self, label: Any) -> tuple[Optional[tuple[TagbodyInfo, int]], int]:
        depth = 0
        s: Optional[Scope] = self
        while s is not None:
            if s.tags is not None and label in s.tags:
                return s.tags[label], depth
            if s.runtime:
                depth += 1
            s = s.parent
        return None, 0

    def names(self) -> set[str]:
        """The variable names visible here (for "did you mean" hints)."""
        out: set[str] = set()
        s: Optional[Scope] = self
        while s is not None:
            if s.vars:
                out.update(k.name for k in s.vars if isinstance(k, Symbol))
            s = s.parent
        return out

    def macros_only(self) -> "Scope":
        """This scope for a macrolet expander: only the local macros and symbol macros, over
        a fresh null environment (an expander runs at analysis time, with no frames)."""
        chain: list[Scope] = []
        s: Optional[Scope] = self
        while s is not None:
            funs: dict[Any, FunEntry] = {k: v for k, v in (s.funs or {}).items() if isinstance(v, Macro)}
            vars_: dict[Symbol, VarEntry] = {k: v for k, v in (s.vars or {}).items() if isinstance(v, SymbolMacroEntry)}
            if funs or vars_:
                chain.append(Scope(None, funs=funs or None, vars=vars_ or None))
            s = s.parent
        result = Scope(None, runtime=True)
        for frame in reversed(chain):
            frame.parent = result
            result = frame
        return result


def frame_at(frame: Frame, depth: int) -> Frame:
    from .objects import PARENT

    for _ in range(depth):
        frame = frame[PARENT]
    return frame


# -- lambda lists made ready to bind ------------------------------------------------------------

Pattern = Union[Symbol, "BindPlan"]


@dataclass
class ParamPlan:
    pattern: Pattern
    default: Optional[Node]
    supplied: Optional[Symbol]
    keyword: Optional[Symbol] = None


@dataclass
class BindPlan:
    """A parsed lambda list with its default forms analyzed. SPECIALS are the variables it
    binds dynamically (declared special, or globally special when it was analyzed)."""

    required: list[Pattern] = field(default_factory=list)
    optional: list[ParamPlan] = field(default_factory=list)
    rest: Optional[Pattern] = None
    has_key: bool = False
    keys: list[ParamPlan] = field(default_factory=list)
    allow_other_keys: bool = False
    aux: list[tuple[Symbol, Node]] = field(default_factory=list)
    whole: Optional[Pattern] = None
    environment: Optional[Symbol] = None
    specials: frozenset[Symbol] = frozenset()

    @property
    def max_args(self) -> Optional[int]:
        if self.rest is not None or self.has_key:
            return None
        return len(self.required) + len(self.optional)


SYSTEM_FILES = {"<prelude>"}
LIBRARY_FILES = ("<prelude>", "sexpgpu/lib/")  # where a diagnostic also names the user's call


def user_loc(loc: Optional[Loc]) -> Optional[Loc]:
    """A position errors may point at: never one inside the prelude."""
    return None if loc is None or loc.file in SYSTEM_FILES else loc


class LocalParam:
    """A parameter of a lambda whose generated body keeps it in a Python variable. The
    analyzer never reads one: it marks it captured, and the body is generated again with
    its parameters in a frame."""

    __slots__ = ("name", "python", "captured")

    def __init__(self, name: Symbol, python: str) -> None:
        self.name = name
        self.python = python
        self.captured = False


_NO_SYMBOLS: frozenset[Symbol] = frozenset()


def split_declarations(body: Any) -> tuple[list[Any], Any]:
    """The leading (declare ...) forms of a body, and the rest."""
    decls: list[Any] = []
    while type(body) is Cons and type(body.car) is Cons and type(body.car.car) is Symbol and body.car.car.name == "DECLARE":
        decls.append(body.car)
        body = body.cdr
    return decls, body


def declared_specials(decls: list[Any]) -> frozenset[Symbol]:
    if not decls:
        return _NO_SYMBOLS
    out: set[Symbol] = set()
    for decl in decls:
        for spec in _items(decl.cdr):
            if type(spec) is Cons and type(spec.car) is Symbol and spec.car.name == "SPECIAL":
                out.update(s for s in _items(spec.cdr) if type(s) is Symbol)
    return frozenset(out)


def _items(x: Any) -> Any:
    while type(x) is Cons:
        yield x.car
        x = x.cdr
