"""Builtins of evaluation and calling (CLHS 3 and 5): equality, funcall and apply, values,
the cores of the definition macros, macros, eval and macroexpansion, types."""


from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from .builtins import (
    Registry,
    eq,
    eql,
    equal,
    equalp,
    lbool,
    list_cells,
    list_items,
    need_string,
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
    from .builtins import to_lisp_list

    return to_lisp_list([interp.gensym() for _ in range(n)])


def _tree_has_name(interp: "Interpreter", tree: Any, name: str) -> bool:
    """Whether a symbol named NAME occurs in TREE (conses only; charged per cons)."""
    stack = [tree]
    seen = 0
    while stack:
        x = stack.pop()
        while type(x) is Cons:
            seen += 1
            if seen == 1024:  # charged as it goes: a circular tree ends at the budget
                interp.charge(seen)
                seen = 0
            stack.append(x.car)
            x = x.cdr
        if type(x) is Symbol and x.name == name:
            interp.charge(seen)
            return True
    interp.charge(seen)
    return False


def _proper_length(x: Any) -> Any:
    cells, end = list_cells(x)
    return len(cells) if end is NIL else NIL


def install(reg: Registry) -> None:
    interp = reg.interp
    add = reg.add


    add("eq", lambda a, b: lbool(eq(a, b)))
    add("eql", lambda a, b: lbool(eql(a, b)))
    add("equal", lambda a, b: lbool(equal(a, b, interp.charge)))
    add("equalp", lambda a, b: lbool(equalp(a, b, interp.charge)))
    tests: dict[str, Callable[[Any, Any], bool]] = {
        "eq": eq, "eql": eql, "equal": lambda a, b: equal(a, b, interp.charge), "equalp": lambda a, b: equalp(a, b, interp.charge),
    }
    for name, test in tests.items():
        interp.standard_tests[interp.functions[interp.sym(name)]] = test
    add("not", lambda x: lbool(not interp.truth(x)))
    add("functionp", lambda x: lbool(type(x) in (Closure, Builtin)))
    add("hash-table-p", lambda x: lbool(type(x) is HashTable))
    add("typep", lambda x, spec: lbool(typep(interp, x, spec)))
    add("type-of", lambda x: type_of(interp, x))

    # -- calling ----------------------------------------------------------------------------
    def funcall(fn: Any, *args: Any) -> Any:
        return interp.apply(interp.function_value(fn), list(args))

    def apply(fn: Any, arg: Any, *more: Any) -> Any:
        args = (arg, *more)
        spread = list_items("apply", len(args) + 1, args[-1])
        return interp.apply(interp.function_value(fn), list(args[:-1]) + spread)

    def values(*xs: Any) -> Any:
        return xs[0] if len(xs) == 1 else MultipleValues(xs)

    def values_list(x: Any) -> Any:
        return values(*list_items("values-list", 1, x))

    add("funcall", funcall)
    add("apply", apply)
    add("values", values)
    add("values-list", values_list)

    def symbol_function(s: Any) -> Any:
        return interp.function_value(need_symbol("symbol-function", 1, s))

    def fboundp(s: Any) -> Any:
        if type(s) is Cons and s.car is interp.sym("SETF") and type(s.cdr) is Cons and s.cdr.cdr is NIL:
            return lbool(s.cdr.car in interp.setf_functions)
        need_symbol("fboundp", 1, s)
        return lbool(s in interp.functions or s in interp.macros or s in interp.special_forms)

    def symbol_value(s: Any) -> Any:
        return interp.global_value(need_symbol("symbol-value", 1, s))

    def boundp(s: Any) -> Any:
        need_symbol("boundp", 1, s)
        return lbool(s in interp.values or s.package == "KEYWORD")

    def lisp_set(s: Any, value: Any) -> Any:
        need_symbol("set", 1, s)
        if s in interp.constants or s.package == "KEYWORD":
            raise lisp_error("E107", f"`{short(s)}` is a constant and cannot be assigned", "ERROR")
        interp.values[s] = value
        return value

    add("symbol-function", symbol_function)
    add("fdefinition", symbol_function)
    add("fboundp", fboundp)
    add("symbol-value", symbol_value)
    add("boundp", boundp)
    add("set", lisp_set)
    add("special-operator-p", lambda s: lbool(need_symbol("special-operator-p", 1, s) in interp.special_forms))

    # -- definitions (the cores of the prelude's defun, defvar ...) ------------------------------
    def p_defun(name: Any, fn: Any) -> Any:
        need_symbol("defun", 1, name)
        interp.check_redefinition(name, "function")
        if type(fn) is Closure and (fn.name is NIL or fn.name is None):
            fn.name = name
        interp.functions[name] = fn
        interp.macros.pop(name, None)
        return name

    def p_defsetf_function(name: Any, fn: Any) -> Any:
        need_symbol("defun", 1, name)
        interp.setf_functions[name] = fn
        return to_lisp_list([interp.sym("SETF"), name])

    def p_defvar(name: Any, value: Any, always: Any) -> Any:
        need_symbol("defvar", 1, name)
        interp.check_assignable(name)
        interp.specials.add(name)
        if always is not NIL or name not in interp.values:
            interp.values[name] = value
        return name

    def p_declare_special(name: Any) -> Any:
        need_symbol("defvar", 1, name)
        interp.check_assignable(name)
        interp.specials.add(name)
        return name

    def p_special_p(name: Any) -> Any:
        return lbool(name in interp.specials)

    def p_defconstant(name: Any, value: Any) -> Any:
        need_symbol("defconstant", 1, name)
        if name in interp.constants and not eql(interp.values.get(name), value) and not equal(interp.values.get(name), value):
            raise lisp_error("E107", f"constant `{short(name)}` is already defined with another value", "PROGRAM-ERROR")
        interp.values[name] = value
        interp.constants.add(name)
        return name

    def p_set_symbol_function(name: Any, fn: Any) -> Any:
        fn = interp.function_value(fn)
        if type(name) is Cons and name.car is interp.sym("SETF") and type(name.cdr) is Cons and name.cdr.cdr is NIL:
            p_defsetf_function(name.cdr.car, fn)
        else:
            p_defun(name, fn)
        return fn

    add("%defun", p_defun)
    add("%set-symbol-function", p_set_symbol_function)
    add("%defsetf-function", p_defsetf_function)

    def p_define_setf_expander(name: Any, expander: Any) -> Any:
        need_symbol("define-setf-expander", 1, name)
        interp.setf_expanders[name] = interp.function_value(expander)
        return name

    def p_setf_expander(name: Any) -> Any:
        return interp.setf_expanders.get(name, NIL) if type(name) is Symbol else NIL

    def documentation_key(fn: str, x: Any, doc_type: Any) -> tuple[Any, str]:
        need_symbol(fn, 2, doc_type)
        name: Any = x.name if type(x) is Closure else interp.sym(x.name.upper()) if type(x) is Builtin else x
        if type(name) is Symbol:
            return name, doc_type.name
        if type(name) is Cons and name.car is interp.sym("SETF") and type(name.cdr) is Cons:
            return ("SETF", name.cdr.car), doc_type.name
        raise type_error(fn, 1, "a symbol, (setf name) or function", x)

    def documentation(x: Any, doc_type: Any) -> Any:
        return interp.documentation.get(documentation_key("documentation", x, doc_type), NIL)

    def p_set_documentation(x: Any, doc_type: Any, doc: Any) -> Any:
        key = documentation_key("(setf documentation)", x, doc_type)
        if doc is NIL:
            interp.documentation.pop(key, None)
        elif type(doc) is str:
            interp.documentation[key] = doc
        else:
            raise type_error("(setf documentation)", 3, "a string or nil", doc)
        return doc

    def function_lambda_expression(fn: Any) -> Any:
        """(values nil t name): CLHS allows nil for the lambda expression, and t for closure-p."""
        if type(fn) is Closure:
            name = fn.name if isinstance(fn.name, (Symbol, Cons)) else NIL
        elif type(fn) is Builtin:
            name = interp.sym(fn.name.upper()) if " " not in fn.name else NIL
        else:
            raise type_error("function-lambda-expression", 1, "a function", fn)
        return MultipleValues((NIL, T, name))

    add("documentation", documentation)
    add("%set-documentation", p_set_documentation)
    add("function-lambda-expression", function_lambda_expression)
    add("%define-setf-expander", p_define_setf_expander)
    add("%setf-expander", p_setf_expander)
    add("%defvar", p_defvar)
    add("%special-p", p_special_p)
    add("%declare-special", p_declare_special)
    add("%defconstant", p_defconstant)

    # -- macros and eval ----------------------------------------------------------------------------
    def local_definition(env: Any, name: Any) -> Any:
        """What a lexical environment says of a function name: a Macro, a local function, or None."""
        if type(env) is not LexicalEnvironment:
            return None
        entry, _ = env.scope.find_fun(name)
        return entry

    def local_function_p(name: Any, env: Any) -> Any:
        """Whether ENV binds NAME as a local function (flet, labels), which shadows a setf expander."""
        entry = local_definition(env, name)
        return lbool(entry is not None and type(entry) is not Macro)

    add("%local-function-p", local_function_p)

    def macroexpand_1(form: Any, env: Any = NIL) -> Any:
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

    def macroexpand(form: Any, env: Any = NIL) -> Any:
        expanded_any = False
        for _ in range(10_000):
            form, expanded = macroexpand_1(form, env)
            if expanded is NIL:
                break
            expanded_any = True
        return MultipleValues((form, lbool(expanded_any)))

    def expander_function(macro: Macro) -> Builtin:
        """What funcall makes of a macro function: the expander itself, called as CLHS says
        with the whole form and an environment (two arguments, no fewer, no more)."""

        def expand(form: Any, env: Any) -> Any:
            if type(form) is not Cons:
                raise lisp_error("E103", f"the expander of `{short(macro.name)}` takes a macro form, not {short(form)}", "TYPE-ERROR", form)
            return interp.call_macro(macro, form, env.scope if type(env) is LexicalEnvironment else None)

        return Builtin(f"expander of {short(macro.name)}", expand, 2, 2)

    def macro_function(name: Any, env: Any = NIL) -> Any:
        local = local_definition(env, need_symbol("macro-function", 1, name))
        if local is not None:
            return expander_function(local) if type(local) is Macro else NIL
        macro = interp.macros.get(name)
        return NIL if macro is None else expander_function(macro)

    def set_macro_function(fn: Any, name: Any, env: Any = NIL) -> Any:
        """(setf (macro-function name) fn): NAME becomes a macro whose expander is FN, called
        with the form and the environment."""
        need_symbol("(setf macro-function)", 2, name)
        expander = interp.function_value(fn)
        form, environment, args = Symbol("FORM", None), Symbol("ENV", None), Symbol("ARGS", None)
        call = to_lisp_list([interp.sym("FUNCALL"), to_lisp_list([interp.sym("QUOTE"), expander]), form, environment])
        lambda_list = to_lisp_list([interp.sym("&WHOLE"), form, interp.sym("&ENVIRONMENT"), environment, interp.sym("&REST"), args])
        ignore = to_lisp_list([interp.sym("DECLARE"), to_lisp_list([interp.sym("IGNORE"), args])])
        interp.ev(to_lisp_list([interp.sym("%DEFMACRO"), name, lambda_list, ignore, call]))
        return fn

    interp.setf_functions[interp.sym("MACRO-FUNCTION")] = Builtin("(setf macro-function)", set_macro_function, 2, 3)

    def lisp_eval(form: Any) -> Any:
        return interp.ev(form)

    def p_define_symbol_macro(name: Any, expansion: Any) -> Any:
        need_symbol("define-symbol-macro", 1, name)
        if name in interp.specials or name in interp.constants:
            raise lisp_error("E107", f"`{short(name)}` is a variable; it cannot also be a symbol macro", "PROGRAM-ERROR")
        interp.symbol_macros[name] = expansion
        return name

    add("%define-symbol-macro", p_define_symbol_macro)
    add("macroexpand-1", macroexpand_1)
    add("macro-function", macro_function)
    add("macroexpand", macroexpand)
    add("eval", lisp_eval)

    # -- types ------------------------------------------------------------------------------------------------
    def p_deftype(name: Any, expander: Any) -> Any:
        need_symbol("deftype", 1, name)
        interp.types.deftypes[name] = expander
        interp.types.cache.clear()
        return name

    add("subtypep", lambda a, b, env=NIL: subtypep_values(interp.types, a, b))
    add("%deftype", p_deftype)

    # -- misc ---------------------------------------------------------------------------------------------------
    add("%gensym-list", lambda n: _gensyms(interp, n))
    add("%name=", lambda x, name: lbool(type(x) is Symbol and x.name == name))
    add("%list-length-or-nil", lambda x: _proper_length(x))
    add("%macro-p", lambda s: lbool(type(s) is Symbol and s in interp.macros))
    # loop's parser asks this of every token: (%loop-kw-p x "FOR" "AS" ...)
    add("%loop-kw-p", lambda x, *names: lbool(type(x) is Symbol and x is not NIL and x.name in names))
    add("%loop-keyword", lambda x: interp.kw(x.name) if type(x) is Symbol and x is not NIL else NIL)
    add("%tree-has-name", lambda tree, name: lbool(_tree_has_name(interp, tree, need_string("%tree-has-name", 2, name))))


