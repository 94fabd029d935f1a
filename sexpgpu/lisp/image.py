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

A text a world loads into its base (the prelude, the contract macros) is also imaged as a
world evaluates it: each top-level form's expansion, down to the forms that are neither a
`progn` nor a macro call, which a world then analyzes and runs without calling the macros'
expanders again (they were about half of building the prelude's world). Those forms are
templates too, made in the world that recorded them (its base's names, its keywords, its
gensyms), each with the gensym and gentemp counters, counted from the text's start, that it
was evaluated at. Every world loads the same text from the same state (the builtins, the
texts before it), so each expansion is the one its own expanders would make; an expansion
that holds an object a template cannot copy (a function, a structure) leaves the text to be
expanded by each world, as before.

A module the user's file requires before any other of its top-level forms (a standard
module, or a library of the project) is recorded the same way (ModuleLoader.load_module),
into its own table: its leaves' names are the module's, its base's (BASE), those of the
modules it required (ALIAS), keywords and gensyms. It is recorded under its text and the
texts' digests of the modules loaded before it, so a library that changed between two of
watch's checks is expanded again, and so is every module loaded after it. Required later,
what the file did first may change its expansion, and each world expands it. The names its
reading and expanding interned that no leaf holds end its leaves as a quoted list, so that a
replaying world interns them too.

lisp/imagefile.py keeps an image on disk between processes: what one check recorded, every
later one replays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, TypeVar

from .diagnostics import DiagnosticError
from .objects import BitVector
from .reader import Reader, ReadForm
from .types import NIL, QUOTE, Char, Cons, Loc, Symbol, SymbolTable, is_standard_symbol

_ATOMS = (str, int, float, Fraction, Char, bool)
SYSTEM_FILE = "<prelude>"  # the file name the prelude and the contract macros are read under
TextKey = tuple[str, str]  # (the file name its forms are read under, the text)


BASE = "\0base"  # a Name's kind: interned in the base of the module a text is loaded into
ALIAS = "\0alias:"  # a Name's kind, then a prefix: interned in the module the text required under it


class Name:
    """A symbol of a template: what it was read as. KIND is "" for a name interned in the
    table the text is loaded into, BASE for one of that module's base (a module's recorded
    expansion), ALIAS + PREFIX for one of the module the text required as PREFIX (`nn:dense`,
    or `dense` imported from it), "KEYWORD" for a keyword, None for an uninterned one (`#:x`:
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
    expanded: Mapping[TextKey, tuple[Leaf, ...]] = field(default_factory=lambda: MappingProxyType({}))

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

    def leaves(self, file: str, text: str, table: SymbolTable) -> Optional[Iterator[Leaf]]:
        """TEXT's top-level forms as expanded (see the module's docstring), instantiated in
        the world of TABLE one by one; None when the image holds no expansion of it."""
        kept = self.expanded.get((file, text))
        if kept is None:
            return None
        symbols: dict[int, Symbol] = {}
        return (Leaf(instance(leaf.form, table, symbols, {}), leaf.loc, leaf.counters) for leaf in kept)

    def with_expansions(self, recorded: Mapping[TextKey, tuple[Leaf, ...]], superseding: bool = False) -> SystemImage:
        """This image with RECORDED's expansions added; SUPERSEDING: less every expansion of
        a file RECORDED holds another of (watch: the library's text before the last save),
        so that an image kept for hours holds one expansion of each file."""
        files = {expanded_file(key) for key in recorded} if superseding else set()
        return SystemImage(self.texts, Deferred.of(self.expanded).merged(recorded, lambda key: expanded_file(key) not in files))


V = TypeVar("V")
Maker = Callable[[], V]


class Deferred(Mapping[TextKey, V]):
    """A mapping whose values are made on first use, each once (an image kept on disk,
    lisp/imagefile.py, decodes a text's forms only when a world asks for them). What it holds
    never changes: only when each value is made."""

    __slots__ = ("made", "makers")

    def __init__(self, made: Mapping[TextKey, V], makers: Optional[Mapping[TextKey, Maker[V]]] = None) -> None:
        self.made = dict(made)
        self.makers = {key: make for key, make in (makers or {}).items() if key not in self.made}

    @classmethod
    def of(cls, values: Mapping[TextKey, V]) -> Deferred[V]:
        return values if isinstance(values, Deferred) else cls(values)

    def __getitem__(self, key: TextKey) -> V:
        if key in self.made:
            return self.made[key]
        value = self.makers[key]()  # KeyError where it holds no such key
        self.made[key] = value
        return value

    def __iter__(self) -> Iterator[TextKey]:
        yield from list(self.made)
        yield from (key for key in list(self.makers) if key not in self.made)

    def __len__(self) -> int:
        return len(self.made) + sum(1 for key in self.makers if key not in self.made)

    def __contains__(self, key: object) -> bool:
        return key in self.made or key in self.makers

    def merged(self, added: Mapping[TextKey, V], keep: Callable[[TextKey], bool]) -> Deferred[V]:
        """These values that KEEP keeps, and ADDED's over them; nothing is made."""
        made = {key: value for key, value in self.made.items() if keep(key)}
        made.update(added)
        return Deferred(made, {key: make for key, make in self.makers.items() if keep(key) and key not in self.made})


def expanded_file(key: TextKey) -> str:
    """The file name an expansion's key is recorded under (a module's: its first line)."""
    return key[0].split("\n", 1)[0]


Counters = tuple[int, ...]  # what names the next gensym and gentemp (Interpreter.counters)


class Leaf:
    """A top-level form that is neither a progn nor a macro call, as a world evaluated it:
    LOC is its top-level form's, COUNTERS the world's counters just before it ran, counted
    from the start of its text."""

    __slots__ = ("form", "loc", "counters")

    def __init__(self, form: Any, loc: Loc, counters: Counters) -> None:
        self.form = form
        self.loc = loc
        self.counters = counters


class Recording:
    """The leaves of one text as the world of TABLE evaluates it (Interpreter.load_system_text),
    each made a template just before it runs; `failed` once one cannot be."""

    def __init__(self, table: SymbolTable, counters: Optional[Counters]) -> None:
        self.table = table
        self.start = counters
        self.leaves: list[Leaf] = []
        self.at = Loc(SYSTEM_FILE, 1, 1)  # the top-level form being evaluated
        self.failed = counters is None
        self.copies: dict[int, Any] = {}
        self.alive: list[Any] = []  # what COPIES names by id stays alive until the text is done
        self.before = set(table.own)  # the names the table held before the text
        self.named: set[str] = set()  # the names of the table the leaves hold

    def leaf(self, form: Any, counters: Optional[Counters]) -> None:
        """FORM, a leaf of the top-level form at `at`, about to run at COUNTERS (None: a
        counter is not a number)."""
        if self.failed or counters is None or self.start is None:
            self.failed = True
            return
        try:
            made = template(form, self.copies, self.name, self.alive)
        except NotImaged:
            self.failed = True
            return
        self.leaves.append(Leaf(made, self.at, tuple(now - start for now, start in zip(counters, self.start))))

    def name(self, sym: Symbol, copies: dict[int, Any], alive: Optional[list[Any]]) -> Any:
        """SYM's Name in the recording world: one of the names of the table the text is
        loaded into, of its base (a module's text), a keyword, a gensym."""
        if is_standard_symbol(sym) or sym.package is None or sym.package == "KEYWORD":
            if sym.package != "KEYWORD" or self.table.keywords.get(sym.name) is sym:
                return _name(sym, copies, alive)
        elif self.table.own.get(sym.name) is sym:
            self.named.add(sym.name)
            return _named(sym, "", copies, alive)
        elif self.table.base is not None and sym.package == "" and self.table.base.own.get(sym.name) is sym:
            return _named(sym, BASE, copies, alive)
        else:
            for alias, module in self.table.aliases.items():
                if module.own.get(sym.name) is sym:
                    return _named(sym, ALIAS + alias, copies, alive)
        raise NotImaged(f"the symbol {sym.name} is not one a world's tables give")

    def result(self, counters: Optional[Counters]) -> Optional[tuple[Leaf, ...]]:
        """The leaves, once the text is done at COUNTERS. The names the text's reading and
        expanding interned in the table but no leaf holds (a macro's clause names) end them
        as one more leaf, a quoted list of them, so that a world replaying the text interns
        them too."""
        if self.failed or counters is None or self.start is None:
            return None
        unheld = sorted(name for name in self.table.own if name not in self.before and name not in self.named)
        if not unheld:
            return tuple(self.leaves)
        names: Any = NIL
        for name in reversed(unheld):
            names = Cons(Name(name, ""), names)
        quoted = Cons(QUOTE, Cons(names, NIL))
        return (*self.leaves, Leaf(quoted, self.at, tuple(now - start for now, start in zip(counters, self.start))))


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


NameOf = Callable[[Symbol, dict[int, Any], Optional[list[Any]]], Any]


def template(x: Any, copies: dict[int, Any], name: Optional[NameOf] = None, alive: Optional[list[Any]] = None) -> Any:
    """X as a template: fresh conses and vectors (shared structure stays shared), each symbol
    a Name (the scratch table holds one symbol per name, so one Name per name; one per
    uninterned symbol; NAME makes it where the symbols are a world's). COPIES maps the id of
    each object done so far to what it became; ALIVE, where given, keeps each such object
    alive (a world's objects may be freed while its text runs; the reader's are not)."""
    done = copies.get(id(x))
    if done is not None:
        return done
    name_of = name or _name
    kind = type(x)
    if kind is Symbol:
        return name_of(x, copies, alive)
    if alive is not None:
        alive.append(x)
    if kind is list or kind is BitVector:
        return _copy(x, copies, lambda item: template(item, copies, name, alive))
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
            last.car = copies.get(id(car)) or name_of(car, copies, alive)
        else:
            last.car = template(car, copies, name, alive)
        rest = cell.cdr
        if type(rest) is not Cons or id(rest) in copies:
            last.cdr = template(rest, copies, name, alive)
            return head
        if alive is not None:
            alive.append(rest)
        fresh = Cons(None, None, rest.loc)
        copies[id(rest)] = fresh
        last.cdr = fresh
        cell, last = rest, fresh


def _named(sym: Symbol, kind: str, copies: dict[int, Any], alive: Optional[list[Any]]) -> Name:
    """SYM's Name as one interned in the table KIND says (see Name)."""
    made = Name(sym.name, kind)
    copies[id(sym)] = made
    if alive is not None:
        alive.append(sym)
    return made


def _name(sym: Symbol, copies: dict[int, Any], alive: Optional[list[Any]] = None) -> Any:
    """SYM's Name, made the first time (a standard symbol stays itself: every world has it)."""
    made = sym if is_standard_symbol(sym) else Name(sym.name, sym.package)
    copies[id(sym)] = made
    if alive is not None:
        alive.append(sym)
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
    if kind == "":
        sym = table.intern(name.name)
    elif kind == "KEYWORD":
        sym = table.keyword(name.name)
    elif kind == BASE:
        sym = (table if table.base is None else table.base).intern(name.name)
    elif kind is not None and kind.startswith(ALIAS):
        sym = table.aliases[kind[len(ALIAS):]].intern(name.name)
    else:
        sym = Symbol(name.name, None)
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
