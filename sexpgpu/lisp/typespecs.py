"""Type specifiers (CLHS 4.2): typep compiles a specifier into a predicate once (kept per
specifier object, so a quoted type in a loop is compiled once), and subtypep for the
documented types. Every float is a double, so single-float and short-float are empty; every
vector holds any element (element type t), except strings (element type character)."""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any, Callable, Optional

from .checks import list_items, short
from .conditions import CONDITION_PARENTS, Condition, condition_is, lisp_error
from .equality import eql
from .objects import BitVector, Builtin, Closure, HashTable, LispArray, StructInstance
from .types import NIL, T, Char, Cons, MultipleValues, Symbol

if TYPE_CHECKING:
    from .evaluator import Interpreter

Predicate = Callable[[Any], bool]
FIXNUM_LOW, FIXNUM_HIGH = -(2**62), 2**62 - 1


def _is_function(x: Any) -> bool:
    return type(x) in (Closure, Builtin)


def _number(x: Any) -> bool:
    t = type(x)
    return t is int or t is float or t is Fraction


ATOMIC: dict[str, Predicate] = {
    "T": lambda x: True,
    "NIL": lambda x: False,
    "NUMBER": _number,
    "REAL": _number,
    "RATIONAL": lambda x: type(x) in (int, Fraction),
    "INTEGER": lambda x: type(x) is int,
    "FIXNUM": lambda x: type(x) is int and FIXNUM_LOW <= x <= FIXNUM_HIGH,
    "BIGNUM": lambda x: type(x) is int and not FIXNUM_LOW <= x <= FIXNUM_HIGH,
    "BIT": lambda x: type(x) is int and x in (0, 1),
    "UNSIGNED-BYTE": lambda x: type(x) is int and x >= 0,
    "SIGNED-BYTE": lambda x: type(x) is int,
    "RATIO": lambda x: type(x) is Fraction,
    "FLOAT": lambda x: type(x) is float,
    "DOUBLE-FLOAT": lambda x: type(x) is float,
    "LONG-FLOAT": lambda x: type(x) is float,
    "SINGLE-FLOAT": lambda x: False,
    "SHORT-FLOAT": lambda x: False,
    "COMPLEX": lambda x: False,
    "CHARACTER": lambda x: type(x) is Char,
    "BASE-CHAR": lambda x: type(x) is Char and ord(x.ch) < 128,
    "STANDARD-CHAR": lambda x: type(x) is Char and (32 <= ord(x.ch) < 127 or x.ch == "\n"),
    "EXTENDED-CHAR": lambda x: type(x) is Char and ord(x.ch) >= 128,
    "SYMBOL": lambda x: type(x) is Symbol,
    "KEYWORD": lambda x: type(x) is Symbol and x.package == "KEYWORD",
    "BOOLEAN": lambda x: x is T or x is NIL,
    "NULL": lambda x: x is NIL,
    "CONS": lambda x: type(x) is Cons,
    "LIST": lambda x: x is NIL or type(x) is Cons,
    "ATOM": lambda x: type(x) is not Cons,
    "SEQUENCE": lambda x: x is NIL or type(x) in (Cons, list, str, BitVector),
    "STRING": lambda x: type(x) is str,
    "SIMPLE-STRING": lambda x: type(x) is str,
    "BASE-STRING": lambda x: False,  # strings read or made here hold characters, as in SBCL
    "SIMPLE-BASE-STRING": lambda x: False,
    "VECTOR": lambda x: type(x) in (list, str, BitVector),
    "SIMPLE-VECTOR": lambda x: type(x) is list,
    "BIT-VECTOR": lambda x: type(x) is BitVector,
    "SIMPLE-BIT-VECTOR": lambda x: type(x) is BitVector,
    "ARRAY": lambda x: type(x) in (list, str, BitVector, LispArray),
    "SIMPLE-ARRAY": lambda x: type(x) in (list, str, BitVector, LispArray),
    "FUNCTION": _is_function,
    "COMPILED-FUNCTION": _is_function,
    "HASH-TABLE": lambda x: type(x) is HashTable,
    "STRUCTURE-OBJECT": lambda x: type(x) is StructInstance,
    "RANDOM-STATE": lambda x: False,
    "PACKAGE": lambda x: False,
    "PATHNAME": lambda x: False,
    "STREAM": lambda x: False,
    "READTABLE": lambda x: False,
}

NUMERIC_RANGES = {"INTEGER", "RATIONAL", "REAL", "FLOAT", "DOUBLE-FLOAT", "LONG-FLOAT", "SINGLE-FLOAT", "SHORT-FLOAT", "NUMBER"}


def _star(x: Any) -> bool:
    return type(x) is Symbol and x.name == "*"


class TypeSpecs:
    """typep and subtypep for one interpreter (which knows the structures and deftypes)."""

    def __init__(self, interp: "Interpreter") -> None:
        self.interp = interp
        self.cache: dict[int, tuple[Any, Predicate]] = {}
        self.deftypes: dict[Symbol, Any] = {}  # name -> the expander (a closure of the type's arguments)

    def typep(self, x: Any, spec: Any) -> bool:
        hit = self.cache.get(id(spec))
        if hit is not None and hit[0] is spec:
            return hit[1](x)
        predicate = self.compile(spec)
        if type(spec) in (Cons, Symbol):
            self.cache[id(spec)] = (spec, predicate)
        return predicate(x)

    def unknown(self, spec: Any) -> Exception:
        return lisp_error("E103", f"unknown type specifier {short(spec)}", "ERROR", spec)

    def expand(self, spec: Any) -> Any:
        """SPEC with deftypes expanded (at its head), or SPEC."""
        for _ in range(1000):
            name = spec if type(spec) is Symbol else (spec.car if type(spec) is Cons and type(spec.car) is Symbol else None)
            expander = self.deftypes.get(name) if name is not None else None
            if expander is None:
                return spec
            args = list(spec.cdr) if type(spec) is Cons else []
            spec = self.interp.call(expander, *args)
        raise self.unknown(spec)

    def compile(self, spec: Any) -> Predicate:
        spec = self.expand(spec)
        if type(spec) is Symbol:
            return self.atomic(spec)
        if type(spec) is not Cons or type(spec.car) is not Symbol:
            raise self.unknown(spec)
        head = spec.car.name
        args = list_items("typep", 2, spec.cdr)
        if head == "OR":
            parts = [self.compile(s) for s in args]
            return lambda x: any(p(x) for p in parts)
        if head == "AND":
            parts = [self.compile(s) for s in args]
            return lambda x: all(p(x) for p in parts)
        if head == "NOT" and len(args) == 1:
            part = self.compile(args[0])
            return lambda x: not part(x)
        if head == "MEMBER":
            return lambda x: any(eql(x, a) for a in args)
        if head == "EQL" and len(args) == 1:
            value = args[0]
            return lambda x: eql(x, value)
        if head == "SATISFIES" and len(args) == 1:
            fn = args[0]
            return lambda x: self.interp.call(fn, x) is not NIL
        if head in NUMERIC_RANGES:
            return self.numeric_range(head, args, spec)
        if head == "MOD" and len(args) == 1 and type(args[0]) is int:
            n = args[0]
            return lambda x: type(x) is int and 0 <= x < n
        if head in ("UNSIGNED-BYTE", "SIGNED-BYTE"):
            return self.byte_range(head, args, spec)
        if head == "CONS":
            car = self.compile(args[0]) if args and not _star(args[0]) else ATOMIC["T"]
            cdr = self.compile(args[1]) if len(args) > 1 and not _star(args[1]) else ATOMIC["T"]
            return lambda x: type(x) is Cons and car(x.car) and cdr(x.cdr)
        if head in ("VECTOR", "SIMPLE-VECTOR", "ARRAY", "SIMPLE-ARRAY", "STRING", "SIMPLE-STRING", "BASE-STRING", "SIMPLE-BASE-STRING", "BIT-VECTOR", "SIMPLE-BIT-VECTOR"):
            return self.array_type(head, args, spec)
        if head in ("FUNCTION", "COMPILED-FUNCTION"):
            return _is_function
        if head == "COMPLEX":
            return lambda x: False
        if head == "VALUES":
            raise lisp_error("E103", "typep: a (values ...) type specifier names no objects", "ERROR", spec)
        raise self.unknown(spec)

    def atomic(self, spec: Symbol) -> Predicate:
        check = ATOMIC.get(spec.name) if spec.package in ("", None) or spec is NIL or spec is T else None
        if check is not None:
            return self.simple_only(check) if spec.name in SIMPLE_TYPES else check
        stype = self.interp.structs.get(spec)
        if stype is not None:
            return lambda x: type(x) is StructInstance and x.stype.isa(stype)
        if spec.name in CONDITION_PARENTS or spec.name in self.interp.condition_types:
            name = spec.name
            return lambda x: type(x) is Condition and condition_is(x, name)
        raise self.unknown(spec)

    def numeric_range(self, head: str, args: list[Any], spec: Any) -> Predicate:
        kind = ATOMIC[head]
        low = args[0] if args else NIL
        high = args[1] if len(args) > 1 else NIL
        if len(args) > 2:
            raise self.unknown(spec)
        for bound in args:
            if not (_star(bound) or _number(bound) or (type(bound) is Cons and _number(bound.car) and bound.cdr is NIL)):
                raise self.unknown(spec)

        def within(x: Any) -> bool:
            return kind(x) and _in_bound(x, low, True) and _in_bound(x, high, False)

        return within

    def byte_range(self, head: str, args: list[Any], spec: Any) -> Predicate:
        size = args[0] if args else NIL
        if _star(size) or size is NIL:
            return ATOMIC[head]
        if type(size) is not int or size <= 0:
            raise self.unknown(spec)
        if head == "UNSIGNED-BYTE":
            return lambda x: type(x) is int and 0 <= x < 2**size
        return lambda x: type(x) is int and -(2 ** (size - 1)) <= x < 2 ** (size - 1)

    def simple_only(self, check: Predicate) -> Predicate:
        """CHECK, and not a vector with a fill pointer or made adjustable (CLHS 15.1.1.3.1.2)."""
        headers = self.interp.vector_headers
        return lambda x: check(x) and id(x) not in headers

    def array_type(self, head: str, args: list[Any], spec: Any) -> Predicate:
        """(vector elt size) (array elt dims) (string size) and their simple- forms."""
        check = self.any_array_type(head, args, spec)
        return self.simple_only(check) if head in SIMPLE_TYPES else check

    def any_array_type(self, head: str, args: list[Any], spec: Any) -> Predicate:
        if head in ("STRING", "SIMPLE-STRING", "BASE-STRING", "SIMPLE-BASE-STRING"):
            size = args[0] if args else NIL
            base = ATOMIC[head]
            return lambda x: base(x) and _size_ok(len(x), size)
        if head in ("BIT-VECTOR", "SIMPLE-BIT-VECTOR"):
            size = args[0] if args else NIL
            return lambda x: type(x) is BitVector and _size_ok(len(x), size)
        if head == "SIMPLE-VECTOR":
            size = args[0] if args else NIL
            return lambda x: type(x) is list and _size_ok(len(x), size)
        element = args[0] if args else _ANY
        if head == "VECTOR":
            size = args[1] if len(args) > 1 else NIL
            kinds = self.element_kinds(element)
            return lambda x: type(x) in (list, str, BitVector) and _kind(x) in kinds and _size_ok(len(x), size)
        dims = args[1] if len(args) > 1 else NIL
        kinds = self.element_kinds(element)

        def array(x: Any) -> bool:
            if type(x) not in (list, str, BitVector, LispArray) or _kind(x) not in kinds:
                return False
            shape = x.dims if type(x) is LispArray else (len(x),)
            return _dims_ok(shape, dims)

        return array

    def element_kinds(self, element: Any) -> set[str]:
        """Which of our array kinds ("t": vectors and arrays, "character": strings, "bit": bit
        vectors) an element type admits: * all, t and types t upgrades to only "t"."""
        if _star(element) or element is _ANY:
            return {"t", "character", "bit"}
        if type(element) is Symbol and element.name in ("CHARACTER", "BASE-CHAR", "STANDARD-CHAR"):
            return {"character"}
        if upgrades_to_bit(self.expand(element)):
            return {"bit"}
        if element is T:
            return {"t"}
        return set()  # a specialized element type (fixnum, double-float ...): no array of ours


_ANY = Symbol("*", None)  # an element type left out: any
SIMPLE_TYPES = frozenset({"SIMPLE-VECTOR", "SIMPLE-ARRAY", "SIMPLE-BIT-VECTOR"})


def _kind(x: Any) -> str:
    t = type(x)
    return "character" if t is str else "bit" if t is BitVector or (t is LispArray and x.bits) else "t"


def upgrades_to_bit(element: Any) -> bool:
    """Whether an array of element type ELEMENT is a bit array: bit, (integer 0 1),
    (unsigned-byte 1), (mod 2) and (member 0 1), as SBCL upgrades them."""
    if type(element) is Symbol:
        return element.name == "BIT"
    if type(element) is not Cons or type(element.car) is not Symbol:
        return False
    head, args = element.car.name, list(element.cdr) if type(element.cdr) is Cons else []
    if head == "INTEGER" and len(args) == 2:
        return args[0] == 0 and args[1] == 1
    if head == "UNSIGNED-BYTE":
        return args == [1]
    if head == "MOD":
        return args == [2]
    if head == "MEMBER":
        return bool(args) and all(type(a) is int and a in (0, 1) for a in args)
    return False


def _size_ok(n: int, size: Any) -> bool:
    return size is NIL or _star(size) or n == size


def _dims_ok(shape: tuple[int, ...], dims: Any) -> bool:
    if dims is NIL or _star(dims):
        return True
    if type(dims) is int:
        return len(shape) == dims
    wanted = list(dims) if type(dims) is Cons else None
    if wanted is None or len(wanted) != len(shape):
        return dims is NIL and not shape
    return all(_star(w) or w == d for w, d in zip(wanted, shape))


def _in_bound(x: Any, bound: Any, lower: bool) -> bool:
    if bound is NIL or _star(bound):
        return True
    if type(bound) is Cons:
        b = bound.car
        return bool(x > b) if lower else bool(x < b)
    return bool(x >= bound) if lower else bool(x <= bound)


# -- subtypep ----------------------------------------------------------------------------------

SUPERTYPES: dict[str, tuple[str, ...]] = {
    "NIL": (), "T": (),
    "NUMBER": ("T",), "REAL": ("NUMBER",), "RATIONAL": ("REAL",), "INTEGER": ("RATIONAL",), "RATIO": ("RATIONAL",),
    "FIXNUM": ("INTEGER",), "BIGNUM": ("INTEGER",), "BIT": ("FIXNUM", "UNSIGNED-BYTE"), "UNSIGNED-BYTE": ("SIGNED-BYTE",),
    "SIGNED-BYTE": ("INTEGER",), "FLOAT": ("REAL",), "DOUBLE-FLOAT": ("FLOAT",), "LONG-FLOAT": ("FLOAT",),
    "SINGLE-FLOAT": ("FLOAT",), "SHORT-FLOAT": ("FLOAT",), "COMPLEX": ("NUMBER",),
    "CHARACTER": ("T",), "BASE-CHAR": ("CHARACTER",), "STANDARD-CHAR": ("BASE-CHAR",), "EXTENDED-CHAR": ("CHARACTER",),
    "SYMBOL": ("T",), "KEYWORD": ("SYMBOL",), "BOOLEAN": ("SYMBOL",), "NULL": ("SYMBOL", "LIST", "BOOLEAN"),
    "SEQUENCE": ("T",), "LIST": ("SEQUENCE",), "CONS": ("LIST",), "ATOM": ("T",),
    "ARRAY": ("T",), "SIMPLE-ARRAY": ("ARRAY",), "VECTOR": ("ARRAY", "SEQUENCE"), "SIMPLE-VECTOR": ("VECTOR", "SIMPLE-ARRAY"),
    "STRING": ("VECTOR",), "SIMPLE-STRING": ("STRING", "SIMPLE-ARRAY"), "BASE-STRING": ("STRING",),
    "SIMPLE-BASE-STRING": ("BASE-STRING", "SIMPLE-STRING"), "BIT-VECTOR": ("VECTOR",), "SIMPLE-BIT-VECTOR": ("BIT-VECTOR", "SIMPLE-ARRAY"),
    "FUNCTION": ("T",), "COMPILED-FUNCTION": ("FUNCTION",), "HASH-TABLE": ("T",), "STRUCTURE-OBJECT": ("T",),
    **{name: parents or ("T",) for name, parents in CONDITION_PARENTS.items()},
}
ATOMS = {"NUMBER", "REAL", "RATIONAL", "INTEGER", "RATIO", "FIXNUM", "BIGNUM", "BIT", "UNSIGNED-BYTE", "SIGNED-BYTE", "FLOAT",
         "DOUBLE-FLOAT", "LONG-FLOAT", "SINGLE-FLOAT", "SHORT-FLOAT", "COMPLEX", "CHARACTER", "BASE-CHAR", "STANDARD-CHAR",
         "EXTENDED-CHAR", "SYMBOL", "KEYWORD", "BOOLEAN", "NULL", "ARRAY", "SIMPLE-ARRAY", "VECTOR", "SIMPLE-VECTOR",
         "STRING", "SIMPLE-STRING", "BASE-STRING", "SIMPLE-BASE-STRING", "BIT-VECTOR", "SIMPLE-BIT-VECTOR", "FUNCTION",
         "COMPILED-FUNCTION", "HASH-TABLE", "STRUCTURE-OBJECT", "LIST", "CONS", "SEQUENCE", *CONDITION_PARENTS}
NOT_ATOMS = {"CONS", "LIST", "SEQUENCE"}  # types that hold conses


def _supertypes(name: str) -> set[str]:
    out = {name, "T"}
    pending = list(SUPERTYPES.get(name, ()))
    while pending:
        current = pending.pop()
        if current not in out:
            out.add(current)
            pending.extend(SUPERTYPES.get(current, ()))
    return out


def subtypep(specs: TypeSpecs, a: Any, b: Any) -> tuple[bool, bool]:
    """(subtype-p, certain-p) for the documented types: atomic types, structures,
    and/or/not/member/eql and numeric ranges; otherwise (nil, nil) when unsure."""
    a, b = specs.expand(a), specs.expand(b)
    name_a = a.name if type(a) is Symbol else None
    name_b = b.name if type(b) is Symbol else None
    if name_a == "NIL" or name_b == "T":
        return True, True
    if type(a) is Cons and type(a.car) is Symbol:
        head = a.car.name
        args = list(a.cdr)
        if head in ("MEMBER", "EQL"):
            return all(specs.typep(x, b) for x in args), True
        if head == "OR":
            results = [subtypep(specs, x, b) for x in args]
            if all(r[0] for r in results):
                return True, True
            return False, all(r[1] for r in results)
        if head == "AND":
            if any(subtypep(specs, x, b)[0] for x in args):
                return True, True
            return False, False
    if type(b) is Cons and type(b.car) is Symbol:
        head = b.car.name
        args = list(b.cdr)
        if head == "AND":
            results = [subtypep(specs, a, x) for x in args]
            if all(r[0] for r in results):
                return True, True
            return False, any(r[1] and not r[0] for r in results)
        if head == "OR":
            results = [subtypep(specs, a, x) for x in args]
            if any(r[0] for r in results):
                return True, True
            return False, False
        if head == "NOT" and len(args) == 1:
            disjoint = _disjoint(specs, a, args[0])
            return (True, True) if disjoint else (False, disjoint is not None and False)
    if name_b == "ATOM" and name_a is not None and (name_a in ATOMS or specs.interp.structs.get(a) is not None):
        return name_a not in NOT_ATOMS, True
    if name_a == "T" and name_b is not None and (name_b in ATOMS or specs.interp.structs.get(b) is not None):
        return False, True
    array_a, array_b = _array_shape(a), _array_shape(b)
    if array_a is not None and array_b is not None:
        return _array_within(array_a, array_b), True
    range_a, range_b = _range(a), _range(b)
    if range_a is not None and range_b is not None:
        kind_a, low_a, high_a = range_a
        kind_b, low_b, high_b = range_b
        if kind_b not in _supertypes(kind_a):
            return False, True
        return _within(low_a, low_b, True) and _within(high_a, high_b, False), True
    if name_a is not None and name_b is not None:
        defined = specs.interp.condition_types
        if name_a in defined:
            lineage = defined[name_a].lineage
            return any(t == name_b or (t in CONDITION_PARENTS and name_b in _supertypes(t)) for t in lineage), True
        if name_b in defined:
            return False, name_a in ATOMS
        if name_a in ATOMS and name_b in ATOMS:
            return name_b in _supertypes(name_a), True
        stype_a, stype_b = specs.interp.structs.get(a), specs.interp.structs.get(b)
        if stype_a is not None and stype_b is not None:
            return stype_a.isa(stype_b), True
        if stype_a is not None:
            return name_b in ("STRUCTURE-OBJECT", "ATOM"), True
        if name_a in ATOMS and stype_b is not None:
            return False, True
    return False, False


def _disjoint(specs: TypeSpecs, a: Any, b: Any) -> Optional[bool]:
    if type(a) is Symbol and type(b) is Symbol and a.name in ATOMS and b.name in ATOMS:
        sa, sb = _supertypes(a.name), _supertypes(b.name)
        if b.name in sa or a.name in sb:
            return False
        return None
    return None


def _range(spec: Any) -> Optional[tuple[str, Any, Any]]:
    """A numeric type as (kind, low, high), bounds as given (* for none)."""
    if type(spec) is Symbol and spec.name in NUMERIC_RANGES | {"FIXNUM", "BIT"}:
        if spec.name == "FIXNUM":
            return "INTEGER", FIXNUM_LOW, FIXNUM_HIGH
        if spec.name == "BIT":
            return "INTEGER", 0, 1
        return spec.name, NIL, NIL
    if type(spec) is Cons and type(spec.car) is Symbol and spec.car.name in NUMERIC_RANGES:
        args = list(spec.cdr)
        return spec.car.name, args[0] if args else NIL, args[1] if len(args) > 1 else NIL
    if type(spec) is Cons and type(spec.car) is Symbol and spec.car.name == "MOD" and type(spec.cdr) is Cons:
        return "INTEGER", 0, spec.cdr.car - 1
    if type(spec) is Symbol and spec.name == "UNSIGNED-BYTE":
        return "INTEGER", 0, NIL
    if type(spec) is Cons and type(spec.car) is Symbol and spec.car.name in ("UNSIGNED-BYTE", "SIGNED-BYTE") and type(spec.cdr) is Cons and type(spec.cdr.car) is int:
        n = spec.cdr.car
        return ("INTEGER", 0, 2**n - 1) if spec.car.name == "UNSIGNED-BYTE" else ("INTEGER", -(2 ** (n - 1)), 2 ** (n - 1) - 1)
    return None


ArrayShape = tuple[bool, str, Any]  # simple-p, element kind ("T", "CHARACTER", "STRING" or "*"), dims


ARRAY_HEADS = {
    "ARRAY": (False, "*"), "SIMPLE-ARRAY": (True, "*"), "VECTOR": (False, "*"), "SIMPLE-VECTOR": (True, "T"),
    "STRING": (False, "STRING"), "SIMPLE-STRING": (True, "STRING"), "BASE-STRING": (False, "CHARACTER"),
    "SIMPLE-BASE-STRING": (True, "CHARACTER"),
}


def _array_shape(spec: Any) -> Optional[ArrayShape]:
    """An array type as (simple-p, element kind, dimensions: * or a list of ints and *s)."""
    if type(spec) is Symbol:
        head, args = spec.name, []
    elif type(spec) is Cons and type(spec.car) is Symbol:
        head, args = spec.car.name, list(spec.cdr)
    else:
        return None
    if head not in ARRAY_HEADS:
        return None
    simple, element = ARRAY_HEADS[head]
    vector_like = head not in ("ARRAY", "SIMPLE-ARRAY")
    if head in ("ARRAY", "SIMPLE-ARRAY", "VECTOR") and args:
        e = args[0]
        element = "*" if _star(e) else ("CHARACTER" if type(e) is Symbol and e.name in ("CHARACTER", "BASE-CHAR", "STANDARD-CHAR") else "T")
        args = args[1:]
    size = args[0] if args else _ANY
    if vector_like:
        dims: Any = [size]
    elif _star(size):
        dims = _ANY
    elif type(size) is int:
        dims = [_ANY] * size
    else:
        dims = list(size) if type(size) is Cons else [] if size is NIL else None
    return simple, element, dims



def _array_within(a: ArrayShape, b: ArrayShape) -> bool:
    simple_a, element_a, dims_a = a
    simple_b, element_b, dims_b = b
    if simple_b and not simple_a:
        return False
    if element_b != "*" and not (element_a == element_b or (element_b == "STRING" and element_a == "CHARACTER")):
        return False
    if _star(dims_b):
        return True
    if _star(dims_a) or len(dims_a) != len(dims_b):
        return False
    return all(_star(db) or (not _star(da) and da == db) for da, db in zip(dims_a, dims_b))


def _within(inner: Any, outer: Any, lower: bool) -> bool:
    """Whether the bound INNER is inside the bound OUTER (on the low side when LOWER);
    (x) is an exclusive bound, nil or * none."""
    if outer is NIL or _star(outer):
        return True
    if inner is NIL or _star(inner):
        return False
    vi = inner.car if type(inner) is Cons else inner
    vo = outer.car if type(outer) is Cons else outer
    if vi == vo:
        return type(inner) is Cons or type(outer) is not Cons
    return bool(vi > vo) if lower else bool(vi < vo)


def subtypep_values(specs: TypeSpecs, a: Any, b: Any) -> Any:
    sub, certain = subtypep(specs, a, b)
    return MultipleValues((T if sub else NIL, T if certain else NIL))
