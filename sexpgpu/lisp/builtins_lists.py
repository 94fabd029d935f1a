"""List and sequence builtins. Functional arguments are called through the interpreter."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

from .builtins import (
    Registry,
    eql,
    from_items,
    lbool,
    list_items,
    need_index,
    need_list,
    need_sequence,
    parse_keys,
    seq_items,
    sort_items,
    to_lisp_list,
    type_error,
)
from .conditions import lisp_error
from .objects import Builtin, Closure
from .types import NIL, T, Char, Cons, primary

if TYPE_CHECKING:
    from .evaluator import Interpreter


def install(reg: Registry) -> None:
    interp = reg.interp
    ops = ListOps(interp)
    for name in [
        "cons", "car", "cdr", "list", "list*", "append", "nconc", "reverse", "nreverse", "length", "nth", "nthcdr",
        "rest", "last", "butlast", "member", "member-if", "assoc", "assoc-if", "rassoc", "getf", "remove", "remove-if",
        "remove-if-not", "delete", "delete-if", "delete-if-not", "find", "find-if", "find-if-not", "position", "position-if",
        "count", "count-if", "count-if-not", "mapcar", "mapc", "mapcan", "maplist", "mapl", "map", "reduce", "sort",
        "stable-sort", "subseq", "every", "some", "notany", "notevery", "copy-list", "copy-tree", "elt", "coerce", "iota",
        "make-list", "rplaca", "rplacd", "null", "listp", "consp", "atom", "endp", "adjoin", "remove-duplicates",
        "union", "intersection", "set-difference", "subsetp", "acons", "pairlis", "list-length", "vector", "make-array",
        "aref", "svref", "vectorp", "%aset", "%set-nth", "%set-elt", "%rplaca-value", "%rplacd-value", "%putf",
        "%remf", "fill", "substitute", "substitute-if", "search", "mismatch", "identity", "tailp", "ldiff", "revappend",
        "copy-seq", "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth", "sequencep",
    ]:
        reg.add(name, getattr(ops, "op_" + name.replace("%", "p_").replace("-", "_").replace("*", "_star")))
    for path in _cxr_paths():
        reg.add(f"c{path}r", _cxr(path))


def _cxr_paths() -> list[str]:
    out: list[str] = []
    for n in range(2, 5):
        for i in range(2**n):
            out.append("".join("a" if (i >> b) & 1 else "d" for b in range(n)))
    return out


def _cxr(path: str) -> Callable[[Any], Any]:
    name = f"c{path}r"

    def op(x: Any) -> Any:
        for step in reversed(path):
            if x is NIL:
                return NIL
            if type(x) is not Cons:
                raise type_error(name, 1, "a list", x)
            x = x.car if step == "a" else x.cdr
        return x

    return op


class ListOps:
    def __init__(self, interp: "Interpreter") -> None:
        self.interp = interp

    # -- helpers ---------------------------------------------------------------------------
    def call(self, fn: Any, *args: Any) -> Any:
        return self.interp.call(fn, *args)

    def test_fn(self, name: str, keys: dict[str, Any]) -> Callable[[Any, Any], bool]:
        key = keys.get("KEY", NIL)
        test = keys.get("TEST", NIL)
        test_not = keys.get("TEST-NOT", NIL)
        keyf: Callable[[Any], Any] = (lambda x: x) if key is NIL else self.function_of(key)
        if test_not is not NIL:
            fn = self.predicate_of(test_not)
            return lambda item, x: not fn(item, keyf(x))
        if test is NIL:
            if key is NIL:
                return eql
            return lambda item, x: eql(item, keyf(x))
        fn = self.predicate_of(test)
        if key is NIL:
            return fn
        return lambda item, x: fn(item, keyf(x))

    def predicate_of(self, designator: Any) -> Callable[[Any, Any], bool]:
        """A two-argument test as a Python predicate: the standard equality builtins
        directly, any other function called through the interpreter."""
        interp = self.interp
        fn = interp.function_value(designator)
        fast = interp.standard_tests.get(fn) if type(fn) is Builtin else None
        if fast is not None:
            return fast
        if type(fn) is Closure:
            return lambda a, b: primary(interp.call_closure(fn, (a, b))) is not NIL
        return lambda a, b: interp.call(fn, a, b) is not NIL

    def function_of(self, designator: Any) -> Callable[[Any], Any]:
        """A one-argument function (a :key) as a Python function."""
        interp = self.interp
        fn = interp.function_value(designator)
        if type(fn) is Closure:
            return lambda a: primary(interp.call_closure(fn, (a,)))
        return lambda a: interp.call(fn, a)

    def pred_fn(self, pred: Any, keys: dict[str, Any], negate: bool = False) -> Callable[[Any], bool]:
        key = keys.get("KEY", NIL)
        if key is NIL:
            return lambda x: (self.call(pred, x) is NIL) == negate
        return lambda x: (self.call(pred, self.call(key, x)) is NIL) == negate

    def bounds(self, name: str, keys: dict[str, Any], n: int) -> tuple[int, int]:
        start = keys.get("START", 0)
        end = keys.get("END", NIL)
        end = n if end is NIL else end
        if type(start) is not int or type(end) is not int or not 0 <= start <= end <= n:
            raise lisp_error("E103", f"`{name}`: bad bounds :start {start} :end {end} for a sequence of length {n}", "TYPE-ERROR")
        return start, end

    def alloc(self, n: int) -> None:
        self.interp.alloc(n)

    # -- conses ----------------------------------------------------------------------------
    def op_cons(self, a: Any, b: Any) -> Any:
        self.alloc(1)
        return Cons(a, b)

    def op_car(self, x: Any) -> Any:
        if type(x) is Cons:
            return x.car
        need_list("car", 1, x)
        return NIL

    def op_cdr(self, x: Any) -> Any:
        if type(x) is Cons:
            return x.cdr
        need_list("cdr", 1, x)
        return NIL

    def op_rest(self, x: Any) -> Any:
        if type(x) is Cons:
            return x.cdr
        need_list("rest", 1, x)
        return NIL

    def nth_of(self, name: str, n: int, x: Any) -> Any:
        need_list(name, 1, x)
        for _ in range(n):
            if type(x) is not Cons:
                return NIL
            x = x.cdr
        if type(x) is Cons:
            return x.car
        need_list(name, 1, x)
        return NIL

    def op_first(self, x: Any) -> Any:
        return self.nth_of("first", 0, x)

    def op_second(self, x: Any) -> Any:
        return self.nth_of("second", 1, x)

    def op_third(self, x: Any) -> Any:
        return self.nth_of("third", 2, x)

    def op_fourth(self, x: Any) -> Any:
        return self.nth_of("fourth", 3, x)

    def op_fifth(self, x: Any) -> Any:
        return self.nth_of("fifth", 4, x)

    def op_sixth(self, x: Any) -> Any:
        return self.nth_of("sixth", 5, x)

    def op_seventh(self, x: Any) -> Any:
        return self.nth_of("seventh", 6, x)

    def op_eighth(self, x: Any) -> Any:
        return self.nth_of("eighth", 7, x)

    def op_ninth(self, x: Any) -> Any:
        return self.nth_of("ninth", 8, x)

    def op_tenth(self, x: Any) -> Any:
        return self.nth_of("tenth", 9, x)

    def op_list(self, *xs: Any) -> Any:
        self.alloc(len(xs))
        return to_lisp_list(xs)

    def op_list_star(self, x: Any, *xs: Any) -> Any:
        items = [x, *xs]
        self.alloc(len(items))
        result = items[-1]
        for item in reversed(items[:-1]):
            result = Cons(item, result)
        return result

    def op_append(self, *xs: Any) -> Any:
        if not xs:
            return NIL
        result = xs[-1]
        for i in range(len(xs) - 2, -1, -1):
            items = list_items("append", i + 1, xs[i])
            self.alloc(len(items))
            for item in reversed(items):
                result = Cons(item, result)
        return result

    def op_nconc(self, *xs: Any) -> Any:
        return self.op_append(*xs)

    def op_revappend(self, x: Any, tail: Any) -> Any:
        for item in list_items("revappend", 1, x):
            tail = Cons(item, tail)
        return tail

    def op_reverse(self, x: Any) -> Any:
        items = seq_items("reverse", 1, x)
        self.alloc(len(items))
        return from_items(items[::-1], x)

    def op_nreverse(self, x: Any) -> Any:
        return self.op_reverse(x)

    def op_length(self, x: Any) -> Any:
        t = type(x)
        if t is str or t is list:
            return len(x)
        n = 0
        cell = x
        while type(cell) is Cons:
            n += 1
            cell = cell.cdr
        if cell is not NIL:
            raise type_error("length", 1, "a proper sequence", x)
        return n

    def op_list_length(self, x: Any) -> Any:
        return len(list_items("list-length", 1, x))

    def op_nth(self, n: Any, x: Any) -> Any:
        need_index("nth", 1, n)
        return self.nth_of("nth", n, x)

    def op_nthcdr(self, n: Any, x: Any) -> Any:
        need_index("nthcdr", 1, n)
        need_list("nthcdr", 2, x)
        for _ in range(n):
            if type(x) is not Cons:
                return NIL
            x = x.cdr
        return x

    def op_last(self, x: Any, n: Any = 1) -> Any:
        need_list("last", 1, x)
        need_index("last", 2, n)
        cells = []
        cell = x
        while type(cell) is Cons:
            cells.append(cell)
            cell = cell.cdr
        if n == 0:
            return cell
        if n >= len(cells):
            return x
        return cells[-n]

    def op_butlast(self, x: Any, n: Any = 1) -> Any:
        need_index("butlast", 2, n)
        items = []
        cell = need_list("butlast", 1, x)
        while type(cell) is Cons:
            items.append(cell.car)
            cell = cell.cdr
        return to_lisp_list(items[: max(len(items) - n, 0)])

    def op_ldiff(self, x: Any, obj: Any) -> Any:
        items = []
        cell = need_list("ldiff", 1, x)
        while type(cell) is Cons and cell is not obj:
            items.append(cell.car)
            cell = cell.cdr
        return to_lisp_list(items)

    def op_tailp(self, obj: Any, x: Any) -> Any:
        cell = need_list("tailp", 2, x)
        while type(cell) is Cons:
            if cell is obj:
                return T
            cell = cell.cdr
        return lbool(eql(cell, obj))

    def op_copy_list(self, x: Any) -> Any:
        need_list("copy-list", 1, x)
        items = []
        cell = x
        while type(cell) is Cons:
            items.append(cell.car)
            cell = cell.cdr
        self.alloc(len(items))
        return to_lisp_list(items) if cell is NIL else _with_tail(items, cell)

    def op_copy_seq(self, x: Any) -> Any:
        items = seq_items("copy-seq", 1, x)
        self.alloc(len(items))
        return from_items(items, x)

    def op_copy_tree(self, x: Any) -> Any:
        if type(x) is not Cons:
            return x
        self.alloc(1)
        return Cons(self.op_copy_tree(x.car), self.op_copy_tree(x.cdr))

    def op_make_list(self, n: Any, *args: Any) -> Any:
        need_index("make-list", 1, n)
        keys = parse_keys("make-list", args, {"INITIAL-ELEMENT"}, 2)
        self.alloc(n)
        return to_lisp_list([keys.get("INITIAL-ELEMENT", NIL)] * n)

    def op_iota(self, n: Any, *args: Any) -> Any:
        need_index("iota", 1, n)
        keys = parse_keys("iota", args, {"START", "STEP"}, 2)
        start, step = keys.get("START", 0), keys.get("STEP", 1)
        self.alloc(n)
        return to_lisp_list([start + i * step for i in range(n)])

    def op_rplaca(self, x: Any, v: Any) -> Any:
        if type(x) is not Cons:
            raise type_error("rplaca", 1, "a cons", x)
        x.car = v
        return x

    def op_rplacd(self, x: Any, v: Any) -> Any:
        if type(x) is not Cons:
            raise type_error("rplacd", 1, "a cons", x)
        x.cdr = v
        return x

    def op_p_rplaca_value(self, x: Any, v: Any) -> Any:
        self.op_rplaca(x, v)
        return v

    def op_p_rplacd_value(self, x: Any, v: Any) -> Any:
        self.op_rplacd(x, v)
        return v

    def op_p_set_nth(self, n: Any, x: Any, v: Any) -> Any:
        need_index("(setf nth)", 1, n)
        cell = x
        for _ in range(n):
            if type(cell) is not Cons:
                break
            cell = cell.cdr
        if type(cell) is not Cons:
            raise lisp_error("E103", f"(setf nth): index {n} is past the end of the list", "TYPE-ERROR")
        cell.car = v
        return v

    def op_p_set_elt(self, seq: Any, i: Any, v: Any) -> Any:
        if type(seq) is list:
            return self.op_p_aset(seq, i, v)
        return self.op_p_set_nth(i, seq, v)

    def op_null(self, x: Any) -> Any:
        return lbool(x is NIL)

    def op_listp(self, x: Any) -> Any:
        return lbool(x is NIL or type(x) is Cons)

    def op_consp(self, x: Any) -> Any:
        return lbool(type(x) is Cons)

    def op_atom(self, x: Any) -> Any:
        return lbool(type(x) is not Cons)

    def op_endp(self, x: Any) -> Any:
        need_list("endp", 1, x)
        return lbool(x is NIL)

    def op_sequencep(self, x: Any) -> Any:
        return lbool(x is NIL or type(x) in (Cons, list, str))

    def op_identity(self, x: Any) -> Any:
        return x

    # -- searching ---------------------------------------------------------------------------
    def op_member(self, item: Any, x: Any, *args: Any) -> Any:
        keys = parse_keys("member", args, {"TEST", "KEY", "TEST-NOT"}, 3)
        test = self.test_fn("member", keys)
        cell = need_list("member", 2, x)
        while type(cell) is Cons:
            if test(item, cell.car):
                return cell
            cell = cell.cdr
        return NIL

    def op_member_if(self, pred: Any, x: Any, *args: Any) -> Any:
        keys = parse_keys("member-if", args, {"KEY"}, 3)
        p = self.pred_fn(pred, keys)
        cell = need_list("member-if", 2, x)
        while type(cell) is Cons:
            if p(cell.car):
                return cell
            cell = cell.cdr
        return NIL

    def op_assoc(self, item: Any, alist: Any, *args: Any) -> Any:
        keys = parse_keys("assoc", args, {"TEST", "KEY", "TEST-NOT"}, 3)
        test = self.test_fn("assoc", keys)
        for entry in list_items("assoc", 2, alist):
            if entry is NIL:
                continue
            if type(entry) is not Cons:
                raise type_error("assoc", 2, "an association list", alist)
            if test(item, entry.car):
                return entry
        return NIL

    def op_assoc_if(self, pred: Any, alist: Any, *args: Any) -> Any:
        keys = parse_keys("assoc-if", args, {"KEY"}, 3)
        p = self.pred_fn(pred, keys)
        for entry in list_items("assoc-if", 2, alist):
            if type(entry) is Cons and p(entry.car):
                return entry
        return NIL

    def op_rassoc(self, item: Any, alist: Any, *args: Any) -> Any:
        keys = parse_keys("rassoc", args, {"TEST", "KEY", "TEST-NOT"}, 3)
        test = self.test_fn("rassoc", keys)
        for entry in list_items("rassoc", 2, alist):
            if type(entry) is Cons and test(item, entry.cdr):
                return entry
        return NIL

    def op_getf(self, plist: Any, indicator: Any, default: Any = NIL) -> Any:
        items = list_items("getf", 1, plist)
        for k, v in zip(items[::2], items[1::2]):
            if k is indicator or eql(k, indicator):
                return v
        return default

    def op_p_putf(self, plist: Any, indicator: Any, value: Any) -> Any:
        cell = plist
        while type(cell) is Cons and type(cell.cdr) is Cons:
            if eql(cell.car, indicator):
                cell.cdr.car = value
                return plist
            cell = cell.cdr.cdr
        return Cons(indicator, Cons(value, plist))

    def op_p_remf(self, plist: Any, indicator: Any) -> Any:
        items = list_items("remf", 1, plist)
        out: list[Any] = []
        found = False
        for k, v in zip(items[::2], items[1::2]):
            if not found and eql(k, indicator):
                found = True
                continue
            out += [k, v]
        return to_lisp_list(out) if found else plist

    def op_acons(self, k: Any, v: Any, alist: Any) -> Any:
        return Cons(Cons(k, v), alist)

    def op_pairlis(self, keys: Any, values: Any, alist: Any = NIL) -> Any:
        ks, vs = list_items("pairlis", 1, keys), list_items("pairlis", 2, values)
        if len(ks) != len(vs):
            raise lisp_error("E103", "`pairlis`: the key and value lists differ in length", "TYPE-ERROR")
        for k, v in reversed(list(zip(ks, vs))):
            alist = Cons(Cons(k, v), alist)
        return alist

    def filtered(self, name: str, seq: Any, keep: Callable[[Any], bool], keys: dict[str, Any]) -> Any:
        items = seq_items(name, 2, seq)
        start, end = self.bounds(name, keys, len(items))
        count = keys.get("COUNT", NIL)
        limit = len(items) if count is NIL else count
        from_end = keys.get("FROM-END", NIL) is not NIL
        indices = range(end - 1, start - 1, -1) if from_end else range(start, end)
        drop: set[int] = set()
        for i in indices:
            if len(drop) >= limit:
                break
            if not keep(items[i]):
                drop.add(i)
        self.alloc(len(items))
        return from_items([x for i, x in enumerate(items) if i not in drop], seq)

    def op_remove(self, item: Any, seq: Any, *args: Any) -> Any:
        keys = parse_keys("remove", args, {"TEST", "KEY", "TEST-NOT", "COUNT", "START", "END", "FROM-END"}, 3)
        test = self.test_fn("remove", keys)
        return self.filtered("remove", seq, lambda x: not test(item, x), keys)

    def op_remove_if(self, pred: Any, seq: Any, *args: Any) -> Any:
        keys = parse_keys("remove-if", args, {"KEY", "COUNT", "START", "END", "FROM-END"}, 3)
        p = self.pred_fn(pred, keys)
        return self.filtered("remove-if", seq, lambda x: not p(x), keys)

    def op_remove_if_not(self, pred: Any, seq: Any, *args: Any) -> Any:
        keys = parse_keys("remove-if-not", args, {"KEY", "COUNT", "START", "END", "FROM-END"}, 3)
        p = self.pred_fn(pred, keys)
        return self.filtered("remove-if-not", seq, p, keys)

    def op_delete(self, item: Any, seq: Any, *args: Any) -> Any:
        return self.op_remove(item, seq, *args)

    def op_delete_if(self, pred: Any, seq: Any, *args: Any) -> Any:
        return self.op_remove_if(pred, seq, *args)

    def op_delete_if_not(self, pred: Any, seq: Any, *args: Any) -> Any:
        return self.op_remove_if_not(pred, seq, *args)

    def op_substitute(self, new: Any, old: Any, seq: Any, *args: Any) -> Any:
        keys = parse_keys("substitute", args, {"TEST", "KEY", "TEST-NOT"}, 4)
        test = self.test_fn("substitute", keys)
        return from_items([new if test(old, x) else x for x in seq_items("substitute", 3, seq)], seq)

    def op_substitute_if(self, new: Any, pred: Any, seq: Any, *args: Any) -> Any:
        keys = parse_keys("substitute-if", args, {"KEY"}, 4)
        p = self.pred_fn(pred, keys)
        return from_items([new if p(x) else x for x in seq_items("substitute-if", 3, seq)], seq)

    def search_index(self, name: str, seq: Any, match: Callable[[Any], bool], keys: dict[str, Any]) -> Optional[int]:
        items = seq_items(name, 2, seq)
        start, end = self.bounds(name, keys, len(items))
        indices = range(end - 1, start - 1, -1) if keys.get("FROM-END", NIL) is not NIL else range(start, end)
        for i in indices:
            if match(items[i]):
                return i
        return None

    def op_find(self, item: Any, seq: Any, *args: Any) -> Any:
        keys = parse_keys("find", args, {"TEST", "KEY", "TEST-NOT", "START", "END", "FROM-END"}, 3)
        test = self.test_fn("find", keys)
        i = self.search_index("find", seq, lambda x: test(item, x), keys)
        return NIL if i is None else seq_items("find", 2, seq)[i]

    def op_find_if(self, pred: Any, seq: Any, *args: Any) -> Any:
        keys = parse_keys("find-if", args, {"KEY", "START", "END", "FROM-END"}, 3)
        p = self.pred_fn(pred, keys)
        i = self.search_index("find-if", seq, p, keys)
        return NIL if i is None else seq_items("find-if", 2, seq)[i]

    def op_find_if_not(self, pred: Any, seq: Any, *args: Any) -> Any:
        keys = parse_keys("find-if-not", args, {"KEY", "START", "END", "FROM-END"}, 3)
        p = self.pred_fn(pred, keys, negate=True)
        i = self.search_index("find-if-not", seq, p, keys)
        return NIL if i is None else seq_items("find-if-not", 2, seq)[i]

    def op_position(self, item: Any, seq: Any, *args: Any) -> Any:
        keys = parse_keys("position", args, {"TEST", "KEY", "TEST-NOT", "START", "END", "FROM-END"}, 3)
        test = self.test_fn("position", keys)
        i = self.search_index("position", seq, lambda x: test(item, x), keys)
        return NIL if i is None else i

    def op_position_if(self, pred: Any, seq: Any, *args: Any) -> Any:
        keys = parse_keys("position-if", args, {"KEY", "START", "END", "FROM-END"}, 3)
        i = self.search_index("position-if", seq, self.pred_fn(pred, keys), keys)
        return NIL if i is None else i

    def op_count(self, item: Any, seq: Any, *args: Any) -> Any:
        keys = parse_keys("count", args, {"TEST", "KEY", "TEST-NOT", "START", "END", "FROM-END"}, 3)
        test = self.test_fn("count", keys)
        items = seq_items("count", 2, seq)
        start, end = self.bounds("count", keys, len(items))
        return sum(1 for x in items[start:end] if test(item, x))

    def op_count_if(self, pred: Any, seq: Any, *args: Any) -> Any:
        keys = parse_keys("count-if", args, {"KEY", "START", "END", "FROM-END"}, 3)
        p = self.pred_fn(pred, keys)
        items = seq_items("count-if", 2, seq)
        start, end = self.bounds("count-if", keys, len(items))
        return sum(1 for x in items[start:end] if p(x))

    def op_count_if_not(self, pred: Any, seq: Any, *args: Any) -> Any:
        keys = parse_keys("count-if-not", args, {"KEY", "START", "END", "FROM-END"}, 3)
        p = self.pred_fn(pred, keys, negate=True)
        return sum(1 for x in seq_items("count-if-not", 2, seq) if p(x))

    def op_search(self, needle: Any, hay: Any, *args: Any) -> Any:
        keys = parse_keys("search", args, {"TEST", "KEY", "FROM-END"}, 3)
        test = self.test_fn("search", keys)
        n, h = seq_items("search", 1, needle), seq_items("search", 2, hay)
        starts = range(len(h) - len(n), -1, -1) if keys.get("FROM-END", NIL) is not NIL else range(len(h) - len(n) + 1)
        for i in starts:
            if all(test(a, b) for a, b in zip(n, h[i : i + len(n)])):
                return i
        return NIL

    def op_mismatch(self, a: Any, b: Any, *args: Any) -> Any:
        keys = parse_keys("mismatch", args, {"TEST", "KEY"}, 3)
        test = self.test_fn("mismatch", keys)
        ia, ib = seq_items("mismatch", 1, a), seq_items("mismatch", 2, b)
        for i, (x, y) in enumerate(zip(ia, ib)):
            if not test(x, y):
                return i
        return NIL if len(ia) == len(ib) else min(len(ia), len(ib))

    # -- sets ----------------------------------------------------------------------------------
    def op_adjoin(self, item: Any, x: Any, *args: Any) -> Any:
        keys = parse_keys("adjoin", args, {"TEST", "KEY", "TEST-NOT"}, 3)
        test = self.test_fn("adjoin", keys)
        key = keys.get("KEY", NIL)
        probe = item if key is NIL else self.call(key, item)
        if any(test(probe, y) for y in list_items("adjoin", 2, x)):
            return x
        return Cons(item, x)

    def op_remove_duplicates(self, seq: Any, *args: Any) -> Any:
        keys = parse_keys("remove-duplicates", args, {"TEST", "KEY", "TEST-NOT", "FROM-END"}, 2)
        test = self.test_fn("remove-duplicates", keys)
        key = keys.get("KEY", NIL)
        items = seq_items("remove-duplicates", 1, seq)
        keyed = [x if key is NIL else self.call(key, x) for x in items]
        if keys.get("FROM-END", NIL) is not NIL:
            kept = [x for i, x in enumerate(items) if not any(test(keyed[j], items[i]) for j in range(i))]
        else:
            kept = [x for i, x in enumerate(items) if not any(test(keyed[i], items[j]) for j in range(i + 1, len(items)))]
        return from_items(kept, seq)

    def op_union(self, a: Any, b: Any, *args: Any) -> Any:
        keys = parse_keys("union", args, {"TEST", "KEY", "TEST-NOT"}, 3)
        test = self.test_fn("union", keys)
        ib = list_items("union", 2, b)
        extra = [x for x in list_items("union", 1, a) if not any(test(self._key(keys, x), y) for y in ib)]
        return to_lisp_list(extra + ib)

    def op_intersection(self, a: Any, b: Any, *args: Any) -> Any:
        keys = parse_keys("intersection", args, {"TEST", "KEY", "TEST-NOT"}, 3)
        test = self.test_fn("intersection", keys)
        ib = list_items("intersection", 2, b)
        return to_lisp_list([x for x in list_items("intersection", 1, a) if any(test(self._key(keys, x), y) for y in ib)])

    def op_set_difference(self, a: Any, b: Any, *args: Any) -> Any:
        keys = parse_keys("set-difference", args, {"TEST", "KEY", "TEST-NOT"}, 3)
        test = self.test_fn("set-difference", keys)
        ib = list_items("set-difference", 2, b)
        return to_lisp_list([x for x in list_items("set-difference", 1, a) if not any(test(self._key(keys, x), y) for y in ib)])

    def op_subsetp(self, a: Any, b: Any, *args: Any) -> Any:
        keys = parse_keys("subsetp", args, {"TEST", "KEY", "TEST-NOT"}, 3)
        test = self.test_fn("subsetp", keys)
        ib = list_items("subsetp", 2, b)
        return lbool(all(any(test(self._key(keys, x), y) for y in ib) for x in list_items("subsetp", 1, a)))

    def _key(self, keys: dict[str, Any], x: Any) -> Any:
        key = keys.get("KEY", NIL)
        return x if key is NIL else self.call(key, x)

    # -- mapping -------------------------------------------------------------------------------
    def lists_of(self, name: str, lists: tuple[Any, ...]) -> list[list[Any]]:
        out = []
        for i, x in enumerate(lists, 2):
            items = []
            cell = need_list(name, i, x)
            while type(cell) is Cons:
                items.append(cell.car)
                cell = cell.cdr
            out.append(items)
        return out

    def op_mapcar(self, fn: Any, x: Any, *more: Any) -> Any:
        lists = self.lists_of("mapcar", (x, *more))
        f = self.interp.function_value(fn)
        n = min(len(items) for items in lists)
        self.alloc(n)
        return to_lisp_list([self.call(f, *(items[i] for items in lists)) for i in range(n)])

    def op_mapc(self, fn: Any, x: Any, *more: Any) -> Any:
        lists = self.lists_of("mapc", (x, *more))
        f = self.interp.function_value(fn)
        for i in range(min(len(items) for items in lists)):
            self.call(f, *(items[i] for items in lists))
        return x

    def op_mapcan(self, fn: Any, x: Any, *more: Any) -> Any:
        results = list_items("mapcan", 1, self.op_mapcar(fn, x, *more))
        return self.op_append(*results) if results else NIL

    def tails(self, name: str, lists: tuple[Any, ...]) -> list[list[Any]]:
        out = []
        for i, x in enumerate(lists, 2):
            cells = []
            cell = need_list(name, i, x)
            while type(cell) is Cons:
                cells.append(cell)
                cell = cell.cdr
            out.append(cells)
        return out

    def op_maplist(self, fn: Any, x: Any, *more: Any) -> Any:
        tails = self.tails("maplist", (x, *more))
        n = min(len(t) for t in tails)
        return to_lisp_list([self.call(fn, *(t[i] for t in tails)) for i in range(n)])

    def op_mapl(self, fn: Any, x: Any, *more: Any) -> Any:
        tails = self.tails("mapl", (x, *more))
        for i in range(min(len(t) for t in tails)):
            self.call(fn, *(t[i] for t in tails))
        return x

    def op_map(self, result_type: Any, fn: Any, seq: Any, *more: Any) -> Any:
        seqs = [seq_items("map", i, s) for i, s in enumerate((seq, *more), 3)]
        n = min(len(s) for s in seqs)
        values = [self.call(fn, *(s[i] for s in seqs)) for i in range(n)]
        if result_type is NIL:
            return NIL
        return self.coerce_items(values, result_type, "map")

    def op_reduce(self, fn: Any, seq: Any, *args: Any) -> Any:
        keys = parse_keys("reduce", args, {"INITIAL-VALUE", "FROM-END", "KEY", "START", "END"}, 3)
        items = seq_items("reduce", 2, seq)
        start, end = self.bounds("reduce", keys, len(items))
        items = items[start:end]
        if keys.get("KEY", NIL) is not NIL:
            items = [self.call(keys["KEY"], x) for x in items]
        from_end = keys.get("FROM-END", NIL) is not NIL
        if "INITIAL-VALUE" in keys:
            items = items + [keys["INITIAL-VALUE"]] if from_end else [keys["INITIAL-VALUE"]] + items
        if not items:
            return self.call(fn)
        if from_end:
            acc = items[-1]
            for x in reversed(items[:-1]):
                acc = self.call(fn, x, acc)
            return acc
        acc = items[0]
        for x in items[1:]:
            acc = self.call(fn, acc, x)
        return acc

    def op_every(self, pred: Any, seq: Any, *more: Any) -> Any:
        seqs = [seq_items("every", i, s) for i, s in enumerate((seq, *more), 2)]
        for i in range(min(len(s) for s in seqs)):
            if self.call(pred, *(s[i] for s in seqs)) is NIL:
                return NIL
        return T

    def op_some(self, pred: Any, seq: Any, *more: Any) -> Any:
        seqs = [seq_items("some", i, s) for i, s in enumerate((seq, *more), 2)]
        for i in range(min(len(s) for s in seqs)):
            v = self.call(pred, *(s[i] for s in seqs))
            if v is not NIL:
                return v
        return NIL

    def op_notany(self, pred: Any, seq: Any, *more: Any) -> Any:
        return lbool(self.op_some(pred, seq, *more) is NIL)

    def op_notevery(self, pred: Any, seq: Any, *more: Any) -> Any:
        return lbool(self.op_every(pred, seq, *more) is NIL)

    # -- ordering and slicing ---------------------------------------------------------------------
    def op_sort(self, seq: Any, pred: Any, *args: Any) -> Any:
        keys = parse_keys("sort", args, {"KEY"}, 3)
        items = seq_items("sort", 1, seq)
        return from_items(sort_items(self.interp, "sort", items, pred, keys.get("KEY", NIL)), seq)

    def op_stable_sort(self, seq: Any, pred: Any, *args: Any) -> Any:
        keys = parse_keys("stable-sort", args, {"KEY"}, 3)
        items = seq_items("stable-sort", 1, seq)
        return from_items(sort_items(self.interp, "stable-sort", items, pred, keys.get("KEY", NIL)), seq)

    def op_subseq(self, seq: Any, start: Any, end: Any = NIL) -> Any:
        need_sequence("subseq", 1, seq)
        if type(seq) is str:
            n = len(seq)
        else:
            n = len(seq_items("subseq", 1, seq))
        s, e = self.bounds("subseq", {"START": start, "END": end}, n)
        if type(seq) is str:
            return seq[s:e]
        return from_items(seq_items("subseq", 1, seq)[s:e], seq)

    def op_elt(self, seq: Any, i: Any) -> Any:
        need_index("elt", 2, i)
        items = seq_items("elt", 1, seq)
        if i >= len(items):
            raise lisp_error("E103", f"`elt`: index {i} is out of bounds for a sequence of length {len(items)}", "TYPE-ERROR")
        return items[i]

    def op_fill(self, seq: Any, item: Any, *args: Any) -> Any:
        keys = parse_keys("fill", args, {"START", "END"}, 3)
        if type(seq) is list:
            s, e = self.bounds("fill", keys, len(seq))
            for i in range(s, e):
                seq[i] = item
            return seq
        cell = need_list("fill", 1, seq)
        n = self.op_length(seq)
        s, e = self.bounds("fill", keys, n)
        for i in range(e):
            if i >= s:
                cell.car = item
            cell = cell.cdr
        return seq

    def coerce_items(self, items: list[Any], result_type: Any, who: str) -> Any:
        name = result_type.name if type(result_type) is Cons and False else (result_type.car.name if type(result_type) is Cons else getattr(result_type, "name", ""))
        if name in ("LIST", "CONS"):
            return to_lisp_list(items)
        if name in ("VECTOR", "SIMPLE-VECTOR", "ARRAY"):
            return list(items)
        if name in ("STRING", "SIMPLE-STRING"):
            if not all(type(c) is Char for c in items):
                raise lisp_error("E103", f"`{who}`: only characters can make a string", "TYPE-ERROR")
            return "".join(c.ch for c in items)
        raise lisp_error("E103", f"`{who}`: unsupported result type {result_type!r}", "TYPE-ERROR")

    def op_coerce(self, x: Any, result_type: Any) -> Any:
        name = result_type.car.name if type(result_type) is Cons else getattr(result_type, "name", "")
        if name in ("FLOAT", "DOUBLE-FLOAT", "SINGLE-FLOAT", "REAL", "NUMBER"):
            if type(x) in (int, float) or type(x).__name__ == "Fraction":
                return float(x) if name != "NUMBER" and name != "REAL" else x
            raise type_error("coerce", 1, "a number", x)
        if name == "CHARACTER":
            if type(x) is Char:
                return x
            if type(x) is str and len(x) == 1:
                return Char(x)
            if type(x) is Symbol and len(x.name) == 1:
                return Char(x.name)
            raise type_error("coerce", 1, "a character designator", x)
        if name == "T":
            return x
        if name in ("VECTOR", "SIMPLE-VECTOR", "ARRAY") and type(x) is str:
            return x
        if name in ("STRING", "SIMPLE-STRING") and type(x) is str:
            return x
        if name in ("LIST", "CONS") and (x is NIL or type(x) is Cons):
            return x
        return self.coerce_items(seq_items("coerce", 1, x), result_type, "coerce")

    # -- vectors --------------------------------------------------------------------------------------
    def op_vector(self, *xs: Any) -> Any:
        self.alloc(len(xs))
        return list(xs)

    def op_make_array(self, dims: Any, *args: Any) -> Any:
        keys = parse_keys("make-array", args, {"INITIAL-ELEMENT", "INITIAL-CONTENTS", "ELEMENT-TYPE", "ADJUSTABLE", "FILL-POINTER"}, 2)
        if type(dims) is Cons:
            items = list_items("make-array", 1, dims)
            if len(items) != 1:
                raise lisp_error("E109", "`make-array`: only one-dimensional arrays exist at compile time; use tensors for more", "PROGRAM-ERROR")
            dims = items[0]
        need_index("make-array", 1, dims)
        self.alloc(dims)
        if "INITIAL-CONTENTS" in keys:
            contents = seq_items("make-array", 3, keys["INITIAL-CONTENTS"])
            if len(contents) != dims:
                raise lisp_error("E103", f"`make-array`: :initial-contents has {len(contents)} elements, expected {dims}", "TYPE-ERROR")
            return contents
        init = keys.get("INITIAL-ELEMENT", 0 if keys.get("ELEMENT-TYPE", NIL) is not NIL else NIL)
        return [init] * dims

    def op_aref(self, v: Any, i: Any, *more: Any) -> Any:
        if more:
            raise lisp_error("E109", "`aref`: only one-dimensional arrays exist at compile time", "PROGRAM-ERROR")
        if type(v) not in (list, str):
            raise type_error("aref", 1, "a vector", v)
        need_index("aref", 2, i)
        if i >= len(v):
            raise lisp_error("E103", f"`aref`: index {i} is out of bounds for a vector of length {len(v)}", "TYPE-ERROR")
        return Char(v[i]) if type(v) is str else v[i]

    def op_svref(self, v: Any, i: Any) -> Any:
        return self.op_aref(v, i)

    def op_p_aset(self, v: Any, i: Any, value: Any) -> Any:
        if type(v) is str:
            raise lisp_error("E109", "strings are immutable in SexpGPU; build a new one with concatenate or format", "PROGRAM-ERROR")
        if type(v) is not list:
            raise type_error("(setf aref)", 1, "a vector", v)
        need_index("(setf aref)", 2, i)
        if i >= len(v):
            raise lisp_error("E103", f"(setf aref): index {i} is out of bounds for a vector of length {len(v)}", "TYPE-ERROR")
        v[i] = value
        return value

    def op_vectorp(self, x: Any) -> Any:
        return lbool(type(x) in (list, str))


def _with_tail(items: list[Any], tail: Any) -> Any:
    result = tail
    for item in reversed(items):
        result = Cons(item, result)
    return result


from .types import Symbol  # noqa: E402  (used in coerce)
