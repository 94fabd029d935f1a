"""The layout behind `sexpgpu fmt`: the one canonical layout of a SexpGPU source file.
(Not to be confused with format.py, which is Common Lisp's `format` directives.)

`format_source(text, file)` first reads `text` with the reader, so a file that does not read
raises the reader's own `DiagnosticError`. It then parses the text again into a lossless
concrete syntax tree (atoms keep their exact source text, comments are kept) and prints that
tree in the canonical layout below. The result is

* idempotent: `format_source(format_source(x)) == format_source(x)`;
* form-preserving: reading the output gives the same forms as reading the input;
* comment-preserving: every comment appears, in the same order, attached to the same form.

Canonical layout
----------------

Whitespace
  Line width is 100 columns. Indentation is spaces only. No line ends in whitespace (except
  inside a multi-line string or `|symbol|`, whose text is kept verbatim). The file ends with
  exactly one newline; an empty file stays empty.

Top level
  Top-level forms are separated by exactly one blank line. The exception: consecutive forms
  that each fit on one line and have the same head (several `(defknob ...)` or
  `(require ...)`) stay adjacent if they were adjacent in the input. A comment block directly
  above a form (no blank line between) belongs to that form and follows the same rule; a
  comment block separated from the next form by a blank line keeps the blank lines (at most
  one) that the input had around it.

One line when possible
  A list that contains no comment and no multi-line atom, and fits in the remaining width
  (counting the closing parens that follow it), is printed on one line with single spaces:
  `(a b c)`.

Body forms
  A list headed by one of the body heads below keeps the head and its distinguished arguments
  on the first line and indents the remaining forms by 2 relative to its opening paren. The
  number of distinguished arguments per head (fewer when a keyword comes first, so
  `(defrun :steps 300 ...)` has none):

  ===  ======================================================================================
  0    progn tagbody
  1    defvar defparameter defconstant let let* flet labels macrolet symbol-macrolet lambda
       when unless dolist dotimes handler-case handler-bind restart-case unwind-protect block
       prog1 with-gensyms once-only defstruct case ecase typecase etypecase forward
       optimizer-update defcurriculum defgroups defrun defloader defdiagnostic eval-when
       catch with-numerics defobjective defevaluate
  2    defun defmacro defmodel defoptimizer defpart do do*
       destructuring-bind multiple-value-bind
  ===  ======================================================================================

  A distinguished argument that cannot continue the first line (the previous one spans
  several lines, or a comment is in the way) goes on its own line indented by 4.

Calls
  Any other list headed by a symbol prints the head and its first argument on the first line
  and every further argument on its own line, aligned with the first argument. When that
  layout makes more lines overflow the width than the fallback does, or a comment sits after
  the head or before the first argument, the fallback is used: the head alone on the first
  line, every argument on its own line indented by 2. `loop` is laid out as a call whose
  "arguments" are its clauses: a new line starts at each loop keyword (`for`, `with`, `do`,
  `collect`, `when`, ...); `and` and `else` share the line of the clause after them.

Keyword pairs
  In a call, a body and a data list, a keyword followed by a non-keyword (`:steps 300`) is a
  pair and stays on one line: the value continues the keyword's line unless that makes more
  lines overflow than starting it on the next line, indented 2 more than the keyword. The
  arguments of `setf`, `setq`, `psetf` and `psetq` pair up the same way (place and value), and
  a dotted tail `. x` stays on the line of its dot.

Data
  A list whose head is not a symbol (a binding list, a clause, a plist, a vector `#(...)`)
  aligns every element under the first one.

Comments
  A comment on its own line stays on its own line, at the indentation of the element that
  follows it (or of the last element, before a closing paren). A comment that ended a line
  stays at the end of the line of the element it followed, after one space; a comment that
  directly followed an opening paren stays after it. Several comments on one line become one
  per line. A list that contains a comment is never put on one line; when the last element
  ends with a comment, the closing paren goes on the next line. Comment text is kept
  verbatim, except trailing whitespace at the end of its lines. Blank lines between the
  elements of a list that is printed on several lines are kept, at most one, where a line
  break is printed anyway.

Prefixes and atoms
  `'`, `` ` ``, `,`, `,@` and `#'` attach directly to the following form (`, @x` keeps its
  space, since `,@x` would read differently); a comment between a prefix and its form moves
  to its own line before the prefixed form. Atoms keep their exact source text, except that a
  whitespace character written literally after `#\\` is written by name (`#\\Space`,
  `#\\Tab`, `#\\Newline`, ...).

Limits
  The input is checked with the reader first; a qualified symbol `prefix:name` is accepted
  whether or not a `require` binds the prefix (only syntax is checked), and nesting deeper
  than the reader's limit (2000 levels) is its R003 error. The layout recurses over the
  nesting of the file, so it runs on the big evaluation stack (`sexpgpu fmt` calls it through
  `program.guarded`); on Python's default stack, about 150 levels raise RecursionError.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Callable, Mapping, Optional, Sequence, Union

from .reader import read_all
from .types import Symbol, SymbolTable

WIDTH = 100
BODY_INDENT = 2
DISTINGUISHED_INDENT = 4

BODY_HEADS: Mapping[str, int] = MappingProxyType(
    {
        **dict.fromkeys(("progn", "tagbody"), 0),
        **dict.fromkeys(
            (
                "defvar defparameter defconstant let let* flet labels macrolet symbol-macrolet"
                " lambda when unless dolist dotimes handler-case handler-bind restart-case"
                " unwind-protect block prog1 with-gensyms once-only defstruct case ecase"
                " typecase etypecase forward optimizer-update defcurriculum defgroups defrun"
                " defloader defdiagnostic eval-when catch with-numerics defobjective defevaluate"
                " defsweep defvariant"
            ).split(),
            1,
        ),
        **dict.fromkeys(
            (
                "defun defmacro defmodel defoptimizer defpart do do*"
                " destructuring-bind multiple-value-bind"
            ).split(),
            2,
        ),
    }
)

PAIRWISE_HEADS = frozenset(("setf", "setq", "psetf", "psetq"))

LOOP_KEYWORDS = frozenset(
    (
        "named with for as repeat while until do doing collect collecting append appending"
        " nconc nconcing sum summing count counting maximize maximizing minimize minimizing"
        " when if unless else end always never thereis initially finally return and"
    ).split()
)

# `and` and `else` start a line together with the clause that follows them
LOOP_CONNECTORS = frozenset(("and", "else"))

_WHITESPACE = " \t\n\r\f\v"
_TERMINATING = "()'\";`,"
_PREFIXES = ("#'", ",@", "'", "`", ",")
_NUMBERED_DISPATCH = re.compile(r"#[0-9]+([(aA])")
_CHAR_NAMES: Mapping[str, str] = MappingProxyType({" ": "Space", "\n": "Newline", "\t": "Tab", "\r": "Return", "\f": "Page"})
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?|[0-9]+/[0-9]+|[0-9]*\.[0-9]+(?:[esfdl][+-]?[0-9]+)?|[0-9]+(?:\.[0-9]*)?[esfdl][+-]?[0-9]+)\Z", re.I)


# ---------------------------------------------------------------------------------------
# Concrete syntax tree
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Comment:
    """A `;` or `#| |#` comment, its text verbatim (trailing whitespace of lines removed)."""

    text: str


@dataclass(frozen=True)
class Blank:
    """One or more blank lines between two elements of the input."""


Spacer = Union[Comment, Blank]


@dataclass(frozen=True)
class Atom:
    """A symbol, number, string or character, as written."""

    text: str


@dataclass(frozen=True)
class Prefixed:
    """`'x`, `` `x ``, `,x`, `,@x`, `#'x`, or `#+test x` / `#-test x` (prefix `#+test `)."""

    prefix: str
    body: "Node"


@dataclass(frozen=True)
class Entry:
    """One element of a list with the comments around it: own-line comments and blank lines
    before it, and the comment that ended its line."""

    node: "Node"
    leading: tuple[Spacer, ...]
    trailing: Optional[Comment]


@dataclass(frozen=True)
class Seq:
    """A list `( ... )` or a vector `#( ... )`; `closing` holds the comments after the last
    element, `open_comment` one that directly followed the opening paren."""

    opener: str
    open_comment: Optional[Comment]
    entries: tuple[Entry, ...]
    closing: tuple[Spacer, ...]


@dataclass(frozen=True)
class Document:
    entries: tuple[Entry, ...]
    closing: tuple[Spacer, ...]


Node = Union[Atom, Prefixed, Seq]


# ---------------------------------------------------------------------------------------
# Parser (the input has already been checked by the reader)
# ---------------------------------------------------------------------------------------


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def document(self) -> Document:
        _, entries, closing = self.items(in_list=False)
        return Document(entries, closing)

    def items(self, in_list: bool) -> tuple[Optional[Comment], tuple[Entry, ...], tuple[Spacer, ...]]:
        """The elements up to `)` or the end of the text, with their comments."""
        open_comment: Optional[Comment] = None
        entries: list[Entry] = []
        pending: list[Spacer] = []
        comment_since_element = False
        while True:
            newlines = self.skip_whitespace()
            if self.pos >= len(self.text) or self.text[self.pos] == ")":
                break
            started = bool(entries or pending or open_comment)
            if newlines >= 2 and started and not (pending and isinstance(pending[-1], Blank)):
                pending.append(Blank())
            comment = self.comment()
            if comment is not None:
                same_line = newlines == 0 and not comment_since_element
                comment_since_element = True
                if same_line and entries and entries[-1].trailing is None:
                    entries[-1] = replace(entries[-1], trailing=comment)
                elif same_line and in_list and not entries and open_comment is None:
                    open_comment = comment
                else:
                    pending.append(comment)
                continue
            hoisted, node = self.node()
            entries.append(Entry(node, tuple(pending) + hoisted, None))
            pending = []
            comment_since_element = False
        while pending and isinstance(pending[-1], Blank):
            pending.pop()
        return open_comment, tuple(entries), tuple(pending)

    def skip_whitespace(self) -> int:
        """Skips whitespace; returns how many newlines it skipped."""
        text, start = self.text, self.pos
        while self.pos < len(text) and text[self.pos] in _WHITESPACE:
            self.pos += 1
        return text.count("\n", start, self.pos)

    def comment(self) -> Optional[Comment]:
        text, pos = self.text, self.pos
        if text.startswith(";", pos):
            end = text.find("\n", pos)
            self.pos = len(text) if end < 0 else end
            return Comment(text[pos : self.pos].rstrip())
        if text.startswith("#|", pos):
            self.skip_block_comment()
            raw = text[pos : self.pos]
            return Comment("\n".join(line.rstrip() for line in raw.split("\n")))
        return None

    def skip_block_comment(self) -> None:
        text = self.text
        self.pos += 2
        depth = 1
        while depth and self.pos < len(text):
            if text.startswith("|#", self.pos):
                depth -= 1
                self.pos += 2
            elif text.startswith("#|", self.pos):
                depth += 1
                self.pos += 2
            else:
                self.pos += 1

    def node(self) -> tuple[tuple[Comment, ...], Node]:
        """One form, and the comments found between its prefixes and its body."""
        text, start = self.text, self.pos
        if text.startswith("(", start):
            self.pos += 1
            return (), self.seq("(")
        if text.startswith("#(", start):
            self.pos += 2
            return (), self.seq("#(")
        numbered = _NUMBERED_DISPATCH.match(text, start)
        if numbered is not None:
            # #3(a b) is a vector and #2A((1 2) (3 4)) an array: the number and the dispatch
            # character stay attached to what follows
            self.pos = numbered.end()
            dispatch = text[start : self.pos]
            if numbered.group(1) == "(":
                return (), self.seq(dispatch)
            hoisted, body = self.node()
            return hoisted, Prefixed(dispatch, body)
        if text.startswith(("#+", "#-"), start):
            return self.conditional(text[start : start + 2])
        for prefix in _PREFIXES:
            if text.startswith(prefix, start):
                self.pos += len(prefix)
                hoisted = self.prefix_comments()
                inner_hoisted, body = self.node()
                return hoisted + inner_hoisted, Prefixed(prefix, body)
        if text.startswith('"', start):
            return (), Atom(self.string())
        if text.startswith("#\\", start):
            return (), Atom(self.character())
        if text.startswith("#", start):
            self.pos += 2
        self.scan_token()
        return (), Atom(text[start : self.pos])

    def conditional(self, mark: str) -> tuple[tuple[Comment, ...], Node]:
        """`#+test form` and `#-test form`: the test on one line, attached to its form like a
        prefix (comments inside the test move before the whole conditional)."""
        self.pos += len(mark)
        hoisted = list(self.prefix_comments())
        test_hoisted, test = self.node()
        hoisted += test_hoisted
        prefix = mark + _one_line(test, hoisted) + " "
        hoisted += self.prefix_comments()
        inner_hoisted, body = self.node()
        return tuple(hoisted) + inner_hoisted, Prefixed(prefix, body)

    def seq(self, opener: str) -> Seq:
        open_comment, entries, closing = self.items(in_list=True)
        self.pos += 1  # the closing paren
        return Seq(opener, open_comment, entries, closing)

    def prefix_comments(self) -> tuple[Comment, ...]:
        found: list[Comment] = []
        while True:
            self.skip_whitespace()
            comment = self.comment()
            if comment is None:
                return tuple(found)
            found.append(comment)

    def string(self) -> str:
        text, start = self.text, self.pos
        self.pos += 1
        while self.pos < len(text) and text[self.pos] != '"':
            self.pos += 2 if text[self.pos] == "\\" else 1
        self.pos += 1
        return text[start : self.pos]

    def character(self) -> str:
        text, start = self.text, self.pos
        self.pos += 3
        self.scan_plain()
        token = text[start : self.pos]
        if len(token) == 3 and token[2] in _WHITESPACE:
            return "#\\" + _CHAR_NAMES.get(token[2], f"U{ord(token[2]):X}")
        return token

    def scan_plain(self) -> None:
        text = self.text
        while self.pos < len(text) and text[self.pos] not in _WHITESPACE and text[self.pos] not in _TERMINATING:
            self.pos += 1

    def scan_token(self) -> None:
        text = self.text
        while self.pos < len(text):
            c = text[self.pos]
            if c in _WHITESPACE or c in _TERMINATING:
                return
            if c == "\\":
                self.pos += 2
            elif c == "|":
                close = text.find("|", self.pos + 1)
                self.pos = len(text) if close < 0 else close + 1
            else:
                self.pos += 1


# ---------------------------------------------------------------------------------------
# Classifying atoms
# ---------------------------------------------------------------------------------------


def _one_line(node: Node, comments: list[Comment]) -> str:
    """A feature expression's text on one line; its comments are added to COMMENTS."""
    if isinstance(node, Atom):
        return node.text
    if isinstance(node, Prefixed):
        return node.prefix + _one_line(node.body, comments)
    spacers: list[Spacer] = [node.open_comment] if node.open_comment is not None else []
    parts: list[str] = []
    for entry in node.entries:
        spacers += [*entry.leading, *([entry.trailing] if entry.trailing is not None else [])]
        parts.append(_one_line(entry.node, comments))
    comments += [x for x in [*spacers, *node.closing] if isinstance(x, Comment)]
    return node.opener + " ".join(parts) + ")"


def _is_keyword(node: Node) -> bool:
    return isinstance(node, Atom) and len(node.text) > 1 and node.text[0] == ":"


def _is_dot(node: Node) -> bool:
    return isinstance(node, Atom) and node.text == "."


def _symbol_name(node: Node) -> Optional[str]:
    """The lower-case name of a non-keyword symbol atom (package prefix dropped), else None."""
    if not isinstance(node, Atom):
        return None
    text = node.text
    if not text or text[0] in "\":" or _NUMBER.match(text) or text == ".":
        return None
    if text.startswith("#"):
        return text[2:].lower() if text.startswith("#:") else None
    return text.rsplit(":", 1)[-1].lower()


def _head_name(seq: Seq) -> Optional[str]:
    if seq.opener != "(" or not seq.entries:
        return None
    return _symbol_name(seq.entries[0].node)


def _has_comment(spacers: Sequence[Spacer]) -> bool:
    return any(isinstance(s, Comment) for s in spacers)


def _prefix_text(prefixed: Prefixed) -> str:
    body = prefixed.body
    if prefixed.prefix == "," and isinstance(body, Atom) and body.text.startswith("@"):
        return ", "
    return prefixed.prefix


# ---------------------------------------------------------------------------------------
# Grouping the arguments of a list into lines
# ---------------------------------------------------------------------------------------

Group = tuple[Entry, ...]


def keyword_groups(entries: Sequence[Entry]) -> list[Group]:
    """`:key value` pairs and `. tail` pairs; everything else alone. Entries that are all
    `:key value` pairs (a keyword at every other place) pair up even where a value is a
    keyword itself: `:precision :bf16` stays on one line."""
    if entries and len(entries) % 2 == 0 and all(_is_keyword(e.node) for e in entries[::2]):
        return pairwise_groups(entries)
    groups: list[Group] = []
    i = 0
    while i < len(entries):
        node = entries[i].node
        nxt = entries[i + 1].node if i + 1 < len(entries) else None
        pairs = nxt is not None and (_is_dot(node) or (_is_keyword(node) and not _is_keyword(nxt) and not _is_dot(nxt)))
        size = 2 if pairs else 1
        groups.append(tuple(entries[i : i + size]))
        i += size
    return groups


def pairwise_groups(entries: Sequence[Entry]) -> list[Group]:
    return [tuple(entries[i : i + 2]) for i in range(0, len(entries), 2)]


def loop_groups(entries: Sequence[Entry]) -> list[Group]:
    """One group per loop clause: a loop keyword and what follows it up to the next one."""
    groups: list[Group] = []
    current: list[Entry] = []
    for entry in entries:
        name = _loop_word(entry.node)
        connected = len(current) == 1 and _loop_word(current[0].node) in LOOP_CONNECTORS
        if name in LOOP_KEYWORDS and not connected:
            if current:
                groups.append(tuple(current))
            current = [entry]
        elif current:
            current.append(entry)
        else:
            groups.append((entry,))
    if current:
        groups.append(tuple(current))
    return groups


def _loop_word(node: Node) -> Optional[str]:
    """The loop keyword a symbol or keyword atom spells (`for`, `:for`), lower case."""
    if _is_keyword(node):
        return node.text[1:].lower()  # type: ignore[union-attr]
    return _symbol_name(node)


def _grouper(name: str) -> Callable[[Sequence[Entry]], list[Group]]:
    if name == "loop":
        return loop_groups
    if name in PAIRWISE_HEADS:
        return pairwise_groups
    return keyword_groups


def _distinguished_count(name: str, args: Sequence[Entry]) -> int:
    count = 0
    for entry in args[: BODY_HEADS[name]]:
        if _is_keyword(entry.node):
            break
        count += 1
    return count


# ---------------------------------------------------------------------------------------
# Lines and blocks
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """One output line: code at `indent` and an end-of-line comment. A `raw` line continues a
    multi-line atom and is printed verbatim, without indentation. The first line of a block
    has the block's starting column as its indent."""

    indent: int
    code: str
    comment: str = ""
    raw: bool = False


Block = tuple[Line, ...]


def _line_end(line: Line) -> int:
    return len(line.code) if line.raw else line.indent + len(line.code)


def overflow(block: Block, tail: int) -> int:
    """How many lines of the block (plus `tail` closing parens on its last line) run past
    the width. Verbatim continuation lines of multi-line atoms are not counted."""
    last = len(block) - 1
    return sum(1 for i, line in enumerate(block) if not line.raw and _line_end(line) + (tail if i == last else 0) > WIDTH)


def line_text(line: Line) -> str:
    if line.raw:
        code = line.code
    else:
        code = " " * line.indent + line.code if line.code else ""
    if not line.comment:
        return code
    return code + " " + line.comment if code else " " * line.indent + line.comment


@dataclass(frozen=True)
class Placement:
    """Where a group of entries goes: its first entry continues the current line when `join`
    (and nothing is in the way), else starts a new line at `indent`; later entries of the group
    continue the line when that does not add overflow, else start a line at `indent + 2`."""

    group: Group
    join: bool
    indent: int


@dataclass(frozen=True)
class Layout:
    placements: tuple[Placement, ...]
    rest_indent: int  # for comments after the last element and a dangling closing paren


class _BlockBuilder:
    """Accumulates the lines of one list printed over several lines."""

    def __init__(self, col: int, opener: str) -> None:
        self.lines: list[Line] = [Line(col, opener)]
        self.at_open = True
        self.last_single = True

    def can_join(self, entry: Entry) -> bool:
        return not self.lines[-1].comment and self.last_single and not _has_comment(entry.leading)

    def join_col(self) -> int:
        return _line_end(self.lines[-1]) + (0 if self.at_open else 1)

    def join(self, block: Block) -> None:
        last = self.lines[-1]
        sep = "" if self.at_open else " "
        self.lines[-1] = replace(last, code=last.code + sep + block[0].code, comment=block[0].comment)
        self.lines.extend(block[1:])
        self.at_open = False
        self.last_single = len(block) == 1

    def new_line(self, block: Block) -> None:
        self.lines.extend(block)
        self.at_open = False
        self.last_single = len(block) == 1

    def spacers(self, spacers: Sequence[Spacer], indent: int) -> None:
        for spacer in spacers:
            if isinstance(spacer, Blank):
                self.lines.append(Line(0, ""))
            else:
                self.lines.append(Line(indent, "", spacer.text))
        if spacers:
            self.at_open = False

    def trailing(self, comment: Optional[Comment]) -> None:
        if comment is not None:
            self.lines[-1] = replace(self.lines[-1], comment=comment.text)

    def close(self, indent: int) -> Block:
        last = self.lines[-1]
        if last.comment or not last.code:
            self.lines.append(Line(indent, ")"))
        else:
            self.lines[-1] = replace(last, code=last.code + ")")
        return tuple(self.lines)


# ---------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------


class _Renderer:
    """Renders nodes; memoizes per node, column and tail for the duration of one call."""

    def __init__(self) -> None:
        self._flat: dict[int, Optional[str]] = {}
        self._blocks: dict[tuple[int, int, int], Block] = {}

    # -- one line --------------------------------------------------------------------
    def flat(self, node: Node) -> Optional[str]:
        """The node on one line, or None if it holds a comment or a multi-line atom."""
        key = id(node)
        if key not in self._flat:
            self._flat[key] = self._compute_flat(node)
        return self._flat[key]

    def _compute_flat(self, node: Node) -> Optional[str]:
        if isinstance(node, Atom):
            return None if "\n" in node.text else node.text
        if isinstance(node, Prefixed):
            inner = self.flat(node.body)
            return None if inner is None else _prefix_text(node) + inner
        if node.open_comment is not None or _has_comment(node.closing):
            return None
        parts: list[str] = []
        for entry in node.entries:
            text = self.flat(entry.node)
            if text is None or entry.trailing is not None or _has_comment(entry.leading):
                return None
            parts.append(text)
        return node.opener + " ".join(parts) + ")"

    # -- blocks ----------------------------------------------------------------------
    def render(self, node: Node, col: int, tail: int) -> Block:
        """The node's lines when it starts at column `col` and `tail` closing parens follow."""
        key = (id(node), col, tail)
        block = self._blocks.get(key)
        if block is None:
            block = self._compute_block(node, col, tail)
            self._blocks[key] = block
        return block

    def _compute_block(self, node: Node, col: int, tail: int) -> Block:
        if isinstance(node, Atom):
            first, *rest = node.text.split("\n")
            return (Line(col, first),) + tuple(Line(0, part, raw=True) for part in rest)
        if isinstance(node, Prefixed):
            prefix = _prefix_text(node)
            inner = self.render(node.body, col + len(prefix), tail)
            return (replace(inner[0], indent=col, code=prefix + inner[0].code),) + inner[1:]
        text = self.flat(node)
        if text is not None and col + len(text) + tail <= WIDTH and not _always_broken(node):
            return (Line(col, text),)
        return self._render_broken(node, col, tail)

    def _render_broken(self, seq: Seq, col: int, tail: int) -> Block:
        best: Optional[Block] = None
        best_overflow = 0
        for layout in self.layouts(seq, col):
            block = self.build(seq, col, tail, layout)
            cost = overflow(block, tail)
            if best is None or cost < best_overflow:
                best, best_overflow = block, cost
            if cost == 0:
                break
        assert best is not None
        return best

    # -- layouts ---------------------------------------------------------------------
    def layouts(self, seq: Seq, col: int) -> list[Layout]:
        """The candidate layouts of a list printed over several lines, preferred first."""
        inner = col + len(seq.opener)
        entries = seq.entries
        name = _head_name(seq)
        if name is None:
            groups = keyword_groups(entries)
            placements = [Placement(g, i == 0, inner) for i, g in enumerate(groups)]
            return [Layout(tuple(placements), inner)]
        head, args = entries[0], entries[1:]
        head_placement = Placement((head,), True, inner)
        body_col = col + BODY_INDENT
        if name in BODY_HEADS:
            count = _distinguished_count(name, args)
            header = [Placement((e,), True, col + DISTINGUISHED_INDENT) for e in args[:count]]
            body = [Placement(g, False, body_col) for g in keyword_groups(args[count:])]
            return [Layout((head_placement, *header, *body), body_col)]
        groups = _grouper(name)(args)
        fallback = Layout((head_placement, *(Placement(g, False, body_col) for g in groups)), body_col)
        if not self._can_align(seq, groups):
            return [fallback]
        align_col = inner + len(self.flat(head.node) or "") + 1
        rest = (Placement(g, False, align_col) for g in groups[1:])
        aligned = Layout((head_placement, Placement(groups[0], True, align_col), *rest), align_col)
        return [aligned, fallback]

    def _can_align(self, seq: Seq, groups: Sequence[Group]) -> bool:
        head = seq.entries[0]
        return (
            bool(groups)
            and seq.open_comment is None
            and head.trailing is None
            and not _has_comment(head.leading)
            and not _has_comment(groups[0][0].leading)
            and self.flat(head.node) is not None
        )

    def build(self, seq: Seq, col: int, tail: int, layout: Layout) -> Block:
        builder = _BlockBuilder(col, seq.opener)
        builder.trailing(seq.open_comment)
        last = len(seq.entries) - 1
        closer_follows = not _has_comment(seq.closing) and (last < 0 or seq.entries[last].trailing is None)
        index = 0
        for placement in layout.placements:
            for k, entry in enumerate(placement.group):
                entry_tail = tail + 1 if index == last and closer_follows else 0
                if k == 0:
                    self.place(builder, entry, placement.join, placement.indent, entry_tail, compare=False)
                else:
                    self.place(builder, entry, True, placement.indent + 2, entry_tail, compare=True)
                index += 1
        builder.spacers(seq.closing, layout.rest_indent)
        return builder.close(layout.rest_indent)

    def place(self, builder: _BlockBuilder, entry: Entry, join: bool, indent: int, tail: int, compare: bool) -> None:
        """Puts one entry on the current line if asked and possible (and, with `compare`, if
        that adds no overflow), else on a new line at `indent` after its leading comments."""
        if join and builder.can_join(entry):
            joined = self.render(entry.node, builder.join_col(), tail)
            if not compare or overflow(joined, tail) <= overflow(self.render(entry.node, indent, tail), tail):
                builder.join(joined)
                builder.trailing(entry.trailing)
                return
        builder.spacers(entry.leading, indent)
        builder.new_line(self.render(entry.node, indent, tail))
        builder.trailing(entry.trailing)

    # -- the file --------------------------------------------------------------------
    def document(self, doc: Document) -> list[str]:
        lines: list[Line] = []
        previous: Optional[tuple[Entry, Block]] = None
        for entry in doc.entries:
            block = self.render(entry.node, 0, 0)
            leading = entry.leading
            if previous is not None and leading and isinstance(leading[0], Blank):
                leading = leading[1:]
            if previous is not None and _blank_before(previous, (entry, block)):
                lines.append(Line(0, ""))
            lines.extend(Line(0, "") if isinstance(s, Blank) else Line(0, "", s.text) for s in leading)
            lines.extend(block)
            if entry.trailing is not None:
                lines[-1] = replace(lines[-1], comment=entry.trailing.text)
            previous = (entry, block)
        lines.extend(Line(0, "") if isinstance(s, Blank) else Line(0, "", s.text) for s in doc.closing)
        return [line_text(line) for line in lines]


ALWAYS_BROKEN = frozenset({"defun", "defmacro", "defmodel", "defoptimizer", "defobjective", "defevaluate", "forward", "optimizer-update"})


def _always_broken(seq: Seq) -> bool:
    """Definitions put their body on its own lines even when everything would fit on one."""
    name = _head_name(seq)
    if name is None or name not in ALWAYS_BROKEN:
        return False
    return len(seq.entries) > 1 + BODY_HEADS.get(name, 0)


def _top_head(entry: Entry) -> Optional[str]:
    node = entry.node
    return _head_name(node) if isinstance(node, Seq) else None


def _blank_before(previous: tuple[Entry, Block], current: tuple[Entry, Block]) -> bool:
    """Whether a blank line separates two top-level forms (before the comments of the second)."""
    (prev_entry, prev_block), (entry, block) = previous, current
    leading = entry.leading
    had_blank = bool(leading) and isinstance(leading[0], Blank)
    if _has_comment(leading) and isinstance(leading[-1], Blank):
        return had_blank  # a free-standing comment block: keep the input's spacing
    head = _top_head(entry)
    stays_adjacent = (
        not had_blank and len(prev_block) == 1 and len(block) == 1 and head is not None and head == _top_head(prev_entry)
    )
    return not stays_adjacent


# ---------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------


class SyntaxSymbolTable(SymbolTable):
    """A symbol table for checking syntax alone: `prefix:name` reads as a symbol of module
    PREFIX whether or not a `require` bound it, since formatting resolves no modules."""

    def qualified(self, prefix: str, name: str) -> Symbol:
        return Symbol(name, prefix)


def parse_source(text: str) -> Document:
    """The concrete syntax tree of a text that the reader accepts."""
    return _Parser(text).document()


def format_source(text: str, file: str = "<fmt>") -> str:
    """The canonical layout of a source file (see the module docstring). Raises the reader's
    DiagnosticError if the text does not read (module prefixes are not resolved)."""
    read_all(text, file, SyntaxSymbolTable())
    lines = _Renderer().document(parse_source(text))
    return "\n".join(lines) + "\n" if lines else ""
