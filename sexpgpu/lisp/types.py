"""Lisp data: symbols, conses, characters, source locations and conditions.

Numbers are Python ints (arbitrary size), fractions.Fraction (ratios) and floats (doubles).
Strings are Python str (immutable, see "It is Common Lisp"), vectors are Python lists,
`nil` is the symbol NIL, which is also the empty list.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Iterator, Optional

from .hints import did_you_mean


@dataclass(frozen=True, slots=True)
class Loc:
    """A position in a source file: 1-based line and column."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


class Symbol:
    """A symbol. `name` is the CL symbol-name (upper case for symbols read unescaped).

    `package` is "KEYWORD" for keywords, a module prefix string for qualified symbols that
    the evaluator resolves, None for uninterned symbols, and "" for ordinary interned ones.
    """

    __slots__ = ("name", "package", "__weakref__")

    def __init__(self, name: str, package: Optional[str]) -> None:
        self.name = name
        self.package = package

    @property
    def is_keyword(self) -> bool:
        return self.package == "KEYWORD"


class SymbolTable:
    """One module's symbols, like a CL package that uses the standard library.

    `intern` looks in this table, then in the names it imported, then in the symbols the
    base (prelude and builtins) defines, and only then makes a new symbol here. So two
    modules that each define `helper` get two different symbols, while `car` is shared.
    Keywords live in one table shared by every module of a compile.
    """

    def __init__(self, package: str = "", base: Optional["SymbolTable"] = None, internals: bool = False) -> None:
        self.package = package
        self.base = base
        # the standard modules may use the base's %-internals; user files may not
        self.internals = internals
        self.own: dict[str, Symbol] = {}
        self.imported: dict[str, Symbol] = {}
        self.exported: dict[str, Symbol] = {}
        self.aliases: dict[str, "SymbolTable"] = {}
        self.keywords: dict[str, Symbol] = base.keywords if base is not None else {}
        if base is None:
            for sym in _CONSTANT_SYMBOLS.values():
                self.own[sym.name] = sym

    def intern(self, name: str) -> Symbol:
        sym = self.own.get(name) or self.imported.get(name)
        if sym is None and self.base is not None:
            sym = self.base.exported.get(name)
            if sym is None and self.internals and name.startswith("%"):
                sym = self.base.own.get(name)
        if sym is None:
            sym = Symbol(name, self.package)
            self.own[name] = sym
        return sym

    def find(self, name: str) -> Optional[Symbol]:
        sym = self.own.get(name) or self.imported.get(name)
        if sym is None and self.base is not None:
            sym = self.base.exported.get(name)
        return sym

    def keyword(self, name: str) -> Symbol:
        sym = self.keywords.get(name)
        if sym is None:
            sym = Symbol(name, "KEYWORD")
            self.keywords[name] = sym
        return sym

    def qualified(self, prefix: str, name: str) -> Symbol:
        """`prefix:name`: the exported symbol NAME of the module required as PREFIX.
        Raises LookupError with a message for the diagnostic."""
        module = self.aliases.get(prefix)
        if module is None and prefix in STANDARD_PACKAGE_NAMES:
            # cl:car, common-lisp::car, cl-user::x: the one package there is (no package system)
            standard = self.base.exported.get(name) if self.base is not None else self.own.get(name)
            if prefix in ("CL", "COMMON-LISP") and standard is None:
                raise LookupError(f"`{name.lower()}` is not a standard Common Lisp symbol, so `{prefix.lower()}:{name.lower()}` names nothing")
            return standard or self.intern(name)
        if module is None:
            known = ", ".join(sorted(p.lower() for p in self.aliases)) or "none"
            raise LookupError(
                f"no module is bound to the prefix `{prefix.lower()}` (prefixes here: {known}); "
                f'add (require "sexpgpu/{prefix.lower()}" :as {prefix.lower()}) before this form'
            )
        sym = module.exported.get(name)
        if sym is None:
            raise LookupError(f"module `{module.package}` exports no `{name.lower()}`{did_you_mean(name, module.exported, MODULE_NAME_CUTOFF)}")
        return sym


MODULE_NAME_CUTOFF = 0.6  # short names: `mpl` is 0.67 alike `mlp`

STANDARD_PACKAGE_NAMES = frozenset({"CL", "COMMON-LISP", "CL-USER", "COMMON-LISP-USER"})

NIL = Symbol("NIL", "")
T = Symbol("T", "")
_CONSTANT_SYMBOLS: dict[tuple[str, str], Symbol] = {("", "NIL"): NIL, ("", "T"): T}


def standard_symbol(name: str) -> Symbol:
    """A symbol shared by every table (used for the reader's own output, e.g. QUOTE)."""
    key = ("", name)
    sym = _CONSTANT_SYMBOLS.get(key)
    if sym is None:
        sym = Symbol(name, "")
        _CONSTANT_SYMBOLS[key] = sym
    return sym


def is_standard_symbol(sym: Symbol) -> bool:
    """Whether SYM is one of the symbols every table shares (NIL, T, the reader's QUOTE ...)."""
    return _CONSTANT_SYMBOLS.get(("", sym.name)) is sym


QUOTE = standard_symbol("QUOTE")
FUNCTION = standard_symbol("FUNCTION")
QUASIQUOTE = standard_symbol("QUASIQUOTE")
UNQUOTE = standard_symbol("UNQUOTE")
UNQUOTE_SPLICING = standard_symbol("UNQUOTE-SPLICING")


class Cons:
    """A cons cell. `loc` is where the object in the car starts in the source (set by the
    reader); `open_loc` on the first cell of a list read from source is its opening paren."""

    __slots__ = ("car", "cdr", "loc")

    def __init__(self, car: Any, cdr: Any, loc: Optional[Loc] = None) -> None:
        self.car = car
        self.cdr = cdr
        self.loc = loc

    def __iter__(self) -> Iterator[Any]:
        """Iterate the cars of a proper list (stops at the first non-cons cdr)."""
        cell: Any = self
        while type(cell) is Cons:
            yield cell.car
            cell = cell.cdr


class Char:
    """A character object, distinct from a one-character string."""

    __slots__ = ("ch",)

    def __init__(self, ch: str) -> None:
        self.ch = ch

    def __eq__(self, other: object) -> bool:
        return type(other) is Char and other.ch == self.ch

    def __hash__(self) -> int:
        return hash(("char", self.ch))

    def __repr__(self) -> str:
        return f"#\\{self.ch}"


Number = (int, float, Fraction)


def is_number(x: Any) -> bool:
    return type(x) in (int, float, Fraction) and type(x) is not bool


def lisp_list(*items: Any, loc: Optional[Loc] = None) -> Any:
    return from_iter(items, loc=loc)


def from_iter(items: Any, tail: Any = NIL, loc: Optional[Loc] = None) -> Any:
    result = tail
    for item in reversed(list(items)):
        result = Cons(item, result)
    if loc is not None and type(result) is Cons:
        result.loc = loc
    return result


class MultipleValues(tuple):  # type: ignore[type-arg]
    """What `values` returns when it does not return exactly one value."""

    __slots__ = ()


def primary(v: Any) -> Any:
    if type(v) is MultipleValues:
        return v[0] if v else NIL
    return v
