"""String streams (CLHS 21, the part that needs no files): string output and input streams,
the standard output streams (which write to the interpreter's output), and the printing and
reading functions that take a stream. Writing to a string stream counts its bytes against
the allocation limit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from .builtins import lbool, need_char, need_string, parse_keys, type_error
from .conditions import lisp_error
from .objects import InputStream, OutputStream
from .printer import PrintTooLarge
from .registry import builtin
from .reader import FEATURES
from .types import NIL, T, Char, MultipleValues, from_iter

if TYPE_CHECKING:
    from .evaluator import Interpreter

STANDARD_STREAMS = ("*STANDARD-OUTPUT*", "*ERROR-OUTPUT*", "*TRACE-OUTPUT*", "*TERMINAL-IO*", "*DEBUG-IO*", "*QUERY-IO*")
# the printer and reader variables, with the values the differential suite's SBCL runs under
PRINTER_VARIABLES: dict[str, Any] = {
    "*PRINT-BASE*": 10, "*PRINT-RADIX*": NIL, "*PRINT-LEVEL*": NIL, "*PRINT-LENGTH*": NIL, "*PRINT-CASE*": ":DOWNCASE",
    "*PRINT-ESCAPE*": T, "*PRINT-PRETTY*": T, "*PRINT-READABLY*": NIL, "*PRINT-ARRAY*": T, "*PRINT-CIRCLE*": NIL,
    "*PRINT-GENSYM*": T, "*PRINT-LINES*": NIL, "*PRINT-RIGHT-MARGIN*": NIL, "*PRINT-MISER-WIDTH*": NIL,
    "*READ-BASE*": 10, "*READ-DEFAULT-FLOAT-FORMAT*": "DOUBLE-FLOAT", "*READ-EVAL*": NIL, "*READ-SUPPRESS*": NIL,
}
WRITE_KEYS = {
    "STREAM", "ESCAPE", "READABLY", "PRETTY", "BASE", "RADIX", "CASE", "LEVEL", "LENGTH", "CIRCLE", "ARRAY", "GENSYM",
    "LINES", "RIGHT-MARGIN", "MISER-WIDTH", "PPRINT-DISPATCH",
}


def define_variables(interp: "Interpreter") -> None:
    """The standard streams (all writing to the interpreter's output), the printer and reader
    variables, and *features*."""
    console = OutputStream(lambda text: interp.write(text))
    for name in STANDARD_STREAMS:
        sym = interp.sym(name)
        interp.values[sym] = console
        interp.specials.add(sym)
    for name, value in PRINTER_VARIABLES.items():
        sym = interp.sym(name)
        interp.values[sym] = interp.kw(value[1:]) if type(value) is str and value.startswith(":") else (
            interp.sym(value) if type(value) is str else value)
        interp.specials.add(sym)
    features = interp.sym("*FEATURES*")
    interp.values[features] = from_iter(interp.kw(name) for name in FEATURES)
    interp.specials.add(features)


class Streams:
    def __init__(self, interp: "Interpreter") -> None:
        self.interp = interp

    # -- designators ---------------------------------------------------------------------------------
    def output(self, fn: str, pos: int, designator: Any) -> OutputStream:
        """The output stream a designator names: nil standard output, t the terminal."""
        name = "*STANDARD-OUTPUT*" if designator is NIL else "*TERMINAL-IO*" if designator is T else None
        stream = self.interp.values.get(self.interp.sym(name)) if name is not None else designator
        if type(stream) is not OutputStream:
            raise type_error(fn, pos, "an output stream (SexpGPU has string streams)", designator)
        return stream

    def input(self, fn: str, pos: int, designator: Any) -> InputStream:
        if type(designator) is not InputStream:
            raise type_error(fn, pos, "an input stream (SexpGPU has string input streams)", designator)
        return designator

    def emit(self, fn: str, pos: int, designator: Any, text: str) -> None:
        stream = self.output(fn, pos, designator)
        if stream.sink is None:
            self.interp.alloc(len(text) // 8)
        stream.write(text)

    def printed(self, fn: str, x: Any, escape: bool, **options: Any) -> str:
        try:
            text = self.interp.print_string(x, escape, **options)
        except PrintTooLarge as exc:
            raise lisp_error("L003", f"`{fn}`: {exc}", "STORAGE-CONDITION") from None
        return text

    def write_text(self, fn: str, s: Any, stream: Any, args: tuple[Any, ...], after: str) -> Any:
        need_string(fn, 1, s)
        keys = parse_keys(fn, args, {"START", "END"}, 3)
        start = keys.get("START", 0)
        end = keys.get("END", NIL)
        end = len(s) if end is NIL else end
        if type(start) is not int or type(end) is not int or not 0 <= start <= end <= len(s):
            raise lisp_error("E103", f"`{fn}`: bad bounds {start} {end} for a string of length {len(s)}", "TYPE-ERROR")
        self.emit(fn, 2, stream, s[start:end] + after)
        return s

    # -- reading -------------------------------------------------------------------------------------
    def eof(self, fn: str, eof_error: Any, eof_value: Any) -> Any:
        if eof_error is not NIL:
            raise lisp_error("E104", f"`{fn}`: end of file on the string stream", "END-OF-FILE")
        return eof_value

    def read_form(self, fn: str, stream: Any, eof_error: Any, eof_value: Any, preserve: bool) -> Any:
        s = self.input(fn, 1, stream)
        read_from_string: Callable[..., Any] = self.interp.functions[self.interp.sym("read-from-string")].fn
        result = read_from_string(s.text, NIL, _EOF, self.interp.kw("start"), s.pos, self.interp.kw("end"), s.end,
                                  self.interp.kw("preserve-whitespace"), lbool(preserve))
        form, s.pos = result
        return self.eof(fn, eof_error, eof_value) if form is _EOF else form


# -- making streams ------------------------------------------------------------------------------
@builtin("make-string-output-stream")
def make_string_output_stream(*args: Any) -> Any:
    parse_keys("make-string-output-stream", args, {"ELEMENT-TYPE"}, 1)
    return OutputStream()


@builtin("get-output-stream-string")
def get_output_stream_string(stream: Any) -> Any:
    if type(stream) is not OutputStream or stream.sink is not None:
        raise type_error("get-output-stream-string", 1, "a string output stream", stream)
    return stream.take()


@builtin("make-string-input-stream")
def make_string_input_stream(text: Any, start: Any = 0, end: Any = NIL) -> Any:
    need_string("make-string-input-stream", 1, text)
    stop = len(text) if end is NIL else end
    if type(start) is not int or type(stop) is not int or not 0 <= start <= stop <= len(text):
        raise lisp_error("E103", f"`make-string-input-stream`: bad bounds {start} {end} for a string of length {len(text)}", "TYPE-ERROR")
    return InputStream(text, start, stop)


@builtin("streamp")
def streamp(x: Any) -> Any:
    return lbool(type(x) in (OutputStream, InputStream))


@builtin("input-stream-p")
def input_stream_p(x: Any) -> Any:
    if type(x) not in (OutputStream, InputStream):
        raise type_error("input-stream-p", 1, "a stream", x)
    return lbool(type(x) is InputStream)


@builtin("output-stream-p")
def output_stream_p(x: Any) -> Any:
    if type(x) not in (OutputStream, InputStream):
        raise type_error("output-stream-p", 1, "a stream", x)
    return lbool(type(x) is OutputStream)


@builtin("open-stream-p")
def open_stream_p(x: Any) -> Any:
    if type(x) not in (OutputStream, InputStream):
        raise type_error("open-stream-p", 1, "a stream", x)
    return T


@builtin("interactive-stream-p")
def interactive_stream_p(x: Any) -> Any:
    return NIL


@builtin("close")
def close(x: Any, *args: Any) -> Any:
    parse_keys("close", args, {"ABORT"}, 2)
    return T


@builtin("finish-output", context=Streams)
def finish_output(lib: Streams, stream: Any = NIL) -> Any:
    lib.output("finish-output", 1, stream)
    return NIL


@builtin("force-output", context=Streams)
def force_output(lib: Streams, stream: Any = NIL) -> Any:
    return finish_output(lib, stream)


@builtin("clear-output", context=Streams)
def clear_output(lib: Streams, stream: Any = NIL) -> Any:
    return finish_output(lib, stream)


# -- writing -------------------------------------------------------------------------------------
@builtin("write-char", context=Streams)
def write_char(lib: Streams, c: Any, stream: Any = NIL) -> Any:
    lib.emit("write-char", 2, stream, need_char("write-char", 1, c).ch)
    return c


@builtin("write-string", context=Streams)
def write_string(lib: Streams, s: Any, stream: Any = NIL, *args: Any) -> Any:
    return lib.write_text("write-string", s, stream, args, "")


@builtin("write-line", context=Streams)
def write_line(lib: Streams, s: Any, stream: Any = NIL, *args: Any) -> Any:
    return lib.write_text("write-line", s, stream, args, "\n")


@builtin("terpri", context=Streams)
def terpri(lib: Streams, stream: Any = NIL) -> Any:
    lib.emit("terpri", 1, stream, "\n")
    return NIL


@builtin("fresh-line", context=Streams)
def fresh_line(lib: Streams, stream: Any = NIL) -> Any:
    if lib.output("fresh-line", 1, stream).fresh:
        return NIL
    lib.emit("fresh-line", 1, stream, "\n")
    return T


@builtin("prin1", context=Streams)
def prin1(lib: Streams, x: Any, stream: Any = NIL) -> Any:
    lib.emit("prin1", 2, stream, lib.printed("prin1", x, True))
    return x


@builtin("princ", context=Streams)
def princ(lib: Streams, x: Any, stream: Any = NIL) -> Any:
    lib.emit("princ", 2, stream, lib.printed("princ", x, False))
    return x


@builtin("print", context=Streams)
def print_(lib: Streams, x: Any, stream: Any = NIL) -> Any:
    lib.emit("print", 2, stream, "\n" + lib.printed("print", x, True) + " ")
    return x


@builtin("pprint", context=Streams)
def pprint(lib: Streams, x: Any, stream: Any = NIL) -> Any:
    lib.emit("pprint", 2, stream, "\n" + lib.printed("pprint", x, True))
    return MultipleValues(())


@builtin("write", context=Streams)
def write(lib: Streams, x: Any, *args: Any) -> Any:
    keys = parse_keys("write", args, WRITE_KEYS, 2)
    stream = keys.pop("STREAM", NIL)
    escape = keys.pop("ESCAPE", None)
    if escape is None:
        escape = lib.interp.values.get(lib.interp.sym("*PRINT-ESCAPE*"), T)
    text = lib.printed("write", x, escape is not NIL, **{k.lower(): v for k, v in keys.items()})
    lib.emit("write", 2, stream, text)
    return x


@builtin("%format-to-stream", context=Streams)
def p_format_to_stream(lib: Streams, stream: Any, text: Any) -> Any:
    lib.emit("format", 1, stream, text)
    return NIL


@builtin("read-char", context=Streams)
def read_char(lib: Streams, stream: Any = NIL, eof_error: Any = T, eof_value: Any = NIL, recursive: Any = NIL) -> Any:
    s = lib.input("read-char", 1, stream)
    if s.pos >= s.end:
        return lib.eof("read-char", eof_error, eof_value)
    s.pos += 1
    return Char(s.text[s.pos - 1])


@builtin("read-char-no-hang", context=Streams)
def read_char_no_hang(lib: Streams, stream: Any = NIL, eof_error: Any = T, eof_value: Any = NIL, recursive: Any = NIL) -> Any:
    return read_char(lib, stream, eof_error, eof_value)


@builtin("peek-char", context=Streams)
def peek_char(lib: Streams, peek_type: Any = NIL, stream: Any = NIL, eof_error: Any = T, eof_value: Any = NIL, recursive: Any = NIL) -> Any:
    s = lib.input("peek-char", 2, stream)
    while s.pos < s.end:
        c = s.text[s.pos]
        if peek_type is NIL or (peek_type is T and c not in " \t\n\r\f") or (type(peek_type) is Char and c == peek_type.ch):
            return Char(c)
        s.pos += 1
    return lib.eof("peek-char", eof_error, eof_value)


@builtin("unread-char", context=Streams)
def unread_char(lib: Streams, c: Any, stream: Any = NIL) -> Any:
    s = lib.input("unread-char", 2, stream)
    if s.pos > 0 and s.text[s.pos - 1] == need_char("unread-char", 1, c).ch:
        s.pos -= 1
    return NIL


@builtin("read-line", context=Streams)
def read_line(lib: Streams, stream: Any = NIL, eof_error: Any = T, eof_value: Any = NIL, recursive: Any = NIL) -> Any:
    s = lib.input("read-line", 1, stream)
    if s.pos >= s.end:
        return MultipleValues((lib.eof("read-line", eof_error, eof_value), T))
    stop = s.text.find("\n", s.pos, s.end)
    if stop < 0:
        line, s.pos = s.text[s.pos : s.end], s.end
        return MultipleValues((line, T))
    line, s.pos = s.text[s.pos : stop], stop + 1
    return MultipleValues((line, NIL))


@builtin("read", context=Streams)
def read(lib: Streams, stream: Any = NIL, eof_error: Any = T, eof_value: Any = NIL, recursive: Any = NIL) -> Any:
    return lib.read_form("read", stream, eof_error, eof_value, False)


@builtin("read-preserving-whitespace", context=Streams)
def read_preserving_whitespace(lib: Streams, stream: Any = NIL, eof_error: Any = T, eof_value: Any = NIL, recursive: Any = NIL) -> Any:
    return lib.read_form("read-preserving-whitespace", stream, eof_error, eof_value, True)


@builtin("listen", context=Streams)
def listen(lib: Streams, stream: Any = NIL) -> Any:
    s = lib.input("listen", 1, stream)
    return lbool(s.pos < s.end)


@builtin("%stream-position", context=Streams)
def p_stream_position(lib: Streams, stream: Any) -> Any:
    return lib.input("with-input-from-string", 1, stream).pos


@builtin("clear-input")
def clear_input(stream: Any = NIL) -> Any:
    return NIL

_EOF = object()  # read's own end-of-file marker
