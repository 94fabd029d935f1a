"""The recorded expansions of the prelude and the contract macros (image.py), kept on disk
between processes, so that a `check` of one file builds its one world from them too.

A world that reads and expands the two texts itself costs about three times one that
evaluates their recorded leaves. The leaves are a function of the texts and of the Lisp's
own Python (the builtins the expanders call), so an entry is keyed by the SHA-256 of both,
and of the Python that reads it: `$SEXPGPU_CACHE/image/<hash>` (cachefiles.py says where the
root is and how an entry is read and written). An entry is marshal's bytes of plain data
(tuples, strings, numbers: no code object is accepted), sealed with their SHA-256; one that
is damaged, truncated, too large or not a regular file is recorded again and written over.
A folder that cannot be written leaves each process recording the texts, as a cache only
saves time.

The data of a template: a string, an integer, a float or a boolean is itself; every other
object is a tuple whose first item says what it is: ("s", name) a standard symbol, ("n",
name, kind) a Name, ("q", numerator, denominator) a ratio, ("h", string) a character, ("c",
cars, locs, tail) a run of conses (each cell's car and position, and what the last cdr is),
("v", items) and ("b", items) a vector and a bit vector, ("r", i) the i-th cons, vector or
Name met before (shared and circular structure, and one symbol per gensym, stay so).
"""

from __future__ import annotations

import hashlib
import marshal
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from ..cachefiles import BadEntry, cache_root, publish, read_entry
from .image import Leaf, Name, SystemImage, TextKey
from .objects import BitVector
from .types import Char, Cons, Loc, Symbol, known_standard_symbol

KIND = "image"
HEADER = b"sexpgpu system image 1\n"
DIGEST_BYTES = 32
ENTRY_LIMIT = 64 << 20
_PLAIN = (str, int, float, bool)
_SOURCES = Path(__file__).resolve().parent


class Malformed(Exception):
    """An entry's data that is not what encode writes."""


def entry_path(texts: Sequence[TextKey]) -> Path:
    """Where the expansions of TEXTS are kept, for this Python and this Lisp."""
    key = hashlib.sha256(f"{sys.implementation.cache_tag}\0{sys.version}\0".encode() + HEADER)
    for source in sorted(_SOURCES.glob("*.py")):
        key.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
    for file, text in texts:
        key.update(f"{file}\0{len(text)}\0".encode() + text.encode("utf-8", "surrogatepass"))
    return cache_root() / KIND / key.hexdigest()


def load(texts: Sequence[TextKey]) -> Optional[SystemImage]:
    """An image holding the recorded expansions of every one of TEXTS, from the cache; None
    when the cache does not hold them whole."""
    try:
        data = read_entry(entry_path(texts), ENTRY_LIMIT)
    except (BadEntry, OSError):
        return None
    if data is None or not data.startswith(HEADER):
        return None
    digest, payload = data[len(HEADER) : len(HEADER) + DIGEST_BYTES], data[len(HEADER) + DIGEST_BYTES :]
    if hashlib.sha256(payload).digest() != digest:
        return None
    try:
        kept = decoded(marshal.loads(payload), texts)
    except (EOFError, ValueError, TypeError, Malformed):
        return None
    return SystemImage({}, kept)


def store(texts: Sequence[TextKey], recorded: Mapping[TextKey, tuple[Leaf, ...]]) -> None:
    """Keep the expansions RECORDED of TEXTS (every one of them recorded), where the cache can."""
    if any(key not in recorded for key in texts):
        return
    payload = marshal.dumps(tuple(encoded_text(recorded[key]) for key in texts))
    sealed = HEADER + hashlib.sha256(payload).digest() + payload
    try:
        publish(entry_path(texts), lambda out: out.write(sealed))
    except OSError:
        pass  # not writable here: record again next time


def encoded_text(leaves: tuple[Leaf, ...]) -> tuple[Any, ...]:
    """A text's leaves, numbering what they share across the whole text (a gensym may be in two)."""
    seen: dict[int, int] = {}
    return tuple(encoded_leaf(leaf, seen) for leaf in leaves)


def encoded_leaf(leaf: Leaf, seen: dict[int, int]) -> Any:
    loc = leaf.loc
    return (encoded(leaf.form, seen), (loc.file, loc.line, loc.col), leaf.counters)


def encoded(x: Any, seen: dict[int, int]) -> Any:
    """X's data (see the module's docstring); SEEN numbers each cons, vector and Name met so far."""
    kind = type(x)
    if kind in _PLAIN:
        return x
    done = seen.get(id(x))
    if done is not None:
        return ("r", done)
    if kind is Cons:
        cells: list[Cons] = []
        cell: Any = x
        while type(cell) is Cons and id(cell) not in seen:
            seen[id(cell)] = len(seen)
            cells.append(cell)
            cell = cell.cdr
        cars = tuple(encoded(c.car, seen) for c in cells)
        locs = tuple(None if c.loc is None else (c.loc.file, c.loc.line, c.loc.col) for c in cells)
        return ("c", cars, locs, encoded(cell, seen))
    if kind is Name:
        seen[id(x)] = len(seen)
        return ("n", x.name, x.kind)
    if kind is list or kind is BitVector:
        seen[id(x)] = len(seen)
        return ("v" if kind is list else "b", tuple(encoded(item, seen) for item in x))
    if kind is Symbol:  # a template holds only the standard symbols themselves
        return ("s", x.name)
    if kind is Fraction:
        return ("q", x.numerator, x.denominator)
    if kind is Char:
        return ("h", x.ch)
    raise TypeError(f"a {kind.__name__} in a template")


def decoded(data: Any, texts: Sequence[TextKey]) -> dict[TextKey, tuple[Leaf, ...]]:
    if type(data) is not tuple or len(data) != len(texts):
        raise Malformed("not one run of leaves per text")
    kept: dict[TextKey, tuple[Leaf, ...]] = {}
    for key, leaves in zip(texts, data):
        if type(leaves) is not tuple:
            raise Malformed("a text's leaves are not a tuple")
        seen: list[Any] = []
        kept[key] = tuple(decoded_leaf(leaf, seen) for leaf in leaves)
    return kept


def decoded_leaf(data: Any, seen: list[Any]) -> Leaf:
    if type(data) is not tuple or len(data) != 3:
        raise Malformed("a leaf is (form, loc, counters)")
    form, loc, counters = data
    if type(counters) is not tuple or not all(type(n) is int for n in counters):
        raise Malformed("a leaf's counters are integers")
    made = _loc(loc)
    if made is None:
        raise Malformed("a leaf has a position")
    return Leaf(decoding(form, seen), made, counters)


def _loc(data: Any) -> Optional[Loc]:
    if data is None:
        return None
    if type(data) is not tuple or len(data) != 3 or type(data[0]) is not str or type(data[1]) is not int or type(data[2]) is not int:
        raise Malformed("a position is (file, line, column)")
    return Loc(data[0], data[1], data[2])


def decoding(data: Any, seen: list[Any]) -> Any:
    """The template DATA is (see encoded); SEEN: each cons, vector and Name made so far."""
    kind = type(data)
    if kind in _PLAIN:
        return data
    if kind is not tuple or not data or type(data[0]) is not str:
        raise Malformed(f"a {kind.__name__} where a template's data was expected")
    tag = data[0]
    if tag == "c" and len(data) == 4 and type(data[1]) is tuple and type(data[2]) is tuple and len(data[1]) == len(data[2]) > 0:
        cells = [Cons(None, None, _loc(loc)) for loc in data[2]]
        seen.extend(cells)
        for cell, after in zip(cells, cells[1:]):
            cell.cdr = after
        for cell, car in zip(cells, data[1]):
            cell.car = decoding(car, seen)
        cells[-1].cdr = decoding(data[3], seen)
        return cells[0]
    if tag == "r" and len(data) == 2 and type(data[1]) is int and 0 <= data[1] < len(seen):
        return seen[data[1]]
    if tag == "n" and len(data) == 3 and type(data[1]) is str and data[2] in ("", "KEYWORD", None):
        name = Name(data[1], data[2])
        seen.append(name)
        return name
    if tag in ("v", "b") and len(data) == 2 and type(data[1]) is tuple:
        vector: list[Any] = [] if tag == "v" else BitVector()
        seen.append(vector)
        vector.extend(decoding(item, seen) for item in data[1])
        return vector
    if tag == "s" and len(data) == 2 and type(data[1]) is str:
        return _standard(data[1])
    if tag == "q" and len(data) == 3 and type(data[1]) is int and type(data[2]) is int and data[2] > 1:
        return Fraction(data[1], data[2])
    if tag == "h" and len(data) == 2 and type(data[1]) is str and len(data[1]) == 1:
        return Char(data[1])
    raise Malformed(f"a template's data tagged {tag!r} is malformed")


def _standard(name: str) -> Symbol:
    sym = known_standard_symbol(name)
    if sym is None:
        raise Malformed(f"{name} is no standard symbol")
    return sym
