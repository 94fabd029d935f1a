"""The cons and list functions (CLHS chapter 14): conses, lists, trees, association and property
lists, sets, and the mapping functions. An improper list where a list is needed is a
type-error; each element visited costs a step of the budget."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

from .builtins import CIRCULAR, Lib, test_family, eql, lbool, list_cars, list_cells, need_index, need_list, parse_keys, to_lisp_list, type_error
from .conditions import lisp_error
from .registry import builtin
from .types import NIL, T, Cons, MultipleValues

TEST_KEYS = {"TEST", "TEST-NOT", "KEY"}


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


# caar to cddddr: the car/cdr path read right to left, as the name spells it
cddr = builtin("cddr")(_cxr("dd"))
cadr = builtin("cadr")(_cxr("ad"))
cdar = builtin("cdar")(_cxr("da"))
caar = builtin("caar")(_cxr("aa"))
cdddr = builtin("cdddr")(_cxr("ddd"))
caddr = builtin("caddr")(_cxr("add"))
cdadr = builtin("cdadr")(_cxr("dad"))
caadr = builtin("caadr")(_cxr("aad"))
cddar = builtin("cddar")(_cxr("dda"))
cadar = builtin("cadar")(_cxr("ada"))
cdaar = builtin("cdaar")(_cxr("daa"))
caaar = builtin("caaar")(_cxr("aaa"))
cddddr = builtin("cddddr")(_cxr("dddd"))
cadddr = builtin("cadddr")(_cxr("addd"))
cdaddr = builtin("cdaddr")(_cxr("dadd"))
caaddr = builtin("caaddr")(_cxr("aadd"))
cddadr = builtin("cddadr")(_cxr("ddad"))
cadadr = builtin("cadadr")(_cxr("adad"))
cdaadr = builtin("cdaadr")(_cxr("daad"))
caaadr = builtin("caaadr")(_cxr("aaad"))
cdddar = builtin("cdddar")(_cxr("ddda"))
caddar = builtin("caddar")(_cxr("adda"))
cdadar = builtin("cdadar")(_cxr("dada"))
caadar = builtin("caadar")(_cxr("aada"))
cddaar = builtin("cddaar")(_cxr("ddaa"))
cadaar = builtin("cadaar")(_cxr("adaa"))
cdaaar = builtin("cdaaar")(_cxr("daaa"))
caaaar = builtin("caaaar")(_cxr("aaaa"))


class Conses(Lib):
    # -- parts of lists -----------------------------------------------------------------------------
    def nth_of(self, name: str, n: int, x: Any) -> Any:
        need_list(name, 1, x)
        for _ in range(n):
            if type(x) is not Cons:
                if x is not NIL:
                    raise type_error(name, 1, "a list", x)
                return NIL
            x = x.cdr
        if type(x) is Cons:
            return x.car
        need_list(name, 1, x)
        return NIL

    def spine(self, fn: str, x: Any) -> tuple[list[Any], Any]:
        """The conses of a list that may be dotted, and what ends it."""
        need_list(fn, 1, x)
        cells, end = list_cells(x)
        self.charge(len(cells))
        if end is CIRCULAR:
            self.interp.endless()
        return cells, end

    def member_tail(self, fn: str, x: Any, match: Callable[[Any], bool]) -> Any:
        """The first tail of X whose car matches, walking only as far as it (as SBCL does:
        (member 1 '(1 . 2)) is (1 . 2)); a dotted end, when reached, is a type-error. Each
        cell is a step, charged as it goes, so a circular list ends at the budget."""
        cell = need_list(fn, 2, x)
        n = 0
        while type(cell) is Cons:
            n += 1
            if n == 1024:
                self.charge(n)
                n = 0
            if match(cell.car):
                self.charge(n)
                return cell
            cell = cell.cdr
        self.charge(n)
        if cell is not NIL:
            raise type_error(fn, 2, "a proper list", x)
        return NIL

    def alist_find(self, fn: str, alist: Any, part: str, match: Callable[[Any], bool]) -> Any:
        """The first pair of ALIST whose car (or cdr) matches; nil entries are skipped. Walked
        as member walks a list: only as far as the match."""

        def pair_matches(entry: Any) -> bool:
            if entry is NIL:
                return False
            if type(entry) is not Cons:
                raise type_error(fn, 2, "an association list", alist)
            return match(entry.car if part == "car" else entry.cdr)

        tail = self.member_tail(fn, alist, pair_matches)
        return tail.car if type(tail) is Cons else NIL

    # -- property lists ---------------------------------------------------------------------------
    def plist_pairs(self, fn: str, plist: Any) -> Iterator[Any]:
        """The conses of a property list that hold an indicator, in order: a caller that stops
        at the one it wants never looks further (as SBCL: (getf '(:a 1 . 2) :a) is 1); an odd
        length or a dotted end, when reached, is a type-error. Each pair is a step."""
        cell = plist
        walked = 0
        while type(cell) is Cons:
            if type(cell.cdr) is not Cons:
                raise type_error(fn, 1, "a property list (of even length)", plist)
            walked += 1
            if walked == 1024:  # a circular plist ends at the step budget
                self.charge(2 * walked)
                walked = 0
            yield cell
            cell = cell.cdr.cdr
        self.charge(2 * walked)
        if cell is not NIL:
            raise type_error(fn, 1, "a property list", plist)

    # -- trees ------------------------------------------------------------------------------------
    def tree_map(self, tree: Any, replace: Callable[[Any], tuple[bool, Any]], destructive: bool) -> Any:
        """TREE with each subtree for which REPLACE says (True, new) replaced by new; shared
        structure is kept where nothing changed (destructive: conses are reused)."""
        self.charge(1)
        hit, new = replace(tree)
        if hit:
            return new
        if type(tree) is not Cons:
            return tree
        car = self.tree_map(tree.car, replace, destructive)
        cdr = self.tree_map(tree.cdr, replace, destructive)
        if destructive:
            tree.car, tree.cdr = car, cdr
            return tree
        if car is tree.car and cdr is tree.cdr:
            return tree
        self.alloc(1)
        return Cons(car, cdr)

    def subst_replacer(self, fn: str, new: Any, match: Callable[[Any], bool], keys: dict[str, Any]) -> Callable[[Any], tuple[bool, Any]]:
        key = self.key_fn(keys)

        def replace(x: Any) -> tuple[bool, Any]:
            return (True, new) if match(x if key is None else key(x)) else (False, None)

        return replace

    def sublis_replacer(self, fn: str, alist: Any, keys: dict[str, Any]) -> Callable[[Any], tuple[bool, Any]]:
        pairs = [e for e in self.elements(fn, 1, alist) if type(e) is Cons]
        test = self.test_fn(fn, keys)
        key = self.key_fn(keys)

        def replace(x: Any) -> tuple[bool, Any]:
            probe = x if key is None else key(x)
            for pair in pairs:
                if test(pair.car, probe):
                    return True, pair.cdr
            return False, None

        return replace

    # -- sets -----------------------------------------------------------------------------------------
    def set_args(self, fn: str, a: Any, b: Any, args: tuple[Any, ...]) -> tuple[list[Any], list[Any], Callable[[Any, Any], bool], Callable[[Any], Any]]:
        keys = parse_keys(fn, args, TEST_KEYS, 3)
        test = self.test_fn(fn, keys)
        key = self.key_fn(keys) or (lambda x: x)
        return self.elements(fn, 1, a), self.elements(fn, 2, b), test, key

    def contains(self, items: list[Any], x: Any, test: Callable[[Any, Any], bool], key: Callable[[Any], Any]) -> bool:
        k = key(x)
        self.charge(len(items))
        return any(test(k, key(y)) for y in items)

    def exclusive_parts(self, fn: str, a: Any, b: Any, args: tuple[Any, ...]) -> tuple[list[Any], list[Any]]:
        ia, ib, test, key = self.set_args(fn, a, b, args)
        only_a = [x for x in ia if not self.contains(ib, x, test, key)]
        # the test is always called (element-of-a, element-of-b)
        only_b = [y for y in ib if not any(test(key(x), key(y)) for x in ia)]
        self.charge(len(ia) * len(ib))
        self.alloc(len(only_a) + len(only_b))
        return only_a, only_b

    # -- mapping ------------------------------------------------------------------------------------
    def walk(self, fn: str, lists: tuple[Any, ...], tails: bool) -> list[list[Any]]:
        """The elements (or tails) of each list, stopping at the shortest; each list must
        be a list, and a dotted one is an error when it ends the walk."""
        for i, x in enumerate(lists, 2):
            need_list(fn, i, x)
        if len(lists) == 1:
            spine = self.cells(fn, 2, lists[0])
            return [[c] for c in spine] if tails else [[c.car] for c in spine]
        columns = []
        cells = list(lists)
        # Brent's cycle test on each list (list_cells), in step: the walk never ends only
        # when every list is circular
        marks: list[Any] = [None] * len(cells)
        looped = [False] * len(cells)
        n, power = 0, 1
        while all(type(c) is Cons for c in cells):
            columns.append([c if tails else c.car for c in cells])
            cells = [c.cdr for c in cells]
            n += 1
            for i, c in enumerate(cells):
                if c is marks[i]:
                    looped[i] = True
            if all(looped):
                self.charge(n * len(lists))
                self.interp.endless()
            if n == power:
                marks, power = list(cells), power << 1
        self.charge(n * len(lists))
        for i, c in enumerate(cells, 2):
            if c is not NIL and type(c) is not Cons:
                raise type_error(fn, i, "a proper list", lists[i - 2])
        return columns


# -- conses ------------------------------------------------------------------------------------
@builtin("cons", context=Conses)
def cons(lib: Conses, a: Any, b: Any) -> Any:
    lib.alloc(1)
    return Cons(a, b)


@builtin("car")
def car(x: Any) -> Any:
    if type(x) is Cons:
        return x.car
    need_list("car", 1, x)
    return NIL


@builtin("cdr")
def cdr(x: Any) -> Any:
    if type(x) is Cons:
        return x.cdr
    need_list("cdr", 1, x)
    return NIL


@builtin("rest")
def rest(x: Any) -> Any:
    if type(x) is Cons:
        return x.cdr
    need_list("rest", 1, x)
    return NIL


@builtin("rplaca")
def rplaca(x: Any, v: Any) -> Any:
    if type(x) is not Cons:
        raise type_error("rplaca", 1, "a cons", x)
    x.car = v
    return x


@builtin("rplacd")
def rplacd(x: Any, v: Any) -> Any:
    if type(x) is not Cons:
        raise type_error("rplacd", 1, "a cons", x)
    x.cdr = v
    return x


@builtin("%rplaca-value", context=Conses)
def p_rplaca_value(lib: Conses, x: Any, v: Any) -> Any:
    rplaca(x, v)
    return v


@builtin("%rplacd-value", context=Conses)
def p_rplacd_value(lib: Conses, x: Any, v: Any) -> Any:
    rplacd(x, v)
    return v


@builtin("null")
def null(x: Any) -> Any:
    return lbool(x is NIL)


@builtin("listp")
def listp(x: Any) -> Any:
    return lbool(x is NIL or type(x) is Cons)


@builtin("consp")
def consp(x: Any) -> Any:
    return lbool(type(x) is Cons)


@builtin("atom")
def atom(x: Any) -> Any:
    return lbool(type(x) is not Cons)


@builtin("endp")
def endp(x: Any) -> Any:
    need_list("endp", 1, x)
    return lbool(x is NIL)


# -- making lists -----------------------------------------------------------------------------
@builtin("list", context=Conses)
def list_(lib: Conses, *xs: Any) -> Any:
    lib.alloc(len(xs))
    return to_lisp_list(xs)


@builtin("list*", context=Conses)
def list_star(lib: Conses, x: Any, *xs: Any) -> Any:
    items = [x, *xs]
    lib.alloc(len(items) - 1)
    result = items[-1]
    for item in reversed(items[:-1]):
        result = Cons(item, result)
    return result


@builtin("make-list", context=Conses)
def make_list(lib: Conses, n: Any, *args: Any) -> Any:
    need_index("make-list", 1, n)
    keys = parse_keys("make-list", args, {"INITIAL-ELEMENT"}, 2)
    lib.alloc(n)
    lib.charge(n)
    init = keys.get("INITIAL-ELEMENT", NIL)
    result: Any = NIL
    for _ in range(n):
        result = Cons(init, result)
    return result


@builtin("iota", context=Conses)
def iota(lib: Conses, n: Any, *args: Any) -> Any:
    need_index("iota", 1, n)
    keys = parse_keys("iota", args, {"START", "STEP"}, 2)
    start, step = keys.get("START", 0), keys.get("STEP", 1)
    lib.alloc(n)
    lib.charge(n)
    from .builtins_numbers import add, mul

    return to_lisp_list([add(start, mul(i, step)) for i in range(n)])


@builtin("copy-list", context=Conses)
def copy_list(lib: Conses, x: Any) -> Any:
    need_list("copy-list", 1, x)
    items, end = list_cars(x)
    lib.charge(len(items))
    if end is CIRCULAR:
        lib.interp.endless()
    lib.alloc(len(items))
    return _with_tail(items, end)


@builtin("copy-alist", context=Conses)
def copy_alist(lib: Conses, x: Any) -> Any:
    out = []
    for entry in lib.elements("copy-alist", 1, x):
        out.append(Cons(entry.car, entry.cdr) if type(entry) is Cons else entry)
    lib.alloc(2 * len(out))
    return to_lisp_list(out)


@builtin("copy-tree", context=Conses)
def copy_tree(lib: Conses, x: Any) -> Any:
    if type(x) is not Cons:
        return x
    lib.charge(1)
    lib.alloc(1)
    return Cons(copy_tree(lib, x.car), copy_tree(lib, x.cdr))


@builtin("list-length", context=Conses)
def list_length(lib: Conses, x: Any) -> Any:
    """The length of a proper list, nil for a circular one (Floyd's cycle test)."""
    need_list("list-length", 1, x)
    n = 0
    fast = slow = x
    while True:
        if fast is NIL:
            break
        if type(fast) is not Cons:
            raise type_error("list-length", 1, "a proper list", x)
        if type(fast.cdr) is not Cons:
            if fast.cdr is not NIL:
                raise type_error("list-length", 1, "a proper list", x)
            n += 1
            break
        fast = fast.cdr.cdr
        slow = slow.cdr
        n += 2
        if fast is slow:
            lib.charge(n)
            return NIL
    lib.charge(n)
    return n


def _nth_accessor(name: str, n: int) -> Callable[[Conses, Any], Any]:
    def op(lib: Conses, x: Any) -> Any:
        return lib.nth_of(name, n, x)

    return op


# first to tenth: the element at the position the name counts
first = builtin("first", context=Conses)(_nth_accessor("first", 0))
second = builtin("second", context=Conses)(_nth_accessor("second", 1))
third = builtin("third", context=Conses)(_nth_accessor("third", 2))
fourth = builtin("fourth", context=Conses)(_nth_accessor("fourth", 3))
fifth = builtin("fifth", context=Conses)(_nth_accessor("fifth", 4))
sixth = builtin("sixth", context=Conses)(_nth_accessor("sixth", 5))
seventh = builtin("seventh", context=Conses)(_nth_accessor("seventh", 6))
eighth = builtin("eighth", context=Conses)(_nth_accessor("eighth", 7))
ninth = builtin("ninth", context=Conses)(_nth_accessor("ninth", 8))
tenth = builtin("tenth", context=Conses)(_nth_accessor("tenth", 9))


@builtin("nth", context=Conses)
def nth(lib: Conses, n: Any, x: Any) -> Any:
    need_index("nth", 1, n)
    lib.charge(n)
    return lib.nth_of("nth", n, x)


@builtin("nthcdr", context=Conses)
def nthcdr(lib: Conses, n: Any, x: Any) -> Any:
    need_index("nthcdr", 1, n)
    need_list("nthcdr", 2, x)
    lib.charge(n)
    for _ in range(n):
        if type(x) is not Cons:
            if x is not NIL:
                raise type_error("nthcdr", 2, "a list", x)
            return NIL
        x = x.cdr
    return x


@builtin("%set-nth", context=Conses)
def p_set_nth(lib: Conses, n: Any, x: Any, v: Any) -> Any:
    need_index("(setf nth)", 1, n)
    lib.charge(n)
    cell = x
    for _ in range(n):
        if type(cell) is not Cons:
            break
        cell = cell.cdr
    if type(cell) is not Cons:
        raise lisp_error("E103", f"(setf nth): index {n} is past the end of the list", "TYPE-ERROR")
    cell.car = v
    return v


@builtin("last", context=Conses)
def last(lib: Conses, x: Any, n: Any = 1) -> Any:
    need_index("last", 2, n)
    cells, end = lib.spine("last", x)
    if n == 0:
        return end
    if n >= len(cells):
        return x
    return cells[-n]


@builtin("butlast", context=Conses)
def butlast(lib: Conses, x: Any, n: Any = 1) -> Any:
    need_index("butlast", 2, n)
    cells, _ = lib.spine("butlast", x)
    keep = cells[: max(len(cells) - n, 0)]
    lib.alloc(len(keep))
    return to_lisp_list([c.car for c in keep])


@builtin("nbutlast", context=Conses)
def nbutlast(lib: Conses, x: Any, n: Any = 1) -> Any:
    need_index("nbutlast", 2, n)
    cells, _ = lib.spine("nbutlast", x)
    if n >= len(cells):
        return NIL
    if n > 0:
        cells[len(cells) - n - 1].cdr = NIL
    return x


@builtin("ldiff", context=Conses)
def ldiff(lib: Conses, x: Any, obj: Any) -> Any:
    need_list("ldiff", 1, x)
    cells, end = list_cells(x)
    for i, cell in enumerate(cells):  # a tail of a circular list is found before it comes round
        if cell is obj:
            lib.charge(i)
            lib.alloc(i)
            return _with_tail([c.car for c in cells[:i]], NIL)
    lib.charge(len(cells))
    if end is CIRCULAR:
        lib.interp.endless()
    lib.alloc(len(cells))
    return _with_tail([c.car for c in cells], NIL if end is obj or eql(end, obj) else end)


@builtin("tailp", context=Conses)
def tailp(lib: Conses, obj: Any, x: Any) -> Any:
    need_list("tailp", 2, x)
    cells, end = list_cells(x)
    for n, cell in enumerate(cells):
        if cell is obj:
            lib.charge(n)
            return T
    lib.charge(len(cells))
    if end is CIRCULAR:
        lib.interp.endless()
    return lbool(eql(end, obj))


# -- joining ---------------------------------------------------------------------------------
@builtin("append", context=Conses)
def append(lib: Conses, *xs: Any) -> Any:
    if not xs:
        return NIL
    result = xs[-1]
    for i in range(len(xs) - 2, -1, -1):
        items = lib.elements("append", i + 1, xs[i])
        lib.alloc(len(items))
        for item in reversed(items):
            result = Cons(item, result)
    return result


@builtin("nconc", context=Conses)
def nconc(lib: Conses, *xs: Any) -> Any:
    """Destructive: the last cons of each non-empty list gets the next one as its cdr
    (a dotted list's final atom is replaced)."""
    result: Any = NIL
    last: Optional[Cons] = None
    for i, x in enumerate(xs, 1):
        if i == len(xs):
            if last is None:
                return x
            last.cdr = x
            return result
        if x is NIL:
            continue
        if type(x) is not Cons:
            raise type_error("nconc", i, "a list", x)
        if last is None:
            result = x
        else:
            last.cdr = x
        cells, end = list_cells(x)
        lib.charge(len(cells) - 1)
        if end is CIRCULAR:
            lib.interp.endless()
        last = cells[-1]
    return result


@builtin("revappend", context=Conses)
def revappend(lib: Conses, x: Any, tail: Any) -> Any:
    items = lib.elements("revappend", 1, x)
    lib.alloc(len(items))
    for item in items:
        tail = Cons(item, tail)
    return tail


@builtin("nreconc", context=Conses)
def nreconc(lib: Conses, x: Any, tail: Any) -> Any:
    cells = lib.cells("nreconc", 1, x)
    for cell in cells:
        cell.cdr = tail
        tail = cell
    return tail


# -- searching lists ------------------------------------------------------------------------


@builtin("acons", context=Conses)
def acons(lib: Conses, k: Any, v: Any, alist: Any) -> Any:
    lib.alloc(2)
    return Cons(Cons(k, v), alist)


@builtin("pairlis", context=Conses)
def pairlis(lib: Conses, keys: Any, values: Any, alist: Any = NIL) -> Any:
    ks, vs = lib.elements("pairlis", 1, keys), lib.elements("pairlis", 2, values)
    if len(ks) != len(vs):
        raise lisp_error("E103", "`pairlis`: the key and value lists differ in length", "ERROR")
    lib.alloc(2 * len(ks))
    for k, v in zip(ks, vs):  # each pair goes on the front, as SBCL does
        alist = Cons(Cons(k, v), alist)
    return alist


@builtin("getf", context=Conses)
def getf(lib: Conses, plist: Any, indicator: Any, default: Any = NIL) -> Any:
    for cell in lib.plist_pairs("getf", plist):
        if cell.car is indicator or eql(cell.car, indicator):
            return cell.cdr.car
    return default


@builtin("get-properties", context=Conses)
def get_properties(lib: Conses, plist: Any, indicators: Any) -> Any:
    wanted = lib.elements("get-properties", 2, indicators)
    for cell in lib.plist_pairs("get-properties", plist):
        if any(eql(cell.car, w) for w in wanted):
            return MultipleValues((cell.car, cell.cdr.car, cell))
    return MultipleValues((NIL, NIL, NIL))


@builtin("%putf", context=Conses)
def p_putf(lib: Conses, plist: Any, indicator: Any, value: Any) -> Any:
    for cell in lib.plist_pairs("(setf getf)", plist):
        if eql(cell.car, indicator):
            cell.cdr.car = value
            return plist
    lib.alloc(2)
    return Cons(indicator, Cons(value, plist))


@builtin("%remf", context=Conses)
def p_remf(lib: Conses, plist: Any, indicator: Any) -> Any:
    """(values new-plist removed-p): the plist without the first INDICATOR."""
    previous: Optional[Cons] = None
    for cell in lib.plist_pairs("remf", plist):
        if eql(cell.car, indicator):
            if previous is None:
                return MultipleValues((cell.cdr.cdr, T))
            previous.cdr.cdr = cell.cdr.cdr
            return MultipleValues((plist, T))
        previous = cell
    return MultipleValues((plist, NIL))


@builtin("subst", context=Conses)
def subst(lib: Conses, new: Any, old: Any, tree: Any, *args: Any) -> Any:
    keys = parse_keys("subst", args, TEST_KEYS, 4)
    test = lib.test_fn("subst", keys)
    return lib.tree_map(tree, lib.subst_replacer("subst", new, lambda x: test(old, x), keys), False)


@builtin("subst-if", context=Conses)
def subst_if(lib: Conses, new: Any, pred: Any, tree: Any, *args: Any) -> Any:
    keys = parse_keys("subst-if", args, {"KEY"}, 4)
    return lib.tree_map(tree, lib.subst_replacer("subst-if", new, lib.predicate1(pred), keys), False)


@builtin("subst-if-not", context=Conses)
def subst_if_not(lib: Conses, new: Any, pred: Any, tree: Any, *args: Any) -> Any:
    keys = parse_keys("subst-if-not", args, {"KEY"}, 4)
    return lib.tree_map(tree, lib.subst_replacer("subst-if-not", new, lib.predicate1(pred, negate=True), keys), False)


@builtin("nsubst", context=Conses)
def nsubst(lib: Conses, new: Any, old: Any, tree: Any, *args: Any) -> Any:
    keys = parse_keys("nsubst", args, TEST_KEYS, 4)
    test = lib.test_fn("nsubst", keys)
    return lib.tree_map(tree, lib.subst_replacer("nsubst", new, lambda x: test(old, x), keys), True)


@builtin("nsubst-if", context=Conses)
def nsubst_if(lib: Conses, new: Any, pred: Any, tree: Any, *args: Any) -> Any:
    keys = parse_keys("nsubst-if", args, {"KEY"}, 4)
    return lib.tree_map(tree, lib.subst_replacer("nsubst-if", new, lib.predicate1(pred), keys), True)


@builtin("nsubst-if-not", context=Conses)
def nsubst_if_not(lib: Conses, new: Any, pred: Any, tree: Any, *args: Any) -> Any:
    keys = parse_keys("nsubst-if-not", args, {"KEY"}, 4)
    return lib.tree_map(tree, lib.subst_replacer("nsubst-if-not", new, lib.predicate1(pred, negate=True), keys), True)


@builtin("sublis", context=Conses)
def sublis(lib: Conses, alist: Any, tree: Any, *args: Any) -> Any:
    keys = parse_keys("sublis", args, TEST_KEYS, 3)
    return lib.tree_map(tree, lib.sublis_replacer("sublis", alist, keys), False)


@builtin("nsublis", context=Conses)
def nsublis(lib: Conses, alist: Any, tree: Any, *args: Any) -> Any:
    keys = parse_keys("nsublis", args, TEST_KEYS, 3)
    return lib.tree_map(tree, lib.sublis_replacer("nsublis", alist, keys), True)


@builtin("tree-equal", context=Conses)
def tree_equal(lib: Conses, a: Any, b: Any, *args: Any) -> Any:
    keys = parse_keys("tree-equal", args, {"TEST", "TEST-NOT"}, 3)
    test = lib.test_fn("tree-equal", keys)
    pending = [(a, b)]
    while pending:
        x, y = pending.pop()
        lib.charge(1)
        if type(x) is Cons and type(y) is Cons:
            pending.append((x.cdr, y.cdr))
            pending.append((x.car, y.car))
        elif type(x) is Cons or type(y) is Cons or not test(x, y):
            return NIL
    return T


@builtin("adjoin", context=Conses)
def adjoin(lib: Conses, item: Any, x: Any, *args: Any) -> Any:
    keys = parse_keys("adjoin", args, TEST_KEYS, 3)
    test = lib.test_fn("adjoin", keys)
    key = lib.key_fn(keys) or (lambda e: e)
    probe = key(item)
    if any(test(probe, key(y)) for y in lib.elements("adjoin", 2, x)):
        return x
    lib.alloc(1)
    return Cons(item, x)


# The orders below are SBCL's (CLHS leaves them open), so results print the same.
@builtin("union", context=Conses)
def union(lib: Conses, a: Any, b: Any, *args: Any) -> Any:
    ia, ib, test, key = lib.set_args("union", a, b, args)
    # the shorter list is the base; the other's new elements are pushed on it
    short, long_items, short_items = (a, ib, ia) if len(ia) < len(ib) else (b, ia, ib)
    out = short
    for x in long_items:
        if not lib.contains(short_items, x, test, key):
            lib.alloc(1)
            out = Cons(x, out)
    return out


@builtin("nunion", context=Conses)
def nunion(lib: Conses, a: Any, b: Any, *args: Any) -> Any:
    return union(lib, a, b, *args)


@builtin("intersection", context=Conses)
def intersection(lib: Conses, a: Any, b: Any, *args: Any) -> Any:
    ia, ib, test, key = lib.set_args("intersection", a, b, args)
    kept = [x for x in ia if lib.contains(ib, x, test, key)] if ib else []
    lib.alloc(len(kept))
    return to_lisp_list(kept[::-1])


@builtin("nintersection", context=Conses)
def nintersection(lib: Conses, a: Any, b: Any, *args: Any) -> Any:
    return intersection(lib, a, b, *args)


@builtin("set-difference", context=Conses)
def set_difference(lib: Conses, a: Any, b: Any, *args: Any) -> Any:
    ia, ib, test, key = lib.set_args("set-difference", a, b, args)
    if not ib:
        return a
    kept = [x for x in ia if not lib.contains(ib, x, test, key)]
    lib.alloc(len(kept))
    return to_lisp_list(kept[::-1])


@builtin("nset-difference", context=Conses)
def nset_difference(lib: Conses, a: Any, b: Any, *args: Any) -> Any:
    return set_difference(lib, a, b, *args)


@builtin("set-exclusive-or", context=Conses)
def set_exclusive_or(lib: Conses, a: Any, b: Any, *args: Any) -> Any:
    only_a, only_b = lib.exclusive_parts("set-exclusive-or", a, b, args)
    return to_lisp_list((only_a + only_b)[::-1])


@builtin("nset-exclusive-or", context=Conses)
def nset_exclusive_or(lib: Conses, a: Any, b: Any, *args: Any) -> Any:
    only_a, only_b = lib.exclusive_parts("nset-exclusive-or", a, b, args)
    return to_lisp_list(only_a + only_b)


@builtin("subsetp", context=Conses)
def subsetp(lib: Conses, a: Any, b: Any, *args: Any) -> Any:
    ia, ib, test, key = lib.set_args("subsetp", a, b, args)
    return lbool(all(lib.contains(ib, x, test, key) for x in ia))


@builtin("mapcar", context=Conses)
def mapcar(lib: Conses, fn: Any, x: Any, *more: Any) -> Any:
    f = lib.fnn(fn)
    columns = lib.walk("mapcar", (x, *more), False)
    lib.alloc(len(columns))
    return to_lisp_list([f(*args) for args in columns])


@builtin("mapc", context=Conses)
def mapc(lib: Conses, fn: Any, x: Any, *more: Any) -> Any:
    f = lib.fnn(fn)
    for args in lib.walk("mapc", (x, *more), False):
        f(*args)
    return x


@builtin("mapcan", context=Conses)
def mapcan(lib: Conses, fn: Any, x: Any, *more: Any) -> Any:
    f = lib.fnn(fn)
    results = [f(*args) for args in lib.walk("mapcan", (x, *more), False)]
    return nconc(lib, *results) if results else NIL


@builtin("maplist", context=Conses)
def maplist(lib: Conses, fn: Any, x: Any, *more: Any) -> Any:
    f = lib.fnn(fn)
    columns = lib.walk("maplist", (x, *more), True)
    lib.alloc(len(columns))
    return to_lisp_list([f(*args) for args in columns])


@builtin("mapl", context=Conses)
def mapl(lib: Conses, fn: Any, x: Any, *more: Any) -> Any:
    f = lib.fnn(fn)
    for args in lib.walk("mapl", (x, *more), True):
        f(*args)
    return x


@builtin("mapcon", context=Conses)
def mapcon(lib: Conses, fn: Any, x: Any, *more: Any) -> Any:
    f = lib.fnn(fn)
    results = [f(*args) for args in lib.walk("mapcon", (x, *more), True)]
    return nconc(lib, *results) if results else NIL

def _with_tail(items: list[Any], tail: Any) -> Any:
    result = tail
    for item in reversed(items):
        result = Cons(item, result)
    return result


# the X, X-if and X-if-not families (CLHS 14.2.2)
member, member_if, member_if_not = test_family("member", Conses, TEST_KEYS, {"KEY"}, lambda lib, fn, x, match, keys: lib.member_tail(fn, x, match))
assoc, assoc_if, assoc_if_not = test_family("assoc", Conses, TEST_KEYS, {"KEY"}, lambda lib, fn, alist, match, keys: lib.alist_find(fn, alist, "car", match))
rassoc, rassoc_if, rassoc_if_not = test_family("rassoc", Conses, TEST_KEYS, {"KEY"}, lambda lib, fn, alist, match, keys: lib.alist_find(fn, alist, "cdr", match))
