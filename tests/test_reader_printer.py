"""Reader positions and the printer: exact locations, and print/read round trips."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from sexpgpu.lisp.diagnostics import DiagnosticError
from sexpgpu.lisp.printer import prin1_to_string, princ_to_string
from sexpgpu.lisp.reader import FEATURES, Reader, read_all
from sexpgpu.lisp.types import NIL, Char, Cons, Loc, Symbol, SymbolTable, lisp_list


def read_one(text: str):  # type: ignore[no-untyped-def]
    (form,) = read_all(text, "t.lisp", SymbolTable())
    return form


def test_every_list_and_element_remembers_its_position() -> None:
    text = ";; header\n(defun f (x)\n  (+ x\t\"é\" 1))\n"
    form = read_one(text)
    assert form.loc == Loc("t.lisp", 2, 1)
    lst = form.form
    assert lst.loc == Loc("t.lisp", 2, 1)
    second = lst.cdr
    assert second.loc == Loc("t.lisp", 2, 8)  # f
    args = second.cdr.car
    assert args.loc == Loc("t.lisp", 2, 10)  # (x)
    body = second.cdr.cdr.car
    assert body.loc == Loc("t.lisp", 3, 3)
    cells = []
    cell = body
    while type(cell) is Cons:
        cells.append(cell.loc)
        cell = cell.cdr
    assert cells == [Loc("t.lisp", 3, 3), Loc("t.lisp", 3, 6), Loc("t.lisp", 3, 8), Loc("t.lisp", 3, 12)]


def test_error_positions_are_exact() -> None:
    cases = {
        "(a b))": (1, 6, "R002"),
        "(a\n  #p\"x\" b)": (2, 3, "R005"),
        "(a\n  #+(or x 1) b)": (2, 5, "R008"),
        "(a\n  #-(not) b)": (2, 5, "R008"),
        "(a\n  #+": (2, 3, "R001"),
        "(a\n  #-sexpgpu": (2, 3, "R001"),
        "(a #+(or))": (1, 10, "R002"),
        "(a #+(or) #<x> b)": (1, 11, "R005"),
        '(a "b\n\nc': (1, 4, "R001"),
        "(a\n  ( . b))": (2, 5, "R006"),
        "  #\\nope": (1, 3, "R004"),
        "(1 2 . 3 4)": (1, 10, "R006"),
    }
    for text, (line, col, code) in cases.items():
        try:
            read_all(text, "t.lisp", SymbolTable())
        except DiagnosticError as exc:
            d = exc.diagnostic
            assert (d.code, d.line, d.col) == (code, line, col), text
        else:
            raise AssertionError(f"no error for {text!r}")


def read_texts(text: str) -> list[str]:
    return [prin1_to_string(f.form) for f in read_all(text, "t.lisp", SymbolTable())]


def test_feature_expressions_select_forms() -> None:
    """CLHS 2.4.8.17/18 with FEATURES (:sexpgpu :common-lisp :ansi-cl :ieee-floating-point)."""
    assert read_texts("(list #+sexpgpu 1 #-sexpgpu 2 #+sbcl 3 #-sbcl 4)") == ["(list 1 4)"]
    assert read_texts("(#+(and common-lisp ansi-cl) a #+(:or sbcl :ieee-floating-point) b #+(not sexpgpu) c)") == ["(a b)"]
    assert read_texts("(#+:sexpgpu a #+(AND) b #+(or) c #-(or) d #+nil e #+(not nil) f)") == ["(a b d f)"]
    assert read_texts("#+sbcl (defun only-sbcl () 1)\n(defun both (x) x)\n#-sexpgpu x") == ["(defun both (x) x)"]
    # nesting: #+(or) skips the whole `#+(or) a b`, as in CL
    assert read_texts("(#+(or) #+(or) a b c)") == ["(c)"]
    assert read_texts("(#+(and) #+(or) a b c)") == ["(b c)"]
    assert read_texts("(#+(or) #+(and) a b c)") == ["(b c)"]
    assert read_texts("('#+(or) a b #-(or) ; note\n c)") == ["('b c)"]


def test_a_skipped_form_is_read_for_its_extent_only() -> None:
    symbols = SymbolTable()
    forms = read_all('(list #+sbcl (sb-ext:gc :full t) #+(or) (never-interned #z(1 2) #p"x" #.(boom) a:b:c #\\bogus (. 1) #1#) 2)',
                     "t.lisp", symbols)
    assert [prin1_to_string(f.form) for f in forms] == ["(list 2)"]
    assert symbols.find("NEVER-INTERNED") is None and symbols.find("BOOM") is None
    # the test is read in the KEYWORD package: no symbol of the file's own
    read_all("(#+no-such-feature x)", "t.lisp", symbols)
    assert symbols.find("NO-SUCH-FEATURE") is None and "NO-SUCH-FEATURE" in symbols.keywords


def test_the_reader_asks_for_the_current_features() -> None:
    symbols = SymbolTable()
    features = lisp_list(symbols.keyword("FAST"))
    forms = Reader("(#+fast 1 #+sexpgpu 2)", "t.lisp", symbols, features=lambda: features).read_all()
    assert prin1_to_string(forms[0].form) == "(1)"
    empty = Reader("(#+sexpgpu 2)", "t.lisp", symbols, features=lambda: NIL).read_all()
    assert empty[0].form is NIL
    assert FEATURES == ("SEXPGPU", "COMMON-LISP", "ANSI-CL", "IEEE-FLOATING-POINT")
    assert all(type(s) is Symbol for s in [symbols.keyword(n) for n in FEATURES])


def test_numbers() -> None:
    assert read_one("1/3").form == Fraction(1, 3)
    assert read_one("4/2").form == 2
    assert read_one("3e-4").form == 3e-4
    assert read_one("1d0").form == 1.0
    assert read_one("#x-1F").form == -31
    assert read_one("123456789012345678901234567890").form == 123456789012345678901234567890
    assert read_one("1.").form == 1


def test_printer_matches_cl() -> None:
    assert [prin1_to_string(read_one(t).form) for t in ["1.0", "1d7", "1d-4", "123456.789", "-0.5", "1.5e300"]] == [
        "1.0", "1.0e7", "1.0e-4", "123456.789", "-0.5", "1.5e300"]
    assert prin1_to_string(read_one('(a "b\\"c" #\\x #\\Space #(1 2) (c . d) \'e #\'f)').form) == (
        '(a "b\\"c" #\\x #\\  #(1 2) (c . d) \'e #\'f)'
    )
    assert princ_to_string(read_one('(a "b" #\\c :d)').form) == "(a b c d)"
    assert prin1_to_string(read_one("|Mixed Case|").form) == "|Mixed Case|"
    assert prin1_to_string(Char("\n")) == "#\\Newline"


ATOMS = st.one_of(
    st.integers(),
    st.fractions().filter(lambda f: f.denominator != 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.sampled_from(["a", "foo-bar", ":key", "nil", "t", "|Odd Name|", "1+", "x:y"]).map(lambda s: ("SYM", s)),
)


def to_text(x: object) -> str:
    if isinstance(x, tuple) and x and x[0] == "SYM":
        return str(x[1]) if x[1] != "x:y" else "|x:y|"
    if isinstance(x, list):
        return "(" + " ".join(to_text(e) for e in x) + ")"
    if isinstance(x, str):
        return '"' + x.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(x, Fraction):
        return f"{x.numerator}/{x.denominator}"
    return repr(x)


@settings(max_examples=200, deadline=None)
@given(st.recursive(ATOMS, lambda inner: st.lists(inner, max_size=4), max_leaves=12))
def test_print_read_round_trip(x: object) -> None:
    symbols = SymbolTable()
    first = Reader(to_text(x), "t.lisp", symbols).read_all()[0].form
    printed = prin1_to_string(first)
    again = Reader(printed, "t.lisp", symbols).read_all()[0].form
    assert prin1_to_string(again) == printed
