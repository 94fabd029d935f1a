"""The layout (`sexpgpu fmt`): idempotent, form-preserving, comment-preserving, and canonical."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sexpgpu.lisp.diagnostics import DiagnosticError
from sexpgpu.lisp.layout import WIDTH, SyntaxSymbolTable, format_source
from sexpgpu.lisp.printer import prin1_to_string
from sexpgpu.lisp.reader import read_all
from sexpgpu.lisp.types import SymbolTable

# ---------------------------------------------------------------------------------------
# Helpers: an independent comment scanner and the three properties
# ---------------------------------------------------------------------------------------

_WS = " \t\r\f\v"
_TERMINATING = "()'\";`,"


def printed_forms(text: str) -> list[str]:
    return [prin1_to_string(f.form) for f in read_all(text, "<test>", SyntaxSymbolTable())]


def _scan_block_comment(text: str, i: int) -> int:
    depth, i = 1, i + 2
    while depth and i < len(text):
        if text.startswith("|#", i):
            depth, i = depth - 1, i + 2
        elif text.startswith("#|", i):
            depth, i = depth + 1, i + 2
        else:
            i += 1
    return i


def _scan_token(text: str, i: int) -> int:
    while i < len(text) and text[i] not in _WS + "\n" + _TERMINATING:
        if text[i] == "\\":
            i += 2
        elif text[i] == "|":
            i = text.index("|", i + 1) + 1
        else:
            i += 1
    return i


def comments(text: str) -> list[tuple[str, str]]:
    """Every comment with what precedes it on its line: "start" (nothing), "code" or
    "comment". Block comments have trailing whitespace of their lines removed."""
    out: list[tuple[str, str]] = []
    prev = "start"
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\n":
            prev, i = "start", i + 1
        elif c in _WS:
            i += 1
        elif c == ";":
            j = text.find("\n", i)
            j = len(text) if j < 0 else j
            out.append((text[i:j].rstrip(), prev))
            prev, i = "comment", j
        elif text.startswith("#|", i):
            j = _scan_block_comment(text, i)
            out.append(("\n".join(line.rstrip() for line in text[i:j].split("\n")), prev))
            prev, i = "comment", j
        elif c == '"':
            j = i + 1
            while text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            prev, i = "code", j + 1
        elif text.startswith("#\\", i):
            prev, i = "code", _scan_token(text, i + 3)
        elif c in _TERMINATING:
            prev, i = "code", i + 1
        else:
            prev, i = "code", _scan_token(text, i + 1 if c == "#" else i)
    return out


def check_properties(text: str, positions: bool = True) -> str:
    out = format_source(text)
    assert format_source(out) == out, f"not idempotent:\n{out}"
    assert printed_forms(out) == printed_forms(text)
    before, after = comments(text), comments(out)
    assert [t for t, _ in before] == [t for t, _ in after]
    if positions:  # own-line comments stay on their own line, end-of-line ones at the end
        expected = {"start": "start", "code": "code", "comment": "start"}
        assert [expected[p] for _, p in before] == [p for _, p in after], out
    assert out == "" or (out.endswith("\n") and not out.endswith("\n\n"))
    assert all("\t" not in line[: len(line) - len(line.lstrip())] for line in out.split("\n"))
    return out


def no_trailing_whitespace(out: str) -> bool:
    return all(line == line.rstrip() for line in out.split("\n"))


# ---------------------------------------------------------------------------------------
# Representative snippets
# ---------------------------------------------------------------------------------------

SNIPPETS: dict[str, str] = {
    "defuns": """
(defun square (x) (* x x))
(defun long-function (alpha beta gamma) "docstring" (let ((a (+ alpha beta)) (b (* gamma gamma gamma gamma gamma))) (when (> a b) (format t "~a is bigger than ~a~%" a b)) (list a b)))
""",
    "nested-lets": """
(let ((x 1) (y 2))
  (let* ((z (+ x y)) (w (* z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z)))
    (let ((v (list x y z w))) (print v) (values v w))))
""",
    "loop": """
(defun collect-squares (n)
  (loop for i from 0 below n when (evenp i) collect (* i i) into squares and count i into k finally (return (values squares k))))
(loop for x in '(1 2 3) do (print x))
""",
    "backquote": """
(defmacro with-timing ((name &key (clock 'real-time)) &body body)
  (let ((start (gensym "START")))
    `(let ((,start (,clock)))
       (unwind-protect (progn ,@body) (record-timing ',name (- (,clock) ,start) :units :ms :sink *timing-sink*)))))
(defmacro spaced () `(list , @x ,@y ,.z #',f))
""",
    "strings": """
(defparameter *msg* "a string ; with a semicolon and \\"escaped quotes\\" and a \\\\ backslash")
(format t "(not a list ; not a comment" "#| not a block |#")
(defvar *multi* "first line
  second line ; still the string
third")
""",
    "characters": """
(list #\\; #\\( #\\) #\\" #\\Space #\\Newline #\\a #\\\\ #\\|)
(char= c #\\;) ; a comment after a semicolon character
(case c (#\\( 'open) (#\\) 'close) (t nil))
""",
    "block-comments": """
#| A file header
   in a block comment |#
(defun f (x) #| inline |# (+ x 1))
(defun g (y)
  #| nested #| inner |# outer |#
  (* y 2))
""",
    "dotted-and-vectors": """
(defparameter *pairs* '((a . 1) (b . 2) (c . (d . e)) (f g . h)))
(defparameter *vec* #(1 2.5 1/3 "s" #\\x (nested list) #(inner vector)))
(cons 'a . ('b))
""",
    "keywords": """
(defloader train :source (synthetic :spirals :n 2048) :fields ((x :f32 (2)) (y :i32 ())) :batch 64)
(defrun :steps 300 :seed 0 :model mlp :optimizer (adam :lr 0.001 :betas (0.9 0.999)) :loader train :eval-every 50)
(make-instance 'trainer :model (mlp :in 2 :hidden 64 :out 2) :optimizer (sgd :lr 0.1 :momentum 0.9) :verbose :quiet)
""",
    "comments-everywhere": """
;;; File header
;;; second line

(require "nn") ; the network library
(require "data")
(defknob lr 0.001)
(defknob steps 300)
;; The model.
(defmodel mlp (x) ; trailing after the lambda list
  ;; own-line comment before the body
  (let ((h (relu (linear x 64)))) ; hidden layer

    ;; after a blank line
    (linear h 2) ; output
    ))
( ; right after the paren
 foo bar)
(baz
  ;; closing comment
  )
;; trailing comment at the end of the file
""",
    "comment-after-prefix": """
(list ' ; a comment between quote and form
 foo `( ;; inside a template
        ,x))
""",
    "setf-and-cond": """
(setf *alpha* (compute-something-long with many arguments here) *beta* (compute-something-else also long enough))
(cond ((< x 0) (print "negative number, which is a long enough message to break the line")) ((= x 0) 'zero) (t 'positive))
(if (some-predicate-with-a-long-name argument-one argument-two) (then-branch argument-one) (else-branch argument-two))
""",
    "symbols": """
(list |hello world| foo\\ bar |a;b| pkg:thing #:uninterned :keyword nil t 1+ -1 +1 .5 1e3 #x1F #b101 #o17)
""",
    "deep-data": """
(defgroups groups ((train :fraction 0.8 :shuffle t) (valid :fraction 0.1) (test :fraction 0.1 :seed 42 :stratify (label region device-type batch-id))))
""",
}


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_snippet_properties(name: str) -> None:
    out = check_properties(SNIPPETS[name], positions=name != "comment-after-prefix")
    if name != "strings":
        assert no_trailing_whitespace(out)


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_snippet_lines_fit_the_width(name: str) -> None:
    out = format_source(SNIPPETS[name])
    for line in out.split("\n"):
        assert len(line) <= WIDTH or '"' in line, line


def test_formatting_unformatted_and_formatted_text_agree() -> None:
    messy = "(defun   f(x)\n\n\n(+ x\n1))\n\n\n\n(defun g () nil)   "
    assert format_source(messy) == "(defun f (x)\n\n  (+ x 1))\n\n(defun g ()\n  nil)\n"


# ---------------------------------------------------------------------------------------
# Exact layouts
# ---------------------------------------------------------------------------------------


def test_short_form_on_one_line() -> None:
    assert format_source("(a\n   b\n c)") == "(a b c)\n"


def test_body_form_layout() -> None:
    text = "(defun long-function (alpha beta gamma) " + "(print alpha) " * 8 + ")"
    out = format_source(text)
    lines = out.splitlines()
    assert lines[0] == "(defun long-function (alpha beta gamma)"
    assert all(line == "  (print alpha)" for line in lines[1:-1])
    assert lines[-1] == "  (print alpha))"


def test_let_bindings_align_under_first_binding() -> None:
    text = "(let ((alpha (compute-the-first-value 1 2 3 4 5 6 7 8)) (beta (compute-the-second-value 4 5 6 7 8 9 10 11 12))) (+ alpha beta))"
    assert format_source(text) == (
        "(let ((alpha (compute-the-first-value 1 2 3 4 5 6 7 8))\n"
        "      (beta (compute-the-second-value 4 5 6 7 8 9 10 11 12)))\n"
        "  (+ alpha beta))\n"
    )


def test_keyword_pairs_one_per_line() -> None:
    text = "(defloader train :source (synthetic :spirals :n 2048) :fields ((x :f32 (2)) (y :i32 ())) :batch 64)"
    assert format_source(text) == text + "\n"  # it fits
    longer = text[:-1] + " :shuffle t)"
    assert format_source(longer) == (
        "(defloader train\n"
        "  :source (synthetic :spirals :n 2048)\n"
        "  :fields ((x :f32 (2)) (y :i32 ()))\n"
        "  :batch 64\n"
        "  :shuffle t)\n"
    )
    run = "(defrun :steps 300 :seed 0 :model mlp :optimizer (adam :lr 0.001) :loader train :eval-every 50 :log t)"
    assert format_source(run) == (
        "(defrun\n  :steps 300\n  :seed 0\n  :model mlp\n  :optimizer (adam :lr 0.001)\n"
        "  :loader train\n  :eval-every 50\n  :log t)\n"
    )


def test_a_keyword_value_stays_with_its_key() -> None:
    run = "(defrun :steps 300 :seed 0 :log-every 10 :precision :bf16 :checkpoint (:every 100 :keep 2) :microbatches 4)"
    assert format_source(run) == (
        "(defrun\n  :steps 300\n  :seed 0\n  :log-every 10\n  :precision :bf16\n"
        "  :checkpoint (:every 100 :keep 2)\n  :microbatches 4)\n"
    )
    sweep = "(defsweep search :sample 16 :seed 0 :lr (log-uniform 0.003 0.3) :width (choice 16 32 64 128) :act (:relu :gelu))"
    assert format_source(sweep) == (
        "(defsweep search\n  :sample 16\n  :seed 0\n  :lr (log-uniform 0.003 0.3)\n  :width (choice 16 32 64 128)\n"
        "  :act (:relu :gelu))\n"
    )
    assert format_source("(f :a :b c)") == "(f :a :b c)\n"  # not all pairs: a keyword alone stays alone when broken


def test_call_aligns_arguments_with_the_first() -> None:
    text = "(list (first-element-of-the-list 1 2 3) (second-element-of-the-list 4 5 6) (third-one 7 8 9 10 11 12 13))"
    assert format_source(text) == (
        "(list (first-element-of-the-list 1 2 3)\n"
        "      (second-element-of-the-list 4 5 6)\n"
        "      (third-one 7 8 9 10 11 12 13))\n"
    )


def test_call_falls_back_to_indent_two_when_alignment_overflows() -> None:
    head = "a-function-with-an-extremely-long-name-that-takes-up-most-of-the-line"
    arg = "(argument-" + "x" * 30 + ")"
    out = format_source(f"({head} {arg} {arg})")
    assert out == f"({head}\n  {arg}\n  {arg})\n"


def test_loop_clauses_on_their_own_lines() -> None:
    text = "(loop for i from 0 below 10 when (evenp i) collect (* i i) into squares finally (return (values squares i)))"
    assert format_source(text) == (
        "(loop for i from 0 below 10\n"
        "      when (evenp i)\n"
        "      collect (* i i) into squares\n"
        "      finally (return (values squares i)))\n"
    )


def test_data_list_aligns_under_first_element() -> None:
    text = "'((alpha-element 1 2 3 4 5 6 7 8 9) (beta-element 1 2 3 4 5 6 7 8 9) (gamma-element 1 2 3 4 5 6 7 8 9))"
    assert format_source(text) == (
        "'((alpha-element 1 2 3 4 5 6 7 8 9)\n"
        "  (beta-element 1 2 3 4 5 6 7 8 9)\n"
        "  (gamma-element 1 2 3 4 5 6 7 8 9))\n"
    )


def test_top_level_separation() -> None:
    text = "(require \"a\")\n(require \"b\")\n(defknob lr 0.1)\n(defknob wd 0.0)\n\n\n\n(defknob steps 3)\n(defun f () 1)\n(defun g () 2)"
    assert format_source(text) == (
        '(require "a")\n(require "b")\n\n(defknob lr 0.1)\n(defknob wd 0.0)\n\n(defknob steps 3)\n\n'
        "(defun f ()\n  1)\n\n(defun g ()\n  2)\n"
    )


def test_top_level_multi_line_forms_get_a_blank_line() -> None:
    body = " ".join(f"(step-{i} x)" for i in range(12))
    out = format_source(f"(defun f (x) {body})\n(defun g (x) {body})")
    assert "\n\n(defun g" in out


def test_comment_block_attaches_to_next_form() -> None:
    text = "(defknob a 1)\n;; about b\n(defknob b 2)\n(defun f () 1)\n;; free-standing\n\n(defun g () 2)"
    assert format_source(text) == (
        "(defknob a 1)\n;; about b\n(defknob b 2)\n\n(defun f ()\n  1)\n;; free-standing\n\n(defun g ()\n  2)\n"
    )


def test_comments_inside_forms() -> None:
    text = "(defun f (x) ; why\n;; first\n(g x) ; then\n\n\n(h x) ; last\n)"
    assert format_source(text) == "(defun f (x) ; why\n  ;; first\n  (g x) ; then\n\n  (h x) ; last\n  )\n"


def test_comment_after_open_paren() -> None:
    assert format_source("( ; note\nfoo bar)") == "( ; note\n foo\n  bar)\n"
    assert format_source("( ; note\n1 2)") == "( ; note\n 1\n 2)\n"


def test_list_with_comment_is_never_flattened() -> None:
    assert format_source("(a ; c\n b)") == "(a ; c\n  b)\n"


def test_blank_lines_inside_a_flat_form_disappear() -> None:
    assert format_source("(progn (a)\n\n\n(b))") == "(progn (a) (b))\n"


def test_comment_between_prefix_and_form_moves_before_the_form() -> None:
    text = "(list 'a ' ; note\n b)"
    assert check_properties(text, positions=False) == "(list 'a\n      ; note\n      'b)\n"


def test_prefixes_attach() -> None:
    assert format_source("( quote-me ' a ` ( b , c ,@ d ) #' e)") == "(quote-me 'a `(b ,c ,@d) #'e)\n"


def test_a_feature_conditional_stays_with_its_form() -> None:
    text = "(defun f (x)\n  #+sbcl  (sb-ext:gc :full t) #-( or ) (print x)\n  (list #+ ; why\n (and sexpgpu (not sbcl)) 1))\n#+(or) #+(or) (a) (b)\n"
    out = check_properties(text, positions=False)
    assert out == (
        "(defun f (x)\n  #+sbcl (sb-ext:gc :full t)\n  #-(or) (print x)\n"
        "  (list\n    ; why\n    #+(and sexpgpu (not sbcl)) 1))\n\n#+(or) #+(or) (a)\n\n(b)\n"
    )
    # the skipped forms are kept: the text reads the same under any *features*
    for kept in ["#+sbcl (sb-ext:gc :full t)", "#-(or) (print x)", "#+(or) #+(or) (a)"]:
        assert kept in out


def test_unquote_of_at_symbol_keeps_its_space() -> None:
    out = format_source("`(a , @b)")
    assert out == "`(a , @b)\n"
    assert printed_forms(out) == printed_forms("`(a , @b)")


def test_whitespace_characters_are_named() -> None:
    out = format_source("(list #\\  #\\\t)")
    assert out == "(list #\\Space #\\Tab)\n"
    assert printed_forms(out) == printed_forms("(list #\\  #\\\t)")


def test_special_characters_stay_characters() -> None:
    out = check_properties("(list #\\; #\\( #\\) #\\\" #\\|)")
    assert out == "(list #\\; #\\( #\\) #\\\" #\\|)\n"


def test_multi_line_string_kept_verbatim() -> None:
    text = '(defun f ()\n  "line one   \n   line two"\n  nil)'
    out = check_properties(text)
    assert '"line one   \n   line two"' in out


def test_trailing_comment_whitespace_removed() -> None:
    assert format_source("(a b) ; note   \n") == "(a b) ; note\n"


def test_empty_and_comment_only_files() -> None:
    assert format_source("") == ""
    assert format_source("  \n\n ") == ""
    assert format_source("\n\n;; only a comment\n\n\n;; and another\n") == ";; only a comment\n\n;; and another\n"


def test_crlf_input() -> None:
    out = check_properties("(defun f (x)\r\n  ; note\r\n  x)\r\n")
    assert "\r" not in out


@pytest.mark.parametrize("bad", ["(a b", "a)", "#+sbcl", "#+(or 1) x", '"open', "(a . )", "#|"])
def test_unreadable_input_raises_the_readers_diagnostic(bad: str) -> None:
    with pytest.raises(DiagnosticError) as formatted:
        format_source(bad, "bad.lisp")
    with pytest.raises(DiagnosticError) as read:
        read_all(bad, "bad.lisp", SymbolTable())
    assert formatted.value.diagnostic == read.value.diagnostic


# ---------------------------------------------------------------------------------------
# Random s-expressions with comments
# ---------------------------------------------------------------------------------------

ATOMS = [
    "foo", "bar-baz", "*x*", "+", "1+", "nil", "t", "|a b|", "|x;y|", "pkg:thing", "#:g1", ":key",
    ":steps", "0", "-3", "1.5", "1/2", "#x1F", "1e3", '"s;t"', '"q\\"x\\""', '""', '"a\\\\b"', "#\\;",
    "#\\(", "#\\)", "#\\a", "#\\Space", "#\\Newline", '"multi\n  line"', "@at", "f\\(x",
]
HEADS = ["defun", "let", "when", "loop", "defrun", "setf", "progn", "foo", "list", "collect", "for", ":key"]
SEPARATORS = [" ", " ", " ", "\n", "\n\n", " ; c1\n", "\n;; own\n", " #| b |# ", "\n#| multi\n   line |#\n", " #| x\n y |# ", "\t"]
TOP_SEPARATORS = ["\n", "\n\n", "\n;; top\n", " ; tr\n", "\n\n;; free\n\n", " #| t |#\n"]

long_symbol = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=8, max_size=40).map(lambda s: "s" + s)
atoms = st.one_of(st.sampled_from(ATOMS), long_symbol)


def _join(draw: st.DrawFn, items: list[str]) -> str:
    out = items[0] if items else ""
    for item in items[1:]:
        out += draw(st.sampled_from(SEPARATORS)) + item
    return out


@st.composite
def lists(draw: st.DrawFn, children: st.SearchStrategy[str]) -> str:
    elems = draw(st.lists(children, max_size=7))
    if elems and draw(st.booleans()):
        elems[0] = draw(st.sampled_from(HEADS))
    body = _join(draw, elems)
    dotted = bool(elems) and draw(st.integers(0, 5)) == 0
    if dotted:
        body += draw(st.sampled_from(SEPARATORS)) + "." + draw(st.sampled_from(SEPARATORS)) + draw(children)
    opener = "(" if dotted else draw(st.sampled_from(["(", "(", "(", "#("]))
    start = draw(st.sampled_from(["", "", " ", " ; open\n", "\n;; first\n", "\n\n"]))
    end = draw(st.sampled_from(["", "", " ", "\n", " ; last\n", "\n;; end\n"]))
    return opener + start + body + end + ")"


@st.composite
def prefixed(draw: st.DrawFn, children: st.SearchStrategy[str]) -> str:
    between = draw(st.sampled_from(["", "", "", " ;pc\n", " #|pb|# ", "\n;pc\n "]))
    return draw(st.sampled_from(["'", "`", ",", ",@", "#'"])) + between + draw(children)


forms = st.recursive(atoms, lambda children: st.one_of(lists(children), prefixed(children)), max_leaves=40)


@st.composite
def files(draw: st.DrawFn) -> str:
    items = draw(st.lists(forms, min_size=1, max_size=5))
    out = draw(st.sampled_from(["", ";; header\n", "\n\n"])) + items[0]
    for item in items[1:]:
        out += draw(st.sampled_from(TOP_SEPARATORS)) + item
    return out + draw(st.sampled_from(["", "\n", " ; end\n", "\n;; eof"]))


def _reads(text: str) -> bool:
    try:
        read_all(text, "<test>", SyntaxSymbolTable())
    except DiagnosticError:
        return False
    return True


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files())
def test_random_sources(text: str) -> None:
    if not _reads(text):  # e.g. a dot in a vector or right after an opening paren
        with pytest.raises(DiagnosticError):
            format_source(text)
        return
    # a comment between a prefix and its form moves to its own line before the prefixed form
    out = check_properties(text, positions=";pc" not in text and "#|pb|#" not in text)
    if '"multi' not in text:
        assert no_trailing_whitespace(out)


def test_numbered_dispatch_stays_attached() -> None:
    """#3(a b) is a vector and #2A((1 2) (3 4)) an array: fmt keeps the number, the dispatch
    character and the contents together."""
    text = "(list #3(1 2) #2A((1 2) (3 4)) #0Aq #*101 #3r12)\n"
    assert format_source(text, "x.lisp") == text
