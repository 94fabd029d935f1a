"""Hypothesis fuzzing: any input to the reader and evaluator gives values or diagnostics,
never a Python exception, a hang or runaway memory."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sexpgpu.lisp.diagnostics import DiagnosticError
from sexpgpu.lisp.evaluator import Limits
from sexpgpu.lisp.program import new_program
from sexpgpu.lisp.reader import Reader, decode_source
from sexpgpu.lisp.types import SymbolTable

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ATOMS = st.sampled_from(
    ["1", "-2", "3/4", "1.5", "1e3", "#x1f", "'a", "x", "y", ":k", '"s"', "#\\a", "nil", "t", "#'car", "`(a ,x)", ",@y", "."]
)
HEADS = st.sampled_from(
    ["let", "let*", "if", "setq", "progn", "lambda", "defun", "defmacro", "loop", "dolist", "dotimes", "funcall",
     "apply", "car", "cons", "list", "+", "*", "/", "format", "gethash", "setf", "push", "block", "return-from",
     "tagbody", "go", "catch", "throw", "handler-case", "error", "the", "multiple-value-bind", "destructuring-bind",
     "flet", "labels", "macrolet", "symbol-macrolet", "defstruct", "case", "typecase", "make-hash-table", "mapcar",
     "reduce", "sort", "expt", "concatenate", "string", "intern", "eval", "unwind-protect", "require", "quote"]
)


def sexp(depth: int = 3) -> st.SearchStrategy[str]:
    if depth == 0:
        return ATOMS
    return st.one_of(
        ATOMS,
        st.builds(lambda h, xs: "(" + " ".join([h, *xs]) + ")", HEADS, st.lists(sexp(depth - 1), max_size=4)),
        st.builds(lambda xs: "(" + " ".join(xs) + ")", st.lists(sexp(depth - 1), max_size=3)),
    )


@FAST
@given(st.binary(max_size=300))
def test_reader_never_crashes_on_bytes(data: bytes) -> None:
    try:
        text = decode_source(data, "fuzz.lisp")
        Reader(text, "fuzz.lisp", SymbolTable()).read_all()
    except DiagnosticError as exc:
        assert exc.diagnostic.code.startswith(("R", "M"))
        assert exc.diagnostic.line is not None and exc.diagnostic.line >= 1


@FAST
@given(st.text(alphabet="()'`,@#\\|\";:.xab1 \n-+/eE|", max_size=80))
def test_reader_never_crashes_on_lisp_like_text(text: str) -> None:
    try:
        Reader(text, "fuzz.lisp", SymbolTable()).read_all()
    except DiagnosticError as exc:
        assert exc.diagnostic.code.startswith(("R", "M"))


@FAST
@given(st.lists(sexp(), min_size=1, max_size=4))
def test_evaluator_gives_values_or_diagnostics(forms: list[str]) -> None:
    program = new_program(None, Limits(steps=20_000, depth=200, alloc=200_000))
    for result in program.eval_text("\n".join(forms)):
        if result.error is not None:
            assert result.error.code != "X001", result.error.message
        else:
            assert isinstance(result.values, list)


def test_runaway_programs_stop_with_a_limit() -> None:
    # builtins charge a step per element they visit, so the step budget is twice the
    # allocation limit here for the growing list and string to meet the allocation limit first
    program = new_program(None, Limits(steps=200_000, depth=500, alloc=100_000))
    cases = {
        "(loop)": "L001",
        "(defun f (x) (f x)) (f 1)": "L002",
        "(let ((l (list 1))) (loop (setq l (append l l))))": "L003",
        "(expt 2 (expt 2 40))": "L003",
        "(make-list 1000000000)": "L003",
        '(let ((s "ab")) (loop (setq s (concatenate (quote string) s s))))': "L003",
        "(labels ((f (n) (cons n (f (1+ n))))) (f 0))": "L002",
    }
    for source, code in cases.items():
        results = program.eval_text(source)
        assert results[-1].error is not None, source
        assert results[-1].error.code == code, (source, results[-1].error.headline())


def test_handler_case_cannot_swallow_limits() -> None:
    program = new_program(None, Limits(steps=20_000))
    (result,) = program.eval_text("(handler-case (loop) (error () :caught))")
    assert result.error is not None and result.error.code == "L001"
    (result,) = program.eval_text("(ignore-errors (loop))")
    assert result.error is not None and result.error.code == "L001"
