"""Hash tables (CLHS 18)."""


from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any

from .builtins import (
    Registry,
    lbool,
    parse_keys,
    short,
    to_lisp_list,
    type_error,
)
from .conditions import lisp_error
from .objects import BitVector, Builtin, HashTable
from .types import NIL, T, Char, Cons, MultipleValues, Symbol

if TYPE_CHECKING:
    pass

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


def install(reg: Registry) -> None:
    interp = reg.interp
    add = reg.add

    # -- hash tables ----------------------------------------------------------------------------------------
    def make_hash_table(*args: Any) -> Any:
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
        return HashTable(name, interp.charge)

    def need_table(fn: str, pos: int, x: Any) -> HashTable:
        if type(x) is not HashTable:
            raise type_error(fn, pos, "a hash table", x)
        return x

    def gethash(key: Any, table: Any, default: Any = NIL) -> Any:
        entry = need_table("gethash", 2, table).entries.get(table.key(key))
        if entry is None:
            return MultipleValues((default, NIL))
        return MultipleValues((entry[1], T))

    def puthash(key: Any, table: Any, *rest: Any) -> Any:
        """(setf (gethash key table [default]) value): the value comes last."""
        if not 1 <= len(rest) <= 2:
            raise lisp_error("E102", "`(setf gethash)` takes a key, a table, an optional default and a value", "PROGRAM-ERROR")
        value = rest[-1]
        interp.alloc(1)
        need_table("(setf gethash)", 2, table).entries[table.key(key)] = (key, value)
        return value

    def remhash(key: Any, table: Any) -> Any:
        return lbool(need_table("remhash", 2, table).entries.pop(table.key(key), None) is not None)

    def clrhash(table: Any) -> Any:
        need_table("clrhash", 1, table).entries.clear()
        return table

    def maphash(fn: Any, table: Any) -> Any:
        f = interp.function_value(fn)
        for key, value in list(need_table("maphash", 2, table).entries.values()):
            interp.call(f, key, value)
        return NIL

    add("make-hash-table", make_hash_table)
    add("gethash", gethash)
    add("%puthash", puthash)
    add("remhash", remhash)
    add("clrhash", clrhash)
    add("maphash", maphash)
    def hash_entries(table: Any) -> Any:

        return to_lisp_list([Cons(k, v) for k, v in need_table("maphash", 1, table).entries.values()])

    add("%hash-entries", hash_entries)
    add("hash-table-count", lambda t: len(need_table("hash-table-count", 1, t).entries))
    add("hash-table-test", lambda t: interp.sym(need_table("hash-table-test", 1, t).test))
    add("hash-table-size", lambda t: max(16, len(need_table("hash-table-size", 1, t).entries)))
    add("hash-table-rehash-size", lambda t: (need_table("hash-table-rehash-size", 1, t), 1.5)[1])
    add("hash-table-rehash-threshold", lambda t: (need_table("hash-table-rehash-threshold", 1, t), 1.0)[1])
    add("sxhash", lambda x: _sxhash(x))

