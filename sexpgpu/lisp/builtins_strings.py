"""String, character and symbol builtins."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from .builtins import Registry, format_to_string, lbool, need_char, need_index, need_string, need_symbol, parse_keys, seq_items, type_error
from .conditions import lisp_error
from .printer import PrintTooLarge, prin1_to_string, princ_to_string
from .types import NIL, T, Char, Symbol

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


def string_compare(name: str, op: Callable[[str, str], bool], fold: bool = False) -> Callable[..., Any]:
    def compare(a: Any, b: Any, *args: Any) -> Any:
        sa, sb = string_designator(name, 1, a), string_designator(name, 2, b)
        keys = parse_keys(name, args, {"START1", "END1", "START2", "END2"}, 3)
        sa = sa[keys.get("START1", 0) : _end(keys.get("END1", NIL))]
        sb = sb[keys.get("START2", 0) : _end(keys.get("END2", NIL))]
        offset = keys.get("START1", 0)
        if fold:
            sa, sb = sa.lower(), sb.lower()
        if name in ("string=", "string-equal"):
            return lbool(sa == sb)
        if not op(sa, sb):
            return NIL
        i = 0
        while i < min(len(sa), len(sb)) and sa[i] == sb[i]:
            i += 1
        return i + offset

    return compare


def _end(x: Any) -> Any:
    return None if x is NIL else x


def install(reg: Registry) -> None:
    interp = reg.interp
    import operator

    reg.add("string=", string_compare("string=", operator.eq))
    reg.add("string-equal", string_compare("string-equal", operator.eq, fold=True))
    reg.add("string<", string_compare("string<", operator.lt))
    reg.add("string>", string_compare("string>", operator.gt))
    reg.add("string<=", string_compare("string<=", operator.le))
    reg.add("string>=", string_compare("string>=", operator.ge))
    reg.add("string/=", string_compare("string/=", operator.ne))
    reg.add("string-lessp", string_compare("string-lessp", operator.lt, fold=True))
    reg.add("string-greaterp", string_compare("string-greaterp", operator.gt, fold=True))
    reg.add("string-upcase", lambda s: string_designator("string-upcase", 1, s).upper())
    reg.add("string-downcase", lambda s: string_designator("string-downcase", 1, s).lower())
    reg.add("string-capitalize", lambda s: _capitalize(string_designator("string-capitalize", 1, s)))
    reg.add("string", lambda x: string_designator("string", 1, x))
    reg.add("string-trim", lambda bag, s: string_designator("string-trim", 2, s).strip(_bag(bag)))
    reg.add("string-left-trim", lambda bag, s: string_designator("string-left-trim", 2, s).lstrip(_bag(bag)))
    reg.add("string-right-trim", lambda bag, s: string_designator("string-right-trim", 2, s).rstrip(_bag(bag)))
    reg.add("stringp", lambda x: lbool(type(x) is str))
    reg.add("characterp", lambda x: lbool(type(x) is Char))
    reg.add("symbolp", lambda x: lbool(type(x) is Symbol))
    reg.add("keywordp", lambda x: lbool(type(x) is Symbol and x.package == "KEYWORD"))
    reg.add("symbol-name", lambda s: need_symbol("symbol-name", 1, s).name)
    reg.add("char", _char)
    reg.add("schar", _char)
    reg.add("char-code", lambda c: ord(need_char("char-code", 1, c).ch))
    reg.add("code-char", _code_char)
    reg.add("char-upcase", lambda c: Char(_one(need_char("char-upcase", 1, c).ch, str.upper)))
    reg.add("char-downcase", lambda c: Char(_one(need_char("char-downcase", 1, c).ch, str.lower)))
    reg.add("alpha-char-p", lambda c: lbool(need_char("alpha-char-p", 1, c).ch.isalpha()))
    reg.add("alphanumericp", lambda c: lbool(need_char("alphanumericp", 1, c).ch.isalnum()))
    reg.add("upper-case-p", lambda c: lbool(need_char("upper-case-p", 1, c).ch.isupper()))
    reg.add("lower-case-p", lambda c: lbool(need_char("lower-case-p", 1, c).ch.islower()))
    reg.add("digit-char-p", _digit_char_p)
    reg.add("char=", _char_compare("char=", lambda a, b: a == b))
    reg.add("char/=", _char_compare("char/=", lambda a, b: a != b))
    reg.add("char<", _char_compare("char<", lambda a, b: a < b))
    reg.add("char>", _char_compare("char>", lambda a, b: a > b))
    reg.add("char<=", _char_compare("char<=", lambda a, b: a <= b))
    reg.add("char>=", _char_compare("char>=", lambda a, b: a >= b))
    reg.add("char-equal", _char_compare("char-equal", lambda a, b: a.lower() == b.lower()))
    reg.add("parse-integer", _parse_integer)

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
        init = keys.get("INITIAL-ELEMENT", Char(" "))
        return need_char("make-string", 3, init).ch * n

    def concatenate(result_type: Any, *seqs: Any) -> Any:
        name = getattr(result_type, "name", "")
        items: list[Any] = []
        for i, s in enumerate(seqs, 2):
            items.extend(seq_items("concatenate", i, s))
        interp.alloc(len(items) // 8 + 1)
        if name in ("STRING", "SIMPLE-STRING"):
            if not all(type(c) is Char for c in items):
                raise lisp_error("E103", "`concatenate`: only characters can make a string", "TYPE-ERROR")
            return "".join(c.ch for c in items)
        if name == "LIST":
            from .builtins import to_lisp_list

            return to_lisp_list(items)
        if name in ("VECTOR", "SIMPLE-VECTOR"):
            return items
        raise type_error("concatenate", 1, "one of string, list, vector", result_type)

    def lisp_format(dest: Any, control: Any, *args: Any) -> Any:
        need_string("format", 2, control)
        text = format_to_string(interp, control, list(args))
        if dest is NIL:
            return text
        if dest is T:
            interp.write(text)
            return NIL
        raise type_error("format", 1, "nil or t (SexpGPU has no other streams)", dest)

    def printed(fn: Callable[..., str], name: str) -> Callable[[Any], Any]:
        def op(x: Any) -> Any:
            try:
                text = fn(x, interp.print_other)
            except PrintTooLarge as exc:
                raise lisp_error("L003", f"`{name}`: {exc}", "STORAGE-CONDITION") from None
            interp.alloc(len(text) // 8)
            return text

        return op

    def intern(name: Any, package: Any = NIL) -> Any:
        need_string("intern", 1, name)
        if package is not NIL:
            pname = string_designator("intern", 2, package)
            if pname.upper() == "KEYWORD":
                sym = interp.table.keyword(name)
                return _two(sym, interp)
        existing = interp.table.find(name)
        sym = interp.table.intern(name)
        return _two(sym, interp, existing is not None)

    def make_symbol(name: Any) -> Any:
        return Symbol(need_string("make-symbol", 1, name), None)

    def gensym(prefix: Any = "G") -> Any:
        if type(prefix) is int:
            return Symbol(f"G{prefix}", None)
        return interp.gensym(need_string("gensym", 1, prefix))

    def read_from_string(text: Any) -> Any:
        from .diagnostics import DiagnosticError
        from .reader import Reader

        need_string("read-from-string", 1, text)
        reader = Reader(text, "<string>", interp.table)
        try:
            form = reader.read_next()
        except DiagnosticError as exc:
            raise lisp_error("E104", f"read-from-string: {exc.diagnostic.message}", "PARSE-ERROR") from None
        if form is None:
            raise lisp_error("E104", "read-from-string: end of string before a form", "PARSE-ERROR")
        from .types import MultipleValues

        return MultipleValues((form.form, reader.pos))

    def output(name: str, fn: Callable[..., str], before: str = "", after: str = "") -> Callable[..., Any]:
        def op(x: Any, stream: Any = NIL) -> Any:
            if stream is not NIL and stream is not T:
                raise type_error(name, 2, "nil or t (SexpGPU has only standard output)", stream)
            interp.write(before + printed(fn, name)(x) + after)
            return x

        return op

    def terpri(stream: Any = NIL) -> Any:
        interp.write("\n")
        return NIL

    def write_string(s: Any, stream: Any = NIL) -> Any:
        interp.write(need_string("write-string", 1, s))
        return s

    def write_line(s: Any, stream: Any = NIL) -> Any:
        interp.write(need_string("write-line", 1, s) + "\n")
        return s

    reg.add("print", output("print", prin1_to_string, "\n", " "))
    reg.add("prin1", output("prin1", prin1_to_string))
    reg.add("princ", output("princ", princ_to_string))
    reg.add("write", output("write", prin1_to_string))
    reg.add("pprint", output("pprint", prin1_to_string, "\n"))
    reg.add("terpri", terpri)
    reg.add("fresh-line", terpri)
    reg.add("write-string", write_string)
    reg.add("write-line", write_line)
    reg.add("make-string", make_string)
    reg.add("concatenate", concatenate)
    reg.add("format", lisp_format)
    reg.add("prin1-to-string", printed(prin1_to_string, "prin1-to-string"))
    reg.add("write-to-string", printed(prin1_to_string, "write-to-string"))
    reg.add("princ-to-string", printed(princ_to_string, "princ-to-string"))
    reg.add("intern", intern)
    reg.add("make-symbol", make_symbol)
    reg.add("gensym", gensym)
    reg.add("read-from-string", read_from_string)


def _two(sym: Symbol, interp: "Interpreter", existed: bool = True) -> Any:
    from .types import MultipleValues

    status = interp.kw("internal") if existed else NIL
    if sym.package == "KEYWORD":
        status = interp.kw("external") if existed else NIL
    return MultipleValues((sym, status))


def _one(ch: str, case: Callable[[str], str]) -> str:
    """A character's other case, when that is one character (ß upcases to itself)."""
    other = case(ch)
    return other if len(other) == 1 else ch


def _capitalize(s: str) -> str:
    out = []
    start = True
    for c in s:
        if c.isalnum():
            out.append(c.upper() if start else c.lower())
            start = False
        else:
            out.append(c)
            start = True
    return "".join(out)


def _bag(bag: Any) -> str:
    if type(bag) is str:
        return bag
    return "".join(c.ch for c in seq_items("string-trim", 1, bag) if type(c) is Char)


def _char(s: Any, i: Any) -> Any:
    need_string("char", 1, s)
    need_index("char", 2, i)
    if i >= len(s):
        raise lisp_error("E103", f"`char`: index {i} is out of bounds for a string of length {len(s)}", "TYPE-ERROR")
    return Char(s[i])


def _code_char(n: Any) -> Any:
    need_index("code-char", 1, n)
    try:
        return Char(chr(n))
    except (ValueError, OverflowError):
        return NIL


def _digit_char_p(c: Any, radix: Any = 10) -> Any:
    need_char("digit-char-p", 1, c)
    try:
        value = int(c.ch, radix)
    except ValueError:
        return NIL
    return value


def _char_compare(name: str, op: Callable[[str, str], bool]) -> Callable[..., Any]:
    def compare(a: Any, *more: Any) -> Any:
        chars = [need_char(name, i, c).ch for i, c in enumerate((a, *more), 1)]
        return lbool(all(op(x, y) for x, y in zip(chars, chars[1:])))

    return compare


def _parse_integer(s: Any, *args: Any) -> Any:
    from .types import MultipleValues

    need_string("parse-integer", 1, s)
    keys = parse_keys("parse-integer", args, {"START", "END", "RADIX", "JUNK-ALLOWED"}, 2)
    start = keys.get("START", 0)
    end = keys.get("END", NIL)
    end = len(s) if end is NIL else end
    text = s[start:end].strip()
    try:
        return MultipleValues((int(text, keys.get("RADIX", 10)), end))
    except ValueError:
        if keys.get("JUNK-ALLOWED", NIL) is not NIL:
            return MultipleValues((NIL, start))
        raise lisp_error("E104", f"parse-integer: {s!r} is not an integer", "PARSE-ERROR") from None
