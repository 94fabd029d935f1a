"""Number builtins: the CL numeric tower without complexes or single floats."""

from __future__ import annotations

import math
import operator
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Callable

from .builtins import MAX_INTEGER_BITS, is_num, lbool, need_index, need_integer, need_number, norm, short, to_lisp_list, type_error
from .conditions import LimitExceeded, OperationName, lisp_error
from .objects import RandomState
from .registry import builtin
from .types import NIL, T, Cons, MultipleValues

if TYPE_CHECKING:
    from .evaluator import Interpreter


def big(fn: str, x: Any) -> Any:
    if type(x) is int and x.bit_length() > MAX_INTEGER_BITS:
        raise LimitExceeded("L003", f"allocation limit: `{fn}` made an integer larger than {MAX_INTEGER_BITS} bits")
    return x


need_real = need_number  # no complex numbers: every number is real


def div_zero(fn: str, *operands: Any) -> Exception:
    exc = lisp_error("E108", f"`{fn}`: division by zero", "DIVISION-BY-ZERO")
    exc.condition.slots.update({"OPERATION": OperationName(fn), "OPERANDS": to_lisp_list(list(operands))})
    return exc


def finite(fn: str, x: Any) -> Any:
    """A float result that overflowed is an error, as in SBCL, never an infinity."""
    if type(x) is float and (x == math.inf or x == -math.inf):
        raise lisp_error("E108", f"`{fn}`: floating-point overflow (a number too large for a double)", "FLOATING-POINT-OVERFLOW")
    return x


_INF = math.inf


@builtin("+")
def add(*xs: Any) -> Any:
    if len(xs) == 2:  # the common case, without the general loop
        a, b = xs
        ta, tb = type(a), type(b)
        if ta is int and tb is int:
            return a + b
        if ta is float and tb is float:
            r = a + b
            if r == _INF or r == -_INF:
                return finite("+", r)
            return r
    if not xs:
        return 0
    # the first argument starts the sum, so that (+ -0.0) is -0.0, as 0 + -0.0 would not be
    total: Any = need_number("+", 1, xs[0])
    for i, x in enumerate(xs[1:], 2):
        total = total + need_number("+", i, x)
    return finite("+", norm(total))


@builtin("-")
def sub(x: Any, *xs: Any) -> Any:
    if len(xs) == 1:
        y = xs[0]
        tx, ty = type(x), type(y)
        if tx is int and ty is int:
            return x - y
        if tx is float and ty is float:
            r = x - y
            if r == _INF or r == -_INF:
                return finite("-", r)
            return r
    need_number("-", 1, x)
    if not xs:
        return norm(-x)
    total = x
    for i, y in enumerate(xs, 2):
        total = total - need_number("-", i, y)
    return finite("-", norm(total))


@builtin("*")
def mul(*xs: Any) -> Any:
    if len(xs) == 2:
        a, b = xs
        ta, tb = type(a), type(b)
        if ta is float and tb is float:
            r = a * b
            if r == _INF or r == -_INF:
                return finite("*", r)
            return r
        if ta is int and tb is int and -_FIXNUM_LIMIT < a < _FIXNUM_LIMIT and -_FIXNUM_LIMIT < b < _FIXNUM_LIMIT:
            return a * b
    total: Any = 1
    for i, x in enumerate(xs, 1):
        total = big("*", total * need_number("*", i, x))
    return finite("*", norm(total))


_FIXNUM_LIMIT = 2**62


@builtin("/")
def divide(x: Any, *xs: Any) -> Any:
    need_number("/", 1, x)
    if not xs:
        return _div2(1, x)
    total = x
    for i, y in enumerate(xs, 2):
        need_number("/", i, y)
        total = _div2(total, y)
    return total


def _div2(a: Any, b: Any) -> Any:
    if b == 0:
        raise div_zero("/", a, b)
    if type(a) is float or type(b) is float:
        return finite("/", a / b)
    return norm(Fraction(a) / Fraction(b))


def compare_chain(name: str, op: Callable[[Any, Any], bool]) -> Callable[..., Any]:
    def compare(x: Any, *xs: Any) -> Any:
        if len(xs) == 1:
            y = xs[0]
            tx, ty = type(x), type(y)
            if (tx is int or tx is float) and (ty is int or ty is float):
                return T if op(x, y) else NIL
        need_number(name, 1, x)
        for i, y in enumerate(xs, 2):
            need_number(name, i, y)
        seq = (x, *xs)
        return lbool(all(op(a, b) for a, b in zip(seq, seq[1:])))

    return compare


@builtin("/=")
def not_equal(x: Any, *xs: Any) -> Any:
    seq = (x, *xs)
    for i, v in enumerate(seq, 1):
        need_number("/=", i, v)
    return lbool(all(seq[i] != seq[j] for i in range(len(seq)) for j in range(i + 1, len(seq))))


@builtin("max")
def lisp_max(x: Any, *xs: Any) -> Any:
    best = need_number("max", 1, x)
    for i, y in enumerate(xs, 2):
        if need_number("max", i, y) > best:
            best = y
    if any(type(v) is float for v in (x, *xs)):
        return float(best)
    return best


@builtin("min")
def lisp_min(x: Any, *xs: Any) -> Any:
    best = need_number("min", 1, x)
    for i, y in enumerate(xs, 2):
        if need_number("min", i, y) < best:
            best = y
    if any(type(v) is float for v in (x, *xs)):
        return float(best)
    return best


def divider(name: str, rounding: Callable[[Any], int], float_quotient: bool = False) -> Callable[..., Any]:
    """floor, ceiling, truncate, round (and the f- versions, whose quotient is a float): the
    quotient is rounded exactly (floats as the rationals they are), the remainder computed
    in the arguments' own arithmetic."""

    def op(x: Any, y: Any = 1) -> Any:
        need_real(name, 1, x)
        need_real(name, 2, y)
        if y == 0:
            raise div_zero(name, x, y)
        floats = type(x) is float or type(y) is float
        try:
            q = rounding(Fraction(x) / Fraction(y))
        except (OverflowError, ValueError):
            raise lisp_error("E108", f"`{name}`: {short(x)} / {short(y)} has no finite quotient", "ARITHMETIC-ERROR") from None
        if floats:
            rem: Any = float(x) - q * float(y)
        else:
            rem = norm(Fraction(x) - q * Fraction(y))
        if float_quotient:
            return MultipleValues((finite(name, float(q)) if q != 0 or not _negative_zero_quotient(x, y) else -0.0, rem))
        return MultipleValues((q, rem))

    return op


def _negative_zero_quotient(x: Any, y: Any) -> bool:
    return (x < 0) != (y < 0) and x != 0


def _round_half_even(x: Any) -> int:
    return round(x)


@builtin("mod")
def lisp_mod(x: Any, y: Any) -> Any:
    return divider("mod", math.floor)(x, y)[1]


@builtin("rem")
def lisp_rem(x: Any, y: Any) -> Any:
    return divider("rem", math.trunc)(x, y)[1]


@builtin("expt")
def expt(base: Any, power: Any) -> Any:
    need_number("expt", 1, base)
    need_number("expt", 2, power)
    if type(power) is int:
        if type(base) is float:
            try:
                return finite("expt", base**power)
            except OverflowError:
                raise lisp_error("E108", "`expt`: floating-point overflow (a number too large for a double)", "FLOATING-POINT-OVERFLOW") from None
            except ZeroDivisionError:
                raise div_zero("expt") from None
        if power < 0:
            if base == 0:
                raise div_zero("expt")
            return norm(Fraction(1) / Fraction(base) ** -power)
        if abs(base) > 1 and math.log2(abs(base)) * power > MAX_INTEGER_BITS:
            raise LimitExceeded("L003", f"allocation limit: `expt` result would exceed {MAX_INTEGER_BITS} bits")
        return norm(Fraction(base) ** power) if type(base) is Fraction else base**power
    if base < 0:
        raise lisp_error("E103", "`expt`: a negative base with a non-integer power is a complex number, which SexpGPU does not support", "ARITHMETIC-ERROR")
    try:
        return finite("expt", float(base) ** float(power))
    except OverflowError:
        raise lisp_error("E108", "`expt`: floating-point overflow (a number too large for a double)", "FLOATING-POINT-OVERFLOW") from None
    except ZeroDivisionError:
        raise div_zero("expt") from None


@builtin("sqrt")
def lisp_sqrt(x: Any) -> Any:
    need_number("sqrt", 1, x)
    if x < 0:
        raise lisp_error("E103", f"`sqrt`: {x} is negative; its square root is a complex number, which SexpGPU does not support", "ARITHMETIC-ERROR")
    return math.sqrt(x)


@builtin("isqrt")
def isqrt(x: Any) -> Any:
    if type(x) is not int or x < 0:
        raise type_error("isqrt", 1, "a non-negative integer", x)
    return math.isqrt(x)


@builtin("exp")
def lisp_exp(x: Any) -> Any:
    need_number("exp", 1, x)
    try:
        return finite("exp", math.exp(x))
    except OverflowError:
        raise lisp_error("E108", "`exp`: floating-point overflow", "FLOATING-POINT-OVERFLOW") from None


@builtin("log")
def lisp_log(x: Any, base: Any = None) -> Any:
    need_number("log", 1, x)
    if x <= 0:
        raise lisp_error("E103", f"`log`: {x} is not positive; its logarithm is not a real number", "ARITHMETIC-ERROR")
    if base is None:
        return math.log(x)
    need_number("log", 2, base)
    if base <= 0 or base == 1:
        raise lisp_error("E103", f"`log`: bad base {base}", "ARITHMETIC-ERROR")
    return math.log(x) / math.log(base)


def unary_float(name: str, fn: Callable[[float], float]) -> Callable[[Any], Any]:
    def op(x: Any) -> Any:
        need_number(name, 1, x)
        try:
            return fn(float(x))
        except (ValueError, OverflowError):
            raise lisp_error("E103", f"`{name}`: {x} is outside the domain", "ARITHMETIC-ERROR") from None

    return op


@builtin("atan")
def atan(y: Any, x: Any = None) -> Any:
    need_number("atan", 1, y)
    if x is None:
        return math.atan(y)
    need_number("atan", 2, x)
    return math.atan2(y, x)


@builtin("abs")
def lisp_abs(x: Any) -> Any:
    return abs(need_number("abs", 1, x))


@builtin("signum")
def signum(x: Any) -> Any:
    need_number("signum", 1, x)
    if type(x) is float:
        return math.copysign(1.0, x) if x != 0 else x
    return (x > 0) - (x < 0)


@builtin("gcd")
def gcd(*xs: Any) -> Any:
    result = 0
    for i, x in enumerate(xs, 1):
        result = math.gcd(result, need_integer("gcd", i, x))
    return result


@builtin("lcm")
def lcm(*xs: Any) -> Any:
    result = 1
    for i, x in enumerate(xs, 1):
        result = big("lcm", math.lcm(result, need_integer("lcm", i, x)))
    return abs(result) if xs else 1


@builtin("float")
def to_float(x: Any, prototype: Any = None) -> Any:
    need_number("float", 1, x)
    try:
        return float(x)
    except OverflowError:
        raise lisp_error("E108", f"`float`: {x} is too large for a double", "FLOATING-POINT-OVERFLOW") from None


def predicate(name: str, test: Callable[[Any], bool], need: Callable[[str, int, Any], Any] = need_number) -> Callable[[Any], Any]:
    def op(x: Any) -> Any:
        need(name, 1, x)
        return lbool(test(x))

    return op


@builtin("ash")
def ash(x: Any, count: Any) -> Any:
    need_integer("ash", 1, x)
    need_integer("ash", 2, count)
    if count > MAX_INTEGER_BITS:
        raise LimitExceeded("L003", f"allocation limit: `ash` by {count} bits")
    return big("ash", x << count if count >= 0 else x >> -count)


def logop(name: str, op: Callable[[int, int], int], identity: int) -> Callable[..., Any]:
    def fn(*xs: Any) -> Any:
        result = identity
        for i, x in enumerate(xs, 1):
            result = op(result, need_integer(name, i, x))
        return result

    return fn


@builtin("numerator")
def numerator(x: Any) -> Any:
    if type(x) is int:
        return x
    if type(x) is Fraction:
        return x.numerator
    raise type_error("numerator", 1, "a rational", x)


@builtin("denominator")
def denominator(x: Any) -> Any:
    if type(x) is int:
        return 1
    if type(x) is Fraction:
        return x.denominator
    raise type_error("denominator", 1, "a rational", x)


@builtin("rational")
def rational(x: Any) -> Any:
    need_number("rational", 1, x)
    return norm(Fraction(x))



# -- bits and bytes -------------------------------------------------------------------------------

@builtin("logbitp")
def logbitp(index: Any, x: Any) -> Any:
    need_index("logbitp", 1, index)
    return lbool((need_integer("logbitp", 2, x) >> index) & 1)


@builtin("logcount")
def logcount(x: Any) -> Any:
    need_integer("logcount", 1, x)
    return bin(~x if x < 0 else x).count("1")


@builtin("integer-length")
def integer_length(x: Any) -> Any:
    need_integer("integer-length", 1, x)
    return (~x if x < 0 else x).bit_length()


@builtin("logtest")
def logtest(a: Any, b: Any) -> Any:
    return lbool(need_integer("logtest", 1, a) & need_integer("logtest", 2, b) != 0)


@builtin("logeqv")
def logeqv(*xs: Any) -> Any:
    result = -1
    for i, x in enumerate(xs, 1):
        result = ~(result ^ need_integer("logeqv", i, x))
    return result


def two_integers(name: str, op: Callable[[int, int], int]) -> Callable[[Any, Any], Any]:
    def fn(a: Any, b: Any) -> Any:
        return op(need_integer(name, 1, a), need_integer(name, 2, b))

    return fn


BOOLE_OPS: list[Callable[[int, int], int]] = [
    lambda a, b: 0, lambda a, b: -1, lambda a, b: a, lambda a, b: b, lambda a, b: ~a, lambda a, b: ~b,
    lambda a, b: a & b, lambda a, b: a | b, lambda a, b: a ^ b, lambda a, b: ~(a ^ b), lambda a, b: ~(a & b),
    lambda a, b: ~(a | b), lambda a, b: ~a & b, lambda a, b: a & ~b, lambda a, b: ~a | b, lambda a, b: a | ~b,
]
BOOLE_NAMES = ["CLR", "SET", "1", "2", "C1", "C2", "AND", "IOR", "XOR", "EQV", "NAND", "NOR", "ANDC1", "ANDC2", "ORC1", "ORC2"]


@builtin("boole")
def boole(op: Any, a: Any, b: Any) -> Any:
    if type(op) is not int or not 0 <= op < 16:
        raise type_error("boole", 1, "one of the boole- constants", op)
    return BOOLE_OPS[op](need_integer("boole", 2, a), need_integer("boole", 3, b))


@builtin("byte")
def byte(size: Any, position: Any) -> Any:
    """A byte specifier: (size . position), as SBCL prints it."""
    return Cons(need_index("byte", 1, size), need_index("byte", 2, position))


def _bytespec(fn: str, spec: Any) -> tuple[int, int]:
    if type(spec) is not Cons or type(spec.car) is not int or type(spec.cdr) is not int or spec.car < 0 or spec.cdr < 0:
        raise type_error(fn, 1, "a byte specifier (made by byte)", spec)
    if spec.car > MAX_INTEGER_BITS or spec.cdr > MAX_INTEGER_BITS:
        raise LimitExceeded("L003", f"allocation limit: `{fn}` of a byte wider than {MAX_INTEGER_BITS} bits")
    return spec.car, spec.cdr


@builtin("byte-size")
def byte_size(spec: Any) -> Any:
    return _bytespec("byte-size", spec)[0]


@builtin("byte-position")
def byte_position(spec: Any) -> Any:
    return _bytespec("byte-position", spec)[1]


@builtin("ldb")
def ldb(spec: Any, x: Any) -> Any:
    size, pos = _bytespec("ldb", spec)
    return (need_integer("ldb", 2, x) >> pos) & ((1 << size) - 1)


@builtin("ldb-test")
def ldb_test(spec: Any, x: Any) -> Any:
    return lbool(ldb(spec, x) != 0)


@builtin("mask-field")
def mask_field(spec: Any, x: Any) -> Any:
    size, pos = _bytespec("mask-field", spec)
    return need_integer("mask-field", 2, x) & (((1 << size) - 1) << pos)


@builtin("dpb")
def dpb(new: Any, spec: Any, x: Any) -> Any:
    size, pos = _bytespec("dpb", spec)
    mask = (1 << size) - 1
    return (need_integer("dpb", 3, x) & ~(mask << pos)) | ((need_integer("dpb", 1, new) & mask) << pos)


@builtin("deposit-field")
def deposit_field(new: Any, spec: Any, x: Any) -> Any:
    size, pos = _bytespec("deposit-field", spec)
    mask = ((1 << size) - 1) << pos
    return (need_integer("deposit-field", 3, x) & ~mask) | (need_integer("deposit-field", 1, new) & mask)


# -- floats ---------------------------------------------------------------------------------------

def need_float(fn: str, pos: int, x: Any) -> float:
    if type(x) is not float:
        raise type_error(fn, pos, "a float", x)
    return x


@builtin("float-radix")
def float_radix(x: Any) -> Any:
    need_float("float-radix", 1, x)
    return 2


@builtin("float-sign")
def float_sign(x: Any, y: Any = None) -> Any:
    need_float("float-sign", 1, x)
    magnitude = 1.0 if y is None else abs(need_float("float-sign", 2, y))
    return math.copysign(magnitude, x)


@builtin("float-digits")
def float_digits(x: Any) -> Any:
    need_float("float-digits", 1, x)
    return 53


@builtin("float-precision")
def float_precision(x: Any) -> Any:
    need_float("float-precision", 1, x)
    if x == 0:
        return 0
    m, e = math.frexp(abs(x))
    if e < -1021:  # subnormal: fewer significant bits
        return max(0, 53 - (-1021 - e))
    return 53


@builtin("decode-float")
def decode_float(x: Any) -> Any:
    need_float("decode-float", 1, x)
    if x == 0:
        return MultipleValues((0.0, 0, math.copysign(1.0, x)))
    m, e = math.frexp(abs(x))
    return MultipleValues((m, e, math.copysign(1.0, x)))


@builtin("integer-decode-float")
def integer_decode_float(x: Any) -> Any:
    need_float("integer-decode-float", 1, x)
    if x == 0:
        return MultipleValues((0, 0, -1 if math.copysign(1.0, x) < 0 else 1))
    m, e = math.frexp(abs(x))
    significand = int(m * 2**53)
    return MultipleValues((significand, e - 53, -1 if x < 0 else 1))


@builtin("scale-float")
def scale_float(x: Any, k: Any) -> Any:
    need_float("scale-float", 1, x)
    need_integer("scale-float", 2, k)
    try:
        return finite("scale-float", math.ldexp(x, k))
    except OverflowError:
        raise lisp_error("E108", "`scale-float`: floating-point overflow", "FLOATING-POINT-OVERFLOW") from None


@builtin("rationalize")
def rationalize(x: Any) -> Any:
    """The simplest rational that reads back as the same double (exact rationals as they are)."""
    need_real("rationalize", 1, x)
    if type(x) is not float:
        return x
    if x == 0:
        return 0
    exact = Fraction(x)
    low = (Fraction(math.nextafter(x, -math.inf)) + exact) / 2
    high = (Fraction(math.nextafter(x, math.inf)) + exact) / 2
    return norm(_simplest_between(low, high))


def _simplest_between(low: Fraction, high: Fraction) -> Fraction:
    """The fraction with the smallest denominator in [low, high] (continued fractions)."""
    if low > high:
        low, high = high, low
    if low <= 0 <= high:
        return Fraction(0)
    if high < 0:
        return -_simplest_between(-high, -low)
    floor_low = math.floor(low)
    if floor_low == low:
        return Fraction(floor_low)
    if floor_low + 1 <= high:
        return Fraction(floor_low + 1)
    rest = _simplest_between(1 / (high - floor_low), 1 / (low - floor_low))
    return floor_low + 1 / rest


def hyperbolic(name: str, fn: Callable[[float], float], ok: Callable[[float], bool]) -> Callable[[Any], Any]:
    def op(x: Any) -> Any:
        need_real(name, 1, x)
        if not ok(float(x)):
            raise lisp_error("E103", f"`{name}`: {short(x)} is outside its real domain; the result would be a complex number, which SexpGPU does not support", "ARITHMETIC-ERROR")
        return fn(float(x))

    return op


@builtin("realpart", "conjugate")
def realpart(x: Any) -> Any:
    return need_number("realpart", 1, x)


@builtin("imagpart")
def imagpart(x: Any) -> Any:
    need_number("imagpart", 1, x)
    return 0.0 if type(x) is float else 0


@builtin("complex")
def make_complex(real: Any, imag: Any = 0) -> Any:
    need_real("complex", 1, real)
    need_real("complex", 2, imag)
    if imag == 0 and type(imag) is not float and type(real) is not float:
        return real
    raise lisp_error("E103", "`complex`: SexpGPU has no complex numbers", "ARITHMETIC-ERROR")


CONSTANTS: dict[str, Any] = {
    "PI": math.pi,
    "MOST-POSITIVE-FIXNUM": 2**62 - 1,
    # the implementation limits, SBCL's values
    "CALL-ARGUMENTS-LIMIT": 2**62 - 1,
    "LAMBDA-PARAMETERS-LIMIT": 2**62 - 1,
    "MULTIPLE-VALUES-LIMIT": 2**62 - 1,
    "MOST-NEGATIVE-FIXNUM": -(2**62),
    "MOST-POSITIVE-DOUBLE-FLOAT": 1.7976931348623157e308,
    "MOST-NEGATIVE-DOUBLE-FLOAT": -1.7976931348623157e308,
    "LEAST-POSITIVE-DOUBLE-FLOAT": 5e-324,
    "LEAST-POSITIVE-NORMALIZED-DOUBLE-FLOAT": 2.2250738585072014e-308,
    "DOUBLE-FLOAT-EPSILON": 1.1102230246251568e-16,
    "DOUBLE-FLOAT-NEGATIVE-EPSILON": 5.551115123125784e-17,
    "LEAST-NEGATIVE-DOUBLE-FLOAT": -5e-324,
    "LEAST-NEGATIVE-NORMALIZED-DOUBLE-FLOAT": -2.2250738585072014e-308,
    # long floats are double floats, as in SBCL; so are short and single floats here (1.5f0 and
    # 1.5s0 read as doubles), so their limits are the double's: (+ 1.0f0 single-float-epsilon)
    # differs from 1.0f0 and (+ 1.0f0 (/ single-float-epsilon 2)) does not
    **{
        f"{name}-{fmt}-FLOAT{suffix}": value
        for fmt in ("SHORT", "SINGLE", "LONG")
        for name, suffix, value in (
            ("MOST-POSITIVE", "", 1.7976931348623157e308),
            ("MOST-NEGATIVE", "", -1.7976931348623157e308),
            ("LEAST-POSITIVE", "", 5e-324),
            ("LEAST-POSITIVE-NORMALIZED", "", 2.2250738585072014e-308),
            ("LEAST-NEGATIVE", "", -5e-324),
            ("LEAST-NEGATIVE-NORMALIZED", "", -2.2250738585072014e-308),
        )
    },
    **{f"{fmt}-FLOAT-EPSILON": 1.1102230246251568e-16 for fmt in ("SHORT", "SINGLE", "LONG")},
    **{f"{fmt}-FLOAT-NEGATIVE-EPSILON": 5.551115123125784e-17 for fmt in ("SHORT", "SINGLE", "LONG")},
    **{f"BOOLE-{name}": i for i, name in enumerate(BOOLE_NAMES)},
}


def define_constants(interp: "Interpreter") -> None:
    """The numeric constants (most-positive-fixnum, pi, the float limits, boole-*) and
    *random-state*, which starts from a fixed seed, so evaluation is reproducible."""
    for name, value in CONSTANTS.items():
        sym = interp.sym(name)
        interp.values[sym] = value
        interp.constants.add(sym)
    state_var = interp.sym("*RANDOM-STATE*")
    interp.values[state_var] = RandomState(0)
    interp.specials.add(state_var)


class RandomStates:
    """What random and make-random-state share: *random-state*, and the seeds that each
    (make-random-state t) takes in turn."""

    def __init__(self, interp: "Interpreter") -> None:
        self.interp = interp
        self.state_var = interp.sym("*RANDOM-STATE*")
        self.seeds = iter(range(1, 2**62))


@builtin("random", context=RandomStates)
def random(states: RandomStates, limit: Any, state: Any = None) -> Any:
    rs = states.interp.values[states.state_var] if state is None else state
    if type(rs) is not RandomState:
        raise type_error("random", 2, "a random state", rs)
    if type(limit) is int and limit > 0:
        return rs.rng.randrange(limit)
    if type(limit) is float and limit > 0:
        return rs.rng.random() * limit
    raise type_error("random", 1, "a positive integer or a positive float", limit)


@builtin("make-random-state", context=RandomStates)
def make_random_state(states: RandomStates, state: Any = NIL) -> Any:
    if state is T:
        return RandomState(next(states.seeds))
    source = states.interp.values[states.state_var] if state is NIL else state
    if type(source) is not RandomState:
        raise type_error("make-random-state", 1, "nil, t or a random state", state)
    return source.copy()


random_state_p = builtin("random-state-p")(lambda x: lbool(type(x) is RandomState))


eq = builtin("=")(compare_chain("=", operator.eq))
lt = builtin("<")(compare_chain("<", operator.lt))
gt = builtin(">")(compare_chain(">", operator.gt))
le = builtin("<=")(compare_chain("<=", operator.le))
ge = builtin(">=")(compare_chain(">=", operator.ge))
floor = builtin("floor")(divider("floor", math.floor))
ceiling = builtin("ceiling")(divider("ceiling", math.ceil))
truncate = builtin("truncate")(divider("truncate", math.trunc))
round_ = builtin("round")(divider("round", _round_half_even))
ffloor = builtin("ffloor")(divider("ffloor", math.floor, True))
fceiling = builtin("fceiling")(divider("fceiling", math.ceil, True))
ftruncate = builtin("ftruncate")(divider("ftruncate", math.trunc, True))
fround = builtin("fround")(divider("fround", _round_half_even, True))
lognand = builtin("lognand")(two_integers("lognand", lambda a, b: ~(a & b)))
lognor = builtin("lognor")(two_integers("lognor", lambda a, b: ~(a | b)))
logandc1 = builtin("logandc1")(two_integers("logandc1", lambda a, b: ~a & b))
logandc2 = builtin("logandc2")(two_integers("logandc2", lambda a, b: a & ~b))
logorc1 = builtin("logorc1")(two_integers("logorc1", lambda a, b: ~a | b))
logorc2 = builtin("logorc2")(two_integers("logorc2", lambda a, b: a | ~b))
asinh = builtin("asinh")(hyperbolic("asinh", math.asinh, lambda x: True))
acosh = builtin("acosh")(hyperbolic("acosh", math.acosh, lambda x: x >= 1))
atanh = builtin("atanh")(hyperbolic("atanh", math.atanh, lambda x: -1 < x < 1))
complexp = builtin("complexp")(lambda x: NIL)
sin = builtin("sin")(unary_float("sin", math.sin))
cos = builtin("cos")(unary_float("cos", math.cos))
tan = builtin("tan")(unary_float("tan", math.tan))
asin = builtin("asin")(unary_float("asin", math.asin))
acos = builtin("acos")(unary_float("acos", math.acos))
sinh = builtin("sinh")(unary_float("sinh", math.sinh))
cosh = builtin("cosh")(unary_float("cosh", math.cosh))
tanh = builtin("tanh")(unary_float("tanh", math.tanh))
logand = builtin("logand")(logop("logand", operator.and_, -1))
logior = builtin("logior")(logop("logior", operator.or_, 0))
logxor = builtin("logxor")(logop("logxor", operator.xor, 0))
zerop = builtin("zerop")(predicate("zerop", lambda x: x == 0))
plusp = builtin("plusp")(predicate("plusp", lambda x: x > 0))
minusp = builtin("minusp")(predicate("minusp", lambda x: x < 0))
evenp = builtin("evenp")(predicate("evenp", lambda x: x % 2 == 0, need_integer))
oddp = builtin("oddp")(predicate("oddp", lambda x: x % 2 == 1, need_integer))
one_plus = builtin("1+")(lambda x: norm(need_number("1+", 1, x) + 1))
one_minus = builtin("1-")(lambda x: norm(need_number("1-", 1, x) - 1))
numberp = builtin("numberp")(lambda x: lbool(is_num(x)))
realp = builtin("realp")(lambda x: lbool(is_num(x)))
integerp = builtin("integerp")(lambda x: lbool(type(x) is int))
floatp = builtin("floatp")(lambda x: lbool(type(x) is float))
rationalp = builtin("rationalp")(lambda x: lbool(type(x) in (int, Fraction)))
lognot = builtin("lognot")(lambda x: ~need_integer("lognot", 1, x))
