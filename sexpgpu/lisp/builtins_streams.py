"""String streams (CLHS 21, the part that needs no files): string output and input streams,
the standard output streams (which write to the interpreter's output), and the printing and
reading functions that take a stream. Writing to a string stream counts its bytes against
the allocation limit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from .builtins import Registry, lbool, need_char, need_string, parse_keys, type_error
from .conditions import lisp_error
from .objects import InputStream, OutputStream
from .printer import PrintTooLarge
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


def install(reg: Registry) -> None:
    Streams(reg.interp).install(reg)


class Streams:
    def __init__(self, interp: "Interpreter") -> None:
        self.interp = interp
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

    def install(self, reg: Registry) -> None:
        for name in [
            "make-string-output-stream", "get-output-stream-string", "make-string-input-stream", "streamp",
            "input-stream-p", "output-stream-p", "open-stream-p", "interactive-stream-p", "close", "finish-output",
            "force-output", "clear-output", "write-char", "write-string", "write-line", "terpri", "fresh-line", "prin1",
            "princ", "print", "pprint", "write", "%format-to-stream", "read-char", "read-char-no-hang", "peek-char",
            "unread-char", "read-line", "read", "read-preserving-whitespace", "listen", "clear-input", "%stream-position",
        ]:
            reg.add(name, getattr(self, "op_" + name.replace("%", "p_").replace("-", "_")))

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

    # -- making streams ------------------------------------------------------------------------------
    def op_make_string_output_stream(self, *args: Any) -> Any:
        parse_keys("make-string-output-stream", args, {"ELEMENT-TYPE"}, 1)
        return OutputStream()

    def op_get_output_stream_string(self, stream: Any) -> Any:
        if type(stream) is not OutputStream or stream.sink is not None:
            raise type_error("get-output-stream-string", 1, "a string output stream", stream)
        return stream.take()

    def op_make_string_input_stream(self, text: Any, start: Any = 0, end: Any = NIL) -> Any:
        need_string("make-string-input-stream", 1, text)
        stop = len(text) if end is NIL else end
        if type(start) is not int or type(stop) is not int or not 0 <= start <= stop <= len(text):
            raise lisp_error("E103", f"`make-string-input-stream`: bad bounds {start} {end} for a string of length {len(text)}", "TYPE-ERROR")
        return InputStream(text, start, stop)

    def op_streamp(self, x: Any) -> Any:
        return lbool(type(x) in (OutputStream, InputStream))

    def op_input_stream_p(self, x: Any) -> Any:
        if type(x) not in (OutputStream, InputStream):
            raise type_error("input-stream-p", 1, "a stream", x)
        return lbool(type(x) is InputStream)

    def op_output_stream_p(self, x: Any) -> Any:
        if type(x) not in (OutputStream, InputStream):
            raise type_error("output-stream-p", 1, "a stream", x)
        return lbool(type(x) is OutputStream)

    def op_open_stream_p(self, x: Any) -> Any:
        if type(x) not in (OutputStream, InputStream):
            raise type_error("open-stream-p", 1, "a stream", x)
        return T

    def op_interactive_stream_p(self, x: Any) -> Any:
        return NIL

    def op_close(self, x: Any, *args: Any) -> Any:
        parse_keys("close", args, {"ABORT"}, 2)
        return T

    def op_finish_output(self, stream: Any = NIL) -> Any:
        self.output("finish-output", 1, stream)
        return NIL

    def op_force_output(self, stream: Any = NIL) -> Any:
        return self.op_finish_output(stream)

    def op_clear_output(self, stream: Any = NIL) -> Any:
        return self.op_finish_output(stream)

    # -- writing -------------------------------------------------------------------------------------
    def op_write_char(self, c: Any, stream: Any = NIL) -> Any:
        self.emit("write-char", 2, stream, need_char("write-char", 1, c).ch)
        return c

    def op_write_string(self, s: Any, stream: Any = NIL, *args: Any) -> Any:
        return self.write_text("write-string", s, stream, args, "")

    def op_write_line(self, s: Any, stream: Any = NIL, *args: Any) -> Any:
        return self.write_text("write-line", s, stream, args, "\n")

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

    def op_terpri(self, stream: Any = NIL) -> Any:
        self.emit("terpri", 1, stream, "\n")
        return NIL

    def op_fresh_line(self, stream: Any = NIL) -> Any:
        if self.output("fresh-line", 1, stream).fresh:
            return NIL
        self.emit("fresh-line", 1, stream, "\n")
        return T

    def op_prin1(self, x: Any, stream: Any = NIL) -> Any:
        self.emit("prin1", 2, stream, self.printed("prin1", x, True))
        return x

    def op_princ(self, x: Any, stream: Any = NIL) -> Any:
        self.emit("princ", 2, stream, self.printed("princ", x, False))
        return x

    def op_print(self, x: Any, stream: Any = NIL) -> Any:
        self.emit("print", 2, stream, "\n" + self.printed("print", x, True) + " ")
        return x

    def op_pprint(self, x: Any, stream: Any = NIL) -> Any:
        self.emit("pprint", 2, stream, "\n" + self.printed("pprint", x, True))
        return MultipleValues(())

    def op_write(self, x: Any, *args: Any) -> Any:
        keys = parse_keys("write", args, WRITE_KEYS, 2)
        stream = keys.pop("STREAM", NIL)
        escape = keys.pop("ESCAPE", None)
        if escape is None:
            escape = self.interp.values.get(self.interp.sym("*PRINT-ESCAPE*"), T)
        text = self.printed("write", x, escape is not NIL, **{k.lower(): v for k, v in keys.items()})
        self.emit("write", 2, stream, text)
        return x

    def op_p_format_to_stream(self, stream: Any, text: Any) -> Any:
        self.emit("format", 1, stream, text)
        return NIL

    # -- reading -------------------------------------------------------------------------------------
    def eof(self, fn: str, eof_error: Any, eof_value: Any) -> Any:
        if eof_error is not NIL:
            raise lisp_error("E104", f"`{fn}`: end of file on the string stream", "END-OF-FILE")
        return eof_value

    def op_read_char(self, stream: Any = NIL, eof_error: Any = T, eof_value: Any = NIL, recursive: Any = NIL) -> Any:
        s = self.input("read-char", 1, stream)
        if s.pos >= s.end:
            return self.eof("read-char", eof_error, eof_value)
        s.pos += 1
        return Char(s.text[s.pos - 1])

    def op_read_char_no_hang(self, stream: Any = NIL, eof_error: Any = T, eof_value: Any = NIL, recursive: Any = NIL) -> Any:
        return self.op_read_char(stream, eof_error, eof_value)

    def op_peek_char(self, peek_type: Any = NIL, stream: Any = NIL, eof_error: Any = T, eof_value: Any = NIL, recursive: Any = NIL) -> Any:
        s = self.input("peek-char", 2, stream)
        while s.pos < s.end:
            c = s.text[s.pos]
            if peek_type is NIL or (peek_type is T and c not in " \t\n\r\f") or (type(peek_type) is Char and c == peek_type.ch):
                return Char(c)
            s.pos += 1
        return self.eof("peek-char", eof_error, eof_value)

    def op_unread_char(self, c: Any, stream: Any = NIL) -> Any:
        s = self.input("unread-char", 2, stream)
        if s.pos > 0 and s.text[s.pos - 1] == need_char("unread-char", 1, c).ch:
            s.pos -= 1
        return NIL

    def op_read_line(self, stream: Any = NIL, eof_error: Any = T, eof_value: Any = NIL, recursive: Any = NIL) -> Any:
        s = self.input("read-line", 1, stream)
        if s.pos >= s.end:
            return MultipleValues((self.eof("read-line", eof_error, eof_value), T))
        stop = s.text.find("\n", s.pos, s.end)
        if stop < 0:
            line, s.pos = s.text[s.pos : s.end], s.end
            return MultipleValues((line, T))
        line, s.pos = s.text[s.pos : stop], stop + 1
        return MultipleValues((line, NIL))

    def op_read(self, stream: Any = NIL, eof_error: Any = T, eof_value: Any = NIL, recursive: Any = NIL) -> Any:
        return self.read_form("read", stream, eof_error, eof_value, False)

    def op_read_preserving_whitespace(self, stream: Any = NIL, eof_error: Any = T, eof_value: Any = NIL, recursive: Any = NIL) -> Any:
        return self.read_form("read-preserving-whitespace", stream, eof_error, eof_value, True)

    def read_form(self, fn: str, stream: Any, eof_error: Any, eof_value: Any, preserve: bool) -> Any:
        s = self.input(fn, 1, stream)
        read_from_string: Callable[..., Any] = self.interp.functions[self.interp.sym("read-from-string")].fn
        result = read_from_string(s.text, NIL, _EOF, self.interp.kw("start"), s.pos, self.interp.kw("end"), s.end,
                                  self.interp.kw("preserve-whitespace"), lbool(preserve))
        form, s.pos = result
        return self.eof(fn, eof_error, eof_value) if form is _EOF else form

    def op_listen(self, stream: Any = NIL) -> Any:
        s = self.input("listen", 1, stream)
        return lbool(s.pos < s.end)

    def op_p_stream_position(self, stream: Any) -> Any:
        return self.input("with-input-from-string", 1, stream).pos

    def op_clear_input(self, stream: Any = NIL) -> Any:
        return NIL


_EOF = object()  # read's own end-of-file marker
