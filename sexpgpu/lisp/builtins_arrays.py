"""Arrays (CLHS chapter 15). A vector is a Python list, a bit vector a BitVector (a list of 0s
and 1s), a string a Python str (immutable, see "It is Common Lisp"), an array of any other rank
a LispArray (dimensions, row-major elements). A vector made with a fill pointer holds only its
active elements; vector-push-extend grows it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from .builtins import Lib, bits_of, lbool, need_index, parse_keys, type_error
from .conditions import lisp_error
from .objects import BitVector, LispArray, VectorHeader
from .registry import builtin
from .types import NIL, T, Char, Cons, Symbol
from .typespecs import upgrades_to_bit

if TYPE_CHECKING:
    from .evaluator import Interpreter

ARRAY_RANK_LIMIT = 129  # SBCL's
ARRAY_DIMENSION_LIMIT = 2**31 - 1
ARRAY_TOTAL_SIZE_LIMIT = 2**31 - 1
IMMUTABLE = "strings are immutable in SexpGPU; build a new one with concatenate or format"


def define_constants(interp: "Interpreter") -> None:
    """array-rank-limit, array-dimension-limit and array-total-size-limit."""
    for name, value in (("ARRAY-RANK-LIMIT", ARRAY_RANK_LIMIT), ("ARRAY-DIMENSION-LIMIT", ARRAY_DIMENSION_LIMIT), ("ARRAY-TOTAL-SIZE-LIMIT", ARRAY_TOTAL_SIZE_LIMIT)):
        sym = interp.sym(name)
        interp.values[sym] = value
        interp.constants.add(sym)


def is_array(x: Any) -> bool:
    return type(x) in (list, str, BitVector, LispArray)


def dimensions(x: Any) -> tuple[int, ...]:
    return x.dims if type(x) is LispArray else (len(x),)


def need_bit(fn: str, x: Any) -> int:
    if not (type(x) is int and (x == 0 or x == 1)):
        raise type_error(fn, 0, "a bit (0 or 1)", x)
    return x


BIT_OPERATIONS: dict[str, Any] = {
    "BIT-AND": lambda a, b: a & b, "BIT-IOR": lambda a, b: a | b, "BIT-XOR": lambda a, b: a ^ b,
    "BIT-EQV": lambda a, b: 1 - (a ^ b), "BIT-NAND": lambda a, b: 1 - (a & b), "BIT-NOR": lambda a, b: 1 - (a | b),
    "BIT-ANDC1": lambda a, b: (1 - a) & b, "BIT-ANDC2": lambda a, b: a & (1 - b),
    "BIT-ORC1": lambda a, b: (1 - a) | b, "BIT-ORC2": lambda a, b: a | (1 - b),
}


def _bits(array: Any) -> list[int]:
    """The elements of a bit array, row-major, as the list that holds them."""
    return array.data if type(array) is LispArray else array


def _character_type(element: Any) -> bool:
    return type(element) is Symbol and element.name in ("CHARACTER", "BASE-CHAR", "STANDARD-CHAR", "EXTENDED-CHAR")


class Arrays(Lib):
    def need_array(self, fn: str, pos: int, x: Any) -> Any:
        if not is_array(x):
            raise type_error(fn, pos, "an array", x)
        return x

    def dims_of(self, fn: str, spec: Any) -> tuple[int, ...]:
        if type(spec) is int:
            need_index(fn, 1, spec)
            return (spec,)
        items = self.elements(fn, 1, spec) if spec is NIL or type(spec) is Cons else None
        if items is None or not all(type(d) is int and d >= 0 for d in items):
            raise type_error(fn, 1, "a non-negative integer or a list of them", spec)
        if len(items) > ARRAY_RANK_LIMIT:
            raise lisp_error("E103", f"`{fn}`: rank {len(items)} is above array-rank-limit ({ARRAY_RANK_LIMIT})", "TYPE-ERROR", spec)
        return tuple(items)

    def header(self, v: Any) -> VectorHeader | None:
        return self.interp.vector_headers.get(id(v)) if type(v) is list or type(v) is BitVector else None

    def dims(self, x: Any) -> tuple[int, ...]:
        """The dimensions, counting the elements past a fill pointer."""
        header = self.header(x)
        return (len(x) + len(header.beyond),) if header is not None else dimensions(x)

    def need_fill_pointer(self, fn: str, pos: int, v: Any) -> VectorHeader:
        header = self.header(v)
        if header is None or not header.fill_pointer:
            raise type_error(fn, pos, "a vector with a fill pointer", v)
        return header

    def contents(self, fn: str, contents: Any, shape: tuple[int, ...]) -> list[Any]:
        """The row-major elements of nested :initial-contents matching SHAPE."""
        if not shape:
            return [contents]
        items = self.items(fn, 3, contents)
        if len(items) != shape[0]:
            raise lisp_error("E103", f"`{fn}`: :initial-contents has {len(items)} elements where the dimension is {shape[0]}", "ERROR", contents)
        if len(shape) == 1:
            return items
        out: list[Any] = []
        for sub in items:
            out.extend(self.contents(fn, sub, shape[1:]))
        return out

    def index(self, fn: str, array: Any, subscripts: tuple[Any, ...]) -> int:
        """The row-major index of SUBSCRIPTS in ARRAY, each checked (aref reaches past a fill
        pointer, CLHS 15.1.2.2)."""
        dims = self.dims(self.need_array(fn, 1, array))
        if len(subscripts) != len(dims):
            # SBCL: one subscript on an array of another rank is a type-error (not a vector)
            ctype = "TYPE-ERROR" if len(subscripts) == 1 else "ERROR"
            raise lisp_error("E102", f"`{fn}`: an array of rank {len(dims)} takes {len(dims)} subscripts, got {len(subscripts)}", ctype)
        index = 0
        for i, (d, s) in enumerate(zip(dims, subscripts), 2):
            need_index(fn, i, s)
            if s >= d:
                raise lisp_error("E103", f"`{fn}`: index {s} is out of bounds for dimension {i - 2} of length {d}", "TYPE-ERROR", s)
            index = index * d + s
        return index

    def element(self, array: Any, i: int) -> Any:
        """The element at row-major index I (checked by the caller): past a fill pointer too."""
        t = type(array)
        if t is str:
            return Char(array[i])
        if t is LispArray:
            return array.data[i]
        return array[i] if i < len(array) else self.past_fill_pointer(array)[i - len(array)]

    def store(self, fn: str, array: Any, i: int, value: Any) -> Any:
        """Store VALUE at row-major index I (checked by the caller): a bit array takes only 0
        and 1, a string nothing (immutable)."""
        t = type(array)
        if t is str:
            raise lisp_error("E109", IMMUTABLE, "PROGRAM-ERROR")
        if t is BitVector or (t is LispArray and array.bits):
            need_bit(fn, value)
        if t is LispArray:
            array.data[i] = value
        elif i < len(array):
            array[i] = value
        else:
            self.past_fill_pointer(array)[i - len(array)] = value
        return value

    def past_fill_pointer(self, v: Any) -> list[Any]:
        header = self.header(v)
        assert header is not None  # index() allowed an index past the active elements
        return header.beyond

    def need_vector(self, fn: str, pos: int, v: Any) -> list[Any]:
        if type(v) is not list and type(v) is not BitVector:
            raise type_error(fn, pos, "a vector (strings are immutable)" if type(v) is str else "a vector", v)
        return v

    def adjust_vector(self, v: Any, n: int, init: Any, fill: Any) -> Any:
        """A vector adjusted in place to dimension N: its elements (those past a fill pointer
        too) kept up to N, INIT after them; FILL, when given, the new fill pointer."""
        header = self.header(v)
        every = list(v) + (header.beyond if header is not None else [])
        self.alloc(max(0, n - len(every)))
        every = every[:n] + [init] * max(0, n - len(every))
        if header is None or not header.fill_pointer:
            if fill is not NIL:
                raise type_error("adjust-array", 0, "a vector with a fill pointer (for :fill-pointer)", v)
            v[:] = every
            return v
        active = len(v) if fill is NIL else n if fill is T else fill
        if type(active) is not int or not 0 <= active <= n:
            raise type_error("adjust-array", 0, f"a fill pointer from 0 to {n}", fill if fill is not NIL else active)
        v[:] = every[:active]
        header.beyond[:] = every[active:]
        return v

    # -- bit arrays (CLHS 15.2: bit, sbit, bit-and ...) ---------------------------------------
    def need_bit_array(self, fn: str, pos: int, x: Any) -> Any:
        if type(x) is not BitVector and not (type(x) is LispArray and x.bits):
            raise type_error(fn, pos, "a bit array", x)
        return x

    def bits_into(self, fn: str, bits: list[int], first: Any, result: Any, pos: int) -> Any:
        """CLHS's opt-arg: nil makes a fresh bit array, t stores into FIRST, a bit array of the
        same dimensions is stored into."""
        self.charge(len(bits))
        if result is NIL:
            self.alloc(len(bits))
            return BitVector(bits) if type(first) is BitVector else LispArray(first.dims, bits, True)
        target = first if result is T else self.need_bit_array(fn, pos, result)
        if dimensions(target) != dimensions(first):
            raise lisp_error("E103", f"`{fn}`: the result has dimensions {list(dimensions(target))}, the arguments {list(dimensions(first))}", "TYPE-ERROR", result)
        _bits(target)[:] = bits
        return target


@builtin("make-array", context=Arrays)
def make_array(lib: Arrays, dims: Any, *args: Any) -> Any:
    keys = parse_keys("make-array", args, {"INITIAL-ELEMENT", "INITIAL-CONTENTS", "ELEMENT-TYPE", "ADJUSTABLE", "FILL-POINTER", "DISPLACED-TO", "DISPLACED-INDEX-OFFSET"}, 2)
    shape = lib.dims_of("make-array", dims)
    if keys.get("DISPLACED-TO", NIL) is not NIL:
        raise lisp_error("E109", "`make-array`: displaced arrays do not exist in SexpGPU; copy with subseq or replace", "PROGRAM-ERROR")
    if "INITIAL-ELEMENT" in keys and "INITIAL-CONTENTS" in keys:
        raise lisp_error("E103", "`make-array`: give :initial-element or :initial-contents, not both", "ERROR")
    total = 1
    for d in shape:
        total *= d
    element = keys.get("ELEMENT-TYPE", T)
    characters = _character_type(element)
    bits = upgrades_to_bit(lib.interp.types.expand(element))
    lib.alloc(total // 8 if characters else total)
    lib.charge(total)
    if "INITIAL-CONTENTS" in keys:
        data = lib.contents("make-array", keys["INITIAL-CONTENTS"], shape)
    else:
        default = Char("\x00") if characters else 0  # what SBCL's fresh arrays hold
        data = [keys.get("INITIAL-ELEMENT", default)] * total
    fill = keys.get("FILL-POINTER", NIL)
    active = len(data)
    if fill is not NIL:
        if len(shape) != 1:
            raise lisp_error("E103", "`make-array`: only a vector can have a fill pointer", "TYPE-ERROR", fill)
        if fill is not T:
            if type(fill) is not int or not 0 <= fill <= shape[0]:
                raise type_error("make-array", 0, f"t or an integer from 0 to {shape[0]} (the :fill-pointer)", fill)
            active = fill
    if len(shape) == 1:
        if characters:
            if not all(type(c) is Char for c in data):
                raise lisp_error("E103", "`make-array`: a character array holds only characters", "TYPE-ERROR")
            return "".join(c.ch for c in data[:active])
        vector = bits_of("make-array", data) if bits else data
        if fill is not NIL or keys.get("ADJUSTABLE", NIL) is not NIL:
            lib.interp.vector_headers[id(vector)] = VectorHeader(vector, vector[active:], fill is not NIL, True)
            del vector[active:]
        return vector
    return LispArray(shape, list(bits_of("make-array", data)) if bits else data, bits)


@builtin("vector", context=Arrays)
def vector(lib: Arrays, *xs: Any) -> Any:
    lib.alloc(len(xs))
    return list(xs)


@builtin("aref", context=Arrays)
def aref(lib: Arrays, array: Any, *subscripts: Any) -> Any:
    t = type(array)
    if (t is list or t is BitVector) and len(subscripts) == 1 and type(subscripts[0]) is int and 0 <= subscripts[0] < len(array):
        return array[subscripts[0]]
    return lib.element(array, lib.index("aref", array, subscripts))


@builtin("%aset", context=Arrays)
def p_aset(lib: Arrays, array: Any, *rest: Any) -> Any:
    """(setf (aref array subscripts...) value): the value comes last."""
    if not rest:
        raise lisp_error("E102", "`(setf aref)` needs a value", "PROGRAM-ERROR")
    *subscripts, value = rest
    if type(array) is str:
        raise lisp_error("E109", IMMUTABLE, "PROGRAM-ERROR")
    return lib.store("(setf aref)", array, lib.index("(setf aref)", array, tuple(subscripts)), value)


@builtin("svref", context=Arrays)
def svref(lib: Arrays, v: Any, i: Any) -> Any:
    if type(v) is not list:
        raise type_error("svref", 1, "a simple vector", v)
    return aref(lib, v, i)


@builtin("%svset", context=Arrays)
def p_svset(lib: Arrays, v: Any, i: Any, value: Any) -> Any:
    if type(v) is not list:
        raise type_error("(setf svref)", 1, "a simple vector", v)
    return p_aset(lib, v, i, value)


@builtin("row-major-aref", context=Arrays)
def row_major_aref(lib: Arrays, array: Any, i: Any) -> Any:
    lib.need_array("row-major-aref", 1, array)
    total = array_total_size(lib, array)
    need_index("row-major-aref", 2, i)
    if i >= total:
        raise lisp_error("E103", f"`row-major-aref`: index {i} is out of bounds for an array of {total} elements", "TYPE-ERROR", i)
    return lib.element(array, i)


@builtin("%set-row-major-aref", context=Arrays)
def p_set_row_major_aref(lib: Arrays, array: Any, i: Any, value: Any) -> Any:
    if type(array) is str:
        raise lisp_error("E109", IMMUTABLE, "PROGRAM-ERROR")
    row_major_aref(lib, array, i)
    return lib.store("(setf row-major-aref)", array, i, value)


@builtin("array-dimensions", context=Arrays)
def array_dimensions(lib: Arrays, array: Any) -> Any:
    return to_lisp(list(lib.dims(lib.need_array("array-dimensions", 1, array))))


@builtin("array-dimension", context=Arrays)
def array_dimension(lib: Arrays, array: Any, axis: Any) -> Any:
    dims = lib.dims(lib.need_array("array-dimension", 1, array))
    need_index("array-dimension", 2, axis)
    if axis >= len(dims):
        raise lisp_error("E103", f"`array-dimension`: axis {axis} is not below the rank {len(dims)}", "ERROR", axis)
    return dims[axis]


@builtin("array-rank", context=Arrays)
def array_rank(lib: Arrays, array: Any) -> Any:
    return len(dimensions(lib.need_array("array-rank", 1, array)))


@builtin("array-total-size", context=Arrays)
def array_total_size(lib: Arrays, array: Any) -> Any:
    total = 1
    for d in lib.dims(lib.need_array("array-total-size", 1, array)):
        total *= d
    return total


@builtin("array-row-major-index", context=Arrays)
def array_row_major_index(lib: Arrays, array: Any, *subscripts: Any) -> Any:
    return lib.index("array-row-major-index", array, subscripts)


@builtin("array-in-bounds-p", context=Arrays)
def array_in_bounds_p(lib: Arrays, array: Any, *subscripts: Any) -> Any:
    dims = lib.dims(lib.need_array("array-in-bounds-p", 1, array))
    if len(subscripts) != len(dims):
        raise lisp_error("E102", f"`array-in-bounds-p`: an array of rank {len(dims)} takes {len(dims)} subscripts, got {len(subscripts)}", "PROGRAM-ERROR")
    for i, s in enumerate(subscripts, 2):
        if type(s) is not int:
            raise type_error("array-in-bounds-p", i, "an integer", s)
    return lbool(all(0 <= s < d for s, d in zip(subscripts, dims)))


@builtin("array-element-type", context=Arrays)
def array_element_type(lib: Arrays, array: Any) -> Any:
    lib.need_array("array-element-type", 1, array)
    t = type(array)
    bits = t is BitVector or (t is LispArray and array.bits)
    return lib.interp.sym("CHARACTER") if t is str else lib.interp.sym("BIT") if bits else T


@builtin("upgraded-array-element-type", context=Arrays)
def upgraded_array_element_type(lib: Arrays, spec: Any, env: Any = NIL) -> Any:
    if _character_type(spec):
        return lib.interp.sym("CHARACTER")
    return lib.interp.sym("BIT") if upgrades_to_bit(lib.interp.types.expand(spec)) else T


@builtin("adjustable-array-p", context=Arrays)
def adjustable_array_p(lib: Arrays, array: Any) -> Any:
    # a vector made with :adjustable or :fill-pointer (SBCL makes both adjustable)
    lib.need_array("adjustable-array-p", 1, array)
    return lbool(lib.header(array) is not None)


@builtin("array-has-fill-pointer-p", context=Arrays)
def array_has_fill_pointer_p(lib: Arrays, array: Any) -> Any:
    lib.need_array("array-has-fill-pointer-p", 1, array)
    header = lib.header(array)
    return lbool(header is not None and header.fill_pointer)


@builtin("array-displacement", context=Arrays)
def array_displacement(lib: Arrays, array: Any) -> Any:
    from .types import MultipleValues

    lib.need_array("array-displacement", 1, array)
    return MultipleValues((NIL, 0))


@builtin("fill-pointer", context=Arrays)
def fill_pointer(lib: Arrays, v: Any) -> Any:
    lib.need_fill_pointer("fill-pointer", 1, v)
    return len(v)


@builtin("%set-fill-pointer", context=Arrays)
def p_set_fill_pointer(lib: Arrays, v: Any, n: Any) -> Any:
    header = lib.need_fill_pointer("(setf fill-pointer)", 1, v)
    need_index("(setf fill-pointer)", 2, n)
    capacity = len(v) + len(header.beyond)
    if n > capacity:
        raise lisp_error("E103", f"(setf fill-pointer): {n} is beyond the vector's dimension {capacity}", "TYPE-ERROR", n)
    if n < len(v):
        header.beyond[:0] = v[n:]
        del v[n:]
    else:
        v.extend(header.beyond[: n - len(v)])
        del header.beyond[: n - len(v)]
    return n


@builtin("vector-push", context=Arrays)
def vector_push(lib: Arrays, x: Any, v: Any) -> Any:
    """Store X at the fill pointer and advance it; nil when the vector is full."""
    header = lib.need_fill_pointer("vector-push", 2, v)
    if type(v) is BitVector:
        need_bit("vector-push", x)
    if not header.beyond:
        return NIL
    del header.beyond[0]
    v.append(x)
    return len(v) - 1


@builtin("vector-push-extend", context=Arrays)
def vector_push_extend(lib: Arrays, x: Any, v: Any, extension: Any = NIL) -> Any:
    """vector-push, growing the vector when it is full (as SBCL does, adjustable or not)."""
    header = lib.need_fill_pointer("vector-push-extend", 2, v)
    if extension is not NIL and not (type(extension) is int and extension > 0):
        raise type_error("vector-push-extend", 3, "a positive integer", extension)
    if type(v) is BitVector:
        need_bit("vector-push-extend", x)
    lib.alloc(1)
    if header.beyond:
        del header.beyond[0]
    v.append(x)
    return len(v) - 1


@builtin("vector-pop", context=Arrays)
def vector_pop(lib: Arrays, v: Any) -> Any:
    header = lib.need_fill_pointer("vector-pop", 1, v)
    if not v:
        raise lisp_error("E103", "`vector-pop`: the fill pointer is already zero", "ERROR")
    x = v.pop()
    header.beyond.insert(0, x)  # the element stays in the vector, past the fill pointer
    return x


@builtin("adjust-array", context=Arrays)
def adjust_array(lib: Arrays, array: Any, dims: Any, *args: Any) -> Any:
    keys = parse_keys("adjust-array", args, {"INITIAL-ELEMENT", "INITIAL-CONTENTS", "ELEMENT-TYPE", "FILL-POINTER", "DISPLACED-TO", "DISPLACED-INDEX-OFFSET"}, 3)
    shape = lib.dims_of("adjust-array", dims)
    old = lib.need_array("adjust-array", 1, array)
    bits = type(old) is BitVector or (type(old) is LispArray and old.bits)
    element = (lib.interp.kw("ELEMENT-TYPE"), lib.interp.sym("BIT")) if bits else ()
    if "INITIAL-CONTENTS" in keys:
        return make_array(lib, dims, lib.interp.kw("INITIAL-CONTENTS"), keys["INITIAL-CONTENTS"], *element)
    init = keys.get("INITIAL-ELEMENT", 0 if bits else NIL)
    if bits:
        need_bit("adjust-array", init)
    if (type(old) is list or type(old) is BitVector) and len(shape) == 1:
        return lib.adjust_vector(old, shape[0], init, keys.get("FILL-POINTER", NIL))
    made = make_array(lib, dims, lib.interp.kw("INITIAL-ELEMENT"), init, *element)
    old_dims = dimensions(old)
    if len(old_dims) == len(shape):
        for index in _all_subscripts(tuple(min(a, b) for a, b in zip(old_dims, shape))):
            p_aset(lib, made, *index, aref(lib, old, *index))
    return made


@builtin("arrayp")
def arrayp(x: Any) -> Any:
    return lbool(is_array(x))


@builtin("vectorp")
def vectorp(x: Any) -> Any:
    return lbool(type(x) in (list, str, BitVector))


@builtin("simple-vector-p", context=Arrays)
def simple_vector_p(lib: Arrays, x: Any) -> Any:
    return lbool(type(x) is list and lib.header(x) is None)


@builtin("bit", context=Arrays)
def bit(lib: Arrays, array: Any, *subscripts: Any) -> Any:
    return aref(lib, lib.need_bit_array("bit", 1, array), *subscripts)


@builtin("sbit", context=Arrays)
def sbit(lib: Arrays, array: Any, *subscripts: Any) -> Any:
    return aref(lib, lib.need_bit_array("sbit", 1, array), *subscripts)


@builtin("%set-bit", context=Arrays)
def p_set_bit(lib: Arrays, array: Any, *rest: Any) -> Any:
    return p_aset(lib, lib.need_bit_array("(setf bit)", 1, array), *rest)


@builtin("bit-vector-p")
def bit_vector_p(x: Any) -> Any:
    return lbool(type(x) is BitVector)


@builtin("simple-bit-vector-p", context=Arrays)
def simple_bit_vector_p(lib: Arrays, x: Any) -> Any:
    return lbool(type(x) is BitVector and lib.header(x) is None)


@builtin("bit-not", context=Arrays)
def bit_not(lib: Arrays, a: Any, result: Any = NIL) -> Any:
    lib.need_bit_array("bit-not", 1, a)
    return lib.bits_into("bit-not", [1 - x for x in _bits(a)], a, result, 2)


def _all_subscripts(dims: tuple[int, ...]) -> Any:
    if not dims:
        yield ()
        return
    for i in range(dims[0]):
        for rest in _all_subscripts(dims[1:]):
            yield (i, *rest)


def to_lisp(items: list[Any]) -> Any:
    result: Any = NIL
    for item in reversed(items):
        result = Cons(item, result)
    return result


def _bit_operation(fn: str) -> Callable[..., Any]:
    """bit-and and the other two-argument bit array operations: BIT_OPERATIONS elementwise."""
    combine = BIT_OPERATIONS[fn.upper()]

    def operate(lib: Arrays, a: Any, b: Any, result: Any = NIL) -> Any:
        lib.need_bit_array(fn, 1, a)
        lib.need_bit_array(fn, 2, b)
        if dimensions(a) != dimensions(b):
            raise lisp_error("E103", f"`{fn}`: the bit arrays have dimensions {list(dimensions(a))} and {list(dimensions(b))}", "TYPE-ERROR", b)
        return lib.bits_into(fn, [combine(x, y) for x, y in zip(_bits(a), _bits(b))], a, result, 3)

    return operate


bit_and = builtin("bit-and", context=Arrays)(_bit_operation("bit-and"))
bit_ior = builtin("bit-ior", context=Arrays)(_bit_operation("bit-ior"))
bit_xor = builtin("bit-xor", context=Arrays)(_bit_operation("bit-xor"))
bit_eqv = builtin("bit-eqv", context=Arrays)(_bit_operation("bit-eqv"))
bit_nand = builtin("bit-nand", context=Arrays)(_bit_operation("bit-nand"))
bit_nor = builtin("bit-nor", context=Arrays)(_bit_operation("bit-nor"))
bit_andc1 = builtin("bit-andc1", context=Arrays)(_bit_operation("bit-andc1"))
bit_andc2 = builtin("bit-andc2", context=Arrays)(_bit_operation("bit-andc2"))
bit_orc1 = builtin("bit-orc1", context=Arrays)(_bit_operation("bit-orc1"))
bit_orc2 = builtin("bit-orc2", context=Arrays)(_bit_operation("bit-orc2"))
