"""Symbols (CLHS 10): making and finding them (intern, gensym ...), property lists, values
and function cells, constantp."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from .builtins import (
    Lib,
    lbool,
    list_cars,
    need_string,
    need_symbol,
)
from .conditions import lisp_error
from .objects import Builtin
from .builtins_strings import string_designator
from .types import NIL, Cons, Symbol
from .registry import builtin

if TYPE_CHECKING:
    from .evaluator import Interpreter

# Functions whose calls on constant arguments constantp calls constant (as SBCL does): pure,
# and returning numbers, characters, booleans or parts of their arguments, never fresh conses.
FOLDABLE = frozenset("""
+ - * / 1+ 1- = /= < > <= >= min max abs signum floor ceiling truncate round mod rem gcd lcm
sqrt isqrt exp expt log sin cos tan asin acos atan sinh cosh tanh ash logand logior logxor lognot
logcount integer-length zerop plusp minusp oddp evenp numberp integerp floatp rationalp realp
float numerator denominator car cdr caar cadr cdar cddr first second third rest nth nthcdr
length not null eq eql equal equalp atom consp listp symbolp stringp characterp char-code
code-char char-upcase char-downcase char= char< upper-case-p lower-case-p alpha-char-p
digit-char-p identity
""".upper().split())


def plist_of(lib: Lib, fn: str, sym: Any) -> Any:
    interp = lib.interp
    return interp.plists.get(need_symbol(fn, 1, sym), NIL)


def plist_cells(lib: Lib, plist: Any) -> Iterator[Cons]:
    """The conses of a symbol's property list that hold an indicator; each pair is two
    steps, charged as the walk goes (a circular plist ends at the budget)."""
    interp = lib.interp
    cell = plist
    walked = 0
    while type(cell) is Cons and type(cell.cdr) is Cons:
        walked += 1
        if walked == 1024:
            interp.charge(2 * walked)
            walked = 0
        yield cell
        cell = cell.cdr.cdr
    interp.charge(2 * walked)


@builtin("get", context=Lib)
def get(lib: Lib, sym: Any, indicator: Any, default: Any = NIL) -> Any:
    for cell in plist_cells(lib, plist_of(lib, "get", sym)):
        if cell.car is indicator:
            return cell.cdr.car
    return default


@builtin("%put", context=Lib)
def put(lib: Lib, sym: Any, indicator: Any, *rest: Any) -> Any:
    """(setf (get symbol indicator [default]) value)."""
    interp = lib.interp
    if not 1 <= len(rest) <= 2:
        raise lisp_error("E102", "`(setf get)` takes a symbol, an indicator, an optional default and a value", "PROGRAM-ERROR")
    value = rest[-1]
    for cell in plist_cells(lib, plist_of(lib, "(setf get)", sym)):
        if cell.car is indicator:
            cell.cdr.car = value
            return value
    interp.alloc(2)
    interp.plists[sym] = Cons(indicator, Cons(value, interp.plists.get(sym, NIL)))
    return value


@builtin("remprop", context=Lib)
def remprop(lib: Lib, sym: Any, indicator: Any) -> Any:
    interp = lib.interp
    previous = None
    for cell in plist_cells(lib, plist_of(lib, "remprop", sym)):
        if cell.car is indicator:
            if previous is None:
                interp.plists[sym] = cell.cdr.cdr
            else:
                previous.cdr.cdr = cell.cdr.cdr
            return cell
        previous = cell
    return NIL


@builtin("%set-symbol-plist", context=Lib)
def set_symbol_plist(lib: Lib, sym: Any, plist: Any) -> Any:
    interp = lib.interp
    interp.plists[need_symbol("(setf symbol-plist)", 1, sym)] = plist
    return plist


@builtin("copy-symbol", context=Lib)
def copy_symbol(lib: Lib, sym: Any, copy_props: Any = NIL) -> Any:
    interp = lib.interp
    need_symbol("copy-symbol", 1, sym)
    new = Symbol(sym.name, None)
    if copy_props is not NIL:
        if sym in interp.values:
            interp.values[new] = interp.values[sym]
        if sym in interp.functions:
            interp.functions[new] = interp.functions[sym]
        from .builtins_conses import Conses, copy_list

        interp.plists[new] = copy_list(Conses(interp), interp.plists.get(sym, NIL))
    return new


@builtin("makunbound", context=Lib)
def makunbound(lib: Lib, sym: Any) -> Any:
    interp = lib.interp
    need_symbol("makunbound", 1, sym)
    interp.check_assignable(sym)
    interp.values.pop(sym, None)
    return sym


@builtin("fmakunbound", context=Lib)
def fmakunbound(lib: Lib, name: Any) -> Any:
    interp = lib.interp
    if type(name) is Cons and type(name.cdr) is Cons:
        interp.setf_functions.pop(name.cdr.car, None)
        return name
    need_symbol("fmakunbound", 1, name)
    interp.check_redefinition(name, "function")
    interp.functions.pop(name, None)
    interp.macros.pop(name, None)
    return name


def constant_form(lib: Lib, form: Any) -> bool:
    """SBCL's answer: constants, quoted forms, if/progn/the/block of constant forms, and
    calls of functions it folds (pure ones returning no fresh object) on constant forms."""
    interp = lib.interp
    if type(form) is Symbol:
        return form.package == "KEYWORD" or form in interp.constants
    if type(form) is not Cons:
        return True
    head = form.car
    args, end = list_cars(form.cdr)
    if type(head) is not Symbol or end is not NIL:
        return False
    if head.name == "QUOTE":
        return len(args) == 1
    if head.name == "THE":
        return len(args) == 2 and constant_form(lib, args[1])
    if head.name == "BLOCK":
        return bool(args) and all(constant_form(lib, a) for a in args[1:])
    if head.name in ("IF", "PROGN"):
        return all(constant_form(lib, a) for a in args)
    return head.name in FOLDABLE and type(interp.functions.get(head)) is Builtin and all(constant_form(lib, a) for a in args)


@builtin("constantp", context=Lib)
def constantp(lib: Lib, form: Any, env: Any = NIL) -> Any:
    return lbool(constant_form(lib, form))


symbol_plist = builtin("symbol-plist", context=Lib)(lambda lib, sym: plist_of(lib, "symbol-plist", sym))
symbol_package = builtin("symbol-package")(lambda sym: (need_symbol("symbol-package", 1, sym), NIL)[1])


def status(lib: Lib, sym: Symbol) -> Any:
    """find-symbol's second value: a keyword is :external, a standard symbol :inherited."""
    interp = lib.interp
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


@builtin("find-symbol", context=Lib)
def find_symbol(lib: Lib, name: Any, package: Any = NIL) -> Any:
    interp = lib.interp
    from .types import MultipleValues

    need_string("find-symbol", 1, name)
    if keyword_package("find-symbol", package):
        sym = interp.table.keywords.get(name)
    else:
        sym = interp.table.find(name) if name != "NIL" else NIL
    return MultipleValues((sym, status(lib, sym))) if sym is not None else MultipleValues((NIL, NIL))


@builtin("intern", context=Lib)
def intern(lib: Lib, name: Any, package: Any = NIL) -> Any:
    interp = lib.interp
    from .types import MultipleValues

    found = find_symbol(lib, name, package)
    if found[0] is not NIL or found[1] is not NIL:
        return found
    sym = interp.table.keyword(name) if keyword_package("intern", package) else interp.table.intern(name)
    return MultipleValues((sym, NIL))


@builtin("make-symbol")
def make_symbol(name: Any) -> Any:
    return Symbol(need_string("make-symbol", 1, name), None)


@builtin("gensym", context=Lib)
def gensym(lib: Lib, prefix: Any = "G") -> Any:
    interp = lib.interp
    if type(prefix) is int:
        return Symbol(f"G{prefix}", None)
    counter = interp.sym("*GENSYM-COUNTER*")
    n = interp.values.get(counter, 0)
    interp.values[counter] = n + 1
    return Symbol(f"{need_string('gensym', 1, prefix)}{n}", None)


@builtin("gentemp", context=Lib)
def gentemp(lib: Lib, prefix: Any = "T", package: Any = NIL) -> Any:
    interp = lib.interp
    need_string("gentemp", 1, prefix)
    while True:
        interp.gentemp_counter += 1
        name = f"{prefix}{interp.gentemp_counter}"
        if interp.table.find(name) is None:
            return interp.table.intern(name)


def define_variables(interp: "Interpreter") -> None:
    """*gensym-counter*."""
    counter = interp.sym("*GENSYM-COUNTER*")
    interp.values[counter] = 1
    interp.specials.add(counter)


symbolp = builtin("symbolp")(lambda x: lbool(type(x) is Symbol))
keywordp = builtin("keywordp")(lambda x: lbool(type(x) is Symbol and x.package == "KEYWORD"))
symbol_name = builtin("symbol-name")(lambda s: need_symbol("symbol-name", 1, s).name)
