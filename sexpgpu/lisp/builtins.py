"""Builtins on ordinary values. Each checks its arguments and names the wrong one.

Only what cannot reasonably be written in the language lives here; prelude.lisp has the rest.
"""

from __future__ import annotations

from fractions import Fraction
from functools import cmp_to_key
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Optional

from .conditions import Condition, lisp_error
# the argument checks and equality, re-exported: the builtins modules and the compiler import them from here
from .checks import (
    describe as describe,
    short as short,
    type_error as type_error,
    is_num as is_num,
    is_real_rational as is_real_rational,
    need_number as need_number,
    need_integer as need_integer,
    need_index as need_index,
    need_list as need_list,
    need_string as need_string,
    need_symbol as need_symbol,
    need_char as need_char,
    bits_of as bits_of,
    need_sequence as need_sequence,
    norm as norm,
    lbool as lbool,
    CIRCULAR as CIRCULAR,
    list_cells as list_cells,
    list_cars as list_cars,
    circular_error as circular_error,
    list_items as list_items,
    seq_items as seq_items,
    from_items as from_items,
    to_lisp_list as to_lisp_list,
    parse_keys as parse_keys,
)
from .equality import eq as eq, eql as eql, equal as equal, equalp as equalp
from .objects import (
    BitVector,
    Builtin,
    Closure,
    HashTable,
    Macro,
    StructInstance,
)
from .printer import Printer, PrintTooLarge, function_name
from .registry import arity, builtin
from .types import NIL, T, Char, Cons, Symbol, from_iter, primary

if TYPE_CHECKING:
    from .evaluator import Interpreter

MAX_INTEGER_BITS = 1_000_000


# -- types ----------------------------------------------------------------------------------------
def typep(interp: "Interpreter", x: Any, spec: Any) -> bool:
    return interp.types.typep(x, spec)


def type_name_of(x: Any) -> str:
    t = type(x)
    if t is int:
        return "FIXNUM" if -(2**62) <= x < 2**62 else "BIGNUM"
    names = {float: "DOUBLE-FLOAT", Fraction: "RATIO", str: "STRING", Char: "CHARACTER", Cons: "CONS", list: "SIMPLE-VECTOR", BitVector: "SIMPLE-BIT-VECTOR", HashTable: "HASH-TABLE", Closure: "FUNCTION", Builtin: "FUNCTION"}
    if x is NIL:
        return "NULL"
    if x is T:
        return "BOOLEAN"
    if t is Symbol:
        return "KEYWORD" if x.package == "KEYWORD" else "SYMBOL"
    if t is StructInstance:
        return x.stype.name.name
    if t is Condition:
        return x.ctype
    return names.get(t, t.__name__.upper())


# -- printing of evaluator objects --------------------------------------------------------------------
def print_object(interp: "Interpreter", x: Any, printer: Printer) -> str:
    t = type(x)
    if t is StructInstance and x.stype.printer is not None:
        from .objects import OutputStream

        fn, print_object = x.stype.printer
        stream = OutputStream()
        # the user's printer sees *print-escape* as the printing asks: nil for princ and ~a
        escape = interp.sym("*PRINT-ESCAPE*")
        outer = interp.values.get(escape, T)
        interp.values[escape] = T if printer.escape else NIL
        try:
            interp.call(fn, x, stream, *(() if print_object else (0,)))
        finally:
            interp.values[escape] = outer
        return stream.take()
    if t is StructInstance:
        parts = [printer.text(x.stype.name)]
        for slot, value in zip(x.stype.slots, x.values):
            parts.append(":" + printer.text(slot).lstrip(":").lower() if printer.escape else ":" + slot.name.lower())
            parts.append(printer.text(value))
        return "#S(" + " ".join(parts) + ")"
    if t is Closure or t is Builtin:
        return f"#<function {function_name(x)}>"
    if t is Macro:
        return f"#<macro {short(x.name)}>"
    if t is HashTable:
        return f"#<hash-table :test {x.test.lower()} :count {len(x.entries)}>"
    if t is Condition:
        if printer.escape:
            return f"#<{x.ctype.lower()} {string_escape(x.message)}>"
        if x.report is not None and type(x.report) is not str:
            from .objects import OutputStream

            stream = OutputStream()
            interp.call(x.report, x, stream)
            return stream.take()
        return x.message
    hook = getattr(x, "lisp_print", None)
    if hook is not None:
        return str(hook())
    return f"#<{t.__name__.lower()}>"


def string_escape(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


# -- installation --------------------------------------------------------------------------------
class Registry:
    def __init__(self, interp: "Interpreter") -> None:
        self.interp = interp

    def add(self, name: str, fn: Callable[..., Any]) -> None:
        """A function the compiler adds to the Lisp world (its tensor and model builtins);
        the Lisp's own builtins are registered by @builtin (registry.py)."""
        required, maximum = arity(fn)
        self.interp.functions[self.interp.sym(name)] = Builtin(name.lower(), fn, required, maximum)


def format_to_string(interp: "Interpreter", control: Any, args: list[Any]) -> str:
    """(format nil control . args); CONTROL is a string or a function (CLHS 22.3)."""
    if type(control) is not str:
        called = call_format_control(interp, control, from_iter(args))
        if called is None:
            raise lisp_error("E103", f"`format`: the control must be a string or a function, got {short(control)} ({describe(control)})",
                             "TYPE-ERROR", control)
        return called[0]
    return format_with_rest(interp, control, args)[0]


def format_with_rest(interp: "Interpreter", control: str, args: list[Any]) -> tuple[str, Any]:
    """The text, and the arguments (a Lisp list) the control string did not consume."""
    from .format import FormatError, lisp_format_rest

    try:
        return lisp_format_rest(
            control,
            args,
            lambda x: interp.print_string(x, True),
            lambda x: interp.print_string(x, False),
            interp,
            lambda name, arg, colon, at, params: format_call(interp, name, arg, colon, at, params),
            lambda fn, rest: call_format_control(interp, fn, rest),
        )
    except FormatError as exc:
        raise lisp_error("E103", str(exc), exc.ctype, exc.datum) from None
    except PrintTooLarge as exc:
        raise lisp_error("E103", f"format: {exc}", "SIMPLE-ERROR") from None


def call_format_control(interp: "Interpreter", control: Any, args: Any) -> Optional[tuple[str, Any]]:
    """A function as a format control: called with a string output stream and the arguments;
    what it wrote and what it returned (the arguments left). None if CONTROL is no function."""
    from .objects import OutputStream

    if type(control) not in (Closure, Builtin):
        return None
    items: list[Any] = []
    while type(args) is Cons:
        items.append(args.car)
        args = args.cdr
    if args is not NIL:
        raise lisp_error("E103", f"`format`: the arguments of a function control end in {short(args)}, not nil", "TYPE-ERROR", args)
    stream = OutputStream()
    rest = interp.call(control, stream, *items)
    return stream.take(), rest


def format_call(interp: "Interpreter", name: str, arg: Any, colon: bool, at: bool, params: list[Any]) -> str:
    """~/name/: call the function NAME with a string output stream, the argument, the two
    modifier flags and the parameters, and return what it wrote."""
    from .objects import OutputStream

    symbol_name = name.split(":")[-1].upper()
    stream = OutputStream()
    interp.call(interp.table.intern(symbol_name), stream, arg, lbool(colon), lbool(at), *params)
    return stream.take()


def sort_items(interp: "Interpreter", fn: str, items: list[Any], pred: Any, key: Any) -> list[Any]:
    def keyfn(x: Any) -> Any:
        return x if key is NIL else interp.call(key, x)

    keyed = [(keyfn(x), x) for x in items]

    def compare(a: tuple[Any, Any], b: tuple[Any, Any]) -> int:
        if interp.call(pred, a[0], b[0]) is not NIL:
            return -1
        if interp.call(pred, b[0], a[0]) is not NIL:
            return 1
        return 0

    keyed.sort(key=cmp_to_key(compare))
    return [x for _, x in keyed]


# -- the base of the list, sequence and array builtins -------------------------------------------
class Lib:
    """What the list, sequence and array builtins share: calling their function arguments,
    walking lists and sequences (each element visited costs a step of the budget), and
    making results (each cell allocated is counted)."""

    def __init__(self, interp: "Interpreter") -> None:
        self.interp = interp

    def charge(self, n: int) -> None:
        self.interp.charge(n)

    def alloc(self, n: int) -> None:
        self.interp.alloc(n)

    # -- function arguments -------------------------------------------------------------------
    def fn1(self, designator: Any) -> Callable[[Any], Any]:
        """A function designator as a Python function of one argument (primary value)."""
        interp = self.interp
        fn = interp.function_value(designator)
        if type(fn) is Closure:
            return lambda a: primary(interp.call_closure(fn, (a,)))
        return lambda a: primary(interp.apply(fn, (a,)))

    def fn2(self, designator: Any) -> Callable[[Any, Any], Any]:
        interp = self.interp
        fn = interp.function_value(designator)
        fast = interp.standard_tests.get(fn) if type(fn) is Builtin else None
        if fast is not None:
            return lambda a, b: T if fast(a, b) else NIL
        if type(fn) is Closure:
            return lambda a, b: primary(interp.call_closure(fn, (a, b)))
        return lambda a, b: primary(interp.apply(fn, (a, b)))

    def fnn(self, designator: Any) -> Callable[..., Any]:
        interp = self.interp
        fn = interp.function_value(designator)
        return lambda *args: primary(interp.apply(fn, args))

    def key_fn(self, keys: dict[str, Any]) -> Optional[Callable[[Any], Any]]:
        """The :key function, or None for identity (absent or nil)."""
        key = keys.get("KEY", NIL)
        return None if key is NIL else self.fn1(key)

    def test_fn(self, fn: str, keys: dict[str, Any]) -> Callable[[Any, Any], bool]:
        """(item, element-key) -> whether they match, from :test / :test-not (default eql)."""
        test = keys.get("TEST", NIL)
        test_not = keys.get("TEST-NOT", NIL)
        if test is not NIL and test_not is not NIL:
            raise lisp_error("E102", f"`{fn}`: both :test and :test-not were given", "ERROR")
        if test_not is not NIL:
            f = self.predicate2(test_not)
            return lambda a, b: not f(a, b)
        if test is NIL:
            return eql
        return self.predicate2(test)

    def predicate2(self, designator: Any) -> Callable[[Any, Any], bool]:
        interp = self.interp
        fn = interp.function_value(designator)
        fast = interp.standard_tests.get(fn) if type(fn) is Builtin else None
        if fast is not None:
            return fast
        if type(fn) is Closure:
            return lambda a, b: primary(interp.call_closure(fn, (a, b))) is not NIL
        return lambda a, b: primary(interp.apply(fn, (a, b))) is not NIL

    def matcher(self, fn: str, item: Any, keys: dict[str, Any]) -> Callable[[Any], bool]:
        """Whether an element matches ITEM: :test or :test-not (default eql) on its :key."""
        test = self.test_fn(fn, keys)
        key = self.key_fn(keys)
        if key is None:
            return lambda x: test(item, x)
        return lambda x: test(item, key(x))

    def if_matcher(self, pred: Any, keys: dict[str, Any], negate: bool = False) -> Callable[[Any], bool]:
        """Whether an element's :key satisfies PRED (does not, when NEGATE)."""
        p = self.predicate1(pred, negate)
        key = self.key_fn(keys)
        if key is None:
            return p
        return lambda x: p(key(x))

    def predicate1(self, designator: Any, negate: bool = False) -> Callable[[Any], bool]:
        f = self.fn1(designator)
        if negate:
            return lambda a: f(a) is NIL
        return lambda a: f(a) is not NIL

    # -- walking ------------------------------------------------------------------------------
    def cells(self, fn: str, pos: int, x: Any) -> list[Any]:
        """The conses of a proper list; a dotted list or a non-list is a type error, and a
        circular one a walk that never ends (the step budget)."""
        out, end = list_cells(x)
        self.charge(len(out))
        if end is not NIL:
            self.improper(fn, pos, x, end)
        return out

    def elements(self, fn: str, pos: int, x: Any) -> list[Any]:
        """The elements of a proper list, as cells walks it."""
        out, end = list_cars(x)
        self.charge(len(out))
        if end is not NIL:
            self.improper(fn, pos, x, end)
        return out

    def improper(self, fn: str, pos: int, x: Any, end: Any) -> NoReturn:
        """A walk to the end of X found END, not nil: CIRCULAR never ends, so it is the step
        budget (L001); an atom is a type error."""
        if end is CIRCULAR:
            self.interp.endless()
        raise type_error(fn, pos, "a proper list", x)

    def items(self, fn: str, pos: int, seq: Any) -> list[Any]:
        """The elements of any sequence (a string's are characters)."""
        t = type(seq)
        if t is list or t is BitVector:
            self.charge(len(seq))
            return list(seq)
        if t is str:
            self.charge(len(seq))
            self.alloc(len(seq))
            return [Char(c) for c in seq]
        if seq is NIL or t is Cons:
            return self.elements(fn, pos, seq)
        raise type_error(fn, pos, "a sequence (list, vector or string)", seq)

    def length(self, fn: str, pos: int, seq: Any) -> int:
        t = type(seq)
        if t is str or t is list or t is BitVector:
            return len(seq)
        if seq is NIL or t is Cons:
            return len(self.cells(fn, pos, seq))
        raise type_error(fn, pos, "a sequence (list, vector or string)", seq)

    def bounds(self, fn: str, keys: dict[str, Any], n: int, start_key: str = "START", end_key: str = "END") -> tuple[int, int]:
        """The :start and :end bounding indices of a sequence of length N (CLHS 17.1.1)."""
        start = keys.get(start_key, 0)
        end = keys.get(end_key, NIL)
        end = n if end is NIL else end
        if type(start) is not int or type(end) is not int or not 0 <= start <= end <= n:
            shown_end = "nil" if keys.get(end_key, NIL) is NIL else short(keys.get(end_key))
            raise lisp_error(
                "E103",
                f"`{fn}`: bad bounds :{start_key.lower()} {short(keys.get(start_key, 0))} :{end_key.lower()} {shown_end} for a sequence of length {n}",
                "TYPE-ERROR",
            )
        return start, end

    def like(self, items: list[Any], seq: Any, fn: str = "") -> Any:
        """A fresh sequence of the kind of SEQ (list, vector or string) holding ITEMS."""
        t = type(seq)
        if t is str:
            if not all(type(c) is Char for c in items):
                raise lisp_error("E103", f"`{fn}`: only characters can go into a string", "TYPE-ERROR")
            self.alloc(len(items) // 8 + 1)
            return "".join(c.ch for c in items)
        self.alloc(len(items))
        if t is list:
            return items
        if t is BitVector:
            return bits_of(fn, items)
        return to_lisp_list(items)


Match = Callable[[Any], bool]
FamilyRun = Callable[[Any, str, Any, Match, dict[str, Any]], Any]
Family = tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]


def test_family(name: str, context: type, item_keys: set[str], if_keys: set[str], run: FamilyRun) -> Family:
    """The builtins NAME, NAME-if and NAME-if-not (CLHS 17.2): NAME takes an item that an
    element matches by :test or :test-not (default eql), NAME-if a predicate, NAME-if-not a
    predicate it complements; :key applies to the elements in all three. Each is
    (x sequence &key ...) and does RUN(context, its name, sequence, match, keys)."""
    if_name, if_not_name = f"{name}-if", f"{name}-if-not"

    def with_item(lib: Lib, item: Any, seq: Any, *args: Any) -> Any:
        keys = parse_keys(name, args, item_keys, 3)
        return run(lib, name, seq, lib.matcher(name, item, keys), keys)

    def with_predicate(lib: Lib, pred: Any, seq: Any, *args: Any) -> Any:
        keys = parse_keys(if_name, args, if_keys, 3)
        return run(lib, if_name, seq, lib.if_matcher(pred, keys), keys)

    def with_complement(lib: Lib, pred: Any, seq: Any, *args: Any) -> Any:
        keys = parse_keys(if_not_name, args, if_keys, 3)
        return run(lib, if_not_name, seq, lib.if_matcher(pred, keys, negate=True), keys)

    return (builtin(name, context=context)(with_item), builtin(if_name, context=context)(with_predicate),
            builtin(if_not_name, context=context)(with_complement))


SubstituteRun = Callable[[Any, str, Any, Any, Match, dict[str, Any]], Any]


def substitution_family(name: str, context: type, item_keys: set[str], if_keys: set[str], run: SubstituteRun) -> Family:
    """As test_family, for the families whose first argument is the new element:
    (new x sequence &key ...), doing RUN(context, its name, new, sequence, match, keys)."""
    if_name, if_not_name = f"{name}-if", f"{name}-if-not"

    def with_item(lib: Lib, new: Any, item: Any, seq: Any, *args: Any) -> Any:
        keys = parse_keys(name, args, item_keys, 4)
        return run(lib, name, new, seq, lib.matcher(name, item, keys), keys)

    def with_predicate(lib: Lib, new: Any, pred: Any, seq: Any, *args: Any) -> Any:
        keys = parse_keys(if_name, args, if_keys, 4)
        return run(lib, if_name, new, seq, lib.if_matcher(pred, keys), keys)

    def with_complement(lib: Lib, new: Any, pred: Any, seq: Any, *args: Any) -> Any:
        keys = parse_keys(if_not_name, args, if_keys, 4)
        return run(lib, if_not_name, new, seq, lib.if_matcher(pred, keys, negate=True), keys)

    return (builtin(name, context=context)(with_item), builtin(if_name, context=context)(with_predicate),
            builtin(if_not_name, context=context)(with_complement))
