"""A system image: the read forms of the system's own library texts (the prelude, the contract
macros, the standard modules), read once by a caller that builds many worlds and handed to
each world it builds.

A sweep's check builds a fresh world for every compile, and each world read the same texts
again (reading is about 45% of building the prelude's world). A SystemImage holds each text's
forms as templates: the conses, vectors and atoms as read, with every symbol replaced by the
name it was read as (but NIL, T and the reader's QUOTE ..., which are one object in every
world already). A world instantiates a template form by form, just before it evaluates
that form (as reading would), interning each name in its own table (the base, or the
module's) and copying every
cons and vector: no symbol, cons or vector is shared between two worlds, so whatever one world
does to its symbols (their values, their property lists) or to a literal of the prelude
never reaches another, and the image itself never changes once built.

A text is imaged only where reading it ahead, outside any world, reads what a world reads
form by form: no `#+`/`#-` (which ask the world's *features*), no `prefix:name` (which asks
the modules required so far), no object the templates do not copy (a `#nA` array). Any
other text is read by each world, as before. Read ahead, a name is only a name: the scratch
table it is read into holds no symbol (not even NIL's), so what a token means is decided
by the world's table as the world takes the form.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from types import MappingProxyType
from typing import Any, Iterable, Iterator, Mapping, Optional

from .diagnostics import DiagnosticError
from .objects import BitVector
from .reader import Reader, ReadForm
from .types import Char, Cons, Symbol, SymbolTable, is_standard_symbol

_ATOMS = (str, int, float, Fraction, Char, bool)
SYSTEM_FILE = "<prelude>"  # the file name the prelude and the contract macros are read under
TextKey = tuple[str, str]  # (the file name its forms are read under, the text)


class Name:
    """A symbol of a template: what it was read as. KIND is "" for a name interned in the
    table the text is loaded into, "KEYWORD" for a keyword, None for an uninterned one (`#:x`:
    each Name is one symbol)."""

    __slots__ = ("name", "kind")

    def __init__(self, name: str, kind: Optional[str]) -> None:
        self.name = name
        self.kind = kind


class NotImaged(Exception):
    """A text whose forms a world must read itself (see the module's docstring)."""


class _Scratch(SymbolTable):
    """The table a text is read ahead into: it holds no symbol, and refuses `prefix:name`."""

    def __init__(self) -> None:
        super().__init__("")
        self.own.clear()

    def qualified(self, prefix: str, name: str) -> Symbol:
        raise LookupError(f"{prefix}:{name} asks the modules required so far")


@dataclass(frozen=True)
class SystemImage:
    """The templates of the system texts read so far, by text. Immutable: worlds only read
    it, each instantiating its own copy of the forms."""

    texts: Mapping[TextKey, tuple[ReadForm, ...]]

    @classmethod
    def read(cls, texts: Iterable[TextKey]) -> SystemImage:
        """An image of each (file, text) of TEXTS that can be read ahead (the others are left
        out)."""
        kept: dict[TextKey, tuple[ReadForm, ...]] = {}
        for file, text in texts:
            try:
                kept[file, text] = templates(file, text)
            except NotImaged:
                continue
        return cls(MappingProxyType(kept))

    def forms(self, file: str, text: str, table: SymbolTable) -> Optional[Iterator[ReadForm]]:
        """TEXT's forms, read as FILE, for the world where TABLE is the table it is loaded
        into, each instantiated as it is asked for; None when the image does not hold it."""
        kept = self.texts.get((file, text))
        if kept is None:
            return None
        return instantiated(kept, table)


def templates(file: str, text: str) -> tuple[ReadForm, ...]:
    """TEXT read as FILE into a scratch table, each form as a template; NotImaged where a
    world could read it otherwise."""
    if "#+" in text or "#-" in text:
        raise NotImaged("#+/#- ask the world's *features*")
    reader = Reader(text, file, _Scratch())
    try:
        read = reader.read_all()
    except (DiagnosticError, LookupError) as exc:
        raise NotImaged(str(exc)) from exc
    copies: dict[int, Any] = {}  # by id: every form read is alive until the last is done
    return tuple(ReadForm(template(form.form, copies), form.loc) for form in read)


def template(x: Any, copies: dict[int, Any]) -> Any:
    """X as a template: fresh conses and vectors (shared structure stays shared), each symbol
    a Name (the scratch table holds one symbol per name, so one Name per name; one per
    uninterned symbol). COPIES maps the id of each object done so far to what it became."""
    done = copies.get(id(x))
    if done is not None:
        return done
    kind = type(x)
    if kind is Symbol:
        return _name(x, copies)
    if kind is list or kind is BitVector:
        return _copy(x, copies, lambda item: template(item, copies))
    if kind is not Cons:
        if isinstance(x, _ATOMS):
            return x
        raise NotImaged(f"a {kind.__name__} literal")
    head = Cons(None, None, x.loc)
    copies[id(x)] = head
    cell, last = x, head
    while True:
        car = cell.car
        if type(car) is Symbol:
            last.car = copies.get(id(car)) or _name(car, copies)
        else:
            last.car = template(car, copies)
        rest = cell.cdr
        if type(rest) is not Cons or id(rest) in copies:
            last.cdr = template(rest, copies)
            return head
        fresh = Cons(None, None, rest.loc)
        copies[id(rest)] = fresh
        last.cdr = fresh
        cell, last = rest, fresh


def _name(sym: Symbol, copies: dict[int, Any]) -> Any:
    """SYM's Name, made the first time (a standard symbol stays itself: every world has it)."""
    made = sym if is_standard_symbol(sym) else Name(sym.name, sym.package)
    copies[id(sym)] = made
    return made


def instantiated(forms: tuple[ReadForm, ...], table: SymbolTable) -> Iterator[ReadForm]:
    """FORMS as a world with base table TABLE reads them: each Name interned there (each
    uninterned Name one fresh symbol for the whole text), every cons and vector fresh."""
    symbols: dict[int, Symbol] = {}
    for read in forms:
        yield ReadForm(instance(read.form, table, symbols, {}), read.loc)


def instance(x: Any, table: SymbolTable, symbols: dict[int, Symbol], copies: dict[int, Any]) -> Any:
    """The template X in the world of TABLE (see instantiated). The elements of a list are
    taken in the loop, not by a call each: most are names and atoms."""
    kind = type(x)
    if kind is Name:
        return symbols.get(id(x)) or symbol(x, table, symbols)
    if kind is not Cons:
        if kind is list or kind is BitVector:
            return _copy(x, copies, lambda item: instance(item, table, symbols, copies))
        return x
    done = copies.get(id(x))
    if done is not None:
        return done
    head = Cons(None, None, x.loc)
    copies[id(x)] = head
    cell, last = x, head
    while True:
        car = cell.car
        kind = type(car)
        if kind is Name:
            last.car = symbols.get(id(car)) or symbol(car, table, symbols)
        elif kind is Cons or kind is list or kind is BitVector:
            last.car = instance(car, table, symbols, copies)
        else:
            last.car = car
        rest = cell.cdr
        if type(rest) is not Cons or id(rest) in copies:
            last.cdr = instance(rest, table, symbols, copies)
            return head
        fresh = Cons(None, None, rest.loc)
        copies[id(rest)] = fresh
        last.cdr = fresh
        cell, last = rest, fresh


def symbol(name: Name, table: SymbolTable, symbols: dict[int, Symbol]) -> Symbol:
    """NAME's symbol in the world of TABLE, the first time the text names it."""
    kind = name.kind
    sym = table.intern(name.name) if kind == "" else table.keyword(name.name) if kind == "KEYWORD" else Symbol(name.name, None)
    symbols[id(name)] = sym
    return sym


def _copy(x: Any, copies: dict[int, Any], element: Any) -> Any:
    """A fresh copy of the cons or vector X, its elements mapped by ELEMENT; COPIES maps the id
    of each cell or vector copied so far to its copy (shared or circular structure stays so)."""
    done = copies.get(id(x))
    if done is not None:
        return done
    if type(x) is not Cons:
        vector: list[Any] = BitVector() if type(x) is BitVector else []
        copies[id(x)] = vector
        vector.extend(element(item) for item in x)
        return vector
    head = Cons(None, None, x.loc)
    copies[id(x)] = head
    cell, last = x, head
    while True:
        last.car = element(cell.car)
        rest = cell.cdr
        if type(rest) is not Cons or id(rest) in copies:
            last.cdr = element(rest)
            return head
        fresh = Cons(None, None, rest.loc)
        copies[id(rest)] = fresh
        last.cdr = fresh
        cell, last = rest, fresh
