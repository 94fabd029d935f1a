"""The reader: text to Lisp objects, each cons remembering where it was read.

`Cons.loc` of the first cell of a list is the position of its opening paren; every later
cell's `loc` is the position of its element. Top-level forms come with their own position.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Optional

from .charnames import name_char
from .diagnostics import Diagnostic, DiagnosticError
from .objects import BitVector
from .types import (
    FUNCTION,
    NIL,
    QUASIQUOTE,
    QUOTE,
    UNQUOTE,
    UNQUOTE_SPLICING,
    Char,
    Cons,
    Loc,
    Symbol,
    SymbolTable,
)

WHITESPACE = " \t\n\r\f\v"
TERMINATING = "()'\";`,"


_INT = re.compile(r"[+-]?[0-9]+\.?\Z")
_RATIO = re.compile(r"[+-]?[0-9]+/[0-9]+\Z")
_FLOAT = re.compile(r"[+-]?(?:[0-9]*\.[0-9]+(?:[esfdlESFDL][+-]?[0-9]+)?|[0-9]+(?:\.[0-9]*)?[esfdlESFDL][+-]?[0-9]+)\Z")
_MAX_NUMBER_DIGITS = 10_000
# a token with no escapes, up to whitespace or a terminating character: the common case
_PLAIN_TOKEN = re.compile(r"[^ \t\n\r\f\v()'\";`,\\|]+")
# whitespace and line comments (block comments take the slow path)
_SKIP_START = " \t\n\r\f\v;#"
# what cannot start a plain symbol: a terminating or escape character, `#`, and what starts
# a number or a dotted token (these take read_form's way)
_NOT_PLAIN_SYMBOL_START = "()'\";`,#\\|0123456789+-."
_NOT_READ = object()
_SKIPPABLE = re.compile(r"(?:[ \t\n\r\f\v]+|;[^\n]*)*")
# *features* (CLHS 24.1.2.1): what `#+`/`#-` test; the Lisp variable starts as these keywords
FEATURES: tuple[str, ...] = ("SEXPGPU", "COMMON-LISP", "ANSI-CL", "IEEE-FLOATING-POINT")
_FEATURE_KEYS = frozenset(("KEYWORD", name) for name in FEATURES)
_FEATURE_OPERATORS = ("AND", "OR", "NOT")


@dataclass
class ReadForm:
    form: Any
    loc: Loc


class Reader:
    """Reads every form of one text. Raises DiagnosticError at the exact position of the
    first problem; never raises anything else."""

    def __init__(self, text: str, file: str, symbols: SymbolTable, read_base: int = 10,
                 features: Optional[Callable[[], Any]] = None) -> None:
        self.text = text
        self.file = file
        self.symbols = symbols
        self.read_base = read_base  # *read-base*, for read-from-string
        # the current value of *features* (a Lisp list), asked at each #+/#-; None: FEATURES
        self.features = features
        self.pos = 0
        self.depth = 0  # the nesting depth of the form being read, for the forms #+/#- skip
        self.suppress = False  # *read-suppress*: reading a form #+/#- skips, for its extent only
        self.in_feature = False  # reading a feature expression: names are keywords
        self._holds: Optional[tuple[int, int]] = None  # (start, end) of the #+/#- test last found true
        self._line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self._last_pos = -1
        self._last_loc = Loc(file, 1, 1)

    # -- positions -------------------------------------------------------------------
    def loc_at(self, pos: int) -> Loc:
        # a list's paren is asked for twice in a row: by the list itself, then as its
        # parent's element (Loc is immutable, so the two share one)
        if pos == self._last_pos:
            return self._last_loc
        i = bisect_right(self._line_starts, pos) - 1
        loc = Loc(self.file, i + 1, pos - self._line_starts[i] + 1)
        self._last_pos = pos
        self._last_loc = loc
        return loc

    def error(self, code: str, message: str, pos: int) -> DiagnosticError:
        return DiagnosticError(Diagnostic.at(code, message, self.loc_at(pos)))

    # -- entry points ----------------------------------------------------------------
    def read_all(self) -> list[ReadForm]:
        forms: list[ReadForm] = []
        while (form := self.read_next()) is not None:
            forms.append(form)
        return forms

    def read_next(self) -> Optional[ReadForm]:
        """The next top-level form, or None at the end. Reading form by form lets a
        `require` earlier in the file decide what `prefix:name` means later."""
        self.skip_whitespace_and_comments()
        if self.pos >= len(self.text):
            return None
        start = self.pos
        return ReadForm(self.read_form(depth=0), self.loc_at(start))

    # -- whitespace ------------------------------------------------------------------
    def skip_whitespace_and_comments(self) -> None:
        text, n = self.text, len(self.text)
        if self.pos >= n or text[self.pos] not in _SKIP_START:
            return
        skipped = _SKIPPABLE.match(text, self.pos)
        assert skipped is not None  # the pattern matches the empty string
        self.pos = skipped.end()
        if self.pos >= n or text[self.pos] != "#":
            return
        while self.pos < n:
            c = text[self.pos]
            if c in WHITESPACE:
                self.pos += 1
            elif c == ";":
                end = text.find("\n", self.pos)
                self.pos = n if end < 0 else end + 1
            elif c == "#" and self.pos + 1 < n and text[self.pos + 1] == "|":
                self.skip_block_comment()
            elif c == "#" and self.pos + 1 < n and text[self.pos + 1] in "+-":
                if not self.skip_failed_conditional():
                    return
            else:
                return

    def skip_block_comment(self) -> None:
        start = self.pos
        self.pos += 2
        depth = 1
        text, n = self.text, len(self.text)
        while self.pos < n:
            if text.startswith("|#", self.pos):
                depth -= 1
                self.pos += 2
                if depth == 0:
                    return
            elif text.startswith("#|", self.pos):
                depth += 1
                self.pos += 2
            else:
                self.pos += 1
        raise self.error("R001", "unexpected end of input: `#|` comment is not closed with `|#`", start)

    # -- forms -----------------------------------------------------------------------
    def read_form(self, depth: int) -> Any:
        if depth > 2000:
            raise self.error("R003", "nesting deeper than 2000 levels", self.pos)
        self.depth = depth
        self.skip_whitespace_and_comments()
        if self.pos >= len(self.text):
            raise self.error("R001", "unexpected end of input: expected a form", self.pos)
        start = self.pos
        c = self.text[start]
        if c == "(":
            self.pos += 1
            return self.read_list_rest(start, depth)
        if c == ")":
            raise self.error("R002", "unexpected `)`: no list is open here; delete it", start)
        if c == "'":
            return self.read_wrapped(QUOTE, start, 1, depth)
        if c == "`":
            return self.read_wrapped(QUASIQUOTE, start, 1, depth)
        if c == ",":
            if self.text.startswith(",@", start):
                return self.read_wrapped(UNQUOTE_SPLICING, start, 2, depth)
            return self.read_wrapped(UNQUOTE, start, 1, depth)
        if c == '"':
            return self.read_string(start)
        if c == "#":
            return self.read_dispatch(start, depth)
        return self.read_token_object(start)

    def read_wrapped(self, head: Symbol, start: int, width: int, depth: int) -> Any:
        self.pos += width
        self.skip_whitespace_and_comments()
        if self.pos >= len(self.text) or self.text[self.pos] == ")":
            mark = self.text[start : start + width]
            raise self.error("R001", f"expected a form after `{mark}`", self.pos)
        inner_start = self.pos
        inner = self.read_form(depth + 1)
        loc = self.loc_at(start)
        return Cons(head, Cons(inner, NIL, self.loc_at(inner_start)), loc)

    def read_list_rest(self, open_pos: int, depth: int) -> Any:
        # The hot loop of reading: cells are linked here, and a plain symbol (the commonest
        # element) and a nested list are read without read_form's dispatch; whatever else
        # starts an element goes through read_form.
        head: Any = NIL
        tail: Optional[Cons] = None
        text = self.text
        n = len(text)
        # read_form(depth + 1) would check the depth; a skipped form or a feature expression
        # reads its names its own way
        plain_symbols = depth < 2000 and self.read_base == 10 and not self.suppress and not self.in_feature
        while True:
            if self.pos >= n or text[self.pos] in _SKIP_START:
                self.depth = depth
                self.skip_whitespace_and_comments()
                if self.pos >= n:
                    raise self.error(
                        "R001",
                        f"unexpected end of input: the list opened at {self.loc_at(open_pos)} is not closed; add `)`",
                        self.pos,
                    )
            elem_pos = self.pos
            c = text[elem_pos]
            if c == ")":
                self.pos += 1
                break
            if c == "." and self.is_lone_dot(elem_pos):
                if self.suppress:  # a skipped form's dots are not checked (as in SBCL)
                    self.pos += 1
                    continue
                if tail is None:
                    raise self.error("R006", "a dot cannot start a list: write `(a . b)`", elem_pos)
                self.pos += 1
                self.depth = depth
                self.skip_whitespace_and_comments()
                if self.pos < n and text[self.pos] == ")":
                    raise self.error("R006", "expected a form after the dot in a dotted list", self.pos)
                tail.cdr = self.read_form(depth + 1)
                self.depth = depth
                self.skip_whitespace_and_comments()
                if self.pos >= n:
                    raise self.error("R001", "unexpected end of input: expected `)` after the dotted tail", self.pos)
                if text[self.pos] != ")":
                    raise self.error("R006", "expected `)` after the form that follows the dot", self.pos)
                self.pos += 1
                break
            obj: Any = _NOT_READ
            if plain_symbols and c not in _NOT_PLAIN_SYMBOL_START and not c.isdigit():
                plain = _PLAIN_TOKEN.match(text, elem_pos)
                if plain is not None:
                    stop = plain.end()
                    token = plain.group().upper()
                    if (stop >= n or text[stop] not in "\\|") and ":" not in token:
                        self.pos = stop
                        obj = NIL if token == "NIL" else self.symbols.intern(token)
            elif c == "(" and depth < 2000:
                self.pos += 1
                obj = self.read_list_rest(elem_pos, depth + 1)
            if obj is _NOT_READ:
                obj = self.read_form(depth + 1)
            if tail is None:
                # the first cell's loc is the list's own paren (set below); its element's start
                # is one or more characters later and recoverable by scanning, which
                # diagnostics don't need
                head = tail = Cons(obj, NIL, None)
            else:
                cell = Cons(obj, NIL, self.loc_at(elem_pos))
                tail.cdr = cell
                tail = cell
        if type(head) is Cons:
            head.loc = self.loc_at(open_pos)
        return head

    def is_lone_dot(self, pos: int) -> bool:
        nxt = pos + 1
        return nxt >= len(self.text) or self.text[nxt] in WHITESPACE or self.text[nxt] in TERMINATING

    def read_string(self, start: int) -> str:
        self.pos += 1
        out: list[str] = []
        text, n = self.text, len(self.text)
        while self.pos < n:
            c = text[self.pos]
            if c == '"':
                self.pos += 1
                return "".join(out)
            if c == "\\":
                self.pos += 1
                if self.pos >= n:
                    break
                out.append(text[self.pos])
            else:
                out.append(c)
            self.pos += 1
        raise self.error("R001", "unexpected end of input: the string is not closed; add `\"`", start)

    # -- tokens ----------------------------------------------------------------------
    def scan_token(self) -> tuple[str, bool]:
        """The token at pos with escapes applied, upcased where unescaped; and whether any
        part was escaped (an escaped token is never a number). self.colons gets the
        positions in the token of the colons that were not escaped (package markers)."""
        text, n = self.text, len(self.text)
        plain = _PLAIN_TOKEN.match(text, self.pos)
        if plain is not None and (plain.end() >= n or text[plain.end()] not in "\\|"):
            token = plain.group().upper()
            self.colons = [i for i, c in enumerate(token) if c == ":"] if ":" in token else []
            self.pos = plain.end()
            return token, False
        out: list[str] = []
        escaped = False
        self.colons = []
        length = 0
        while self.pos < n:
            c = text[self.pos]
            if c in WHITESPACE or c in TERMINATING:
                break
            if c == "\\":
                if self.pos + 1 >= n:
                    raise self.error("R001", "unexpected end of input after `\\` in a symbol", self.pos)
                out.append(text[self.pos + 1])
                length += 1
                escaped = True
                self.pos += 2
            elif c == "|":
                close = text.find("|", self.pos + 1)
                if close < 0:
                    raise self.error("R001", "unexpected end of input: `|` in a symbol is not closed", self.pos)
                out.append(text[self.pos + 1 : close])
                length += close - self.pos - 1
                escaped = True
                self.pos = close + 1
            else:
                if c == ":":
                    self.colons.append(length)
                out.append(c.upper())
                length += 1
                self.pos += 1
        return "".join(out), escaped

    def read_token_object(self, start: int) -> Any:
        token, escaped = self.scan_token()
        if self.suppress:
            return NIL
        raw = self.text[start : self.pos]
        if not escaped:
            number = self.parse_number(token, start)
            if number is not None:
                return number
        return self.make_symbol(token, raw, escaped, start)

    def parse_number(self, token: str, start: int) -> Any:
        if self.read_base != 10:
            value = self.parse_in_base(token)
            if value is not None:
                return value
        if not token or not (token[0].isdigit() or token[0] in "+-."):
            return None
        if len(token) > _MAX_NUMBER_DIGITS:
            raise self.error("R003", f"number literal longer than {_MAX_NUMBER_DIGITS} characters", start)
        if _INT.match(token):
            return int(token.rstrip("."))
        if _RATIO.match(token):
            num, den = token.split("/")
            if int(den) == 0:
                raise self.error("R003", f"ratio `{token.lower()}` has a zero denominator", start)
            value = Fraction(int(num), int(den))
            return value.numerator if value.denominator == 1 else value
        if _FLOAT.match(token):
            mantissa = re.sub(r"[ESFDL]", "e", token)
            try:
                double = float(mantissa)
            except ValueError:
                return None
            if double in (float("inf"), float("-inf")):
                raise self.error("R003", f"float `{token.lower()}` is too large for a double", start)
            return double
        return None

    def parse_in_base(self, token: str) -> Any:
        """An integer or ratio in *read-base* (a trailing point still means decimal)."""
        body = token[1:] if token[:1] in "+-" else token
        parts = body.split("/")
        if not body or len(parts) > 2 or not all(parts) or body.endswith("."):
            return None
        try:
            values = [int(part, self.read_base) for part in parts]
        except ValueError:
            return None
        if len(values) == 2 and values[1] == 0:
            return None
        sign = -1 if token[0] == "-" else 1
        value = Fraction(sign * values[0], values[1]) if len(values) == 2 else sign * values[0]
        return value.numerator if type(value) is Fraction and value.denominator == 1 else value

    def make_symbol(self, token: str, raw: str, escaped: bool, start: int) -> Any:
        if not escaped and token and set(token) == {"."}:
            raise self.error("R003", f"`{raw}` is not a valid token: a dot may only appear inside a dotted list", start)
        if self.colons:
            return self.make_qualified_symbol(token, raw, start, list(self.colons), escaped)
        if self.in_feature:
            return self.symbols.keyword(token)  # read as in the KEYWORD package, so `nil` is :nil
        if token == "NIL" and not escaped:
            return NIL
        return self.symbols.intern(token)

    def make_qualified_symbol(self, token: str, raw: str, start: int, colons: list[int], escaped: bool) -> Symbol:
        if colons[0] == 0:
            name = token[1:]
            if len(colons) > 1 or (not name and not escaped):
                raise self.error("R003", f"`{raw}` is not a valid keyword", start)
            return self.symbols.keyword(name)
        marker = colons[0]
        double = len(colons) == 2 and colons[1] == marker + 1
        prefix, name = token[:marker], token[marker + (2 if double else 1) :]
        if len(colons) > (2 if double else 1) or not prefix or not name:
            raise self.error("R003", f"`{raw}` is not a valid symbol: use `prefix:name` with one colon", start)
        try:
            return self.symbols.qualified(prefix, name)
        except LookupError as exc:
            raise DiagnosticError(Diagnostic.at("M004", str(exc), self.loc_at(start))) from None

    # -- # dispatch ------------------------------------------------------------------
    def read_dispatch(self, start: int, depth: int) -> Any:
        text, n = self.text, len(self.text)
        if start + 1 >= n:
            raise self.error("R001", "unexpected end of input after `#`", start)
        c = text[start + 1]
        if c in "+-":
            return self.read_conditional_form(start, depth)
        if self.suppress:
            return self.read_dispatch_suppressed(start, depth)
        if c == "'":
            return self.read_wrapped(FUNCTION, start, 2, depth)
        if c == "\\":
            return self.read_character(start)
        if c == "(":
            self.pos = start + 2
            items = self.read_list_rest(start + 1, depth)
            if type(items) is Cons and not _is_proper(items):
                raise self.error("R006", "a vector literal cannot be a dotted list", start)
            return list(items) if type(items) is Cons else []
        if c in "xXbBoO":
            return self.read_radix(start, {"x": 16, "b": 2, "o": 8}[c.lower()])
        if c == "*":
            return self.read_bits(start, start + 2, None)
        if c.isdigit():
            return self.read_numbered_dispatch(start, depth)
        if c == ":":
            self.pos = start + 2
            token, _ = self.scan_token()
            if not token:
                raise self.error("R003", "expected a symbol name after `#:`", start)
            return Symbol(token, None)
        if c == ".":
            raise self.error("R005", "`#.` (read-time evaluation) is refused: the reader never evaluates code", start)
        raise self.error("R005", f"unknown reader syntax `#{c}`: supported are #' #\\ #( #* #x #b #o #nR #nA #: #+ #- and #| |#", start)

    # -- #+ and #- -------------------------------------------------------------------
    def skip_failed_conditional(self) -> bool:
        """At `#+`/`#-` (CLHS 2.4.8.17): when its test fails, skip the test and the form
        after it, like a comment, and return True; when it holds, leave pos at the `#` for
        read_dispatch to read the form, and return False."""
        start = self.pos
        if self._holds is not None and self._holds[0] == start:
            return False
        holds, after = self.read_feature_test(start)
        if holds:
            self._holds = (start, after)
            self.pos = start
            return False
        self.read_suppressed(start, after)
        return True

    def read_conditional_form(self, start: int, depth: int) -> Any:
        """`#+test form` whose test holds: the form."""
        if self._holds is not None and self._holds[0] == start:
            after = self._holds[1]
        else:  # not reached through skip_whitespace_and_comments: test it here
            holds, after = self.read_feature_test(start)
            if not holds:
                self.read_suppressed(start, after)
                return self.read_form(depth)
        self._holds = None
        self.pos = after
        self.need_conditional_form(start, after)
        return self.read_form(depth + 1)

    def read_feature_test(self, start: int) -> tuple[bool, int]:
        """Read the feature expression after `#+`/`#-` at START (names read as keywords, even
        in a skipped form, as in SBCL): whether the conditional selects its form, and the
        position after the expression."""
        sign = self.text[start + 1]
        self.pos = start + 2
        self.skip_whitespace_and_comments()
        if self.pos >= len(self.text) or self.text[self.pos] == ")":
            raise self.error("R001", f"expected a feature expression after `#{sign}`, such as `#{sign}sexpgpu`", start)
        expr_start = self.pos
        saved = self.suppress, self.in_feature
        self.suppress, self.in_feature = False, True
        try:
            expr = self.read_form(self.depth + 1)
        finally:
            self.suppress, self.in_feature = saved
        keys = self.feature_keys()
        holds = self.feature_holds(expr, keys, self.text[expr_start : self.pos], expr_start)
        return holds == (sign == "+"), self.pos

    def feature_keys(self) -> frozenset[tuple[Optional[str], str]]:
        if self.features is None:
            return _FEATURE_KEYS
        keys: set[tuple[Optional[str], str]] = set()
        features = self.features()
        while type(features) is Cons:
            if type(features.car) is Symbol:
                keys.add((features.car.package, features.car.name))
            features = features.cdr
        return frozenset(keys)

    def feature_holds(self, expr: Any, keys: frozenset[tuple[Optional[str], str]], source: str, pos: int) -> bool:
        """CLHS 24.1.2.1: a name is in *features*; (:and ...), (:or ...) and (:not x) combine."""
        if type(expr) is Symbol:
            return (expr.package, expr.name) in keys
        operator = expr.car if type(expr) is Cons else None
        if type(operator) is Symbol and operator.is_keyword and operator.name in _FEATURE_OPERATORS and _is_proper(expr):
            operands = list(expr.cdr) if type(expr.cdr) is Cons else []
            if operator.name == "NOT":
                if len(operands) != 1:
                    raise self.error("R008", f"`{source}`: (not x) takes one feature expression, got {len(operands)}", pos)
                return not self.feature_holds(operands[0], keys, source, pos)
            test = all if operator.name == "AND" else any
            return test(self.feature_holds(x, keys, source, pos) for x in operands)
        raise self.error(
            "R008",
            f"`{source}` is not a feature expression: write a feature name such as sexpgpu, or (and ...), (or ...), (not x)",
            pos,
        )

    def read_suppressed(self, start: int, after: int) -> None:
        """Skip the form after a failed #+/#- test for its extent only, as *read-suppress*
        does: no symbol is interned and no prefix or unknown `#` syntax is an error."""
        self.pos = after
        saved = self.suppress
        self.suppress = True
        try:
            self.need_conditional_form(start, after)
            self.read_form(self.depth + 1)
        finally:
            self.suppress = saved

    def need_conditional_form(self, start: int, after: int) -> None:
        self.skip_whitespace_and_comments()
        if self.pos >= len(self.text):
            test = self.text[start:after]
            raise self.error("R001", f"unexpected end of input: `{test}` needs a form after its feature expression", start)
        if self.text[self.pos] == ")":
            raise self.error("R002", f"`{self.text[start:after]}` needs a form after its feature expression, not `)`", self.pos)

    def read_dispatch_suppressed(self, start: int, depth: int) -> Any:
        """A `#` syntax inside a skipped form, read for its extent: a token, a list, or
        (for #. #p #c #s #= and any other letter) the form after it."""
        text = self.text
        sub = start + 1
        while sub < len(text) and text[sub].isdigit():
            sub += 1
        if sub >= len(text):
            raise self.error("R001", f"unexpected end of input after `{text[start:sub]}`", start)
        c = text[sub]
        if c in WHITESPACE or c in ")<":
            raise self.error("R005", f"`#{c}` is not reader syntax, even in a form that #+/#- skips", start)
        self.pos = sub + 1
        if c == "(":
            self.read_list_rest(sub, depth)
        elif c == "\\":
            end = sub + 2  # the character itself may be a terminating one: #\(
            while end < len(text) and text[end] not in WHITESPACE and text[end] not in TERMINATING:
                end += 1
            self.pos = min(end, len(text))
        elif c == "#" and sub > start + 1:
            pass  # #n#
        elif c in "xXbBoOrR*:":
            self.scan_token()
        else:
            self.read_form(depth + 1)
        return NIL

    def read_character(self, start: int) -> Char:
        text, n = self.text, len(self.text)
        self.pos = start + 2
        if self.pos >= n:
            raise self.error("R001", "unexpected end of input: expected a character after `#\\`", start)
        first = text[self.pos]
        self.pos += 1
        end = self.pos
        while end < n and text[end] not in WHITESPACE and text[end] not in TERMINATING:
            end += 1
        if end == self.pos:
            return Char(first)
        name = first + text[self.pos : end]
        self.pos = end
        found = name_char(name)
        if found is not None:
            return Char(found)
        raise self.error("R004", f"unknown character name `#\\{name}`; use e.g. #\\a, #\\Space, #\\Newline, #\\Tab", start)

    def read_numbered_dispatch(self, start: int, depth: int) -> Any:
        """#nR (a rational in base n), #nA (an array of rank n), #n( (a vector of n elements,
        the last repeated) and #n* (n bits)."""
        text = self.text
        end = start + 1
        while end < len(text) and text[end].isdigit():
            end += 1
        n = int(text[start + 1 : end])
        c = text[end] if end < len(text) else ""
        if c in "rR" and 2 <= n <= 36:
            return self.read_radix(start, n, end + 1 - start)
        if c in "aA":
            self.pos = end + 1
            return _array_literal(self.read_form(depth + 1), n, lambda: self.error("R006", f"#{n}A needs contents nested {n} deep, all of one shape", start))
        if c == "(":
            self.pos = end + 1
            items = self.read_list_rest(end, depth)
            elements = list(items) if type(items) is Cons else []
            if len(elements) > n or (n and not elements):
                raise self.error("R006", f"#{n}( has {len(elements)} elements", start)
            return elements + elements[-1:] * (n - len(elements))
        if c == "*":
            return self.read_bits(start, end + 1, n)
        raise self.error("R005", f"unknown reader syntax `#{n}{c}`: supported are #nR, #nA, #n( and #n*", start)

    def read_bits(self, start: int, pos: int, n: Optional[int]) -> BitVector:
        """#*0101 and #n*01: a bit vector."""
        self.pos = pos
        token, _ = self.scan_token()
        if token.strip("01"):
            raise self.error("R003", f"`#*{token.lower()}` is not a bit vector: only 0 and 1 may follow #*", start)
        bits = [int(b) for b in token]
        if n is not None:
            if len(bits) > n or (n and not bits):
                raise self.error("R006", f"#{n}* has {len(bits)} bits", start)
            bits += bits[-1:] * (n - len(bits))
        return BitVector(bits)

    def read_radix(self, start: int, base: int, width: int = 2) -> Any:
        self.pos = start + width
        token, _ = self.scan_token()
        try:
            if "/" in token:
                num, den = token.split("/")
                value = Fraction(int(num, base), int(den, base))
                return value.numerator if value.denominator == 1 else value
            if not token or token[0] == "_" or "_" in token:
                raise ValueError
            return int(token, base)
        except (ValueError, ZeroDivisionError):
            mark = self.text[start : start + width]
            raise self.error("R003", f"`{mark}{token.lower()}` is not a valid base-{base} number", start) from None


def _array_literal(contents: Any, rank: int, bad: Callable[[], Exception]) -> Any:
    """The array #rankA(contents) denotes: a vector for rank 1, a LispArray otherwise."""
    from .objects import LispArray

    dims: list[int] = []
    level = contents
    for _ in range(rank):
        items = list(level) if type(level) is Cons else level if type(level) is list else [] if level is NIL else None
        if items is None:
            raise bad()
        dims.append(len(items))
        level = items[0] if items else NIL
    data: list[Any] = []

    def flatten(x: Any, depth: int) -> None:
        if depth == rank:
            data.append(x)
            return
        items = list(x) if type(x) is Cons else x if type(x) is list else [] if x is NIL else None
        if items is None or len(items) != dims[depth]:
            raise bad()
        for item in items:
            flatten(item, depth + 1)

    flatten(contents, 0)
    if rank == 1:
        return data
    return LispArray(tuple(dims), data)


def _is_proper(x: Any) -> bool:
    while type(x) is Cons:
        x = x.cdr
    return x is NIL


def read_all(text: str, file: str, symbols: SymbolTable) -> list[ReadForm]:
    return Reader(text, file, symbols).read_all()


def decode_source(data: bytes, file: str) -> str:
    """Source bytes as text; invalid UTF-8 is a diagnostic at the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        good = data[: exc.start].decode("utf-8")
        line = good.count("\n") + 1
        col = len(good) - (good.rfind("\n") + 1) + 1
        raise DiagnosticError(
            Diagnostic.at("R007", f"byte 0x{data[exc.start]:02x} at offset {exc.start} is not valid UTF-8; save the file as UTF-8", Loc(file, line, col))
        ) from None
