"""Builtins that reach into the evaluator: equality, function calling, values, hash tables,
structures, conditions, definitions, eval and macroexpansion."""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any, Callable, Iterator

from .builtins import (
    Registry,
    eq,
    eql,
    equal,
    equalp,
    format_to_string,
    lbool,
    list_cars,
    list_cells,
    list_items,
    need_string,
    need_symbol,
    parse_keys,
    short,
    to_lisp_list,
    type_error,
    type_name_of,
    typep,
)
from .conditions import CONDITION_PARENTS, Condition, LispError, OperationName, condition_is, lisp_error
from .builtins_strings import STANDARD_CHARS
from .objects import BitVector, Builtin, Closure, ConditionType, HandlerCluster, HashTable, LexicalEnvironment, LispArray, Macro, StructInstance, StructType
from .scope import SymbolMacroEntry
from .typespecs import FIXNUM_HIGH, FIXNUM_LOW, subtypep_values
from .types import NIL, T, Char, Cons, MultipleValues, Symbol

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

    # -- conditions -------------------------------------------------------------------------------------
    condition_keys = {"FORMAT-CONTROL", "FORMAT-ARGUMENTS", "DATUM", "EXPECTED-TYPE", "NAME", "OPERATION", "OPERANDS", "PATHNAME", "STREAM", "PACKAGE"}

    def make_condition(ctype: str, datum: Any, args: tuple[Any, ...], default_type: str) -> Condition:
        """The condition that error, warn, signal and make-condition make of their arguments."""
        if type(datum) is str:
            message = format_to_string(interp, datum, list(args))
            slots = {"FORMAT-CONTROL": datum, "FORMAT-ARGUMENTS": to_lisp_list(args)}
            return Condition(default_type, message, "E104" if default_type != "SIMPLE-WARNING" else "W001", slots=slots)
        if type(datum) is Condition:
            return datum
        if type(datum) is Symbol:
            defined = interp.condition_types.get(datum.name)
            if defined is not None:
                return defined_condition(ctype, defined, args)
            if datum.name not in CONDITION_PARENTS or datum.package not in ("", None):
                raise lisp_error("E103", f"`{ctype}`: {short(datum)} is not a condition type", "TYPE-ERROR", datum)
            keys = parse_keys(ctype, args, condition_keys, 2)
            return Condition(datum.name, standard_message(ctype, datum.name, keys), "E104", keys.get("DATUM"), slots=keys)
        raise type_error(ctype, 1, "a format string, condition type or condition", datum)

    def standard_message(fn: str, name: str, keys: dict[str, Any]) -> str:
        if "FORMAT-CONTROL" in keys:
            control = keys["FORMAT-CONTROL"]
            arguments = list_items(fn, 5, keys.get("FORMAT-ARGUMENTS", NIL))
            return format_to_string(interp, control, arguments) if type(control) is str else short(control)
        if "DATUM" in keys:
            return f"The value {short(keys['DATUM'])} is not of type {short(keys.get('EXPECTED-TYPE', T))}"
        if "NAME" in keys:
            return f"{name.lower()}: {short(keys['NAME'])}"
        return f"condition {name.lower()} was signalled"

    def defined_condition(fn: str, ctype: ConditionType, args: tuple[Any, ...]) -> Condition:
        initargs = {k.name for _, inits, _ in ctype.slots for k in inits}
        keys = parse_keys(fn, args, condition_keys | initargs, 2)
        slots = {k: v for k, v in keys.items() if k in condition_keys}
        for slot, inits, initform in ctype.slots:
            given = next((keys[k.name] for k in inits if k.name in keys), None)
            if given is not None or any(k.name in keys for k in inits):
                slots[slot] = given
            elif initform is not None:
                slots[slot] = interp.call(initform)
        message = ctype.report if type(ctype.report) is str else standard_message(fn, ctype.name, keys)
        return Condition(ctype.name, message, "E104", keys.get("DATUM"), slots, lineage=ctype.lineage, report=ctype.report)

    def p_define_condition(name: Any, parents: Any, slots: Any, report: Any) -> Any:
        need_symbol("define-condition", 1, name)
        lineage = [name.name]
        inherited: list[tuple[str, list[Any], Any]] = []
        for parent in list_items("define-condition", 2, parents) or [interp.sym("CONDITION")]:
            known = interp.condition_types.get(need_symbol("define-condition", 2, parent).name)
            if known is not None:
                lineage.extend(known.lineage)
                inherited.extend(known.slots)
                if report is NIL and known.report is not None:
                    report = known.report
            elif parent.name in CONDITION_PARENTS:
                lineage.append(parent.name)
            else:
                raise lisp_error("E103", f"`define-condition`: {short(parent)} is not a condition type", "ERROR", parent)
        specs = []
        for spec in list_items("define-condition", 3, slots):
            slot_name, inits, initform = list_items("define-condition", 3, spec)
            specs.append((need_symbol("define-condition", 3, slot_name).name, list_items("define-condition", 3, inits), None if initform is NIL else initform))
        own = {slot for slot, _, _ in specs}
        specs = specs + [spec for spec in inherited if spec[0] not in own]
        interp.condition_types[name.name] = ConditionType(name.name, tuple(dict.fromkeys(lineage)), specs, None if report is NIL else report)
        return name

    def condition_slot(c: Any, slot: Any) -> Any:
        if type(c) is not Condition:
            raise type_error("slot-value", 1, "a condition", c)
        name = need_symbol("slot-value", 2, slot).name
        if name not in c.slots:
            raise lisp_error("E103", f"the condition has no slot {short(slot)}", "ERROR", slot)
        return c.slots[name]

    def set_condition_slot(c: Any, slot: Any, value: Any) -> Any:
        condition_slot(c, slot)
        c.slots[slot.name] = value
        return value

    def signal_condition(condition: Condition) -> None:
        """Search the active handlers, innermost first (CLHS 9.1.4): a handler-case that takes
        the condition gets it raised to it; each handler-bind handler for it is called, with
        only the handlers outside its own active, and may decline by returning."""
        stack = interp.handlers
        for i in range(len(stack) - 1, -1, -1):
            frame = stack[i]
            if type(frame) is tuple:
                if any(interp.types.typep(condition, spec) for spec in frame):
                    exc = LispError(condition)
                    exc.signalled = True
                    raise exc
                continue
            assert type(frame) is HandlerCluster
            for spec, handler in frame.bindings:
                if interp.types.typep(condition, spec):
                    inner = stack[i:]
                    del stack[i:]
                    try:
                        interp.call(handler, condition)
                    finally:
                        stack[i:] = inner

    def handler_bind(bindings: Any, thunk: Any) -> Any:
        """The core of handler-bind: call THUNK with the cluster active. An error a builtin
        raised (not yet searched) is offered to this cluster's handlers as it passes."""
        pairs = [(b.car, interp.function_value(b.cdr)) for b in list_items("handler-bind", 1, bindings)]
        cluster = HandlerCluster(pairs)
        depth = len(interp.handlers)
        interp.handlers.append(cluster)
        try:
            return interp.apply(interp.function_value(thunk), [])
        except LispError as exc:
            del interp.handlers[depth:]
            if not exc.signalled:
                for spec, handler in pairs:
                    if interp.types.typep(exc.condition, spec):
                        interp.call(handler, exc.condition)
            raise
        finally:
            del interp.handlers[depth:]

    def lisp_error_fn(datum: Any, *args: Any) -> Any:
        condition = make_condition("error", datum, args, "SIMPLE-ERROR")
        signal_condition(condition)
        exc = LispError(condition)
        exc.signalled = True
        raise exc

    def p_signal(condition: Any) -> Any:
        signal_condition(condition)
        return NIL

    def p_make_warning(datum: Any, args: Any) -> Any:
        condition = make_condition("warn", datum, tuple(list_items("warn", 2, args)), "SIMPLE-WARNING")
        if not condition_is(condition, "WARNING"):
            raise type_error("warn", 1, "a warning (a format string or a warning type)", datum)
        return condition

    def p_record_warning(condition: Any) -> Any:
        interp.warnings.append((condition.message, interp.current_loc))
        return NIL

    def signal(datum: Any, *args: Any) -> Any:
        """Signal: handlers may take the condition; if none does, nil."""
        return p_signal(make_condition("signal", datum, args, "SIMPLE-CONDITION"))

    def condition_reader(slot: str, fn: str, kind: str) -> Callable[[Any], Any]:
        def read(c: Any) -> Any:
            if type(c) is not Condition or not condition_is(c, kind):
                raise type_error(fn, 1, f"a {kind.lower()}", c)
            value = c.slots.get(slot, c.datum if slot in ("DATUM", "NAME") and c.datum is not None else NIL)
            return interp.sym(value.upper()) if type(value) is OperationName else value

        return read

    def p_coerce_condition(datum: Any, args: Any, default_type: Any) -> Any:
        """The condition error, signal or warn would make of DATUM and ARGS (restart-case
        makes it first, to associate its restarts with it)."""
        return make_condition(default_type.lower(), datum, tuple(list_items("restart-case", 2, args)), default_type)

    add("%coerce-condition", p_coerce_condition)
    add("error", lisp_error_fn)
    add("signal", signal)
    add("%signal", p_signal)
    add("%make-warning", p_make_warning)
    add("%record-warning", p_record_warning)
    add("%handler-bind", handler_bind)
    add("%define-condition", p_define_condition)
    add("%condition-slot", condition_slot)
    add("%set-condition-slot", set_condition_slot)
    add("make-condition", lambda ctype, *args: make_condition("make-condition", need_symbol("make-condition", 1, ctype), args, "SIMPLE-ERROR"))
    for slot, fn, kind in [
        ("FORMAT-CONTROL", "simple-condition-format-control", "SIMPLE-CONDITION"),
        ("FORMAT-ARGUMENTS", "simple-condition-format-arguments", "SIMPLE-CONDITION"),
        ("DATUM", "type-error-datum", "TYPE-ERROR"),
        ("EXPECTED-TYPE", "type-error-expected-type", "TYPE-ERROR"),
        ("NAME", "cell-error-name", "CELL-ERROR"),
        ("OPERATION", "arithmetic-error-operation", "ARITHMETIC-ERROR"),
        ("OPERANDS", "arithmetic-error-operands", "ARITHMETIC-ERROR"),
    ]:
        add(fn, condition_reader(slot, fn, kind))
    add("%condition-p", lambda x: lbool(type(x) is Condition))
    add("%condition-message", lambda c: c.message if type(c) is Condition else short(c))

    # -- hash tables ----------------------------------------------------------------------------------------
    def make_hash_table(*args: Any) -> Any:
        keys = parse_keys("make-hash-table", args, {"TEST", "SIZE", "REHASH-SIZE", "REHASH-THRESHOLD", "WEAKNESS", "SYNCHRONIZED"}, 1)
        test = keys.get("TEST", NIL)
        name = "EQL"
        if type(test) is Symbol and test is not NIL:
            name = test.name
        elif type(test) is Builtin:
            fname = test.name
            if interp.functions.get(interp.sym(fname)) is test:
                name = fname.upper()
        if name not in ("EQ", "EQL", "EQUAL", "EQUALP"):
            raise lisp_error("E103", f"`make-hash-table`: the :test must be eq, eql, equal or equalp, got {short(test)}", "ERROR", test)
        return HashTable(name, interp.charge)

    def need_table(fn: str, pos: int, x: Any) -> HashTable:
        if type(x) is not HashTable:
            raise type_error(fn, pos, "a hash table", x)
        return x

    def gethash(key: Any, table: Any, default: Any = NIL) -> Any:
        entry = need_table("gethash", 2, table).entries.get(table.key(key))
        if entry is None:
            return MultipleValues((default, NIL))
        return MultipleValues((entry[1], T))

    def puthash(key: Any, table: Any, *rest: Any) -> Any:
        """(setf (gethash key table [default]) value): the value comes last."""
        if not 1 <= len(rest) <= 2:
            raise lisp_error("E102", "`(setf gethash)` takes a key, a table, an optional default and a value", "PROGRAM-ERROR")
        value = rest[-1]
        interp.alloc(1)
        need_table("(setf gethash)", 2, table).entries[table.key(key)] = (key, value)
        return value

    def remhash(key: Any, table: Any) -> Any:
        return lbool(need_table("remhash", 2, table).entries.pop(table.key(key), None) is not None)

    def clrhash(table: Any) -> Any:
        need_table("clrhash", 1, table).entries.clear()
        return table

    def maphash(fn: Any, table: Any) -> Any:
        f = interp.function_value(fn)
        for key, value in list(need_table("maphash", 2, table).entries.values()):
            interp.call(f, key, value)
        return NIL

    add("make-hash-table", make_hash_table)
    add("gethash", gethash)
    add("%puthash", puthash)
    add("remhash", remhash)
    add("clrhash", clrhash)
    add("maphash", maphash)
    def hash_entries(table: Any) -> Any:
        from .builtins import to_lisp_list

        return to_lisp_list([Cons(k, v) for k, v in need_table("maphash", 1, table).entries.values()])

    add("%hash-entries", hash_entries)
    add("hash-table-count", lambda t: len(need_table("hash-table-count", 1, t).entries))
    add("hash-table-test", lambda t: interp.sym(need_table("hash-table-test", 1, t).test))
    add("hash-table-size", lambda t: max(16, len(need_table("hash-table-size", 1, t).entries)))
    add("hash-table-rehash-size", lambda t: (need_table("hash-table-rehash-size", 1, t), 1.5)[1])
    add("hash-table-rehash-threshold", lambda t: (need_table("hash-table-rehash-threshold", 1, t), 1.0)[1])
    add("sxhash", lambda x: _sxhash(x))

    # -- symbols -------------------------------------------------------------------------------------------
    def plist_of(fn: str, sym: Any) -> Any:
        return interp.plists.get(need_symbol(fn, 1, sym), NIL)

    def plist_cells(plist: Any) -> Iterator[Cons]:
        """The conses of a symbol's property list that hold an indicator; each pair is two
        steps, charged as the walk goes (a circular plist ends at the budget)."""
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

    def get(sym: Any, indicator: Any, default: Any = NIL) -> Any:
        for cell in plist_cells(plist_of("get", sym)):
            if cell.car is indicator:
                return cell.cdr.car
        return default

    def put(sym: Any, indicator: Any, *rest: Any) -> Any:
        """(setf (get symbol indicator [default]) value)."""
        if not 1 <= len(rest) <= 2:
            raise lisp_error("E102", "`(setf get)` takes a symbol, an indicator, an optional default and a value", "PROGRAM-ERROR")
        value = rest[-1]
        for cell in plist_cells(plist_of("(setf get)", sym)):
            if cell.car is indicator:
                cell.cdr.car = value
                return value
        interp.alloc(2)
        interp.plists[sym] = Cons(indicator, Cons(value, interp.plists.get(sym, NIL)))
        return value

    def remprop(sym: Any, indicator: Any) -> Any:
        previous = None
        for cell in plist_cells(plist_of("remprop", sym)):
            if cell.car is indicator:
                if previous is None:
                    interp.plists[sym] = cell.cdr.cdr
                else:
                    previous.cdr.cdr = cell.cdr.cdr
                return cell
            previous = cell
        return NIL

    def set_symbol_plist(sym: Any, plist: Any) -> Any:
        interp.plists[need_symbol("(setf symbol-plist)", 1, sym)] = plist
        return plist

    def copy_symbol(sym: Any, copy_props: Any = NIL) -> Any:
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

    def makunbound(sym: Any) -> Any:
        need_symbol("makunbound", 1, sym)
        interp.check_assignable(sym)
        interp.values.pop(sym, None)
        return sym

    def fmakunbound(name: Any) -> Any:
        if type(name) is Cons and type(name.cdr) is Cons:
            interp.setf_functions.pop(name.cdr.car, None)
            return name
        need_symbol("fmakunbound", 1, name)
        interp.check_redefinition(name, "function")
        interp.functions.pop(name, None)
        interp.macros.pop(name, None)
        return name

    def constant_form(form: Any) -> bool:
        """SBCL's answer: constants, quoted forms, if/progn/the/block of constant forms, and
        calls of functions it folds (pure ones returning no fresh object) on constant forms."""
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
            return len(args) == 2 and constant_form(args[1])
        if head.name == "BLOCK":
            return bool(args) and all(constant_form(a) for a in args[1:])
        if head.name in ("IF", "PROGN"):
            return all(constant_form(a) for a in args)
        return head.name in FOLDABLE and type(interp.functions.get(head)) is Builtin and all(constant_form(a) for a in args)

    def constantp(form: Any, env: Any = NIL) -> Any:
        return lbool(constant_form(form))

    add("get", get)
    add("%put", put)
    add("remprop", remprop)
    add("symbol-plist", lambda sym: plist_of("symbol-plist", sym))
    add("%set-symbol-plist", set_symbol_plist)
    add("copy-symbol", copy_symbol)
    add("makunbound", makunbound)
    add("fmakunbound", fmakunbound)
    add("constantp", constantp)
    add("symbol-package", lambda sym: (need_symbol("symbol-package", 1, sym), NIL)[1])

    # -- types ------------------------------------------------------------------------------------------------
    def p_deftype(name: Any, expander: Any) -> Any:
        need_symbol("deftype", 1, name)
        interp.types.deftypes[name] = expander
        interp.types.cache.clear()
        return name

    add("subtypep", lambda a, b, env=NIL: subtypep_values(interp.types, a, b))
    add("%deftype", p_deftype)

    # -- structures ----------------------------------------------------------------------------------------
    def p_defstruct(name: Any, slots: Any, include: Any) -> Any:
        need_symbol("defstruct", 1, name)
        parent = interp.structs.get(include) if include is not NIL else None
        if include is not NIL and parent is None:
            raise lisp_error("E103", f"defstruct: :include names `{short(include)}`, which is not a structure", "TYPE-ERROR")
        interp.structs[name] = StructType(name, list_items("defstruct", 2, slots), parent)
        return name

    def need_struct_type(fn: str, name: Any) -> StructType:
        stype = interp.structs.get(name)
        if stype is None:
            raise lisp_error("E103", f"`{fn}`: `{short(name)}` is not a structure type", "TYPE-ERROR")
        return stype

    def make_struct(name: Any, *values: Any) -> Any:
        return StructInstance(need_struct_type("make-struct", name), list(values))

    def struct_ref(obj: Any, name: Any, index: Any) -> Any:
        stype = need_struct_type("struct accessor", name)
        if type(obj) is not StructInstance or not obj.stype.isa(stype):
            raise type_error(f"{name.name.lower()}-{stype.slots[index].name.lower()}", 1, f"a {name.name.lower()}", obj)
        return obj.values[index]

    def struct_set(obj: Any, name: Any, index: Any, value: Any) -> Any:
        struct_ref(obj, name, index)
        obj.values[index] = value
        return value

    def struct_p(obj: Any, name: Any) -> Any:
        stype = need_struct_type("struct predicate", name)
        return lbool(type(obj) is StructInstance and obj.stype.isa(stype))

    def copy_structure(obj: Any) -> Any:
        if type(obj) is not StructInstance:
            raise type_error("copy-structure", 1, "a structure", obj)
        return StructInstance(obj.stype, list(obj.values))

    def struct_slots(name: Any) -> Any:
        from .builtins import to_lisp_list

        return to_lisp_list(need_struct_type("defstruct", name).slots)

    def set_struct_printer(name: Any, fn: Any, print_object: Any) -> Any:
        need_struct_type("defstruct", name).printer = (fn, print_object is not NIL)
        return name

    add("%defstruct", p_defstruct)
    add("%set-struct-printer", set_struct_printer)
    add("%make-struct", make_struct)
    add("%struct-ref", struct_ref)
    add("%struct-set", struct_set)
    add("%struct-p", struct_p)
    add("%struct-slots", struct_slots)
    add("copy-structure", copy_structure)

    # -- misc ---------------------------------------------------------------------------------------------------
    add("%gensym-list", lambda n: _gensyms(interp, n))
    add("%name=", lambda x, name: lbool(type(x) is Symbol and x.name == name))
    add("%list-length-or-nil", lambda x: _proper_length(x))
    add("%macro-p", lambda s: lbool(type(s) is Symbol and s in interp.macros))
    # loop's parser asks this of every token: (%loop-kw-p x "FOR" "AS" ...)
    add("%loop-kw-p", lambda x, *names: lbool(type(x) is Symbol and x is not NIL and x.name in names))
    add("%loop-keyword", lambda x: interp.kw(x.name) if type(x) is Symbol and x is not NIL else NIL)
    add("%tree-has-name", lambda tree, name: lbool(_tree_has_name(interp, tree, need_string("%tree-has-name", 2, name))))


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


def _sxhash(x: Any) -> int:
    """A non-negative fixnum, equal for equal objects, and the same in every process (Python's
    own string hash changes from run to run, and a file's result must not)."""
    import hashlib

    digest = hashlib.blake2b(_sxhash_key(x, [64]).encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**62 - 1)


def _sxhash_key(x: Any, budget: list[int]) -> str:
    """Text that equal objects share: the structure of conses to a bounded size, the contents
    of strings, numbers, characters and symbols; any other object only its type (equal on it
    is eq)."""
    budget[0] -= 1
    t = type(x)
    if budget[0] < 0:
        return "..."
    if t is Cons:
        return f"({_sxhash_key(x.car, budget)} . {_sxhash_key(x.cdr, budget)})"
    if t is str:
        return "s" + x
    if t is Symbol:
        return f"y{x.package}:{x.name}"
    if t in (int, float, Fraction):
        return f"n{t.__name__}{x!r}"
    if t is Char:
        return "c" + x.ch
    if t is BitVector:
        return "b" + "".join("1" if b else "0" for b in x)  # equal looks into bit vectors
    if t is list:
        return "v"  # vectors are equal only when eq
    return "o" + t.__name__


def _proper_length(x: Any) -> Any:
    cells, end = list_cells(x)
    return len(cells) if end is NIL else NIL
