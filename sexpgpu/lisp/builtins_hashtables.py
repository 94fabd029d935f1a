"""Hash tables (CLHS 18)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from .equality import equal, equalp
from .builtins import (
    Lib,
    lbool,
    parse_keys,
    short,
    to_lisp_list,
    type_error,
)
from .conditions import lisp_error
from .objects import BitVector, Builtin, HashTable
from .types import NIL, T, Char, Cons, MultipleValues, Symbol
from .registry import builtin


def _sxhash(x: Any) -> int:
    """A non-negative fixnum, equal for equal objects, and the same in every process (Python's
    own string hash changes from run to run, and a file's result must not)."""
    import hashlib

    digest = hashlib.blake2b(_sxhash_key(x, [64]).encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**62 - 1)


def _sxhash_key(x: Any, budget: list[int]) -> str:
    """Text that equal objects share: the structure of conses to a bounded size, the contents
    of strings, numbers, characters and symbols; any other object only its type (equal on it
    is eq)."""
    budget[0] -= 1
    t = type(x)
    if budget[0] < 0:
        return "..."
    if t is Cons:
        return f"({_sxhash_key(x.car, budget)} . {_sxhash_key(x.cdr, budget)})"
    if t is str:
        return "s" + x
    if t is Symbol:
        return f"y{x.package}:{x.name}"
    if t in (int, float, Fraction):
        return f"n{t.__name__}{x!r}"
    if t is Char:
        return "c" + x.ch
    if t is BitVector:
        return "b" + "".join("1" if b else "0" for b in x)  # equal looks into bit vectors
    if t is list:
        return "v"  # vectors are equal only when eq
    return "o" + t.__name__


@builtin("make-hash-table", context=Lib)
def make_hash_table(lib: Lib, *args: Any) -> Any:
    interp = lib.interp
    keys = parse_keys("make-hash-table", args, {"TEST", "SIZE", "REHASH-SIZE", "REHASH-THRESHOLD", "WEAKNESS", "SYNCHRONIZED"}, 1)
    test = keys.get("TEST", NIL)
    name = "EQL"
    if type(test) is Symbol and test is not NIL:
        name = test.name
    elif type(test) is Builtin:
        fname = test.name
        if interp.functions.get(interp.sym(fname)) is test:
            name = fname.upper()
    if name not in ("EQ", "EQL", "EQUAL", "EQUALP"):
        raise lisp_error("E103", f"`make-hash-table`: the :test must be eq, eql, equal or equalp, got {short(test)}", "ERROR", test)
    return HashTable(name, interp.charge, equalp if name == "EQUALP" else equal)


def need_table(fn: str, pos: int, x: Any) -> HashTable:
    if type(x) is not HashTable:
        raise type_error(fn, pos, "a hash table", x)
    return x


@builtin("gethash")
def gethash(key: Any, table: Any, default: Any = NIL) -> Any:
    entry = need_table("gethash", 2, table).entries.get(table.key(key))
    if entry is None:
        return MultipleValues((default, NIL))
    return MultipleValues((entry[1], T))


@builtin("%puthash", context=Lib)
def puthash(lib: Lib, key: Any, table: Any, *rest: Any) -> Any:
    """(setf (gethash key table [default]) value): the value comes last."""
    interp = lib.interp
    if not 1 <= len(rest) <= 2:
        raise lisp_error("E102", "`(setf gethash)` takes a key, a table, an optional default and a value", "PROGRAM-ERROR")
    value = rest[-1]
    interp.alloc(1)
    need_table("(setf gethash)", 2, table).entries[table.key(key)] = (key, value)
    return value


@builtin("remhash")
def remhash(key: Any, table: Any) -> Any:
    return lbool(need_table("remhash", 2, table).entries.pop(table.key(key), None) is not None)


@builtin("clrhash")
def clrhash(table: Any) -> Any:
    need_table("clrhash", 1, table).entries.clear()
    return table


@builtin("maphash", context=Lib)
def maphash(lib: Lib, fn: Any, table: Any) -> Any:
    interp = lib.interp
    f = interp.function_value(fn)
    for key, value in list(need_table("maphash", 2, table).entries.values()):
        interp.call(f, key, value)
    return NIL


@builtin("%hash-entries")
def hash_entries(table: Any) -> Any:

    return to_lisp_list([Cons(k, v) for k, v in need_table("maphash", 1, table).entries.values()])


hash_table_count = builtin("hash-table-count")(lambda t: len(need_table("hash-table-count", 1, t).entries))
hash_table_test = builtin("hash-table-test", context=Lib)(lambda lib, t: lib.interp.sym(need_table("hash-table-test", 1, t).test))
hash_table_size = builtin("hash-table-size")(lambda t: max(16, len(need_table("hash-table-size", 1, t).entries)))
hash_table_rehash_size = builtin("hash-table-rehash-size")(lambda t: (need_table("hash-table-rehash-size", 1, t), 1.5)[1])
hash_table_rehash_threshold = builtin("hash-table-rehash-threshold")(lambda t: (need_table("hash-table-rehash-threshold", 1, t), 1.0)[1])
sxhash = builtin("sxhash")(lambda x: _sxhash(x))

