"""Builtins of evaluation and calling (CLHS 3 and 5): equality, funcall and apply, values,
the cores of the definition macros, macros, eval and macroexpansion, types."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, Callable

from .builtins import (
    Lib,
    eq,
    eql,
    equal,
    equalp,
    lbool,
    list_cells,
    list_items,
    need_symbol,
    short,
    to_lisp_list,
    type_error,
    type_name_of,
    typep,
)
from .conditions import lisp_error
from .builtins_strings import STANDARD_CHARS
from .objects import BitVector, Builtin, Closure, HashTable, LexicalEnvironment, LispArray, Macro, StructInstance
from .scope import SymbolMacroEntry
from .typespecs import FIXNUM_HIGH, FIXNUM_LOW, subtypep_values
from .types import NIL, T, Char, Cons, MultipleValues, Symbol
from .registry import builtin


if TYPE_CHECKING:
    from .evaluator import Interpreter


def type_of(interp: "Interpreter", x: Any) -> Any:
    """type-of as SBCL answers it: integers by their range, arrays with their dimensions."""
    t = type(x)
    if t is StructInstance:
        return x.stype.name
    if t is int:
        if x in (0, 1):
            return interp.sym("BIT")
        if 0 <= x <= FIXNUM_HIGH:
            return to_lisp_list([interp.sym("INTEGER"), 0, FIXNUM_HIGH])
        if FIXNUM_LOW <= x < 0:
            return interp.sym("FIXNUM")
        if x > 0:
            return to_lisp_list([interp.sym("INTEGER"), FIXNUM_HIGH + 1])
        return interp.sym("BIGNUM")
    if t is str:
        return to_lisp_list([interp.sym("SIMPLE-ARRAY"), interp.sym("CHARACTER"), to_lisp_list([len(x)])])
    header = interp.vector_headers.get(id(x)) if t is list or t is BitVector else None
    if header is not None:  # not simple: its dimension counts what is past the fill pointer
        size = len(x) + len(header.beyond)
        return to_lisp_list([interp.sym("BIT-VECTOR"), size] if t is BitVector else [interp.sym("VECTOR"), T, size])
    if t is list:
        return to_lisp_list([interp.sym("SIMPLE-VECTOR"), len(x)])
    if t is BitVector:
        return to_lisp_list([interp.sym("SIMPLE-BIT-VECTOR"), len(x)])
    if t is LispArray:
        return to_lisp_list([interp.sym("SIMPLE-ARRAY"), T, to_lisp_list(list(x.dims))])
    if t is Char:
        code = ord(x.ch)
        return interp.sym("STANDARD-CHAR" if x.ch in STANDARD_CHARS else "BASE-CHAR" if code < 128 else "EXTENDED-CHAR")
    if t is Closure or t is Builtin:
        return interp.sym("COMPILED-FUNCTION")
    return interp.sym(type_name_of(x))

def _gensyms(interp: "Interpreter", n: Any) -> Any:
    return to_lisp_list([interp.gensym() for _ in range(n)])


def _proper_length(x: Any) -> Any:
    cells, end = list_cells(x)
    return len(cells) if end is NIL else NIL


@builtin("funcall", context=Lib)
def funcall(lib: Lib, fn: Any, *args: Any) -> Any:
    interp = lib.interp
    return interp.apply(interp.function_value(fn), list(args))


@builtin("apply", context=Lib)
def apply(lib: Lib, fn: Any, arg: Any, *more: Any) -> Any:
    interp = lib.interp
    args = (arg, *more)
    spread = list_items("apply", len(args) + 1, args[-1])
    return interp.apply(interp.function_value(fn), list(args[:-1]) + spread)


@builtin("values")
def values(*xs: Any) -> Any:
    return xs[0] if len(xs) == 1 else MultipleValues(xs)


@builtin("values-list")
def values_list(x: Any) -> Any:
    return values(*list_items("values-list", 1, x))


@builtin("symbol-function", "fdefinition", context=Lib)
def symbol_function(lib: Lib, s: Any) -> Any:
    interp = lib.interp
    return interp.function_value(need_symbol("symbol-function", 1, s))


@builtin("fboundp", context=Lib)
def fboundp(lib: Lib, s: Any) -> Any:
    interp = lib.interp
    if type(s) is Cons and s.car is interp.sym("SETF") and type(s.cdr) is Cons and s.cdr.cdr is NIL:
        return lbool(s.cdr.car in interp.setf_functions)
    need_symbol("fboundp", 1, s)
    return lbool(s in interp.functions or s in interp.macros or s in interp.special_forms)


@builtin("symbol-value", context=Lib)
def symbol_value(lib: Lib, s: Any) -> Any:
    interp = lib.interp
    return interp.global_value(need_symbol("symbol-value", 1, s))


@builtin("boundp", context=Lib)
def boundp(lib: Lib, s: Any) -> Any:
    interp = lib.interp
    need_symbol("boundp", 1, s)
    return lbool(s in interp.values or s.package == "KEYWORD")


@builtin("set", context=Lib)
def lisp_set(lib: Lib, s: Any, value: Any) -> Any:
    interp = lib.interp
    need_symbol("set", 1, s)
    if s in interp.constants or s.package == "KEYWORD":
        raise lisp_error("E107", f"`{short(s)}` is a constant and cannot be assigned", "ERROR")
    interp.values[s] = value
    return value


@builtin("%defun", context=Lib)
def p_defun(lib: Lib, name: Any, fn: Any) -> Any:
    interp = lib.interp
    need_symbol("defun", 1, name)
    interp.check_redefinition(name, "function")
    if type(fn) is Closure and (fn.name is NIL or fn.name is None):
        fn.name = name
    interp.functions[name] = fn
    interp.macros.pop(name, None)
    return name


@builtin("%defsetf-function", context=Lib)
def p_defsetf_function(lib: Lib, name: Any, fn: Any) -> Any:
    interp = lib.interp
    need_symbol("defun", 1, name)
    interp.setf_functions[name] = fn
    return to_lisp_list([interp.sym("SETF"), name])


@builtin("%defvar", context=Lib)
def p_defvar(lib: Lib, name: Any, value: Any, always: Any) -> Any:
    interp = lib.interp
    need_symbol("defvar", 1, name)
    interp.check_assignable(name)
    interp.specials.add(name)
    if always is not NIL or name not in interp.values:
        interp.values[name] = value
    return name


@builtin("%declare-special", context=Lib)
def p_declare_special(lib: Lib, name: Any) -> Any:
    interp = lib.interp
    need_symbol("defvar", 1, name)
    interp.check_assignable(name)
    interp.specials.add(name)
    return name


@builtin("%special-p", context=Lib)
def p_special_p(lib: Lib, name: Any) -> Any:
    interp = lib.interp
    return lbool(name in interp.specials)


@builtin("%defconstant", context=Lib)
def p_defconstant(lib: Lib, name: Any, value: Any) -> Any:
    interp = lib.interp
    need_symbol("defconstant", 1, name)
    if name in interp.constants and not eql(interp.values.get(name), value) and not equal(interp.values.get(name), value):
        raise lisp_error("E107", f"constant `{short(name)}` is already defined with another value", "PROGRAM-ERROR")
    interp.values[name] = value
    interp.constants.add(name)
    return name


@builtin("%set-symbol-function", context=Lib)
def p_set_symbol_function(lib: Lib, name: Any, fn: Any) -> Any:
    interp = lib.interp
    fn = interp.function_value(fn)
    if type(name) is Cons and name.car is interp.sym("SETF") and type(name.cdr) is Cons and name.cdr.cdr is NIL:
        p_defsetf_function(lib, name.cdr.car, fn)
    else:
        p_defun(lib, name, fn)
    return fn


@builtin("%define-setf-expander", context=Lib)
def p_define_setf_expander(lib: Lib, name: Any, expander: Any) -> Any:
    interp = lib.interp
    need_symbol("define-setf-expander", 1, name)
    interp.setf_expanders[name] = interp.function_value(expander)
    return name


@builtin("%setf-expander", context=Lib)
def p_setf_expander(lib: Lib, name: Any) -> Any:
    interp = lib.interp
    return interp.setf_expanders.get(name, NIL) if type(name) is Symbol else NIL


def documentation_key(lib: Lib, fn: str, x: Any, doc_type: Any) -> tuple[Any, str]:
    interp = lib.interp
    need_symbol(fn, 2, doc_type)
    name: Any = x.name if type(x) is Closure else interp.sym(x.name.upper()) if type(x) is Builtin else x
    if type(name) is Symbol:
        return name, doc_type.name
    if type(name) is Cons and name.car is interp.sym("SETF") and type(name.cdr) is Cons:
        return ("SETF", name.cdr.car), doc_type.name
    raise type_error(fn, 1, "a symbol, (setf name) or function", x)


@builtin("documentation", context=Lib)
def documentation(lib: Lib, x: Any, doc_type: Any) -> Any:
    interp = lib.interp
    return interp.documentation.get(documentation_key(lib, "documentation", x, doc_type), NIL)


@builtin("%set-documentation", context=Lib)
def p_set_documentation(lib: Lib, x: Any, doc_type: Any, doc: Any) -> Any:
    interp = lib.interp
    key = documentation_key(lib, "(setf documentation)", x, doc_type)
    if doc is NIL:
        interp.documentation.pop(key, None)
    elif type(doc) is str:
        interp.documentation[key] = doc
    else:
        raise type_error("(setf documentation)", 3, "a string or nil", doc)
    return doc


@builtin("function-lambda-expression", context=Lib)
def function_lambda_expression(lib: Lib, fn: Any) -> Any:
    """(values nil t name): CLHS allows nil for the lambda expression, and t for closure-p."""
    interp = lib.interp
    if type(fn) is Closure:
        name = fn.name if isinstance(fn.name, (Symbol, Cons)) else NIL
    elif type(fn) is Builtin:
        name = interp.sym(fn.name.upper()) if " " not in fn.name else NIL
    else:
        raise type_error("function-lambda-expression", 1, "a function", fn)
    return MultipleValues((NIL, T, name))


def local_definition(env: Any, name: Any) -> Any:
    """What a lexical environment says of a function name: a Macro, a local function, or None."""
    if type(env) is not LexicalEnvironment:
        return None
    entry, _ = env.scope.find_fun(name)
    return entry


@builtin("%local-function-p")
def local_function_p(name: Any, env: Any) -> Any:
    """Whether ENV binds NAME as a local function (flet, labels), which shadows a setf expander."""
    entry = local_definition(env, name)
    return lbool(entry is not None and type(entry) is not Macro)


@builtin("macroexpand-1", context=Lib)
def macroexpand_1(lib: Lib, form: Any, env: Any = NIL) -> Any:
    interp = lib.interp
    scope = env.scope if type(env) is LexicalEnvironment else None
    if type(form) is Symbol:
        entry = scope.find_var(form)[0] if scope is not None else None
        if type(entry) is SymbolMacroEntry:
            return MultipleValues((entry.expansion, T))
        if entry is None and form in interp.symbol_macros:
            return MultipleValues((interp.symbol_macros[form], T))
    if type(form) is Cons and type(form.car) is Symbol:
        local = local_definition(env, form.car)
        if type(local) is Macro:
            return MultipleValues((interp.call_macro(local, form, scope), T))
        macro = interp.macros.get(form.car) if local is None else None
        if macro is not None and form.car not in interp.special_forms:
            return MultipleValues((interp.call_macro(macro, form, scope), T))
    return MultipleValues((form, NIL))


@builtin("macroexpand", context=Lib)
def macroexpand(lib: Lib, form: Any, env: Any = NIL) -> Any:
    expanded_any = False
    for _ in range(10_000):
        form, expanded = macroexpand_1(lib, form, env)
        if expanded is NIL:
            break
        expanded_any = True
    return MultipleValues((form, lbool(expanded_any)))


def expander_function(lib: Lib, macro: Macro) -> Builtin:
    """What funcall makes of a macro function: the expander itself, called as CLHS says
    with the whole form and an environment (two arguments, no fewer, no more)."""
    interp = lib.interp

    def expand(form: Any, env: Any) -> Any:
        if type(form) is not Cons:
            raise lisp_error("E103", f"the expander of `{short(macro.name)}` takes a macro form, not {short(form)}", "TYPE-ERROR", form)
        return interp.call_macro(macro, form, env.scope if type(env) is LexicalEnvironment else None)

    return Builtin(f"expander of {short(macro.name)}", expand, 2, 2)


@builtin("macro-function", context=Lib)
def macro_function(lib: Lib, name: Any, env: Any = NIL) -> Any:
    interp = lib.interp
    local = local_definition(env, need_symbol("macro-function", 1, name))
    if local is not None:
        return expander_function(lib, local) if type(local) is Macro else NIL
    macro = interp.macros.get(name)
    return NIL if macro is None else expander_function(lib, macro)


def set_macro_function(lib: Lib, fn: Any, name: Any, env: Any = NIL) -> Any:
    """(setf (macro-function name) fn): NAME becomes a macro whose expander is FN, called
    with the form and the environment."""
    interp = lib.interp
    need_symbol("(setf macro-function)", 2, name)
    expander = interp.function_value(fn)
    form, environment, args = Symbol("FORM", None), Symbol("ENV", None), Symbol("ARGS", None)
    call = to_lisp_list([interp.sym("FUNCALL"), to_lisp_list([interp.sym("QUOTE"), expander]), form, environment])
    lambda_list = to_lisp_list([interp.sym("&WHOLE"), form, interp.sym("&ENVIRONMENT"), environment, interp.sym("&REST"), args])
    ignore = to_lisp_list([interp.sym("DECLARE"), to_lisp_list([interp.sym("IGNORE"), args])])
    interp.ev(to_lisp_list([interp.sym("%DEFMACRO"), name, lambda_list, ignore, call]))
    return fn


@builtin("eval", context=Lib)
def lisp_eval(lib: Lib, form: Any) -> Any:
    interp = lib.interp
    return interp.ev(form)


@builtin("%define-symbol-macro", context=Lib)
def p_define_symbol_macro(lib: Lib, name: Any, expansion: Any) -> Any:
    interp = lib.interp
    need_symbol("define-symbol-macro", 1, name)
    if name in interp.specials or name in interp.constants:
        raise lisp_error("E107", f"`{short(name)}` is a variable; it cannot also be a symbol macro", "PROGRAM-ERROR")
    interp.symbol_macros[name] = expansion
    return name


@builtin("%deftype", context=Lib)
def p_deftype(lib: Lib, name: Any, expander: Any) -> Any:
    interp = lib.interp
    need_symbol("deftype", 1, name)
    interp.types.deftypes[name] = expander
    interp.types.cache.clear()
    return name


eq_ = builtin("eq")(lambda a, b: lbool(eq(a, b)))
eql_ = builtin("eql")(lambda a, b: lbool(eql(a, b)))
equal_ = builtin("equal", context=Lib)(lambda lib, a, b: lbool(equal(a, b, lib.interp.charge)))
equalp_ = builtin("equalp", context=Lib)(lambda lib, a, b: lbool(equalp(a, b, lib.interp.charge)))
not_ = builtin("not", context=Lib)(lambda lib, x: lbool(not lib.interp.truth(x)))
functionp = builtin("functionp")(lambda x: lbool(type(x) in (Closure, Builtin)))
hash_table_p = builtin("hash-table-p")(lambda x: lbool(type(x) is HashTable))
typep_ = builtin("typep", context=Lib)(lambda lib, x, spec: lbool(typep(lib.interp, x, spec)))
type_of_ = builtin("type-of", context=Lib)(lambda lib, x: type_of(lib.interp, x))
special_operator_p = builtin("special-operator-p", context=Lib)(lambda lib, s: lbool(need_symbol("special-operator-p", 1, s) in lib.interp.special_forms))
subtypep = builtin("subtypep", context=Lib)(lambda lib, a, b, env=NIL: subtypep_values(lib.interp.types, a, b))
p_gensym_list = builtin("%gensym-list", context=Lib)(lambda lib, n: _gensyms(lib.interp, n))
p_name_eq = builtin("%name=")(lambda x, name: lbool(type(x) is Symbol and x.name == name))
p_list_length_or_nil = builtin("%list-length-or-nil")(lambda x: _proper_length(x))
p_macro_p = builtin("%macro-p", context=Lib)(lambda lib, s: lbool(type(s) is Symbol and s in lib.interp.macros))


def set_up(interp: "Interpreter") -> None:
    """What these builtins need besides themselves: eq, eql, equal and equalp as fast :test
    functions, and (setf macro-function)."""
    tests: dict[str, Callable[[Any, Any], bool]] = {
        "eq": eq, "eql": eql, "equal": lambda a, b: equal(a, b, interp.charge), "equalp": lambda a, b: equalp(a, b, interp.charge),
    }
    for name, test in tests.items():
        interp.standard_tests[interp.functions[interp.sym(name)]] = test
    interp.setf_functions[interp.sym("MACRO-FUNCTION")] = Builtin("(setf macro-function)", partial(set_macro_function, Lib(interp)), 2, 3)


