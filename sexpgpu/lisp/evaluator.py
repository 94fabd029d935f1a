"""The evaluator: special forms, function application, macros, limits.

Everything else (defun, let-style helpers, loop, setf, defstruct ...) is a macro or function
in prelude.lisp, or a builtin in builtins.py.
"""

from __future__ import annotations

import difflib
import sys
import threading
from importlib import resources
from typing import Any, Callable, Optional

from pydantic import BaseModel, PositiveInt

from .conditions import LimitExceeded, LispError, condition_isa, lisp_error
from .lambda_list import LambdaList, parse_lambda_list
from .objects import (
    Builtin,
    Closure,
    Env,
    GoSignal,
    Macro,
    ReturnFromSignal,
    StructType,
    SymbolMacro,
    ThrowSignal,
    function_name,
)
from .printer import prin1_to_string
from .reader import Reader
from .types import (
    NIL,
    QUASIQUOTE,
    QUOTE,
    UNQUOTE,
    UNQUOTE_SPLICING,
    T,
    Cons,
    Loc,
    MultipleValues,
    Symbol,
    SymbolTable,
)

SpecialForm = Callable[[Cons, Env], Any]


class Limits(BaseModel):
    """Evaluation limits for one compile. Exceeding one is a diagnostic (L001-L003)."""

    steps: PositiveInt = 1_000_000
    depth: PositiveInt = 10_000
    alloc: PositiveInt = 10_000_000


SYSTEM_FILES = {"<prelude>"}
LIBRARY_FILES = ("<prelude>", "sexpgpu/lib/")  # where a diagnostic also names the user's call


def _system_loc(loc: Optional[Loc]) -> bool:
    """Positions inside the prelude are never shown: errors point at the user's code."""
    return loc is None or loc.file in SYSTEM_FILES


def _annotate(exc: LispError | LimitExceeded, loc: Optional[Loc]) -> None:
    if exc.loc is None and not _system_loc(loc):
        exc.loc = loc


MARKER_SYMBOLS = (
    "OTHERWISE DECLARE IGNORE IGNORABLE SPECIAL OPTIMIZE TYPE INLINE NOTINLINE DYNAMIC-EXTENT FTYPE "
    "&OPTIONAL &REST &BODY &KEY &ALLOW-OTHER-KEYS &AUX &WHOLE &ENVIRONMENT "
    "INTEGER FIXNUM BIGNUM NUMBER REAL RATIONAL RATIO FLOAT DOUBLE-FLOAT SINGLE-FLOAT STRING SYMBOL "
    "KEYWORD LIST CONS NULL VECTOR ARRAY SIMPLE-VECTOR SEQUENCE CHARACTER HASH-TABLE ATOM BOOLEAN "
    "SIMPLE-STRING STANDARD-CHAR BIT MEMBER EQL SATISFIES OR AND NOT COMPILED-FUNCTION "
    "ERROR SIMPLE-ERROR TYPE-ERROR CONDITION WARNING SERIOUS-CONDITION PROGRAM-ERROR CONTROL-ERROR "
    "CELL-ERROR UNBOUND-VARIABLE UNDEFINED-FUNCTION ARITHMETIC-ERROR DIVISION-BY-ZERO SIMPLE-WARNING "
    "STYLE-WARNING PARSE-ERROR SIMPLE-TYPE-ERROR "
    "SETF :COMPILE-TOPLEVEL :LOAD-TOPLEVEL :EXECUTE COMPILE LOAD EVAL"
).split()


class Interpreter:
    """One compile's Lisp world: the base library (builtins and prelude) and every module
    loaded since. Not shared between compiles."""

    def __init__(self, limits: Optional[Limits] = None) -> None:
        self.limits = limits or Limits()
        self.base = SymbolTable("")
        self.table = self.base
        self.functions: dict[Symbol, Any] = {}
        self.macros: dict[Symbol, Macro] = {}
        self.values: dict[Symbol, Any] = {T: T, NIL: NIL}
        self.specials: set[Symbol] = set()
        self.constants: set[Symbol] = {T, NIL}
        self.setf_functions: dict[Symbol, Any] = {}
        self.structs: dict[Symbol, StructType] = {}
        self.gensym_counter = 0
        self.steps_left = self.limits.steps
        self.alloc_left = self.limits.alloc
        self.depth = 0
        self.warnings: list[tuple[str, Optional[Loc]]] = []
        self.catch_tags: list[Any] = []
        self.current_loc: Optional[Loc] = None
        self.call_loc: Optional[Loc] = None  # the form of the latest function call (staging stamps it on IR nodes)
        self.user_loc: Optional[Loc] = None  # the latest call in the user's own files (not the standard library)
        self.non_boolean_types: tuple[type, ...] = ()
        self.truth_error: Callable[[Any], LispError] | None = None
        self.require_hook: Callable[[Cons, Env], Any] | None = None
        # the host's own objects that can be called like functions (the compiler's models): a
        # callable for such an object, or None for anything else
        self.function_hook: Callable[[Any], Any] | None = None
        # called with each top-level form of the file read into hook_table (contract order)
        self.toplevel_hook: Callable[[Any, Loc], None] | None = None
        self.hook_table: Optional[SymbolTable] = None
        # where print, princ, format t ... write; the CLI points it at a stream
        self.output: list[str] = []
        self.write: Callable[[str], Any] = self.output.append
        self._expansions: dict[int, tuple[Any, Any]] = {}
        self._lambda_lists: dict[int, tuple[Any, LambdaList]] = {}
        self._load_time_values: dict[int, tuple[Any, Any]] = {}
        self.special_forms: dict[Symbol, SpecialForm] = {}
        self._install_special_forms()
        from .builtins import install_builtins

        install_builtins(self)
        self.load_prelude()

    # -- symbols -------------------------------------------------------------------------
    def sym(self, name: str) -> Symbol:
        return self.base.intern(name.upper())

    def kw(self, name: str) -> Symbol:
        return self.base.keyword(name.upper())

    def load_prelude(self) -> None:
        """Load prelude.lisp under the default limits, then give the user's file a full
        budget of its own: the prelude's cost never counts against it."""
        text = resources.files("sexpgpu.lisp").joinpath("prelude.lisp").read_text(encoding="utf-8")
        user_limits = self.limits
        self.limits = Limits()
        self.steps_left, self.alloc_left = self.limits.steps, self.limits.alloc
        try:
            self.load_text(text, "<prelude>", self.base)
        finally:
            self.limits = user_limits
            self.steps_left, self.alloc_left = user_limits.steps, user_limits.alloc
        self.publish_base()

    def publish_base(self) -> None:
        """Make the base library's defined names visible to every module."""
        exported = self.base.exported
        for name in MARKER_SYMBOLS:
            if name.startswith(":"):
                continue
            exported[name] = self.base.intern(name)
        for table in (self.functions, self.macros, self.special_forms, self.values):
            for sym in table:
                if isinstance(sym, Symbol) and sym.package == "" and not sym.name.startswith("%"):
                    exported[sym.name] = sym

    def load_text(self, text: str, file: str, table: SymbolTable, env: Optional[Env] = None) -> Any:
        """Read and evaluate a file's forms one by one (so `require` affects later reads)."""
        previous = self.table
        self.table = table
        try:
            reader = Reader(text, file, table)
            result: Any = NIL
            while (read := reader.read_next()) is not None:
                if self.toplevel_hook is not None and table is self.hook_table:
                    self.toplevel_hook(read.form, read.loc)
                result = self.eval_toplevel(read.form, read.loc, env)
            return result
        finally:
            self.table = previous

    def eval_toplevel(self, form: Any, loc: Loc, env: Optional[Env] = None) -> Any:
        self.current_loc = loc
        try:
            return self.ev(form, env or Env())
        except (LispError, LimitExceeded) as exc:
            _annotate(exc, loc)
            if isinstance(exc, LispError) and exc.loc is not None and exc.loc != loc and not _system_loc(loc):
                exc.notes.append(f"while evaluating the top-level form at {loc}")
            raise
        except RecursionError:
            exc2 = LimitExceeded("L002", f"evaluation depth limit exceeded (the Python stack ran out before {self.limits.depth} calls)")
            _annotate(exc2, loc)
            raise exc2 from None
        except (ReturnFromSignal, GoSignal):
            raise lisp_error("E106", "return-from or go to a block or tag that is no longer active", "CONTROL-ERROR") from None

    # -- evaluation ----------------------------------------------------------------------
    def ev(self, x: Any, env: Env) -> Any:
        t = type(x)
        if t is Symbol:
            return self.var_value(x, env)
        if t is not Cons:
            return x
        self.steps_left -= 1
        if self.steps_left < 0:
            raise LimitExceeded("L001", f"evaluation step budget of {self.limits.steps} steps exhausted; is there an endless loop?")
        head = x.car
        try:
            if type(head) is Symbol:
                special = self.special_forms.get(head)
                if special is not None:
                    return special(x, env)
                fn = self.function_for_call(head, env)
                if type(fn) is Macro:
                    return self.ev_macro_call(fn, x, env)
            elif type(head) is Cons and head.car is self.s_lambda:
                fn = self.make_closure(head, env, NIL)
            else:
                raise lisp_error("E101", f"illegal function call: {prin1_to_string(head)} is not a function name", "UNDEFINED-FUNCTION")
            args = []
            cell = x.cdr
            while type(cell) is Cons:
                try:
                    v = self.ev(cell.car, env)
                except LispError as exc:
                    _annotate(exc, cell.loc)
                    raise
                if type(v) is MultipleValues:
                    v = v[0] if v else NIL
                args.append(v)
                cell = cell.cdr
            if cell is not NIL:
                raise lisp_error("E105", f"a function call cannot be a dotted list: {prin1_to_string(x)}", "PROGRAM-ERROR")
            loc = x.loc
            if loc is not None:
                self.call_loc = loc
                if not loc.file.startswith(LIBRARY_FILES):
                    self.user_loc = loc
            return self.apply(fn, args)
        except (LispError, LimitExceeded) as exc:
            _annotate(exc, x.loc)
            raise

    def ev1(self, x: Any, env: Env) -> Any:
        v = self.ev(x, env)
        if type(v) is MultipleValues:
            return v[0] if v else NIL
        return v

    def ev_macro_call(self, macro: Macro, form: Cons, env: Env) -> Any:
        expansion = self.expand(macro, form, env)
        try:
            return self.ev(expansion, env)
        except (LispError, LimitExceeded) as exc:
            if exc.loc is None and not _system_loc(form.loc):
                exc.loc = form.loc
                exc.macro = exc.macro or prin1_to_string(macro.name)
            raise

    def expand(self, macro: Macro, form: Cons, env: Env) -> Any:
        cacheable = self.macros.get(form.car) is macro
        if cacheable:
            hit = self._expansions.get(id(form))
            if hit is not None and hit[0] is form:
                return hit[1]
        try:
            expansion = self.call_macro(macro, form)
        except (LispError, LimitExceeded) as exc:
            if exc.loc is None and not _system_loc(form.loc):
                exc.loc = form.loc
                exc.macro = exc.macro or prin1_to_string(macro.name)
            raise
        if cacheable:
            self._expansions[id(form)] = (form, expansion)
        return expansion

    def call_macro(self, macro: Macro, form: Cons) -> Any:
        env = Env(macro.env)
        self.depth += 1
        try:
            if self.depth > self.limits.depth:
                raise LimitExceeded("L002", f"evaluation depth limit of {self.limits.depth} nested calls exceeded in macro {prin1_to_string(macro.name)}")
            if macro.params.environment is not None:
                env.vars[macro.params.environment] = NIL
            self.destructure(macro.params, form.cdr, env, macro.name, whole=form)
            return self.progn(macro.body, env)
        finally:
            self.depth -= 1

    def progn(self, body: Any, env: Env) -> Any:
        result: Any = NIL
        while type(body) is Cons:
            result = self.ev(body.car, env)
            body = body.cdr
        return result

    # -- variables -----------------------------------------------------------------------
    def var_value(self, sym: Symbol, env: Env) -> Any:
        e: Optional[Env] = env
        while e is not None:
            vars_ = e.vars
            if sym in vars_:
                v = vars_[sym]
                if type(v) is SymbolMacro:
                    return self.ev(v.expansion, env)
                return v
            e = e.parent
        try:
            return self.values[sym]
        except KeyError:
            pass
        if sym.package == "KEYWORD":
            return sym
        raise lisp_error("E100", f"unbound variable `{prin1_to_string(sym)}`{self.suggest(sym, env)}", "UNBOUND-VARIABLE", sym)

    def suggest(self, sym: Symbol, env: Env) -> str:
        names: set[str] = set()
        e: Optional[Env] = env
        while e is not None:
            names.update(k.name for k in e.vars if isinstance(k, Symbol))
            e = e.parent
        names.update(k.name for k in self.values)
        close = difflib.get_close_matches(sym.name, sorted(names), n=1, cutoff=0.75)
        return f"; did you mean `{close[0].lower()}`?" if close else ""

    def set_var(self, sym: Symbol, value: Any, env: Env) -> Any:
        e: Optional[Env] = env
        while e is not None:
            if sym in e.vars:
                current = e.vars[sym]
                if type(current) is SymbolMacro:
                    setf = Cons(self.sym("SETF"), Cons(current.expansion, Cons(Cons(QUOTE, Cons(value, NIL)), NIL)))
                    return self.ev(setf, env)
                e.vars[sym] = value
                return value
            e = e.parent
        self.check_assignable(sym)
        self.values[sym] = value
        return value

    def check_assignable(self, sym: Symbol) -> None:
        if sym in self.constants or sym.package == "KEYWORD":
            raise lisp_error("E107", f"`{prin1_to_string(sym)}` is a constant and cannot be assigned or bound", "PROGRAM-ERROR")

    def bind(self, env: Env, sym: Symbol, value: Any, saved: list[tuple[Symbol, Any]]) -> None:
        """Bind SYM in ENV, or dynamically if it is special (saving the old value)."""
        if sym in self.specials:
            saved.append((sym, self.values.get(sym, _UNBOUND)))
            self.values[sym] = value
        else:
            if sym in self.constants or sym.package == "KEYWORD":
                self.check_assignable(sym)
            env.vars[sym] = value

    def restore(self, saved: list[tuple[Symbol, Any]]) -> None:
        for sym, old in reversed(saved):
            if old is _UNBOUND:
                self.values.pop(sym, None)
            else:
                self.values[sym] = old

    # -- functions -----------------------------------------------------------------------
    def function_for_call(self, sym: Symbol, env: Env) -> Any:
        e = env.fenv
        while e is not None:
            funs = e.funs
            if funs is not None and sym in funs:
                return funs[sym]
            e = e.parent.fenv if e.parent is not None else None
        fn = self.macros.get(sym)
        if fn is not None:
            return fn
        fn = self.functions.get(sym)
        if fn is not None:
            return fn
        raise self.undefined_function(sym)

    def undefined_function(self, sym: Symbol) -> LispError:
        if sym in self.special_forms:
            return lisp_error("E103", f"`{prin1_to_string(sym)}` is a special form, not a function", "UNDEFINED-FUNCTION", sym)
        names = sorted(({s.name for s in self.functions} | {s.name for s in self.macros}) - {sym.name})
        names = [n for n in names if not n.startswith("%")]
        close = difflib.get_close_matches(sym.name, names, n=1, cutoff=0.8)
        hint = f"; did you mean `{close[0].lower()}`?" if close else ""
        return lisp_error("E101", f"undefined function `{prin1_to_string(sym)}`{hint}", "UNDEFINED-FUNCTION", sym)

    def function_value(self, designator: Any, env: Optional[Env] = None) -> Any:
        """A function designator (symbol or function) as a callable object."""
        if type(designator) is Symbol:
            if env is not None:
                fn = self.function_for_call(designator, env)
            else:
                fn = self.functions.get(designator)
                if fn is None:
                    if designator in self.macros:
                        raise lisp_error("E103", f"`{prin1_to_string(designator)}` is a macro, not a function", "TYPE-ERROR")
                    raise self.undefined_function(designator)
            if type(fn) is Macro or (designator in self.special_forms):
                raise lisp_error("E103", f"`{prin1_to_string(designator)}` is a macro or special form, not a function", "TYPE-ERROR")
            return fn
        if type(designator) in (Closure, Builtin):
            return designator
        if self.function_hook is not None:
            fn = self.function_hook(designator)
            if fn is not None:
                return fn
        raise lisp_error("E103", f"{prin1_to_string(designator, self.print_other)} is not a function", "TYPE-ERROR", designator)

    def call(self, designator: Any, *args: Any) -> Any:
        """Call a function designator from Python; returns the primary value."""
        fn = designator if type(designator) in (Closure, Builtin) else self.function_value(designator)
        v = self.apply(fn, list(args))
        if type(v) is MultipleValues:
            return v[0] if v else NIL
        return v

    def apply(self, fn: Any, args: list[Any]) -> Any:
        t = type(fn)
        if t is Builtin:
            n = len(args)
            if n < fn.min_args or (fn.max_args is not None and n > fn.max_args):
                raise self.arity_error(fn.name, fn.min_args, fn.max_args, n)
            try:
                return fn.fn(*args)
            except OverflowError:
                raise lisp_error("E108", f"`{fn.name}`: floating-point overflow (a number too large for a double)", "FLOATING-POINT-OVERFLOW") from None
        if t is Closure:
            return self.call_closure(fn, args)
        return self.apply(self.function_value(fn), args)

    def arity_error(self, name: str, lo: int, hi: Optional[int], got: int) -> LispError:
        if hi is None:
            want = f"at least {lo}"
        elif lo == hi:
            want = f"{lo}"
        else:
            want = f"{lo} to {hi}"
        plural = "" if want == "1" else "s"
        return lisp_error("E102", f"`{name}` takes {want} argument{plural}, got {got}", "PROGRAM-ERROR")

    def call_closure(self, fn: Closure, args: list[Any]) -> Any:
        self.depth += 1
        try:
            if self.depth > self.limits.depth:
                raise LimitExceeded("L002", f"evaluation depth limit of {self.limits.depth} nested calls exceeded in {function_name(fn)}; is the recursion unbounded?")
            params = fn.params
            if fn.simple:
                required = params.required
                if len(args) != len(required):
                    raise self.arity_error(function_name(fn), len(required), len(required), len(args))
                if not self.specials or not any(p in self.specials for p in required):
                    return self.progn(fn.body, Env(fn.env, dict(zip(required, args))))
            env = Env(fn.env)
            saved: list[tuple[Symbol, Any]] = []
            try:
                self.bind_args(params, args, env, fn.name, saved)
                return self.progn(fn.body, env)
            finally:
                if saved:
                    self.restore(saved)
        finally:
            self.depth -= 1

    def bind_args(self, ll: LambdaList, args: list[Any], env: Env, name: Any, saved: list[tuple[Symbol, Any]]) -> None:
        """Bind an ordinary lambda list to the arguments of a call."""
        n = len(args)
        nreq = len(ll.required)
        if n < nreq or (ll.max_args is not None and n > ll.max_args):
            raise self.arity_error(function_name_of(name), nreq, ll.max_args, n)
        self.bind_parameters(ll, args, args[nreq + len(ll.optional) :], True, env, name, saved)

    def bind_parameters(self, ll: LambdaList, given: list[Any], more: Any, from_call: bool, env: Env, name: Any, saved: list[tuple[Symbol, Any]]) -> None:
        """The binding that calls and destructuring share. GIVEN starts with the positional
        values (the required ones, then the optional ones supplied); MORE is what follows them, for
        &rest and &key: the call's remaining arguments as a Python list when FROM_CALL (&rest
        gets a fresh list), else the rest of the destructured list itself (&rest shares it)."""
        for pattern, value in zip(ll.required, given):
            self.bind_pattern(pattern, value, env, name, saved)
        i = len(ll.required)
        for opt in ll.optional:
            if i < len(given):
                self.bind_pattern(opt.pattern, given[i], env, name, saved)
                supplied = T
            else:
                self.bind_pattern(opt.pattern, self.ev1(opt.default, env), env, name, saved)
                supplied = NIL
            if opt.supplied is not None:
                self.bind(env, opt.supplied, supplied, saved)
            i += 1
        if ll.rest is not None:
            if from_call:
                self.alloc(len(more))
                more_list = _pylist_to_lisp(more)
            else:
                more_list = more
            self.bind_pattern(ll.rest, more_list, env, name, saved)
        if ll.has_key:
            self.bind_keys(ll, more if from_call else list(_iter_list(more)), env, name, saved)
        for var, form in ll.aux:
            self.bind(env, var, self.ev1(form, env), saved)

    def bind_keys(self, ll: LambdaList, rest: list[Any], env: Env, name: Any, saved: list[tuple[Symbol, Any]]) -> None:
        if len(rest) % 2:
            raise lisp_error("E102", f"`{function_name_of(name)}`: odd number of keyword arguments {prin1_to_string(_pylist_to_lisp(rest))}", "PROGRAM-ERROR")
        given: dict[Symbol, Any] = {}
        for k, v in zip(rest[::2], rest[1::2]):
            if type(k) is not Symbol:
                raise lisp_error("E102", f"`{function_name_of(name)}`: {prin1_to_string(k)} is not a keyword", "PROGRAM-ERROR")
            given.setdefault(k, v)
        allow = ll.allow_other_keys or (given.get(self.kw("allow-other-keys"), NIL) is not NIL)
        if not allow:
            known = {kp.keyword for kp in ll.keys}
            for k in given:
                if k not in known and k.name != "ALLOW-OTHER-KEYS":
                    expected = " ".join(prin1_to_string(kp.keyword) for kp in ll.keys) or "none"
                    raise lisp_error("E102", f"`{function_name_of(name)}`: unknown keyword argument {prin1_to_string(k)}; expected one of: {expected}", "PROGRAM-ERROR")
        for kp in ll.keys:
            if kp.keyword in given:
                self.bind_pattern(kp.pattern, given[kp.keyword], env, name, saved)
                supplied = T
            else:
                self.bind_pattern(kp.pattern, self.ev1(kp.default, env), env, name, saved)
                supplied = NIL
            if kp.supplied is not None:
                self.bind(env, kp.supplied, supplied, saved)

    def bind_pattern(self, pattern: Any, value: Any, env: Env, name: Any, saved: list[tuple[Symbol, Any]]) -> None:
        if type(pattern) is Symbol:
            self.bind(env, pattern, value, saved)
        else:
            self.destructure(pattern, value, env, name, saved=saved)

    def destructure(self, ll: LambdaList, value: Any, env: Env, name: Any, whole: Any = None, saved: Optional[list[tuple[Symbol, Any]]] = None) -> None:
        """Bind a macro/destructuring lambda list to a Lisp list."""
        saved = saved if saved is not None else []
        if ll.whole is not None:
            self.bind_pattern(ll.whole, whole if whole is not None else value, env, name, saved)
        items: list[Any] = []
        cell = value
        limit = len(ll.required) + len(ll.optional)
        while type(cell) is Cons and len(items) < limit:
            items.append(cell.car)
            cell = cell.cdr
        if cell is not NIL and type(cell) is not Cons and ll.rest is None:
            raise lisp_error("E105", f"{prin1_to_string(name)}: cannot destructure {prin1_to_string(value)} against the lambda list (dotted list)", "PROGRAM-ERROR")
        if len(items) < len(ll.required):
            raise lisp_error("E105", f"`{prin1_to_string(name)}`: expected at least {len(ll.required)} argument{'s' if len(ll.required) != 1 else ''} in {prin1_to_string(value)}", "PROGRAM-ERROR")
        if ll.rest is None and not ll.has_key and cell is not NIL:
            raise lisp_error("E105", f"`{prin1_to_string(name)}`: too many elements in {prin1_to_string(value)}, expected at most {limit}", "PROGRAM-ERROR")
        self.bind_parameters(ll, items, cell, False, env, name, saved)

    def lambda_list(self, spec: Any, macro: bool = False) -> LambdaList:
        key = id(spec)
        hit = self._lambda_lists.get(key)
        if hit is not None and hit[0] is spec and (macro or not hit[1].whole):
            return hit[1]
        ll = parse_lambda_list(spec, self.base.keyword, macro)
        if type(spec) is Cons:
            self._lambda_lists[key] = (spec, ll)
        return ll

    def make_closure(self, lambda_form: Cons, env: Env, name: Any) -> Closure:
        rest = lambda_form.cdr
        if type(rest) is not Cons:
            raise lisp_error("E105", "lambda needs a lambda list: (lambda (args...) body...)", "PROGRAM-ERROR")
        return Closure(name, self.lambda_list(rest.car), skip_declarations(rest.cdr), env)

    # -- allocation ----------------------------------------------------------------------
    def alloc(self, n: int) -> None:
        self.alloc_left -= n
        if self.alloc_left < 0:
            raise LimitExceeded("L003", f"allocation limit of {self.limits.alloc} cells exceeded; is a list or string growing without bound?")

    # -- truth -----------------------------------------------------------------------------
    def truth(self, v: Any) -> bool:
        if self.non_boolean_types and type(v) in self.non_boolean_types and self.truth_error is not None:
            raise self.truth_error(v)
        return v is not NIL

    def gensym(self, prefix: str = "G") -> Symbol:
        self.gensym_counter += 1
        return Symbol(f"{prefix}{self.gensym_counter}", None)

    def print_other(self, x: Any, printer: Any) -> str:
        from .builtins import print_object

        return print_object(self, x, printer)

    # -- special forms ---------------------------------------------------------------------
    def _install_special_forms(self) -> None:
        self.s_lambda = self.sym("LAMBDA")
        self.s_declare = self.sym("DECLARE")
        self.s_setf = self.sym("SETF")
        table: dict[str, SpecialForm] = {
            "QUOTE": self.sf_quote,
            "FUNCTION": self.sf_function,
            "IF": self.sf_if,
            "PROGN": self.sf_progn,
            "LET": self.sf_let,
            "LET*": self.sf_let_star,
            "FLET": self.sf_flet,
            "LABELS": self.sf_labels,
            "MACROLET": self.sf_macrolet,
            "SYMBOL-MACROLET": self.sf_symbol_macrolet,
            "SETQ": self.sf_setq,
            "LAMBDA": self.sf_lambda,
            "BLOCK": self.sf_block,
            "RETURN-FROM": self.sf_return_from,
            "TAGBODY": self.sf_tagbody,
            "GO": self.sf_go,
            "CATCH": self.sf_catch,
            "THROW": self.sf_throw,
            "UNWIND-PROTECT": self.sf_unwind_protect,
            "THE": self.sf_the,
            "LOCALLY": self.sf_locally,
            "MULTIPLE-VALUE-CALL": self.sf_multiple_value_call,
            "MULTIPLE-VALUE-PROG1": self.sf_multiple_value_prog1,
            "EVAL-WHEN": self.sf_eval_when,
            "LOAD-TIME-VALUE": self.sf_load_time_value,
            "DECLARE": self.sf_declare,
            "QUASIQUOTE": self.sf_quasiquote,
            "UNQUOTE": self.sf_unquote,
            "UNQUOTE-SPLICING": self.sf_unquote,
            "REQUIRE": self.sf_require,
            "HANDLER-CASE": self.sf_handler_case,
            "%DEFMACRO": self.sf_defmacro,
            "DESTRUCTURING-BIND": self.sf_destructuring_bind,
        }
        for name, fn in table.items():
            self.special_forms[self.sym(name)] = fn

    def args_of(self, form: Cons, lo: int, hi: Optional[int], usage: str) -> list[Any]:
        items: list[Any] = []
        cell = form.cdr
        while type(cell) is Cons:
            items.append(cell.car)
            cell = cell.cdr
        if cell is not NIL or len(items) < lo or (hi is not None and len(items) > hi):
            raise lisp_error("E105", f"malformed {prin1_to_string(form.car)}: expected {usage}", "PROGRAM-ERROR")
        return items

    def sf_quote(self, form: Cons, env: Env) -> Any:
        return self.args_of(form, 1, 1, "(quote object)")[0]

    def sf_function(self, form: Cons, env: Env) -> Any:
        (name,) = self.args_of(form, 1, 1, "(function name) or #'name")
        if type(name) is Cons and name.car is self.s_lambda:
            return self.make_closure(name, env, NIL)
        if type(name) is Cons and name.car is self.s_setf and type(name.cdr) is Cons:
            fn = self.setf_functions.get(name.cdr.car)
            if fn is None:
                raise self.undefined_function(name.cdr.car)
            return fn
        if type(name) is not Symbol:
            raise lisp_error("E105", f"function: {prin1_to_string(name)} is not a function name", "PROGRAM-ERROR")
        return self.function_value(name, env)

    def sf_if(self, form: Cons, env: Env) -> Any:
        rest = form.cdr
        if type(rest) is not Cons or type(rest.cdr) is not Cons or (type(rest.cdr.cdr) is Cons and rest.cdr.cdr.cdr is not NIL):
            raise lisp_error("E105", "malformed if: expected (if test then [else])", "PROGRAM-ERROR")
        if self.truth(self.ev1(rest.car, env)):
            return self.ev(rest.cdr.car, env)
        tail = rest.cdr.cdr
        return self.ev(tail.car, env) if type(tail) is Cons else NIL

    def sf_progn(self, form: Cons, env: Env) -> Any:
        return self.progn(form.cdr, env)

    def parse_bindings(self, form: Cons) -> tuple[list[tuple[Symbol, Any]], Any]:
        rest = form.cdr
        if type(rest) is not Cons or (rest.car is not NIL and type(rest.car) is not Cons):
            raise lisp_error("E105", f"malformed {prin1_to_string(form.car)}: expected ({prin1_to_string(form.car)} ((var value)...) body...)", "PROGRAM-ERROR")
        bindings: list[tuple[Symbol, Any]] = []
        for b in _iter_list(rest.car):
            if type(b) is Symbol:
                bindings.append((b, NIL))
            elif type(b) is Cons and type(b.car) is Symbol and (b.cdr is NIL or (type(b.cdr) is Cons and b.cdr.cdr is NIL)):
                bindings.append((b.car, b.cdr.car if type(b.cdr) is Cons else NIL))
            else:
                raise lisp_error("E105", f"malformed binding {prin1_to_string(b)} in {prin1_to_string(form.car)}: expected var or (var value)", "PROGRAM-ERROR")
            if bindings[-1][0] is NIL or bindings[-1][0] is T or bindings[-1][0].package == "KEYWORD":
                self.check_assignable(bindings[-1][0])
        return bindings, skip_declarations(rest.cdr)

    def sf_let(self, form: Cons, env: Env) -> Any:
        bindings, body = self.parse_bindings(form)
        values = [self.ev1(init, env) for _, init in bindings]
        new = Env(env)
        saved: list[tuple[Symbol, Any]] = []
        try:
            for (var, _), value in zip(bindings, values):
                self.bind(new, var, value, saved)
            return self.progn(body, new)
        finally:
            if saved:
                self.restore(saved)

    def sf_let_star(self, form: Cons, env: Env) -> Any:
        bindings, body = self.parse_bindings(form)
        new = Env(env)
        saved: list[tuple[Symbol, Any]] = []
        try:
            for var, init in bindings:
                value = self.ev1(init, new)
                if var in new.vars:
                    new = Env(new)
                self.bind(new, var, value, saved)
            return self.progn(body, new)
        finally:
            if saved:
                self.restore(saved)

    def function_definitions(self, form: Cons) -> tuple[list[tuple[Symbol, Cons]], Any]:
        rest = form.cdr
        if type(rest) is not Cons or (rest.car is not NIL and type(rest.car) is not Cons):
            raise lisp_error("E105", f"malformed {prin1_to_string(form.car)}: expected ({prin1_to_string(form.car)} ((name (args) body...)...) body...)", "PROGRAM-ERROR")
        defs: list[tuple[Symbol, Cons]] = []
        for d in _iter_list(rest.car):
            if type(d) is not Cons or type(d.car) is not Symbol or type(d.cdr) is not Cons:
                raise lisp_error("E105", f"malformed definition {prin1_to_string(d)} in {prin1_to_string(form.car)}: expected (name (args) body...)", "PROGRAM-ERROR")
            defs.append((d.car, d.cdr))
        return defs, skip_declarations(rest.cdr)

    def local_closure(self, name: Symbol, spec: Cons, env: Env) -> Closure:
        body = Cons(Cons(self.sym("BLOCK"), Cons(name, skip_declarations(spec.cdr))), NIL)
        return Closure(name, self.lambda_list(spec.car), body, env)

    def sf_flet(self, form: Cons, env: Env) -> Any:
        defs, body = self.function_definitions(form)
        funs = {name: self.local_closure(name, spec, env) for name, spec in defs}
        return self.progn(body, Env(env, funs=funs))

    def sf_labels(self, form: Cons, env: Env) -> Any:
        defs, body = self.function_definitions(form)
        new = Env(env, funs={})
        for name, spec in defs:
            new.funs[name] = self.local_closure(name, spec, new)  # type: ignore[index]
        return self.progn(body, new)

    def sf_macrolet(self, form: Cons, env: Env) -> Any:
        defs, body = self.function_definitions(form)
        funs: dict[Symbol, Any] = {name: Macro(name, self.lambda_list(spec.car, macro=True), skip_declarations(spec.cdr), env) for name, spec in defs}
        return self.progn(body, Env(env, funs=funs))

    def sf_symbol_macrolet(self, form: Cons, env: Env) -> Any:
        rest = form.cdr
        if type(rest) is not Cons:
            raise lisp_error("E105", "malformed symbol-macrolet: expected (symbol-macrolet ((name expansion)...) body...)", "PROGRAM-ERROR")
        new = Env(env)
        for d in _iter_list(rest.car):
            if type(d) is not Cons or type(d.car) is not Symbol or type(d.cdr) is not Cons:
                raise lisp_error("E105", f"malformed symbol-macrolet binding {prin1_to_string(d)}", "PROGRAM-ERROR")
            new.vars[d.car] = SymbolMacro(d.cdr.car)
        return self.progn(skip_declarations(rest.cdr), new)

    def sf_setq(self, form: Cons, env: Env) -> Any:
        items = self.args_of(form, 0, None, "(setq var value ...)")
        if len(items) % 2:
            raise lisp_error("E105", "setq needs an even number of arguments: (setq var value ...)", "PROGRAM-ERROR")
        result: Any = NIL
        for var, value_form in zip(items[::2], items[1::2]):
            if type(var) is not Symbol:
                raise lisp_error("E105", f"setq: {prin1_to_string(var)} is not a variable name", "PROGRAM-ERROR")
            result = self.set_var(var, self.ev1(value_form, env), env)
        return result

    def sf_lambda(self, form: Cons, env: Env) -> Any:
        return self.make_closure(form, env, NIL)

    def sf_block(self, form: Cons, env: Env) -> Any:
        rest = form.cdr
        if type(rest) is not Cons or type(rest.car) is not Symbol:
            raise lisp_error("E105", "malformed block: expected (block name body...)", "PROGRAM-ERROR")
        token = object()
        new = Env(env, {("block", rest.car): token})
        try:
            return self.progn(rest.cdr, new)
        except ReturnFromSignal as signal:
            if signal.token is token:
                return signal.value
            raise

    def sf_return_from(self, form: Cons, env: Env) -> Any:
        items = self.args_of(form, 1, 2, "(return-from name [value])")
        key = ("block", items[0])
        e: Optional[Env] = env
        while e is not None:
            if key in e.vars:
                value = self.ev(items[1], env) if len(items) > 1 else NIL
                raise ReturnFromSignal(e.vars[key], value)
            e = e.parent
        what = "return: no enclosing block nil" if items[0] is NIL else f"return-from: no enclosing block named `{prin1_to_string(items[0])}`"
        raise lisp_error("E106", what, "CONTROL-ERROR")

    def sf_tagbody(self, form: Cons, env: Env) -> Any:
        statements: list[Any] = []
        labels: dict[Any, int] = {}
        for item in _iter_list(form.cdr):
            if type(item) is Symbol or type(item) is int:
                labels[item] = len(statements)
            else:
                statements.append(item)
        token = object()
        new = Env(env, {("tag", label): (token, index) for label, index in labels.items()})
        i = 0
        n = len(statements)
        while i < n:
            try:
                while i < n:
                    self.ev(statements[i], new)
                    i += 1
            except GoSignal as signal:
                if signal.token is not token:
                    raise
                i = signal.index
        return NIL

    def sf_go(self, form: Cons, env: Env) -> Any:
        (label,) = self.args_of(form, 1, 1, "(go tag)")
        key = ("tag", label)
        e: Optional[Env] = env
        while e is not None:
            if key in e.vars:
                token, index = e.vars[key]
                raise GoSignal(token, index)
            e = e.parent
        raise lisp_error("E106", f"go: no enclosing tagbody has the tag `{prin1_to_string(label)}`", "CONTROL-ERROR")

    def sf_catch(self, form: Cons, env: Env) -> Any:
        rest = form.cdr
        if type(rest) is not Cons:
            raise lisp_error("E105", "malformed catch: expected (catch tag body...)", "PROGRAM-ERROR")
        tag = self.ev1(rest.car, env)
        self.catch_tags.append(tag)
        try:
            return self.progn(rest.cdr, env)
        except ThrowSignal as signal:
            if signal.tag is tag or (type(tag) is int and type(signal.tag) is int and tag == signal.tag):
                return signal.value
            raise
        finally:
            self.catch_tags.pop()

    def sf_throw(self, form: Cons, env: Env) -> Any:
        tag_form, value_form = self.args_of(form, 2, 2, "(throw tag value)")
        tag = self.ev1(tag_form, env)
        if not any(t is tag or (type(t) is int and type(tag) is int and t == tag) for t in self.catch_tags):
            raise lisp_error("E106", f"throw: no catch is active for the tag {prin1_to_string(tag, self.print_other)}", "CONTROL-ERROR")
        raise ThrowSignal(tag, self.ev(value_form, env))

    def sf_unwind_protect(self, form: Cons, env: Env) -> Any:
        rest = form.cdr
        if type(rest) is not Cons:
            raise lisp_error("E105", "malformed unwind-protect: expected (unwind-protect protected cleanup...)", "PROGRAM-ERROR")
        try:
            return self.ev(rest.car, env)
        finally:
            self.progn(rest.cdr, env)

    def sf_the(self, form: Cons, env: Env) -> Any:
        type_spec, value_form = self.args_of(form, 2, 2, "(the type form)")
        value = self.ev(value_form, env)
        from .builtins import typep

        primary_value = value[0] if type(value) is MultipleValues and value else value
        if type(type_spec) is Cons and type_spec.car is self.sym("VALUES"):
            return value
        if not typep(self, primary_value, type_spec):
            raise lisp_error("E103", f"the: {prin1_to_string(primary_value, self.print_other)} is not of type {prin1_to_string(type_spec)}", "TYPE-ERROR", primary_value)
        return value

    def sf_locally(self, form: Cons, env: Env) -> Any:
        return self.progn(skip_declarations(form.cdr), env)

    def sf_multiple_value_call(self, form: Cons, env: Env) -> Any:
        rest = form.cdr
        if type(rest) is not Cons:
            raise lisp_error("E105", "malformed multiple-value-call: expected (multiple-value-call function form...)", "PROGRAM-ERROR")
        fn = self.function_value(self.ev1(rest.car, env))
        args: list[Any] = []
        for f in _iter_list(rest.cdr):
            v = self.ev(f, env)
            if type(v) is MultipleValues:
                args.extend(v)
            else:
                args.append(v)
        return self.apply(fn, args)

    def sf_multiple_value_prog1(self, form: Cons, env: Env) -> Any:
        rest = form.cdr
        if type(rest) is not Cons:
            raise lisp_error("E105", "malformed multiple-value-prog1: expected (multiple-value-prog1 form forms...)", "PROGRAM-ERROR")
        result = self.ev(rest.car, env)
        self.progn(rest.cdr, env)
        return result

    def sf_eval_when(self, form: Cons, env: Env) -> Any:
        rest = form.cdr
        if type(rest) is not Cons:
            raise lisp_error("E105", "malformed eval-when: expected (eval-when (situations...) body...)", "PROGRAM-ERROR")
        names = {s.name for s in _iter_list(rest.car) if type(s) is Symbol}
        if names & {"EXECUTE", "EVAL", "COMPILE-TOPLEVEL", "COMPILE", "LOAD-TOPLEVEL", "LOAD"}:
            return self.progn(rest.cdr, env)
        return NIL

    def sf_load_time_value(self, form: Cons, env: Env) -> Any:
        items = self.args_of(form, 1, 2, "(load-time-value form [read-only-p])")
        hit = self._load_time_values.get(id(form))
        if hit is not None and hit[0] is form:
            return hit[1]
        value = self.ev1(items[0], Env())
        self._load_time_values[id(form)] = (form, value)
        return value

    def sf_declare(self, form: Cons, env: Env) -> Any:
        raise lisp_error("E105", "declare is only allowed at the start of a body (let, defun, lambda ...)", "PROGRAM-ERROR")

    def sf_unquote(self, form: Cons, env: Env) -> Any:
        mark = "," if form.car is UNQUOTE else ",@"
        raise lisp_error("E105", f"`{mark}` outside of a backquote", "PROGRAM-ERROR")

    def sf_require(self, form: Cons, env: Env) -> Any:
        if self.require_hook is None:
            raise lisp_error("M005", "require is only available when compiling a file", "PROGRAM-ERROR")
        return self.require_hook(form, env)

    def sf_defmacro(self, form: Cons, env: Env) -> Any:
        """(%defmacro name lambda-list body...) — the core of the prelude's defmacro."""
        rest = form.cdr
        if type(rest) is not Cons or type(rest.car) is not Symbol or type(rest.cdr) is not Cons:
            raise lisp_error("E105", "malformed defmacro: expected (defmacro name (args...) body...)", "PROGRAM-ERROR")
        name = rest.car
        self.check_redefinition(name, "macro")
        body = Cons(Cons(self.sym("BLOCK"), Cons(name, skip_declarations(rest.cdr.cdr))), NIL)
        redefined = name in self.macros
        self.macros[name] = Macro(name, self.lambda_list(rest.cdr.car, macro=True), body, env)
        self.functions.pop(name, None)
        if redefined:
            self._expansions.clear()
        return name

    def sf_destructuring_bind(self, form: Cons, env: Env) -> Any:
        rest = form.cdr
        if type(rest) is not Cons or type(rest.cdr) is not Cons:
            raise lisp_error("E105", "malformed destructuring-bind: expected (destructuring-bind lambda-list expression body...)", "PROGRAM-ERROR")
        ll = self.lambda_list(rest.car, macro=True)
        value = self.ev1(rest.cdr.car, env)
        new = Env(env)
        saved: list[tuple[Symbol, Any]] = []
        try:
            self.destructure(ll, value, new, self.sym("DESTRUCTURING-BIND"), saved=saved)
            return self.progn(skip_declarations(rest.cdr.cdr), new)
        finally:
            if saved:
                self.restore(saved)

    def check_redefinition(self, name: Symbol, what: str) -> None:
        if self.table is self.base:
            return
        if name in self.special_forms or (self.base.exported.get(name.name) is name and (name in self.functions or name in self.macros)):
            raise lisp_error(
                "E107",
                f"cannot define {what} `{prin1_to_string(name)}`: it is part of SexpGPU's standard library; choose another name",
                "PROGRAM-ERROR",
            )

    def sf_handler_case(self, form: Cons, env: Env) -> Any:
        rest = form.cdr
        if type(rest) is not Cons:
            raise lisp_error("E105", "malformed handler-case: expected (handler-case form (type (var) body...)...)", "PROGRAM-ERROR")
        clauses = []
        no_error = None
        for clause in _iter_list(rest.cdr):
            if type(clause) is not Cons or type(clause.car) is not Symbol or type(clause.cdr) is not Cons:
                raise lisp_error("E105", f"malformed handler-case clause {prin1_to_string(clause)}: expected (type ([var]) body...)", "PROGRAM-ERROR")
            if clause.car.name == ":NO-ERROR" or (clause.car.is_keyword and clause.car.name == "NO-ERROR"):
                no_error = clause
            else:
                clauses.append(clause)
        try:
            value = self.ev(rest.car, env)
        except LispError as exc:
            for clause in clauses:
                if condition_isa(exc.condition.ctype, clause.car.name):
                    new = Env(env)
                    params = list(_iter_list(clause.cdr.car))
                    if params:
                        new.vars[params[0]] = exc.condition
                    return self.progn(skip_declarations(clause.cdr.cdr), new)
            raise
        if no_error is not None:
            fn = Closure(NIL, self.lambda_list(no_error.cdr.car), no_error.cdr.cdr, env)
            return self.apply(fn, list(value) if type(value) is MultipleValues else [value])
        return value

    def sf_quasiquote(self, form: Cons, env: Env) -> Any:
        (template,) = self.args_of(form, 1, 1, "`template")
        return self.quasi(template, 1, env)

    def quasi(self, x: Any, depth: int, env: Env) -> Any:
        """Expand a backquote template at nesting DEPTH (1 = innermost active)."""
        if type(x) is list:
            expanded = self.quasi(_pylist_to_lisp(x), depth, env)
            return list(_iter_list(expanded))
        if type(x) is not Cons:
            return x
        head = x.car
        if head is UNQUOTE and type(x.cdr) is Cons and x.cdr.cdr is NIL:
            if depth == 1:
                return self.ev1(x.cdr.car, env)
            return Cons(UNQUOTE, Cons(self.quasi(x.cdr.car, depth - 1, env), NIL))
        if head is QUASIQUOTE and type(x.cdr) is Cons and x.cdr.cdr is NIL:
            return Cons(QUASIQUOTE, Cons(self.quasi(x.cdr.car, depth + 1, env), NIL))
        if head is UNQUOTE_SPLICING and depth == 1:
            raise lisp_error("E105", "`,@` must be inside a list in a backquote", "PROGRAM-ERROR")
        parts: list[Any] = []
        cell: Any = x
        tail: Any = NIL
        while True:
            if type(cell) is not Cons:
                tail = self.quasi(cell, depth, env) if cell is not NIL else NIL
                break
            if cell.car is UNQUOTE and type(cell.cdr) is Cons and cell.cdr.cdr is NIL and cell is not x:
                tail = self.quasi(cell, depth, env)
                break
            item = cell.car
            if type(item) is Cons and item.car is UNQUOTE_SPLICING and type(item.cdr) is Cons and item.cdr.cdr is NIL and depth == 1:
                spliced = self.ev1(item.cdr.car, env)
                parts.extend(_splice_items(spliced))
            elif type(item) is Cons and item.car is UNQUOTE_SPLICING and type(item.cdr) is Cons and item.cdr.cdr is NIL:
                parts.append(Cons(UNQUOTE_SPLICING, Cons(self.quasi(item.cdr.car, depth - 1, env), NIL)))
            else:
                parts.append(self.quasi(item, depth, env))
            cell = cell.cdr
        self.alloc(len(parts))
        result = tail
        for p in reversed(parts):
            result = Cons(p, result)
        return result


_UNBOUND = object()


def function_name_of(name: Any) -> str:
    if name is None or name is NIL:
        return "lambda"
    return prin1_to_string(name)


def skip_declarations(body: Any) -> Any:
    while type(body) is Cons and type(body.car) is Cons and type(body.car.car) is Symbol and body.car.car.name == "DECLARE":
        body = body.cdr
    return body


def _iter_list(x: Any) -> Any:
    while type(x) is Cons:
        yield x.car
        x = x.cdr


def _pylist_to_lisp(items: list[Any]) -> Any:
    result: Any = NIL
    for item in reversed(items):
        result = Cons(item, result)
    return result


def _splice_items(x: Any) -> list[Any]:
    if type(x) is list:
        return list(x)
    items: list[Any] = []
    while type(x) is Cons:
        items.append(x.car)
        x = x.cdr
    if x is not NIL:
        raise lisp_error("E103", f"`,@` needs a proper list, got a dotted tail {prin1_to_string(x)}", "TYPE-ERROR")
    return items


STACK_BYTES = 512 * 1024 * 1024
RECURSION_LIMIT = 400_000


def run_with_big_stack(thunk: Callable[[], Any]) -> Any:
    """Run THUNK on a thread with a large stack, so deep Lisp recursion reaches the depth
    limit (a diagnostic) long before the Python stack runs out."""
    result: list[Any] = []
    error: list[BaseException] = []

    def target() -> None:
        old = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old, RECURSION_LIMIT))
        try:
            result.append(thunk())
        except BaseException as exc:  # handed back to the calling thread
            error.append(exc)
        finally:
            sys.setrecursionlimit(old)

    previous = threading.stack_size()
    threading.stack_size(STACK_BYTES)
    try:
        worker = threading.Thread(target=target, name="sexpgpu-eval", daemon=True)
        worker.start()
    finally:
        threading.stack_size(previous)
    worker.join()
    if error:
        raise error[0]
    return result[0]
