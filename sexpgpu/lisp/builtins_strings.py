"""String, character and symbol builtins."""

from __future__ import annotations

import operator

from typing import TYPE_CHECKING, Any, Callable, Optional

from .builtins import Lib, format_to_string, format_with_rest, lbool, need_char, need_index, need_string, parse_keys, seq_items, short, type_error
from .charnames import char_name, name_char
from .conditions import lisp_error
from .builtins_streams import WRITE_KEYS
from .objects import Builtin, Closure, OutputStream
from .printer import PrintTooLarge
from .registry import builtin
from .types import NIL, T, Char, Cons, Symbol

if TYPE_CHECKING:
    from .evaluator import Interpreter


def string_designator(fn: str, pos: int, x: Any) -> str:
    if type(x) is str:
        return x
    if type(x) is Symbol:
        return x.name
    if type(x) is Char:
        return x.ch
    raise type_error(fn, pos, "a string designator (string, symbol or character)", x)


def _fold(c: str) -> str:
    """A character as the case-insensitive functions compare it (SBCL folds to lower case)."""
    low = c.lower()
    return low if len(low) == 1 else c


def string_compare(name: str, op: Callable[[str, str], bool], fold: bool = False) -> Callable[..., Any]:
    """string= and friends: t/nil for the equalities, the mismatch index for the others."""

    plain_equality = name == "string=" and not fold

    def compare(a: Any, b: Any, *args: Any) -> Any:
        if plain_equality and not args and type(a) is str and type(b) is str:
            return lbool(a == b)  # the common case (member ... :test #'string=), without the keys
        sa, sb = string_designator(name, 1, a), string_designator(name, 2, b)
        keys = parse_keys(name, args, {"START1", "END1", "START2", "END2"}, 3)
        s1, e1 = _bounds(name, keys, len(sa), "START1", "END1")
        s2, e2 = _bounds(name, keys, len(sb), "START2", "END2")
        x, y = sa[s1:e1], sb[s2:e2]
        if fold:
            x, y = "".join(map(_fold, x)), "".join(map(_fold, y))
        if name in ("string=", "string-equal"):
            return lbool(x == y)
        if not op(x, y):
            return NIL
        i = 0
        while i < min(len(x), len(y)) and x[i] == y[i]:
            i += 1
        return s1 + i

    return compare


def _bounds(fn: str, keys: dict[str, Any], n: int, start_key: str, end_key: str) -> tuple[int, int]:
    start = keys.get(start_key, 0)
    end = keys.get(end_key, NIL)
    end = n if end is NIL else end
    if type(start) is not int or type(end) is not int or not 0 <= start <= end <= n:
        raise lisp_error("E103", f"`{fn}`: bad bounds :{start_key.lower()} {short(keys.get(start_key, 0))} :{end_key.lower()} {short(keys.get(end_key, NIL))} for a string of length {n}", "TYPE-ERROR")
    return start, end


def case_changer(name: str, change: Callable[[str], str]) -> Callable[..., Any]:
    """string-upcase and friends: (string &key start end), only that part changed; the
    n- versions return a new string too (strings are immutable)."""

    def op(x: Any, *args: Any) -> Any:
        text = string_designator(name, 1, x)
        keys = parse_keys(name, args, {"START", "END"}, 2)
        start, end = _bounds(name, keys, len(text), "START", "END")
        return text[:start] + change(text[start:end]) + text[end:]

    return op


def _upcase(text: str) -> str:
    return "".join(_one(c, str.upper) for c in text)


def _downcase(text: str) -> str:
    return "".join(_one(c, str.lower) for c in text)


STANDARD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \n!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


@builtin("make-string", context=Lib)
def make_string(lib: Lib, n: Any, *args: Any) -> Any:
    interp = lib.interp
    need_index("make-string", 1, n)
    keys = parse_keys("make-string", args, {"INITIAL-ELEMENT", "ELEMENT-TYPE"}, 2)
    interp.alloc(n // 8)
    init = keys.get("INITIAL-ELEMENT", Char("\x00"))  # as SBCL
    return need_char("make-string", 3, init).ch * n


@builtin("format", context=Lib)
def lisp_format(lib: Lib, dest: Any, control: Any, *args: Any) -> Any:
    interp = lib.interp
    if type(control) in (Closure, Builtin) and dest is not NIL:
        # CLHS 22.3: a function control is called with the destination stream itself
        stream = interp.values[interp.sym("*STANDARD-OUTPUT*")] if dest is T else dest
        if type(stream) is not OutputStream:
            raise type_error("format", 1, "nil, t or an output stream (SexpGPU has string streams)", dest)
        interp.call(control, stream, *args)
        return NIL
    if type(control) not in (Closure, Builtin):
        need_string("format", 2, control)
    text = format_to_string(interp, control, list(args))
    if dest is NIL:
        return text
    return interp.call(interp.sym("%format-to-stream"), NIL if dest is T else dest, text)


@builtin("%formatter-run", context=Lib)
def formatter_run(lib: Lib, stream: Any, control: Any, args: Any) -> Any:
    """The body of a function `formatter` makes: format ARGS with CONTROL to STREAM and
    return the arguments it did not consume."""
    interp = lib.interp
    need_string("formatter", 1, control)
    text, rest = format_with_rest(interp, control, list(args) if type(args) is Cons else [])
    interp.call(interp.sym("%format-to-stream"), stream, text)
    return rest


@builtin("%formatter-check")
def formatter_check(control: Any) -> Any:
    """formatter's expansion-time check: CONTROL is a string whose directives parse."""
    from .format import FormatError, parse_control

    need_string("formatter", 1, control)
    try:
        parse_control(control)
    except FormatError as exc:
        raise lisp_error("E103", str(exc), exc.ctype) from None
    return control


def printed(name: str, escape: Optional[bool]) -> Callable[..., Any]:
    """prin1-to-string (ESCAPE true), princ-to-string (false), write-to-string (None: the
    keyword or *print-escape*)."""

    def op(lib: Lib, x: Any, *args: Any) -> Any:
        interp = lib.interp
        keys = parse_keys(name, args, WRITE_KEYS - {"STREAM"}, 2) if args else {}
        given = keys.pop("ESCAPE", None)
        if given is None:
            given = interp.values.get(interp.sym("*PRINT-ESCAPE*"), T) if escape is None else lbool(escape)
        try:
            text = interp.print_string(x, given is not NIL, **{k.lower(): v for k, v in keys.items()})
        except PrintTooLarge as exc:
            raise lisp_error("L003", f"`{name}`: {exc}", "STORAGE-CONDITION") from None
        interp.alloc(len(text) // 8)
        return text

    return op


@builtin("read-from-string", context=Lib)
def read_from_string(lib: Lib, text: Any, eof_error: Any = T, eof_value: Any = NIL, *args: Any) -> Any:
    """(read-from-string string &optional eof-error-p eof-value &key start end
    preserve-whitespace): the form (SexpGPU's reader, so #. is refused) and the index after it."""
    interp = lib.interp
    from .diagnostics import DiagnosticError
    from .reader import Reader
    from .types import MultipleValues

    need_string("read-from-string", 1, text)
    keys = parse_keys("read-from-string", args, {"START", "END", "PRESERVE-WHITESPACE"}, 4)
    start, end = _bounds("read-from-string", keys, len(text), "START", "END")
    base = interp.values.get(interp.sym("*READ-BASE*"), 10)
    reader = Reader(text[:end], "<string>", interp.table, base if type(base) is int and 2 <= base <= 36 else 10, interp.features)
    reader.pos = start
    try:
        form = reader.read_next()
    except DiagnosticError as exc:
        if exc.diagnostic.code == "R001" and eof_error is NIL:
            return MultipleValues((eof_value, end))
        ctype = "END-OF-FILE" if exc.diagnostic.code == "R001" else "READER-ERROR"
        raise lisp_error("E104", f"read-from-string: {exc.diagnostic.message}", ctype) from None
    if form is None:
        if eof_error is NIL:
            return MultipleValues((eof_value, reader.pos))
        raise lisp_error("E104", "read-from-string: end of string before a form", "END-OF-FILE")
    position = reader.pos
    if keys.get("PRESERVE-WHITESPACE", NIL) is NIL and position < end and text[position] in _WHITESPACE:
        position += 1
    return MultipleValues((form.form, position))


def set_up(interp: "Interpreter") -> None:
    """What the string builtins need besides themselves: char-code-limit, and the fast
    paths of string= and char= as :test functions."""

    def fast_string_equal(a: Any, b: Any) -> bool:
        if type(a) is str and type(b) is str:
            return a == b
        return interp.call(interp.sym("string="), a, b) is not NIL

    def fast_char_equal(a: Any, b: Any) -> bool:
        if type(a) is Char and type(b) is Char:
            return a.ch == b.ch
        return interp.call(interp.sym("char="), a, b) is not NIL

    interp.values[interp.sym("CHAR-CODE-LIMIT")] = 1114112
    interp.constants.add(interp.sym("CHAR-CODE-LIMIT"))
    interp.standard_tests[interp.functions[interp.sym("string=")]] = fast_string_equal
    interp.standard_tests[interp.functions[interp.sym("char=")]] = fast_char_equal


def _one(ch: str, case: Callable[[str], str]) -> str:
    """A character's other case, when that is one character (ß upcases to itself)."""
    other = case(ch)
    return other if len(other) == 1 else ch


def _capitalize(s: str) -> str:
    """Each word (a run of alphanumeric characters) with its first character upcased and
    the rest downcased."""
    out = []
    start = True
    for c in s:
        if c.isalnum():
            out.append(_one(c, str.upper) if start else _one(c, str.lower))
            start = False
        else:
            out.append(c)
            start = True
    return "".join(out)


def _has_other_case(c: str, other: Callable[[str], str]) -> bool:
    """Whether C changes under OTHER (to lower case: C is upper case, and so on)."""
    changed = _one(c, other)
    return changed != c


def _bag(bag: Any) -> str:
    if type(bag) is str:
        return bag
    return "".join(c.ch for c in seq_items("string-trim", 1, bag) if type(c) is Char)


def _char(s: Any, i: Any) -> Any:
    need_string("char", 1, s)
    need_index("char", 2, i)
    if i >= len(s):
        raise lisp_error("E103", f"`char`: index {i} is out of bounds for a string of length {len(s)}", "TYPE-ERROR", i)
    return Char(s[i])


def _set_char(s: Any, i: Any, value: Any) -> Any:
    raise lisp_error("E109", "strings are immutable in SexpGPU; build a new one with concatenate or format", "PROGRAM-ERROR")


def _code_char(n: Any) -> Any:
    need_index("code-char", 1, n)
    if n >= 1114112:
        raise type_error("code-char", 1, "a character code below char-code-limit (1114112)", n)
    try:
        return Char(chr(n))
    except (ValueError, OverflowError):
        return NIL


def character_of(x: Any, fn: str = "character") -> Char:
    """The character X designates (CLHS: a character, or a string or symbol of length 1)."""
    if type(x) is Char:
        return x
    if type(x) is str and len(x) == 1:
        return Char(x)
    if type(x) is Symbol and len(x.name) == 1:
        return Char(x.name)
    raise type_error(fn, 1, "a character designator (a character, or a string or symbol of length 1)", x)


def _name_char(name: Any) -> Any:
    found = name_char(string_designator("name-char", 1, name))
    return Char(found) if found is not None else NIL


def _radix(fn: str, pos: int, radix: Any) -> int:
    if type(radix) is not int or not 2 <= radix <= 36:
        raise type_error(fn, pos, "a radix from 2 to 36", radix)
    return radix


def _digit_char_p(c: Any, radix: Any = 10) -> Any:
    need_char("digit-char-p", 1, c)
    base = _radix("digit-char-p", 2, radix)
    value = _digit_weight(c.ch)
    return value if value is not None and value < base else NIL


def _digit_weight(ch: str) -> Optional[int]:
    if "0" <= ch <= "9":
        return ord(ch) - 48
    if "a" <= ch.lower() <= "z" and ch.isascii():
        return ord(ch.lower()) - 87
    if ch.isdecimal():
        return int(ch)
    return None


def _digit_char(weight: Any, radix: Any = 10) -> Any:
    need_index("digit-char", 1, weight)
    base = _radix("digit-char", 2, radix)
    if weight >= base:
        return NIL
    return Char("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"[weight])


def _char_compare(name: str, op: Callable[[str, str], bool], fold: bool) -> Callable[..., Any]:
    def compare(a: Any, *more: Any) -> Any:
        chars = [need_char(name, i, c).ch for i, c in enumerate((a, *more), 1)]
        if fold:
            chars = [_fold(c) for c in chars]
        return lbool(all(op(x, y) for x, y in zip(chars, chars[1:])))

    return compare


def _char_distinct(name: str, fold: bool) -> Callable[..., Any]:
    """char/=: no two of the characters are the same."""

    def compare(a: Any, *more: Any) -> Any:
        chars = [need_char(name, i, c).ch for i, c in enumerate((a, *more), 1)]
        if fold:
            chars = [_fold(c) for c in chars]
        return lbool(len(set(chars)) == len(chars))

    return compare


_WHITESPACE = " \t\n\r\f\v"


def _parse_integer(s: Any, *args: Any) -> Any:
    """(parse-integer string &key start end radix junk-allowed): leading and trailing
    whitespace, an optional sign, digits. With :junk-allowed the prefix's value (or nil)
    and the index where parsing stopped."""
    from .types import MultipleValues

    need_string("parse-integer", 1, s)
    keys = parse_keys("parse-integer", args, {"START", "END", "RADIX", "JUNK-ALLOWED"}, 2)
    start, end = _bounds("parse-integer", keys, len(s), "START", "END")
    radix = _radix("parse-integer", 0, keys.get("RADIX", 10))
    junk = keys.get("JUNK-ALLOWED", NIL) is not NIL
    i = start
    while i < end and s[i] in _WHITESPACE:
        i += 1
    sign = 1
    if i < end and s[i] in "+-":
        sign = -1 if s[i] == "-" else 1
        i += 1
    digits_start = i
    value = 0
    while i < end:
        weight = _digit_weight(s[i])
        if weight is None or weight >= radix:
            break
        value = value * radix + weight
        i += 1
        if i - digits_start > 10_000:
            raise lisp_error("L003", "`parse-integer`: more than 10,000 digits", "STORAGE-CONDITION")
    found = i > digits_start
    if junk:
        return MultipleValues((sign * value if found else NIL, i))
    while i < end and s[i] in _WHITESPACE:
        i += 1
    if not found or i < end:
        raise lisp_error("E104", f"parse-integer: {s[start:end]!r} is not an integer", "PARSE-ERROR")
    return MultipleValues((sign * value, i))


string_eq = builtin("string=")(string_compare("string=", operator.eq, False))
string_slash_eq = builtin("string/=")(string_compare("string/=", operator.ne, False))
string_ = builtin("string<")(string_compare("string<", operator.lt, False))
string__ = builtin("string>")(string_compare("string>", operator.gt, False))
string__eq = builtin("string<=")(string_compare("string<=", operator.le, False))
string__eq_ = builtin("string>=")(string_compare("string>=", operator.ge, False))
string_equal = builtin("string-equal")(string_compare("string-equal", operator.eq, True))
string_not_equal = builtin("string-not-equal")(string_compare("string-not-equal", operator.ne, True))
string_lessp = builtin("string-lessp")(string_compare("string-lessp", operator.lt, True))
string_greaterp = builtin("string-greaterp")(string_compare("string-greaterp", operator.gt, True))
string_not_greaterp = builtin("string-not-greaterp")(string_compare("string-not-greaterp", operator.le, True))
string_not_lessp = builtin("string-not-lessp")(string_compare("string-not-lessp", operator.ge, True))
string_upcase = builtin("string-upcase")(case_changer("string-upcase", _upcase))
string_downcase = builtin("string-downcase")(case_changer("string-downcase", _downcase))
string_capitalize = builtin("string-capitalize")(case_changer("string-capitalize", _capitalize))
nstring_upcase = builtin("nstring-upcase")(case_changer("nstring-upcase", _upcase))
nstring_downcase = builtin("nstring-downcase")(case_changer("nstring-downcase", _downcase))
nstring_capitalize = builtin("nstring-capitalize")(case_changer("nstring-capitalize", _capitalize))
string = builtin("string")(lambda x: string_designator("string", 1, x))
string_trim = builtin("string-trim")(lambda bag, s: string_designator("string-trim", 2, s).strip(_bag(bag)))
string_left_trim = builtin("string-left-trim")(lambda bag, s: string_designator("string-left-trim", 2, s).lstrip(_bag(bag)))
string_right_trim = builtin("string-right-trim")(lambda bag, s: string_designator("string-right-trim", 2, s).rstrip(_bag(bag)))
stringp = builtin("stringp")(lambda x: lbool(type(x) is str))
simple_string_p = builtin("simple-string-p")(lambda x: lbool(type(x) is str))
characterp = builtin("characterp")(lambda x: lbool(type(x) is Char))
char = builtin("char", "schar")(_char)
p_set_char = builtin("%set-char")(_set_char)
char_code = builtin("char-code")(lambda c: ord(need_char("char-code", 1, c).ch))
char_int = builtin("char-int")(lambda c: ord(need_char("char-int", 1, c).ch))
code_char = builtin("code-char")(_code_char)
character = builtin("character")(lambda x: character_of(x))
char_upcase = builtin("char-upcase")(lambda c: Char(_one(need_char("char-upcase", 1, c).ch, str.upper)))
char_downcase = builtin("char-downcase")(lambda c: Char(_one(need_char("char-downcase", 1, c).ch, str.lower)))
alpha_char_p = builtin("alpha-char-p")(lambda c: lbool(need_char("alpha-char-p", 1, c).ch.isalpha()))
alphanumericp = builtin("alphanumericp")(lambda c: lbool(need_char("alphanumericp", 1, c).ch.isalnum()))
upper_case_p = builtin("upper-case-p")(lambda c: lbool(_has_other_case(need_char("upper-case-p", 1, c).ch, str.lower)))
lower_case_p = builtin("lower-case-p")(lambda c: lbool(_has_other_case(need_char("lower-case-p", 1, c).ch, str.upper)))
both_case_p = builtin("both-case-p")(lambda c: lbool(_has_other_case(need_char("both-case-p", 1, c).ch, str.lower) or _has_other_case(c.ch, str.upper)))
graphic_char_p = builtin("graphic-char-p")(lambda c: lbool(31 < ord(need_char("graphic-char-p", 1, c).ch) < 127 or ord(c.ch) > 159))
standard_char_p = builtin("standard-char-p")(lambda c: lbool(need_char("standard-char-p", 1, c).ch in STANDARD_CHARS))
digit_char_p = builtin("digit-char-p")(_digit_char_p)
digit_char = builtin("digit-char")(_digit_char)
char_name_ = builtin("char-name")(lambda c: char_name(need_char("char-name", 1, c).ch) or NIL)
name_char_ = builtin("name-char")(_name_char)
char_eq = builtin("char=")(_char_compare("char=", operator.eq, False))
char_ = builtin("char<")(_char_compare("char<", operator.lt, False))
char__ = builtin("char>")(_char_compare("char>", operator.gt, False))
char__eq = builtin("char<=")(_char_compare("char<=", operator.le, False))
char__eq_ = builtin("char>=")(_char_compare("char>=", operator.ge, False))
char_slash_eq = builtin("char/=")(_char_distinct("char/=", False))
char_equal = builtin("char-equal")(_char_compare("char-equal", operator.eq, True))
char_lessp = builtin("char-lessp")(_char_compare("char-lessp", operator.lt, True))
char_greaterp = builtin("char-greaterp")(_char_compare("char-greaterp", operator.gt, True))
char_not_greaterp = builtin("char-not-greaterp")(_char_compare("char-not-greaterp", operator.le, True))
char_not_lessp = builtin("char-not-lessp")(_char_compare("char-not-lessp", operator.ge, True))
char_not_equal = builtin("char-not-equal")(_char_distinct("char-not-equal", True))
parse_integer = builtin("parse-integer")(_parse_integer)
prin1_to_string = builtin("prin1-to-string", context=Lib)(printed("prin1-to-string", True))
write_to_string = builtin("write-to-string", context=Lib)(printed("write-to-string", None))
princ_to_string = builtin("princ-to-string", context=Lib)(printed("princ-to-string", False))
