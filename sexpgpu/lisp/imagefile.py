"""A system image (lisp/image.py) kept on disk between processes.

Building the prelude's world from its text, reading it and expanding its macros, was half of
a fresh `check` of an example (about 75 ms of 150); a world built from an image that holds the
prelude's expansions skips both. Every process used to make that image again. Here it is kept
in `$SEXPGPU_CACHE/image/<key>` (cachefiles.py says where the root is and how an entry is read
and written), where <key> is the SHA-256 of the entry's format, the Python, a signature of the
code that reads and expands the texts (the caller's: every Python file of the package, by
name, size and modification time) and every system text. A text, a Python file or the Python
that changed is another key: its image is built again.

An entry is marshal's bytes (the format of Python's own `.pyc` files, which runs nothing when
read) of one flat table per text: the text's atoms, names, standard symbols, vectors and
conses, each a row, every reference a row's number, so that shared and circular structure
stays so; and the positions of the conses. The bytes are sealed with their SHA-256: an entry
that is damaged, truncated, too large, not a regular file or of another format is built again
and written over. Only expansions of the system texts, made where only standard modules were
loaded before them, are kept: a project's own libraries and their paths never reach it.

A cache only saves time: a folder that cannot be written leaves each process building the
image as before, without a word. Each change of the package or the Python is a new entry, so
a write keeps the KEPT_ENTRIES most recently written and removes the older ones (an install
used again after that writes its entry again, once).
"""

from __future__ import annotations

import hashlib
import marshal
import sys
from fractions import Fraction
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

from ..cachefiles import BadEntry, cache_root, discard, publish, read_entry
from .image import Deferred, Leaf, Name, SystemImage, TextKey
from .objects import BitVector
from .reader import ReadForm
from .types import Char, Cons, Loc, Symbol, standard_symbol

KIND = "image"
HEADER = b"sexpgpu system image 1\n"
DIGEST_BYTES = 32
ENTRY_LIMIT = 64 << 20  # the standard texts' image is a few hundred kilobytes
KEPT_ENTRIES = 4  # entries a write leaves in the folder, the newest (several installs, one cache)

Row = tuple[Any, ...]
Table = tuple[Any, ...]  # one text's rows, as encode_roots makes them


def entry_path(texts: Sequence[TextKey], signature: str) -> Path:
    """Where the image of TEXTS is kept, for this Python and the code SIGNATURE names."""
    key = hashlib.sha256(HEADER + f"{sys.implementation.cache_tag}\0{sys.version}\0{signature}\0".encode())
    for file, text in texts:
        key.update(f"{len(file)}:{file}{len(text)}:".encode())
        key.update(text.encode("utf-8", "surrogatepass"))
    return cache_root() / KIND / key.hexdigest()


def stored_image(texts: Sequence[TextKey], signature: str) -> Optional[SystemImage]:
    """The image of TEXTS kept on disk, or None when there is none this module wrote whole."""
    try:
        data = read_entry(entry_path(texts, signature), ENTRY_LIMIT)
    except (BadEntry, OSError):
        return None
    return decode(data, texts) if data is not None else None


def store_image(image: SystemImage, texts: Sequence[TextKey], signature: str, kept: Callable[[TextKey], bool]) -> None:
    """Keep IMAGE on disk as the image of TEXTS: their templates, and the expansions whose key
    KEPT accepts and whose text is one of TEXTS."""
    path = entry_path(texts, signature)
    try:  # encoded once the folder took the temporary file: an unwritable one costs nothing
        publish(path, lambda out: out.write(seal(encode(image, texts, kept))))
        remove_older_entries(path.parent, path)
    except OSError:
        pass  # not writable here: each process builds the image


def remove_older_entries(folder: Path, written: Path) -> None:
    """All but the KEPT_ENTRIES most recently written entries of FOLDER removed (WRITTEN, just
    written, always stays); a temporary file of a write under way is left alone."""
    entries: list[tuple[float, Path]] = []
    for path in folder.iterdir():
        if path.name.startswith(".") or path == written:
            continue
        try:
            entries.append((path.stat().st_mtime, path))
        except FileNotFoundError:
            continue  # another process removed it
    entries.sort(reverse=True)
    for _, path in entries[KEPT_ENTRIES - 1:]:
        discard(path)


def encode(image: SystemImage, texts: Sequence[TextKey], kept: Callable[[TextKey], bool]) -> Row:
    """IMAGE as plain data: (templates, expansions), each text by its place in TEXTS."""
    place = {text: i for i, text in enumerate(texts)}
    templates = [(place[key], encode_roots([(read.form, read.loc, None) for read in forms]))
                 for key, forms in image.texts.items() if key in place]
    by_text = {text: i for i, (_, text) in enumerate(texts)}
    expansions = [(key[0], by_text[key[1]], encode_roots([(leaf.form, leaf.loc, leaf.counters) for leaf in leaves]))
                  for key, leaves in image.expanded.items() if key[1] in by_text and kept(key)]
    return (tuple(templates), tuple(expansions))


def decode(data: bytes, texts: Sequence[TextKey]) -> Optional[SystemImage]:
    """The image an entry holds, or None when it is not one this module wrote whole. A text's
    forms are decoded when a world first asks for them (most worlds replay the prelude's
    expansions and never read its forms)."""
    plain = unseal(data)
    if plain is None:
        return None
    try:
        templates, expansions = plain
        forms = {texts[i]: partial(decoded_forms, table) for i, table in templates}
        leaves = {(key, texts[i][1]): partial(decoded_leaves, table) for key, i, table in expansions}
    except (ValueError, TypeError, IndexError):
        return None
    return SystemImage(Deferred({}, forms), Deferred({}, leaves))


def decoded_forms(table: Table) -> tuple[ReadForm, ...]:
    return tuple(ReadForm(form, loc) for form, loc, _ in decode_roots(table))


def decoded_leaves(table: Table) -> tuple[Leaf, ...]:
    return tuple(Leaf(form, loc, counters) for form, loc, counters in decode_roots(table))


def seal(plain: Row) -> bytes:
    payload = marshal.dumps(plain)
    return HEADER + hashlib.sha256(payload).digest() + payload


def unseal(data: bytes) -> Optional[Any]:
    if not data.startswith(HEADER):
        return None
    digest, payload = data[len(HEADER) : len(HEADER) + DIGEST_BYTES], data[len(HEADER) + DIGEST_BYTES :]
    if hashlib.sha256(payload).digest() != digest:
        return None
    try:
        return marshal.loads(payload)
    except (EOFError, ValueError, TypeError):
        return None


# A table's parts, in the order of their rows' numbers: an object's number is its place in the
# concatenation of ATOMS, FRACTIONS, CHARS, NAMES, SYMBOLS, VECTORS and CONSES.
ATOMS, FRACTIONS, CHARS, NAMES, SYMBOLS, VECTORS, CONSES = range(7)
NATIVE_ATOMS = (str, int, float, bool, type(None))


class _Rows:
    """The objects of one text's roots, by kind, each numbered once (by identity)."""

    def __init__(self) -> None:
        self.parts: list[list[Any]] = [[] for _ in range(7)]
        self.seen: dict[int, tuple[int, int]] = {}  # id -> (part, place in it)
        self.alive: list[Any] = []  # what SEEN names by id stays alive while it is used

    def add(self, x: Any) -> None:
        """X and everything it reaches, without recursion (a long list is a long cdr chain)."""
        todo = [x]
        while todo:
            obj = todo.pop()
            if id(obj) in self.seen:
                continue
            part = self.part_of(obj)
            self.seen[id(obj)] = (part, len(self.parts[part]))
            self.parts[part].append(obj)
            self.alive.append(obj)
            if part == CONSES:
                todo.append(obj.cdr)
                todo.append(obj.car)
            elif part == VECTORS:
                todo.extend(reversed(obj))

    @staticmethod
    def part_of(x: Any) -> int:
        kind = type(x)
        if kind is Cons:
            return CONSES
        if kind is Name:
            return NAMES
        if kind is Symbol:
            return SYMBOLS  # a template's only symbols are the standard ones (image.py)
        if kind is list or kind is BitVector:
            return VECTORS
        if kind is Fraction:
            return FRACTIONS
        if kind is Char:
            return CHARS
        if kind in NATIVE_ATOMS:
            return ATOMS
        raise TypeError(f"a {kind.__name__} in a system image")

    def numbers(self) -> Callable[[Any], int]:
        offsets = [0]
        for part in self.parts[:-1]:
            offsets.append(offsets[-1] + len(part))
        seen = self.seen
        return lambda x: offsets[seen[id(x)][0]] + seen[id(x)][1]


def encode_roots(roots: Iterable[tuple[Any, Loc, Optional[tuple[int, ...]]]]) -> Table:
    """ROOTS (form, position, counters or None) as one flat table (see the module's docstring)."""
    listed = list(roots)
    rows = _Rows()
    for form, _, _ in listed:
        rows.add(form)
    number = rows.numbers()
    files: dict[str, int] = {}
    positions: list[int] = []

    numbered: dict[Loc, int] = {}  # a Loc is a value: equal positions are one row

    def position(loc: Optional[Loc]) -> int:
        if loc is None:
            return -1
        row = numbered.get(loc)
        if row is None:
            row = numbered[loc] = len(numbered)
            positions.extend((files.setdefault(loc.file, len(files)), loc.line, loc.col))
        return row

    atoms, fractions, chars, names, symbols, vectors, conses = rows.parts
    cons_rows = tuple(x for cell in conses for x in (number(cell.car), number(cell.cdr), position(cell.loc)))
    root_rows = tuple((number(form), position(loc), counters) for form, loc, counters in listed)
    return (
        tuple(atoms),
        tuple((f.numerator, f.denominator) for f in fractions),
        tuple(c.ch for c in chars),
        tuple((n.name, n.kind) for n in names),
        tuple(s.name for s in symbols),
        tuple((type(v) is BitVector, tuple(number(item) for item in v)) for v in vectors),
        cons_rows,
        root_rows,
        tuple(files),
        tuple(positions),
    )


_new = object.__new__
_set_file, _set_line, _set_col = (Loc.__dict__[name].__set__ for name in ("file", "line", "col"))


def new_loc(file: str, line: int, col: int) -> Loc:
    """Loc(FILE, LINE, COL), made through its slots: a frozen dataclass's __init__ sets each
    field through object.__setattr__, twice the time (a fifth of decoding a text)."""
    loc = _new(Loc)
    _set_file(loc, file)
    _set_line(loc, line)
    _set_col(loc, col)
    return loc


def decode_roots(table: Table) -> list[tuple[Any, Loc, Any]]:
    """The roots of a table encode_roots made: (form, position, counters), every object new."""
    atoms, fractions, chars, names, symbols, vectors, cons_rows, root_rows, files, positions = table
    locs = [new_loc(files[positions[i]], positions[i + 1], positions[i + 2]) for i in range(0, len(positions), 3)]
    objects: list[Any] = list(atoms)
    objects.extend(Fraction(n, d) for n, d in fractions)
    objects.extend(Char(ch) for ch in chars)
    objects.extend(Name(name, kind) for name, kind in names)
    objects.extend(standard_symbol(name) for name in symbols)
    made_vectors: list[list[Any]] = [BitVector() if bits else [] for bits, _ in vectors]
    objects.extend(made_vectors)
    conses = [Cons(None, None, locs[cons_rows[i]] if cons_rows[i] >= 0 else None) for i in range(2, len(cons_rows), 3)]
    objects.extend(conses)
    for vector, (_, items) in zip(made_vectors, vectors):
        vector.extend(objects[i] for i in items)
    at = 0
    for cell in conses:
        cell.car = objects[cons_rows[at]]
        cell.cdr = objects[cons_rows[at + 1]]
        at += 3
    return [(objects[form], locs[loc], counters) for form, loc, counters in root_rows]  # a root always has its position

