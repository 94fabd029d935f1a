"""String, character and symbol builtins."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

from .builtins import Registry, format_to_string, format_with_rest, lbool, need_char, need_index, need_string, need_symbol, parse_keys, seq_items, short, type_error
from .charnames import char_name, name_char
from .conditions import lisp_error
from .builtins_streams import WRITE_KEYS
from .objects import Builtin, Closure, OutputStream
from .printer import PrintTooLarge
from .types import NIL, T, Char, Cons, Symbol

if TYPE_CHECKING:
    pass


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


def install(reg: Registry) -> None:
    interp = reg.interp
    import operator

    for name, op, fold in [
        ("string=", operator.eq, False), ("string/=", operator.ne, False), ("string<", operator.lt, False),
        ("string>", operator.gt, False), ("string<=", operator.le, False), ("string>=", operator.ge, False),
        ("string-equal", operator.eq, True), ("string-not-equal", operator.ne, True), ("string-lessp", operator.lt, True),
        ("string-greaterp", operator.gt, True), ("string-not-greaterp", operator.le, True), ("string-not-lessp", operator.ge, True),
    ]:
        reg.add(name, string_compare(name, op, fold))
    for prefix in ("", "n"):
        reg.add(f"{prefix}string-upcase", case_changer(f"{prefix}string-upcase", _upcase))
        reg.add(f"{prefix}string-downcase", case_changer(f"{prefix}string-downcase", _downcase))
        reg.add(f"{prefix}string-capitalize", case_changer(f"{prefix}string-capitalize", _capitalize))
    reg.add("string", lambda x: string_designator("string", 1, x))
    reg.add("string-trim", lambda bag, s: string_designator("string-trim", 2, s).strip(_bag(bag)))
    reg.add("string-left-trim", lambda bag, s: string_designator("string-left-trim", 2, s).lstrip(_bag(bag)))
    reg.add("string-right-trim", lambda bag, s: string_designator("string-right-trim", 2, s).rstrip(_bag(bag)))
    reg.add("stringp", lambda x: lbool(type(x) is str))
    reg.add("simple-string-p", lambda x: lbool(type(x) is str))
    reg.add("characterp", lambda x: lbool(type(x) is Char))
    reg.add("symbolp", lambda x: lbool(type(x) is Symbol))
    reg.add("keywordp", lambda x: lbool(type(x) is Symbol and x.package == "KEYWORD"))
    reg.add("symbol-name", lambda s: need_symbol("symbol-name", 1, s).name)
    reg.add("char", _char)
    reg.add("schar", _char)
    reg.add("%set-char", _set_char)
    reg.add("char-code", lambda c: ord(need_char("char-code", 1, c).ch))
    reg.add("char-int", lambda c: ord(need_char("char-int", 1, c).ch))
    reg.add("code-char", _code_char)
    reg.add("character", lambda x: character_of(x))
    reg.add("char-upcase", lambda c: Char(_one(need_char("char-upcase", 1, c).ch, str.upper)))
    reg.add("char-downcase", lambda c: Char(_one(need_char("char-downcase", 1, c).ch, str.lower)))
    reg.add("alpha-char-p", lambda c: lbool(need_char("alpha-char-p", 1, c).ch.isalpha()))
    reg.add("alphanumericp", lambda c: lbool(need_char("alphanumericp", 1, c).ch.isalnum()))
    reg.add("upper-case-p", lambda c: lbool(_has_other_case(need_char("upper-case-p", 1, c).ch, str.lower)))
    reg.add("lower-case-p", lambda c: lbool(_has_other_case(need_char("lower-case-p", 1, c).ch, str.upper)))
    reg.add("both-case-p", lambda c: lbool(_has_other_case(need_char("both-case-p", 1, c).ch, str.lower) or _has_other_case(c.ch, str.upper)))
    reg.add("graphic-char-p", lambda c: lbool(31 < ord(need_char("graphic-char-p", 1, c).ch) < 127 or ord(c.ch) > 159))
    reg.add("standard-char-p", lambda c: lbool(need_char("standard-char-p", 1, c).ch in STANDARD_CHARS))
    reg.add("digit-char-p", _digit_char_p)
    reg.add("digit-char", _digit_char)
    reg.add("char-name", lambda c: char_name(need_char("char-name", 1, c).ch) or NIL)
    reg.add("name-char", _name_char)
    for name, op in [("=", operator.eq), ("<", operator.lt), (">", operator.gt), ("<=", operator.le), (">=", operator.ge)]:
        reg.add(f"char{name}", _char_compare(f"char{name}", op, False))
    reg.add("char/=", _char_distinct("char/=", False))
    for name, op in [("equal", operator.eq), ("lessp", operator.lt), ("greaterp", operator.gt), ("not-greaterp", operator.le), ("not-lessp", operator.ge)]:
        reg.add(f"char-{name}", _char_compare(f"char-{name}", op, True))
    reg.add("char-not-equal", _char_distinct("char-not-equal", True))
    reg.add("parse-integer", _parse_integer)
    interp.values[interp.sym("CHAR-CODE-LIMIT")] = 1114112
    interp.constants.add(interp.sym("CHAR-CODE-LIMIT"))

    def fast_string_equal(a: Any, b: Any) -> bool:
        if type(a) is str and type(b) is str:
            return a == b
        return interp.call(interp.sym("string="), a, b) is not NIL

    def fast_char_equal(a: Any, b: Any) -> bool:
        if type(a) is Char and type(b) is Char:
            return a.ch == b.ch
        return interp.call(interp.sym("char="), a, b) is not NIL

    interp.standard_tests[interp.functions[interp.sym("string=")]] = fast_string_equal
    interp.standard_tests[interp.functions[interp.sym("char=")]] = fast_char_equal

    def make_string(n: Any, *args: Any) -> Any:
        need_index("make-string", 1, n)
        keys = parse_keys("make-string", args, {"INITIAL-ELEMENT", "ELEMENT-TYPE"}, 2)
        interp.alloc(n // 8)
        init = keys.get("INITIAL-ELEMENT", Char("\x00"))  # as SBCL
        return need_char("make-string", 3, init).ch * n

    def lisp_format(dest: Any, control: Any, *args: Any) -> Any:
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

    def formatter_run(stream: Any, control: Any, args: Any) -> Any:
        """The body of a function `formatter` makes: format ARGS with CONTROL to STREAM and
        return the arguments it did not consume."""
        need_string("formatter", 1, control)
        text, rest = format_with_rest(interp, control, list(args) if type(args) is Cons else [])
        interp.call(interp.sym("%format-to-stream"), stream, text)
        return rest

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

        def op(x: Any, *args: Any) -> Any:
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

    def status(sym: Symbol) -> Any:
        """find-symbol's second value: a keyword is :external, a standard symbol :inherited."""
        if sym.package == "KEYWORD":
            return interp.kw("external")
        return interp.kw("internal") if sym.name in interp.table.own else interp.kw("inherited")

    def keyword_package(fn: str, package: Any) -> bool:
        if package is NIL:
            return False
        pname = string_designator(fn, 2, package).upper()
        if pname not in ("KEYWORD", "CL-USER", "COMMON-LISP-USER", "CL", "COMMON-LISP"):
            raise lisp_error("E103", f"`{fn}`: no package {pname} (SexpGPU has none but KEYWORD and CL-USER)", "PACKAGE-ERROR")
        return pname == "KEYWORD"

    def find_symbol(name: Any, package: Any = NIL) -> Any:
        from .types import MultipleValues

        need_string("find-symbol", 1, name)
        if keyword_package("find-symbol", package):
            sym = interp.table.keywords.get(name)
        else:
            sym = interp.table.find(name) if name != "NIL" else NIL
        return MultipleValues((sym, status(sym))) if sym is not None else MultipleValues((NIL, NIL))

    def intern(name: Any, package: Any = NIL) -> Any:
        from .types import MultipleValues

        found = find_symbol(name, package)
        if found[0] is not NIL or found[1] is not NIL:
            return found
        sym = interp.table.keyword(name) if keyword_package("intern", package) else interp.table.intern(name)
        return MultipleValues((sym, NIL))

    def make_symbol(name: Any) -> Any:
        return Symbol(need_string("make-symbol", 1, name), None)

    def gensym(prefix: Any = "G") -> Any:
        if type(prefix) is int:
            return Symbol(f"G{prefix}", None)
        counter = interp.sym("*GENSYM-COUNTER*")
        n = interp.values.get(counter, 0)
        interp.values[counter] = n + 1
        return Symbol(f"{need_string('gensym', 1, prefix)}{n}", None)

    def gentemp(prefix: Any = "T", package: Any = NIL) -> Any:
        need_string("gentemp", 1, prefix)
        while True:
            interp.gentemp_counter += 1
            name = f"{prefix}{interp.gentemp_counter}"
            if interp.table.find(name) is None:
                return interp.table.intern(name)

    def read_from_string(text: Any, eof_error: Any = T, eof_value: Any = NIL, *args: Any) -> Any:
        """(read-from-string string &optional eof-error-p eof-value &key start end
        preserve-whitespace): the form (SexpGPU's reader, so #. is refused) and the index after it."""
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

    reg.add("make-string", make_string)
    reg.add("format", lisp_format)
    reg.add("%formatter-run", formatter_run)
    reg.add("%formatter-check", formatter_check)
    reg.add("prin1-to-string", printed("prin1-to-string", True))
    reg.add("write-to-string", printed("write-to-string", None))
    reg.add("princ-to-string", printed("princ-to-string", False))
    reg.add("intern", intern)
    reg.add("make-symbol", make_symbol)
    reg.add("gensym", gensym)
    reg.add("gentemp", gentemp)
    reg.add("find-symbol", find_symbol)
    counter = interp.sym("*GENSYM-COUNTER*")
    interp.values[counter] = 1
    interp.specials.add(counter)
    reg.add("read-from-string", read_from_string)


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
