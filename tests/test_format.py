"""Tests for sexpgpu.lisp.format (CL `format` with destination nil).

Every expected string in CASES, and the fact that each entry of ERROR_CASES is an error, was
produced by SBCL 2.2.9 (sbcl 2.x as packaged by Debian) evaluating (format nil CONTROL 'ARG ...)
with *read-default-float-format* double-float and *print-case* :downcase. The arguments were
given to SBCL as quoted data (floats bit for bit), and each case was run both with the control
string as a literal (compiled by FORMATTER) and as a run-time value (the FORMAT interpreter);
the two agree on all of them.
"""

from __future__ import annotations

import random
from fractions import Fraction
from typing import Any

import pytest

from sexpgpu.lisp.format import FormatError, lisp_format
from sexpgpu.lisp.printer import prin1_to_string, princ_to_string
from sexpgpu.lisp.types import NIL, T, Char, Cons, Symbol, SymbolTable, lisp_list

SYMBOLS = SymbolTable()
F = Fraction


def sym(name: str) -> Symbol:
    return SYMBOLS.intern(name.upper())


def lst(*items: Any) -> Any:
    return lisp_list(*items)


def fmt(control: str, *args: Any) -> str:
    return lisp_format(control, list(args), prin1_to_string, princ_to_string)


# (control, args, what SBCL returns)
CASES: list[tuple[str, list[Any], str]] = [
    ('~a|~s|~a|~s', ["str", "str", sym("foo"), sym("foo")], 'str|"str"|foo|foo'),
    ('~a ~s', [lst(1, "two", Char("3"), sym("four")), lst(1, "two", Char("3"), sym("four"))], '(1 two 3 four) (1 "two" #\\3 four)'),
    ('~a|~:a|~s|~:s', [NIL, NIL, NIL, NIL], 'nil|()|nil|()'),
    ('~10a|', [sym("foo")], 'foo       |'),
    ('~10@a|', [sym("foo")], '       foo|'),
    ("~10,3,2,'-a|", [sym("foo")], 'foo--------|'),
    ("~10,3,2,'-@s|", ["foo"], '-----"foo"|'),
    ("~,,3,'*a|~3,4a|", [sym("foo"), sym("foo")], 'foo***|foo|'),
    ('~v,,,va|~#a|', [6, Char("*"), sym("x"), 1, 2], 'x*****|1 |'),
    ('~d|~d|~d', [42, -7, 2**70], '42|-7|1180591620717411303424'),
    ("~5d|~5,'0d|~10,'0d", [42, 42, -42], '   42|00042|0000000-42'),
    ('~:d|~:d|~@d|~:@d', [1234567, -1234, 42, 1000000], '1,234,567|-1,234|+42|+1,000,000'),
    ("~,,'.,4:d|~,,' :d", [123456789, 1234567], '1.2345.6789|1 234 567'),
    ('~d|~5d|~d', [1.5, F(1, 3), sym("foo")], '1.5|1/3|foo'),
    ('~b|~o|~x|~x|~:b', [10, 64, 255, -255, 255], '1010|100|FF|-FF|11,111,111'),
    ("~8,'0b|~5,'*x|~@x", [5, 255, 255], '00000101|***FF|+FF'),
    ('~x|~x', [lst(10, 11, 1.5, F(1, 3)), F(1, 10)], '(A B 1.5 1/3)|1/A'),
    ('~r|~:r|~@r|~:@r', [1234, 1234, 1999, 1999], 'one thousand two hundred thirty-four|one thousand two hundred thirty-fourth|MCMXCIX|MDCCCCLXXXXVIIII'),
    ('~r|~r|~:r|~:r|~:r', [0, -15, 12, 100, 0], 'zero|negative fifteen|twelfth|one hundredth|zeroth'),
    ("~2r|~16,8,'0r|~3r", [10, 255, 8], '1010|000000FF|22'),
    ('~f|~f|~f|~f|~f', [1.5, 1e7, 100.0, 0.1, 123.456], '1.5|10000000.0|100.0|0.1|123.456'),
    ('~f|~f|~f', [1.5e-5, 1e-5, 1e20], '0.000015|0.00001|100000000000000000000.0'),
    ('~f|~f|~f', [0.0, -0.0, -2.5], '0.0|-0.0|-2.5'),
    ('~,2f|~,2f|~,2f|~,2f', [3.14159, 2.5, 0.125, 2.675], '3.14|2.50|0.13|2.67'),
    ('~,1f|~,1f|~,1f|~,1f', [0.25, 0.35, 0.95, 9.96], '0.3|0.3|0.9|10.0'),
    ('~,0f|~,0f|~,0f|~,0f', [2.5, 0.5, 0.4, -2.5], '3.|1.|0.|-3.'),
    ('~,2f|~,2f|~,3f|~,2f', [-1.5, 1234.5678, 0.5, -0.001], '-1.50|1234.57|0.500|-0.00'),
    ('~8,3f|~10,3f|~5,2f|~4,2f|~3,2f', [3.14159, -3.14159, 1.0, 1.0, 1.0], '   3.142|    -3.142| 1.00|1.00|1.00'),
    ('~4,2f|~3,2f|~2,2f|~0f', [0.5, 0.5, 0.5, 0.5], '0.50|.50|.50|.5'),
    ('~5f|~4f|~3f|~2f|~1f', [3.14159, 3.14159, 3.14159, 3.14159, 3.14159], '3.142|3.14|3.1|3.|3.14159'),
    ('~4f|~3f|~5f|~6f', [100.0, 100.0, 0.001234, -0.001234], '100.|100.|.0012|-.0012'),
    ("~@f|~,2@f|~8,3,,,'0f", [3.0, 2.0, 3.14159], '+3.0|+2.00|0003.142'),
    ("~3,2,,'*f|~5,,,'*f|~5,1,,'*f", [10.0, 123456.0, 1234.5], '***|*****|*****'),
    ('~,,2f|~,2,1f|~,2,-1f', [3.14159, 3.14159, 3.14159], '314.159|31.42|0.31'),
    ('~f|~f|~,2f|~,4f', [F(1, 3), F(1, 2), 1, F(1, 3)], '0.33333334|0.5|1.00|0.3333'),
    ('~f|~f', [100, 123456789], '100.0|123456790.0'),
    ('~f|~8f|', [sym("foo"), sym("foo")], 'foo|foo     |'),
    ('~e|~e|~e|~e', [12345.0, 1.0, 0.5, 100.0], '1.2344999999999999e+4|1.0e+0|5.0e-1|1.0e+2'),
    ('~e|~e|~e|~e', [-2.5, 3e-4, 1e100, 1.5e-5], '-2.5e+0|3.0e-4|1.0e+100|1.5000000000000002e-5'),
    ('~e|~e|~e', [0.0, 0.001, 1234567.0], '0.0e+0|1.0e-3|1.234567e+6'),
    ('~,2e|~,3e|~,2e', [1.5, 12345.0, 12345.0], '1.50e+0|1.234e+4|1.23e+4'),
    ('~10,3e|~10,3,3e|~8,2e|~@e', [12345.0, -12345.0, 3.14159, 2.5], '  1.234e+4|-1.234e+004| 3.14e+0|+2.5e+0'),
    ('~,,,2e|~,3,,-1e|~,3,,0e|~,3,,2e', [12345.0, 12345.0, 12345.0, 12345.0], '12.344999999999999e+3|0.012e+6|0.123e+5|12.34e+3'),
    ("~,1,,2e|~,0,,1e|~,,,,,,'de", [12345.0, 12345.0, 3.14], '12.e+3|1.e+4|3.14d+0'),
    ('~e|~e|~,2e', [12, F(1, 8), F(1, 3)], '1.2f+1|1.25f-1|3.33f-1'),
    ('~e|~8e|', [sym("foo"), sym("foo")], 'foo|foo     |'),
    ('~c|~:c|~:c|~:c|~@c|~@c', [Char("a"), Char(" "), Char("\n"), Char("a"), Char("b"), Char(" ")], 'a|Space|Newline|a|#\\b|#\\ '),
    ('~:c|~:c|~:@c', [Char("\x01"), Char("\x7f"), Char(" ")], 'Soh|Rubout|Space'),
    ('~d item~:p, ~d famil~:@p', [1, 2], '1 item, 2 families'),
    ('~d item~:p, ~d famil~:@p', [3, 1], '3 items, 1 family'),
    ('~p|~p|~p|~@p|~@p', [0, 1, 1.0, 1, 2], 's||s|y|ies'),
    ('a~%b~%', [], 'a\nb\n'),
    ('~%|~2%|~0%', [], '\n|\n\n|'),
    ('~&a|a~&b|a~2&b', [], 'a|a\nb|a\n\nb'),
    ('~2&a', [], '\na'),
    ('a~%~&b', [], 'a\nb'),
    ('~~|~3~', [], '~|~~~'),
    ('~{~a~^, ~}', [lst(1, 2, 3)], '1, 2, 3'),
    ('~{~a~^, ~}', [NIL], ''),
    ('~{~a~}', [lst(sym("a"), sym("b"), sym("c"))], 'abc'),
    ('~{~a=~a~^ ~}', [lst(sym("x"), 1, sym("y"), 2)], 'x=1 y=2'),
    ('~@{~a~^ + ~}', [1, 2, 3], '1 + 2 + 3'),
    ('~:{~a:~a~^; ~}', [lst(lst(sym("a"), 1), lst(sym("b"), 2))], 'a:1b:2'),
    ('~:{~a~^,~}|', [lst(lst(1), lst(2))], '12|'),
    ('~:{~a~:^,~}|', [lst(lst(1), lst(2))], '1,2|'),
    ('~:@{~a~a~^;~}', [lst(1, 2), lst(3, 4)], '1234'),
    ('~1{~a~}|~0{~a~}|~2{~a~}', [lst(1, 2, 3), lst(1), lst(1, 2, 3)], '1||12'),
    ('~{x~:}|~{x~}|', [NIL, NIL], 'x||'),
    ('~2@{~a~}|~a', [1, 2, 3], '12|3'),
    ('~{~a~}x~a', [lst(1, 2), 3], '12x3'),
    ('~{~{~a~}~^/~}', [lst(lst(1, 2), lst(3))], '12/3'),
    ('~{~}', ["~a-", lst(1, 2)], '1-2-'),
    ('~{~}', ["~a~^,", lst(1, 2, 3)], '1,2,3'),
    ('~@{~}', ["<~a>", 1, 2], '<1><2>'),
    ('~a~^b', [1], '1'),
    ('~a ~a~^ ~a', [1, 2], '1 2'),
    ('~^nothing', [], ''),
    ('~a~0^~a|~a~1,1^~a', [1, 2, 3, 4], '1'),
    ('~a~1,2^~a|~a~1,2,3^~a', [1, 2, 3, 4], '12|3'),
    ('~{~a~#^ ~}', [lst(1, 2, 3)], '1 2 3'),
    ('~[zero~;one~;two~]', [1], 'one'),
    ('~[zero~;one~;two~]|', [5], '|'),
    ('~[zero~;one~:;other~]', [7], 'other'),
    ('~#[none~;one~;two~:;many~]', [1, 2, 3], 'many'),
    ('~2[a~;b~;c~]', [], 'c'),
    ('~:[false~;true~]|~:[false~;true~]|~:[false~;true~]', [NIL, 0, T], 'false|true|true'),
    ('~@[x=~a~] ~a', [NIL, 3], ' 3'),
    ('~@[x=~a~] ~a', [1, 3], 'x=1 3'),
    ('~a ~* ~a ~:* ~a ~@* ~a', [1, 2, 3], '1  3  3  1'),
    ('~2*~a|~a ~2:*~a|~1@*~a', [1, 2, 3, 4], '3|4 3|2'),
    ("~(hello WORLD~)|~:(hello woRLD-foo 1st don't~)", [], "hello world|Hello World-Foo 1st Don'T"),
    ('~@(  123abc DEF ghi~)|~:@(hello~)', [], '  123abc def ghi|HELLO'),
    ('~@(~a~) ~a', [sym("foo"), sym("bar")], 'Foo bar'),
    ('~:(~{~a~^ ~}~)', [lst("ab cD", sym("ef"))], 'Ab Cd Ef'),
    ('~{~(~a~^ AND ~)~}', [lst(sym("x"), sym("y"), sym("z"))], 'x and y and z'),
    ('a~\n   b', [], 'ab'),
    ('a~:\n   b', [], 'a   b'),
    ('a~@\n   b', [], 'a\nb'),
    ('a~\n  \t \n  b|~{~\n  ~}|', [NIL], 'ab||'),
    ('~6,,,v@a|~6,,,va|', [NIL, sym("x"), Char("*"), sym("x")], '     x|x*****|'),
    ('~va|', [1.5, sym("x")], 'x |'),
    ('~A ~S ~D ~X ~:P', [sym("x"), "y", 10, 255, 2], 'x "y" 10 FF s'),
]

ERROR_CASES: list[tuple[str, list[Any]]] = [
    ('~a', []),
    ('~a ~a', [1]),
    ('~q', [1]),
    ('~', []),
    ('~a~', [1]),
    ('~1,2,3,4,5a', [1]),
    ('~:f', [1.0]),
    ('~:%', []),
    ('~@^', []),
    ('~:a~:5a', [NIL, NIL]),
    ("~5,'xa", [sym("x")]),
    ('~3,0a', [sym("x")]),
    ('~va', [-3, sym("x")]),
    ('~c', ["a"]),
    ('~c', [65]),
    ('~:p', []),
    ('~3*~a', [1, 2]),
    ('~a~2:*~a', [1]),
    ('~5@*', [1]),
    ('~{~a~}', [5]),
    ('~{~a~}', [Cons(1, 2)]),
    ('~{~a~a~}', [lst(1, 2, 3)]),
    ('~[a~;b~]', [sym("x")]),
    ('~[a~;b~]', [NIL]),
    ('~:[a~]', [T]),
    ('~@[a~;b~]', [T]),
    ('~{', [NIL]),
    ('~}', []),
    ('~(abc', []),
    ('~]', []),
    ('a~;b', []),
    ('~:^', []),
    ('~@r', [4000]),
    ('~@r', [0]),
    ('~r', [1.5]),
    ('~,,,0:d', [12345]),
    ('~f', [10**50]),
    ('~e', [10**50]),
    ('~{~}', [sym("x"), lst(1)]),
    ('~{~}', ["~q", lst(1)]),
]


@pytest.mark.parametrize(("control", "args", "expected"), CASES, ids=[repr(c[0]) for c in CASES])
def test_matches_sbcl(control: str, args: list[Any], expected: str) -> None:
    assert fmt(control, *args) == expected


@pytest.mark.parametrize(("control", "args"), ERROR_CASES, ids=[repr(c[0]) for c in ERROR_CASES])
def test_sbcl_errors_are_format_errors(control: str, args: list[Any]) -> None:
    with pytest.raises(FormatError):
        fmt(control, *args)


def test_there_are_enough_sbcl_cases() -> None:
    assert len(CASES) + len(ERROR_CASES) >= 60


@pytest.mark.parametrize(
    ("control", "args", "message"),
    [
        ("ab ~a ~a", [1], "format: not enough arguments for ~a at index 6"),
        ("abc~q", [1], "format: directive ~q at index 3 is not supported"),
        ("~{~a~}~S", [lst(1)], "format: not enough arguments for ~S at index 6"),
        ("x~{~a", [NIL], "format: ~{ at index 1 has no matching ~}"),
        ("~:f", [1.0], "format: ~f at index 0 does not take the : modifier"),
        ("~c", [65], "format: ~c at index 0 needs a character argument, not the integer 65"),
        ("~5,'xa", [1], "format: parameter 2 of ~a at index 0 must be an integer, not the character 'x'"),
        ("~{~}", ["~q", lst(1)], "format: directive ~q at index 0 is not supported (in the control string argument of ~{ at index 0)"),
    ],
)
def test_error_messages_name_the_directive_and_index(control: str, args: list[Any], message: str) -> None:
    with pytest.raises(FormatError) as info:
        fmt(control, *args)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("control", "args", "datum", "message"),
    [
        ("~{~a~}", [Cons(1, Cons(2, 3))], 3, "format: ~a at index 2: the argument list is dotted: it ends in the integer 3"),
        ("~:{~a~}", [lst(lst(1), 2)], 2, "format: ~a at index 3 needs a list of arguments, not the integer 2"),
        ("~:{~a~}", [Cons(lst(1), 3)], 3, "format: ~{ at index 0: the argument list is dotted: it ends in the integer 3"),
        ("~:@{~a~}", [1], 1, "format: ~a at index 4 needs a list of arguments, not the integer 1"),
        ("~{~a~}", [5], 5, "format: ~{ at index 0 needs a list argument, not the integer 5"),
    ],
)
def test_iteration_over_what_is_not_a_proper_list_is_a_type_error(control: str, args: list[Any], datum: Any, message: str) -> None:
    """As in SBCL, a ~{ whose list (or ~:{ whose sublist) is dotted or not a list signals a
    type-error whose datum is the offending object; checked when an argument is taken."""
    with pytest.raises(FormatError) as info:
        fmt(control, *args)
    assert (info.value.ctype, info.value.datum, str(info.value)) == ("TYPE-ERROR", datum, message)
    assert fmt("~:{~a~}", lst(Cons(1, 2))) == "1"  # the tail after the last argument taken is not looked at


def test_unknown_directive_in_an_unused_clause_is_an_error() -> None:
    # SBCL's FORMATTER (a literal control string) rejects this at compile time; its run-time
    # interpreter would print "b". We check the whole control string up front, like FORMATTER.
    with pytest.raises(FormatError):
        fmt("~[~q~;b~]", 1)


@pytest.mark.parametrize(
    ("control", "args"),
    [
        ("~{x~}", [lst(1)]),  # SBCL loops forever
        ("~{~a~:*~}", [lst(1, 2)]),  # SBCL loops forever
        ("~@{~\n  ~}", [Char(" ")]),  # SBCL loops forever
        ("~1000000000%", []),
        ("~100000000a", [1]),
        ("~{" * 500, []),
    ],
)
def test_runaway_control_strings_are_format_errors(control: str, args: list[Any]) -> None:
    with pytest.raises(FormatError):
        fmt(control, *args)


def test_exceptions_from_the_printer_pass_through() -> None:
    class Boom(Exception):
        pass

    def explode(_x: Any) -> str:
        raise Boom()

    with pytest.raises(Boom):
        lisp_format("~a", [1.5], explode, explode)
    with pytest.raises(Boom):
        lisp_format("~x", [lst(1, sym("a"))], explode, explode)


def test_arguments_are_not_consumed_past_an_exit() -> None:
    assert fmt("~@{~a~^, ~}.", 1, 2, 3) == "1, 2, 3."
    assert fmt("~a~:[~; and more~]", 1, NIL) == "1"


_GARBAGE_ALPHABET = "~~~~~aAsSdDxXbBoOrRfFeEcCpP%&*^{}[]();:@,,'#vV0123456789-+\n xq$<>?|"


def _garbage_control(rng: random.Random) -> str:
    return "".join(rng.choice(_GARBAGE_ALPHABET) for _ in range(rng.randint(0, 20)))


def _random_arg(rng: random.Random, depth: int = 2) -> Any:
    atoms: list[Any] = [0, 1, 2, -7, 12345, 1.5, 0.001, F(1, 3), sym("foo"), "str", Char("a"), NIL, T, 10**30, 1e300, Cons(1, 2), [1, 2]]
    if depth and rng.random() < 0.3:
        return lst(*[_random_arg(rng, depth - 1) for _ in range(rng.randint(0, 3))])
    return rng.choice(atoms)


def test_garbage_raises_only_format_errors() -> None:
    rng = random.Random(20240611)
    for _ in range(3000):
        control = _garbage_control(rng)
        args = [_random_arg(rng) for _ in range(rng.randint(0, 5))]
        try:
            result = lisp_format(control, args, prin1_to_string, princ_to_string)
        except FormatError:
            continue
        assert isinstance(result, str)


def test_a_function_control_writes_and_leaves_the_arguments_it_returns() -> None:
    """~{~} and ~? with a function control (CLHS 22.3): the callback gets the arguments left
    and returns what it wrote and the arguments it did not consume."""
    calls: list[Any] = []
    function = sym("a-function")  # stands for a Lisp function: any control that is not a string

    def control(fn: Any, args: Any) -> Any:
        if fn is not function:
            return None
        calls.append(args)
        return f"<{args.car}>", args.cdr

    def run(text: str, *args: Any) -> str:
        return lisp_format(text, list(args), prin1_to_string, princ_to_string, call_control=control)

    assert run("~{~}", function, lst(1, 2, 3)) == "<1><2><3>"
    assert run("~:{~}", function, lst(lst(1, 9), lst(2))) == "<1><2>"
    assert run("~@{~}|", function, 1, 2) == "<1><2>|"
    assert run("~?~a", function, lst(7, 8), 9) == "<7>9"
    assert run("~@?~a", function, 7, 8) == "<7>8"
    assert len(calls) == 9
    with pytest.raises(FormatError) as info:
        run("~{~}", 5, lst(1))
    assert info.value.ctype == "TYPE-ERROR"
