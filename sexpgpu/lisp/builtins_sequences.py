"""The sequence functions (CLHS chapter 17) and every/some/notany/notevery, on lists, vectors and
strings. Keyword arguments follow CLHS 3.4.1.4 (parse_keys); :key nil means identity; with
:from-end the elements are visited, and :key and :test called, from the end."""

from __future__ import annotations

from functools import cmp_to_key
from typing import TYPE_CHECKING, Any, Callable, Optional

from .builtins import Lib, substitution_family, test_family, bits_of, lbool, need_index, parse_keys, short, type_error
from .builtins_strings import character_of
from .conditions import lisp_error
from .objects import BitVector
from .registry import builtin
from .types import NIL, T, Char, Cons, Symbol
from .typespecs import upgrades_to_bit

if TYPE_CHECKING:
    from .evaluator import Interpreter

TEST_KEYS = {"FROM-END", "TEST", "TEST-NOT", "START", "END", "KEY"}
IF_KEYS = {"FROM-END", "START", "END", "KEY"}
TWO_KEYS = {"FROM-END", "TEST", "TEST-NOT", "KEY", "START1", "END1", "START2", "END2"}


class SequenceType:
    """A sequence type specifier resolved: the kind of sequence, its length if the type fixes
    one, and the element type of a vector."""

    def __init__(self, kind: str, length: Optional[int] = None, element: Any = None) -> None:
        self.kind = kind  # "list" "vector" "bits" (a bit vector) "string" "null" "cons"
        self.length = length
        self.element = element  # None: any (the type says vector, not (vector type))


class Sequences(Lib):
    # -- result types -----------------------------------------------------------------------------
    def sequence_type(self, fn: str, spec: Any) -> SequenceType:
        """A result type for make-sequence, map, concatenate, coerce or merge."""
        spec = self.interp.types.expand(spec)
        name = spec.name if type(spec) is Symbol else (spec.car.name if type(spec) is Cons and type(spec.car) is Symbol else "")
        args = list(spec.cdr) if type(spec) is Cons and type(spec.cdr) is Cons else []
        simple = {
            "LIST": "list", "CONS": "cons", "NULL": "null", "VECTOR": "vector", "SIMPLE-VECTOR": "vector",
            "STRING": "string", "SIMPLE-STRING": "string", "BASE-STRING": "string", "SIMPLE-BASE-STRING": "string",
        }
        if type(spec) is Symbol and name in simple:
            return SequenceType(simple[name], element=T if name == "SIMPLE-VECTOR" else None)
        if name in ("BIT-VECTOR", "SIMPLE-BIT-VECTOR"):
            size = args[0] if args and type(args[0]) is int else None
            return SequenceType("bits", size)
        if type(spec) is Cons:
            if name in ("VECTOR", "SIMPLE-ARRAY", "ARRAY") or (name == "SIMPLE-VECTOR"):
                element = T if name == "SIMPLE-VECTOR" else (args[0] if args else None)
                if _is_star(element):
                    element = None
                size = args[0] if name == "SIMPLE-VECTOR" and args else (args[1] if len(args) > 1 else None)
                if name in ("SIMPLE-ARRAY", "ARRAY"):
                    dims = size
                    if type(dims) is Cons and dims.cdr is NIL:
                        size = dims.car
                    elif dims is not None and dims is not NIL and not (type(dims) is Symbol and dims.name == "*") and dims != 1:
                        raise lisp_error("E103", f"`{fn}`: {short(spec)} is not a one-dimensional sequence type", "TYPE-ERROR", spec)
                    else:
                        size = None
                length = size if type(size) is int else None
                if _is_character_type(element):
                    return SequenceType("string", length)
                if element is not None and upgrades_to_bit(self.interp.types.expand(element)):
                    return SequenceType("bits", length)
                return SequenceType("vector", length, element)
            if name in ("STRING", "SIMPLE-STRING", "BASE-STRING", "SIMPLE-BASE-STRING"):
                return SequenceType("string", args[0] if args and type(args[0]) is int else None)
            if name == "CONS":
                return SequenceType("cons")
        raise lisp_error("E103", f"`{fn}`: {short(spec)} is not a sequence type SexpGPU can make (list, vector, string, (vector type [size]))", "TYPE-ERROR", spec)

    def make(self, fn: str, items: list[Any], rtype: SequenceType, spec: Any) -> Any:
        """ITEMS as a fresh sequence of RTYPE, checked against the type's length and elements."""
        if rtype.length is not None and rtype.length != len(items):
            raise lisp_error("E103", f"`{fn}`: the result has {len(items)} elements, but {short(spec)} has {rtype.length}", "TYPE-ERROR", spec)
        if rtype.kind == "null" and items:
            raise lisp_error("E103", f"`{fn}`: a sequence of type null has no elements", "TYPE-ERROR", spec)
        if rtype.kind == "cons" and not items:
            raise lisp_error("E103", f"`{fn}`: a sequence of type cons cannot be empty", "TYPE-ERROR", spec)
        if rtype.kind == "string":
            return self.like(items, "", fn)
        if rtype.kind == "bits":
            return self.like(items, BitVector(), fn)
        if rtype.kind == "vector":
            if rtype.element is not None and rtype.element is not T:
                from .builtins import typep

                for x in items:
                    if not typep(self.interp, x, rtype.element):
                        raise lisp_error("E103", f"`{fn}`: {short(x)} is not of the element type {short(rtype.element)}", "TYPE-ERROR", x)
            return self.like(items, [])
        return self.like(items, NIL)

    def need_bits(self, fn: str, items: list[Any]) -> None:
        """What goes into a bit vector must be 0 or 1."""
        bits_of(fn, items)

    def nth_cell(self, x: Any, i: int) -> Any:
        """The Ith tail of the list X, or the atom that ends it first. The cells walked are
        charged, not the index ((elt nil 1000000) is a quick type-error), as the walk goes
        (a circular list ends at the budget)."""
        cell = x
        walked = 0
        while walked < i and type(cell) is Cons:
            cell = cell.cdr
            walked += 1
            if walked & 1023 == 0:
                self.charge(1024)
        self.charge(walked & 1023)
        return cell

    def cells_of_sequence(self, fn: str, seq: Any) -> list[Any]:
        if seq is not NIL and type(seq) is not Cons:
            raise type_error(fn, 1, "a sequence (list, vector or string)", seq)
        return self.cells(fn, 1, seq)

    # -- counting and searching --------------------------------------------------------------------
    def visit(self, fn: str, pos: int, seq: Any, keys: dict[str, Any]) -> tuple[list[Any], range]:
        """A sequence's elements and the indices to visit, in order, for :start :end :from-end."""
        items = self.items(fn, pos, seq)
        s, e = self.bounds(fn, keys, len(items))
        if keys.get("FROM-END", NIL) is not NIL:
            return items, range(e - 1, s - 1, -1)
        return items, range(s, e)

    def count(self, fn: str, seq: Any, match: Callable[[Any], bool], keys: dict[str, Any]) -> int:
        items, indices = self.visit(fn, 2, seq, keys)
        return sum(1 for i in indices if match(items[i]))

    def first_match(self, fn: str, seq: Any, match: Callable[[Any], bool], keys: dict[str, Any]) -> tuple[Any, Any]:
        """(element, index) of the first match in visiting order, or (nil, nil)."""
        items, indices = self.visit(fn, 2, seq, keys)
        if indices.step < 0 and (seq is NIL or type(seq) is Cons):
            # a list is searched from its start, the last match kept (as SBCL does)
            found: tuple[Any, Any] = (NIL, NIL)
            for i in reversed(indices):
                if match(items[i]):
                    found = items[i], i
            return found
        for i in indices:
            if match(items[i]):
                return items[i], i
        return NIL, NIL

    # -- removing and substituting -------------------------------------------------------------------
    def chosen(self, fn: str, items: list[Any], match: Callable[[Any], bool], keys: dict[str, Any]) -> set[int]:
        """The indices of the elements that match, at most :count of them, taken in visiting
        order (from the end with :from-end)."""
        s, e = self.bounds(fn, keys, len(items))
        count = keys.get("COUNT", NIL)
        if count is NIL:
            limit = len(items)
        elif isinstance(count, int) and type(count) is int:
            limit = max(count, 0)
        else:
            raise type_error(fn, 0, "an integer or nil (the :count)", count)
        indices = range(e - 1, s - 1, -1) if keys.get("FROM-END", NIL) is not NIL else range(s, e)
        out: set[int] = set()
        for i in indices:
            if len(out) >= limit:
                break
            if match(items[i]):
                out.add(i)
        return out

    def removed(self, fn: str, seq: Any, match: Callable[[Any], bool], keys: dict[str, Any]) -> Any:
        if type(seq) is str:
            items = self.items(fn, 2, seq)
            drop = self.chosen(fn, items, match, keys)
            return _fresh("".join(c.ch for i, c in enumerate(items) if i not in drop))
        items = self.items(fn, 2, seq)
        drop = self.chosen(fn, items, match, keys)
        return self.like([x for i, x in enumerate(items) if i not in drop], seq)

    def duplicates(self, fn: str, seq: Any, args: tuple[Any, ...]) -> Any:
        keys = parse_keys(fn, args, TEST_KEYS, 2)
        test = self.test_fn(fn, keys)
        key = self.key_fn(keys) or _identity
        items = self.items(fn, 1, seq)
        s, e = self.bounds(fn, keys, len(items))
        keyed = [key(x) for x in items[s:e]]
        n = len(keyed)
        self.charge(n * (n - 1) // 2)
        if keys.get("FROM-END", NIL) is not NIL:
            drop = {s + i for i in range(n) if any(test(keyed[i], keyed[j]) for j in range(i))}
        else:
            drop = {s + i for i in range(n) if any(test(keyed[i], keyed[j]) for j in range(i + 1, n))}
        return self.like([x for i, x in enumerate(items) if i not in drop], seq, fn)

    def substituted(self, fn: str, new: Any, seq: Any, match: Callable[[Any], bool], keys: dict[str, Any], in_place: bool) -> Any:
        items = self.items(fn, 3, seq)
        change = self.chosen(fn, items, match, keys)
        if in_place and (type(seq) is list or type(seq) is BitVector):
            if type(seq) is BitVector and change:
                self.need_bits(fn, [new])
            for i in change:
                seq[i] = new
            return seq
        if in_place and type(seq) is Cons:
            for i, cell in enumerate(self.cells(fn, 3, seq)):
                if i in change:
                    cell.car = new
            return seq
        return self.like([new if i in change else x for i, x in enumerate(items)], seq, fn)

    # -- ordering, joining ---------------------------------------------------------------------------
    def sorted_items(self, fn: str, seq: Any, pred: Any, args: tuple[Any, ...]) -> Any:
        keys = parse_keys(fn, args, {"KEY"}, 3)
        items = self.items(fn, 1, seq)
        less = self.predicate2(pred)
        key = self.key_fn(keys) or _identity
        keyed = [(key(x), x) for x in items]
        self.charge(len(items) * max(1, len(items).bit_length()))

        def compare(a: tuple[Any, Any], b: tuple[Any, Any]) -> int:
            if less(a[0], b[0]):
                return -1
            if less(b[0], a[0]):
                return 1
            return 0

        keyed.sort(key=cmp_to_key(compare))
        return self.like([x for _, x in keyed], seq, fn)

    # -- quantifiers ----------------------------------------------------------------------------------
    def quantify(self, fn: str, pred: Any, seqs: tuple[Any, ...]) -> Any:
        """Call PRED on successive elements; the first true result (some) or nil."""
        lists = [self.items(fn, i, s) for i, s in enumerate(seqs, 2)]
        f = self.fnn(pred)
        for i in range(min(len(s) for s in lists)):
            yield_value = f(*(s[i] for s in lists))
            if fn in ("every", "notevery"):
                if yield_value is NIL:
                    return NIL
            elif yield_value is not NIL:
                return yield_value
        return T if fn in ("every", "notevery") else NIL


# -- basics -----------------------------------------------------------------------------------
@builtin("length", context=Sequences)
def length(lib: Sequences, seq: Any) -> Any:
    t = type(seq)
    if t is str or t is list or t is BitVector:
        return len(seq)
    if seq is NIL:
        return 0
    if t is not Cons:
        raise type_error("length", 1, "a sequence (list, vector or string)", seq)
    # Floyd: a circular list is found in time proportional to its cycle, not the budget
    slow = fast = seq
    n = 0
    while True:
        for _ in range(2):
            fast = fast.cdr
            n += 1
            if fast is NIL:
                lib.charge(n)
                return n
            if type(fast) is not Cons:
                lib.charge(n)
                raise type_error("length", 1, "a proper sequence", seq)
        slow = slow.cdr
        if fast is slow:
            lib.charge(n)
            raise lisp_error("E103", "`length`: argument 1 must be a proper sequence, got a circular list", "TYPE-ERROR", seq)
        if n % 65536 == 0:
            lib.charge(65536)
            n -= 65536


@builtin("sequencep")
def sequencep(x: Any) -> Any:
    return lbool(x is NIL or type(x) in (Cons, list, str))


@builtin("identity")
def identity(x: Any) -> Any:
    return x


@builtin("elt", context=Sequences)
def elt(lib: Sequences, seq: Any, i: Any) -> Any:
    need_index("elt", 2, i)
    t = type(seq)
    if t is list or t is str or t is BitVector:
        if i >= len(seq):
            raise lisp_error("E103", f"`elt`: index {i} is out of bounds for a sequence of length {len(seq)}", "TYPE-ERROR", i)
        return Char(seq[i]) if t is str else seq[i]
    if seq is not NIL and t is not Cons:
        raise type_error("elt", 1, "a sequence (list, vector or string)", seq)
    cell = lib.nth_cell(seq, i)
    if type(cell) is not Cons:
        raise lisp_error("E103", f"`elt`: index {i} is out of bounds for a sequence of length {length(lib, seq) if cell is NIL else 'shorter than the index'}", "TYPE-ERROR", i)
    return cell.car


@builtin("%set-elt", context=Sequences)
def p_set_elt(lib: Sequences, seq: Any, i: Any, value: Any) -> Any:
    need_index("(setf elt)", 2, i)
    t = type(seq)
    if t is str:
        raise lisp_error("E109", "strings are immutable in SexpGPU; build a new one with concatenate or format", "PROGRAM-ERROR")
    if t is list or t is BitVector:
        if i >= len(seq):
            raise lisp_error("E103", f"(setf elt): index {i} is out of bounds for a vector of length {len(seq)}", "TYPE-ERROR", i)
        if t is BitVector:
            lib.need_bits("(setf elt)", [value])
        seq[i] = value
        return value
    if seq is not NIL and t is not Cons:
        raise type_error("(setf elt)", 1, "a sequence (list, vector or string)", seq)
    cell = lib.nth_cell(seq, i)
    if type(cell) is not Cons:
        raise lisp_error("E103", f"(setf elt): index {i} is past the end of the list", "TYPE-ERROR", i)
    cell.car = value
    return value


@builtin("subseq", context=Sequences)
def subseq(lib: Sequences, seq: Any, start: Any, end: Any = NIL) -> Any:
    if type(seq) is str:
        s, e = lib.bounds("subseq", {"START": start, "END": end}, len(seq))
        lib.alloc((e - s) // 8)
        lib.charge((e - s) // 8)
        return _fresh(seq[s:e])
    items = lib.items("subseq", 1, seq)
    s, e = lib.bounds("subseq", {"START": start, "END": end}, len(items))
    return lib.like(items[s:e], seq)


@builtin("%set-subseq", context=Sequences)
def p_set_subseq(lib: Sequences, seq: Any, start: Any, *rest: Any) -> Any:
    """(setf (subseq seq start [end]) new): replace the elements, return NEW."""
    if not rest or len(rest) > 2:
        raise lisp_error("E102", "`(setf subseq)` takes a sequence, a start, an optional end and a value", "PROGRAM-ERROR")
    end = rest[0] if len(rest) == 2 else NIL
    new = rest[-1]
    replace(lib, seq, new, _kw(lib.interp, "START1"), start, _kw(lib.interp, "END1"), end)
    return new


@builtin("copy-seq", context=Sequences)
def copy_seq(lib: Sequences, seq: Any) -> Any:
    if type(seq) is str:
        lib.alloc(len(seq) // 8)
        lib.charge(len(seq) // 8)
        return _fresh(seq)
    return lib.like(lib.items("copy-seq", 1, seq), seq)


@builtin("reverse", context=Sequences)
def reverse(lib: Sequences, seq: Any) -> Any:
    if type(seq) is str:
        lib.alloc(len(seq) // 8)
        lib.charge(len(seq) // 8)
        return _fresh(seq[::-1])
    return lib.like(lib.items("reverse", 1, seq)[::-1], seq)


@builtin("nreverse", context=Sequences)
def nreverse(lib: Sequences, seq: Any) -> Any:
    return reverse(lib, seq)


@builtin("fill", context=Sequences)
def fill(lib: Sequences, seq: Any, item: Any, *args: Any) -> Any:
    keys = parse_keys("fill", args, {"START", "END"}, 3)
    if type(seq) is str:
        raise lisp_error("E109", "strings are immutable in SexpGPU; build a new one with make-string or concatenate", "PROGRAM-ERROR")
    if type(seq) is list or type(seq) is BitVector:
        s, e = lib.bounds("fill", keys, len(seq))
        lib.charge(e - s)
        if type(seq) is BitVector:
            lib.need_bits("fill", [item])
        seq[s:e] = [item] * (e - s)
        return seq
    cells = lib.cells_of_sequence("fill", seq)
    s, e = lib.bounds("fill", keys, len(cells))
    for cell in cells[s:e]:
        cell.car = item
    return seq


@builtin("replace", context=Sequences)
def replace(lib: Sequences, seq1: Any, seq2: Any, *args: Any) -> Any:
    keys = parse_keys("replace", args, {"START1", "END1", "START2", "END2"}, 3)
    if type(seq1) is str:
        raise lisp_error("E109", "strings are immutable in SexpGPU; build a new one with concatenate or subseq", "PROGRAM-ERROR")
    source = lib.items("replace", 2, seq2)
    s2, e2 = lib.bounds("replace", keys, len(source), "START2", "END2")
    source = source[s2:e2]  # copied first: seq2 may be seq1
    if type(seq1) is list or type(seq1) is BitVector:
        s1, e1 = lib.bounds("replace", keys, len(seq1), "START1", "END1")
        n = min(e1 - s1, len(source))
        if type(seq1) is BitVector:
            lib.need_bits("replace", source[:n])
        seq1[s1 : s1 + n] = source[:n]
        return seq1
    cells = lib.cells_of_sequence("replace", seq1)
    s1, e1 = lib.bounds("replace", keys, len(cells), "START1", "END1")
    for cell, value in zip(cells[s1:e1], source):
        cell.car = value
    return seq1


@builtin("make-sequence", context=Sequences)
def make_sequence(lib: Sequences, rtype: Any, size: Any, *args: Any) -> Any:
    keys = parse_keys("make-sequence", args, {"INITIAL-ELEMENT"}, 3)
    need_index("make-sequence", 2, size)
    kind = lib.sequence_type("make-sequence", rtype)
    lib.alloc(size if kind.kind != "string" else size // 8)
    default = Char(" ") if kind.kind == "string" else (0 if kind.kind == "bits" or (kind.kind == "vector" and kind.element not in (None, T)) else NIL)
    init = keys.get("INITIAL-ELEMENT", default)
    if kind.kind == "string" and type(init) is not Char:
        raise type_error("make-sequence", 4, "a character (the elements of a string)", init)
    return lib.make("make-sequence", [init] * size, kind, rtype)


# -- mapping ----------------------------------------------------------------------------------
@builtin("map", context=Sequences)
def map_(lib: Sequences, rtype: Any, fn: Any, seq: Any, *more: Any) -> Any:
    seqs = [lib.items("map", i, s) for i, s in enumerate((seq, *more), 3)]
    kind = None if rtype is NIL else lib.sequence_type("map", rtype)
    f = lib.fnn(fn)
    n = min(len(s) for s in seqs)
    values = [f(*(s[i] for s in seqs)) for i in range(n)]
    if kind is None:
        return NIL
    return lib.make("map", values, kind, rtype)


@builtin("map-into", context=Sequences)
def map_into(lib: Sequences, result: Any, fn: Any, *seqs: Any) -> Any:
    f = lib.fnn(fn)
    sources = [lib.items("map-into", i, s) for i, s in enumerate(seqs, 3)]
    if type(result) is str:
        raise lisp_error("E109", "strings are immutable in SexpGPU; map into a vector or build a string with map 'string", "PROGRAM-ERROR")
    if type(result) is list or type(result) is BitVector:
        n = min([len(result), *(len(s) for s in sources)])
        values = [f(*(s[i] for s in sources)) for i in range(n)]
        if type(result) is BitVector:
            lib.need_bits("map-into", values)
        result[:n] = values
        return result
    cells = lib.cells_of_sequence("map-into", result)
    n = min([len(cells), *(len(s) for s in sources)])
    for i in range(n):
        cells[i].car = f(*(s[i] for s in sources))
    return result


@builtin("reduce", context=Sequences)
def reduce(lib: Sequences, fn: Any, seq: Any, *args: Any) -> Any:
    keys = parse_keys("reduce", args, {"INITIAL-VALUE", "FROM-END", "KEY", "START", "END"}, 3)
    items = lib.items("reduce", 2, seq)
    s, e = lib.bounds("reduce", keys, len(items))
    items = items[s:e]
    from_end = keys.get("FROM-END", NIL) is not NIL
    key = lib.key_fn(keys)
    f = lib.fn2(fn)
    if from_end:
        items.reverse()
    if key is not None:
        items = [key(x) for x in items]
    if "INITIAL-VALUE" in keys:
        items.insert(0, keys["INITIAL-VALUE"])
    if not items:
        return lib.fnn(fn)()
    acc = items[0]
    for x in items[1:]:
        acc = f(x, acc) if from_end else f(acc, x)
    return acc


@builtin("search", context=Sequences)
def search(lib: Sequences, needle: Any, hay: Any, *args: Any) -> Any:
    keys = parse_keys("search", args, TWO_KEYS, 3)
    test = lib.test_fn("search", keys)
    key = lib.key_fn(keys) or _identity
    a = lib.items("search", 1, needle)
    s1, e1 = lib.bounds("search", keys, len(a), "START1", "END1")
    b = lib.items("search", 2, hay)
    s2, e2 = lib.bounds("search", keys, len(b), "START2", "END2")
    pattern, text = a[s1:e1], b[s2:e2]
    m = len(pattern)
    from_end = keys.get("FROM-END", NIL) is not NIL
    starts = range(len(text) - m + 1)
    if from_end and type(hay) is not Cons:
        starts = starts[::-1]
    found: Any = NIL
    for i in starts:
        lib.charge(m)
        if all(test(key(pattern[j]), key(text[i + j])) for j in range(m)):
            found = s2 + i
            if not from_end or type(hay) is not Cons:
                return found
    return found


@builtin("mismatch", context=Sequences)
def mismatch(lib: Sequences, seq1: Any, seq2: Any, *args: Any) -> Any:
    keys = parse_keys("mismatch", args, TWO_KEYS, 3)
    test = lib.test_fn("mismatch", keys)
    key = lib.key_fn(keys) or _identity
    a = lib.items("mismatch", 1, seq1)
    s1, e1 = lib.bounds("mismatch", keys, len(a), "START1", "END1")
    b = lib.items("mismatch", 2, seq2)
    s2, e2 = lib.bounds("mismatch", keys, len(b), "START2", "END2")
    a, b = a[s1:e1], b[s2:e2]
    n = min(len(a), len(b))
    if keys.get("FROM-END", NIL) is not NIL:
        for i in range(1, n + 1):
            if not test(key(a[-i]), key(b[-i])):
                return s1 + len(a) - i + 1
        return NIL if len(a) == len(b) else s1 + len(a) - n
    for i in range(n):
        if not test(key(a[i]), key(b[i])):
            return s1 + i
    return NIL if len(a) == len(b) else s1 + n


@builtin("remove-duplicates", context=Sequences)
def remove_duplicates(lib: Sequences, seq: Any, *args: Any) -> Any:
    return lib.duplicates("remove-duplicates", seq, args)


@builtin("delete-duplicates", context=Sequences)
def delete_duplicates(lib: Sequences, seq: Any, *args: Any) -> Any:
    return lib.duplicates("delete-duplicates", seq, args)


@builtin("sort", context=Sequences)
def sort(lib: Sequences, seq: Any, pred: Any, *args: Any) -> Any:
    return lib.sorted_items("sort", seq, pred, args)


@builtin("stable-sort", context=Sequences)
def stable_sort(lib: Sequences, seq: Any, pred: Any, *args: Any) -> Any:
    return lib.sorted_items("stable-sort", seq, pred, args)


@builtin("merge", context=Sequences)
def merge(lib: Sequences, rtype: Any, seq1: Any, seq2: Any, pred: Any, *args: Any) -> Any:
    keys = parse_keys("merge", args, {"KEY"}, 5)
    kind = lib.sequence_type("merge", rtype)
    a, b = lib.items("merge", 2, seq1), lib.items("merge", 3, seq2)
    less = lib.predicate2(pred)
    key = lib.key_fn(keys) or _identity
    out: list[Any] = []
    i = j = 0
    while i < len(a) and j < len(b):
        # stable: an element of seq2 goes first only when it is strictly less
        if less(key(b[j]), key(a[i])):
            out.append(b[j])
            j += 1
        else:
            out.append(a[i])
            i += 1
    out += a[i:] + b[j:]
    return lib.make("merge", out, kind, rtype)


@builtin("concatenate", context=Sequences)
def concatenate(lib: Sequences, rtype: Any, *seqs: Any) -> Any:
    kind = lib.sequence_type("concatenate", rtype)
    if kind.kind == "string" and all(type(s) is str for s in seqs):
        total = sum(len(s) for s in seqs)
        lib.alloc(total // 8 + 1)  # before the string exists
        lib.charge(total // 8)
        text = "".join(seqs)
        if kind.length is not None and kind.length != len(text):
            raise lisp_error("E103", f"`concatenate`: the result has {len(text)} elements, but {short(rtype)} has {kind.length}", "TYPE-ERROR", rtype)
        return _fresh(text) if len(seqs) == 1 else text
    total = 0
    for i, s in enumerate(seqs, 2):
        total += lib.length("concatenate", i, s)
    lib.alloc(total)
    items: list[Any] = []
    for i, s in enumerate(seqs, 2):
        items.extend(lib.items("concatenate", i, s))
    return lib.make("concatenate", items, kind, rtype)


@builtin("coerce", context=Sequences)
def coerce(lib: Sequences, x: Any, rtype: Any) -> Any:
    """(coerce object result-type) for sequence types, character, the float types,
    rational/real/number/t and function."""
    rtype = lib.interp.types.expand(rtype)
    name = rtype.name if type(rtype) is Symbol else (rtype.car.name if type(rtype) is Cons and type(rtype.car) is Symbol else "")
    from .builtins import is_num, typep

    if rtype is T or name == "T":
        return x
    if name == "SEQUENCE" and type(rtype) is Symbol:
        if x is NIL or type(x) in (Cons, list, str):
            return x
        raise type_error("coerce", 1, "a sequence", x)
    if name in ("FLOAT", "DOUBLE-FLOAT", "SINGLE-FLOAT", "SHORT-FLOAT", "LONG-FLOAT"):
        if not is_num(x):
            raise type_error("coerce", 1, "a real number", x)
        try:
            return float(x)
        except OverflowError:
            raise lisp_error("E108", f"`coerce`: {short(x)} is too large for a double", "FLOATING-POINT-OVERFLOW") from None
    if name in ("NUMBER", "REAL", "RATIONAL", "INTEGER", "RATIO", "FIXNUM", "BIGNUM"):
        if not typep(lib.interp, x, rtype):
            raise type_error("coerce", 1, f"of type {short(rtype)}", x)
        return x
    if name == "CHARACTER":
        return character_of(x, "coerce")
    if name == "FUNCTION":
        if type(x) is Cons and type(x.car) is Symbol and x.car.name == "LAMBDA":
            return lib.interp.ev(x)
        return lib.interp.function_value(x)
    kind = lib.sequence_type("coerce", rtype)
    if kind.kind in ("list", "cons", "null") and (x is NIL or type(x) is Cons):
        return lib.make("coerce", lib.items("coerce", 1, x), kind, rtype) if kind.kind != "list" else x
    if kind.kind == "string" and type(x) is str and kind.length in (None, len(x)):
        return x
    if kind.kind == "vector" and kind.element is None and type(x) in (list, str, BitVector) and kind.length in (None, len(x)):
        return x
    if kind.kind == "bits" and type(x) is BitVector and kind.length in (None, len(x)):
        return x
    if kind.kind == "vector" and type(x) is list and kind.length in (None, len(x)) and kind.element is T:
        return x
    return lib.make("coerce", lib.items("coerce", 1, x), kind, rtype)


@builtin("every", context=Sequences)
def every(lib: Sequences, pred: Any, seq: Any, *more: Any) -> Any:
    return lib.quantify("every", pred, (seq, *more))


@builtin("some", context=Sequences)
def some(lib: Sequences, pred: Any, seq: Any, *more: Any) -> Any:
    return lib.quantify("some", pred, (seq, *more))


@builtin("notany", context=Sequences)
def notany(lib: Sequences, pred: Any, seq: Any, *more: Any) -> Any:
    return lbool(lib.quantify("notany", pred, (seq, *more)) is NIL)


@builtin("notevery", context=Sequences)
def notevery(lib: Sequences, pred: Any, seq: Any, *more: Any) -> Any:
    return lbool(lib.quantify("notevery", pred, (seq, *more)) is NIL)

def _identity(x: Any) -> Any:
    return x


def _fresh(s: str) -> str:
    """A string object other than S when that is possible (CPython shares empty and
    one-character strings)."""
    if len(s) < 2:
        return s
    return s[:1] + s[1:]


def _is_character_type(element: Any) -> bool:
    return type(element) is Symbol and element.name in ("CHARACTER", "BASE-CHAR", "STANDARD-CHAR", "EXTENDED-CHAR")


def _is_star(x: Any) -> bool:
    return type(x) is Symbol and x.name == "*"


def _kw(interp: "Interpreter", name: str) -> Symbol:
    return interp.kw(name)


# the X, X-if and X-if-not families (CLHS 17.2)
count, count_if, count_if_not = test_family("count", Sequences, TEST_KEYS, IF_KEYS, Sequences.count)
find, find_if, find_if_not = test_family("find", Sequences, TEST_KEYS, IF_KEYS, lambda lib, fn, seq, match, keys: lib.first_match(fn, seq, match, keys)[0])
position, position_if, position_if_not = test_family("position", Sequences, TEST_KEYS, IF_KEYS, lambda lib, fn, seq, match, keys: lib.first_match(fn, seq, match, keys)[1])
remove, remove_if, remove_if_not = test_family("remove", Sequences, TEST_KEYS | {"COUNT"}, IF_KEYS | {"COUNT"}, Sequences.removed)
delete, delete_if, delete_if_not = test_family("delete", Sequences, TEST_KEYS | {"COUNT"}, IF_KEYS | {"COUNT"}, Sequences.removed)
substitute, substitute_if, substitute_if_not = substitution_family(
    "substitute", Sequences, TEST_KEYS | {"COUNT"}, IF_KEYS | {"COUNT"},
    lambda lib, fn, new, seq, match, keys: lib.substituted(fn, new, seq, match, keys, False))
nsubstitute, nsubstitute_if, nsubstitute_if_not = substitution_family(
    "nsubstitute", Sequences, TEST_KEYS | {"COUNT"}, IF_KEYS | {"COUNT"},
    lambda lib, fn, new, seq, match, keys: lib.substituted(fn, new, seq, match, keys, True))
