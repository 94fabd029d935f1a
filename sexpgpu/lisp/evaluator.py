"""The interpreter: one compile's Lisp world (global functions, macros, variables), the
limits, and function calls. Forms are turned into closures by analyze.py and run there.

Everything else (defun, let-style helpers, loop, setf, defstruct ...) is a macro or function
in prelude.lisp, or a builtin in builtins*.py.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from importlib import resources
from dataclasses import dataclass
from typing import Any, Callable, Iterable, NoReturn, Optional


from .analyze import _UNBOUND, Analyzer, SpecialForm, primary
from .hints import did_you_mean
from .conditions import LimitExceeded, LispError, lisp_error
from .lambda_list import LambdaList, parse_lambda_list
from .objects import (
    PARENT,
    Builtin,
    Closure,
    ConditionType,
    Frame,
    GoSignal,
    HandlerCluster,
    LexicalEnvironment,
    Macro,
    ReturnFromSignal,
    StructType,
    Undefined,
    VectorHeader,
    root_frame,
)
from .printer import PrintOptions, function_name, prin1_to_string, print_to_string
from .image import SYSTEM_FILE, Counters, Leaf, Recording, SystemImage, TextKey
from .reader import Reader, ReadForm
from .chapters import install_builtins
from .scope import SYSTEM_FILES, BindPlan, Pattern, Scope, user_loc
from .typespecs import TypeSpecs
from .types import NIL, T, Cons, Loc, MultipleValues, Symbol, SymbolTable

DEFAULT_SECONDS = 30.0
PRINT_SETTINGS = ("base", "radix", "level", "length", "case", "pretty")  # the *print-...* variables print_string reads
HOT_CALLS = 40  # calls of a function before its body is generated as Python (codegen.py)
HOT_LOOPS = 100  # backward jumps of a tagbody before it is generated as Python
STEP_CHUNK = 10_000  # steps between looks at the clock


@dataclass(kw_only=True, slots=True, frozen=True)
class Limits:
    """Evaluation limits for one compile. Exceeding one is a diagnostic (L001-L004). A record
    (sexpgpu/records.py): a sweep job carries it to its workers."""

    steps: int = 1_000_000
    depth: int = 10_000
    alloc: int = 10_000_000
    seconds: float = DEFAULT_SECONDS

    def __post_init__(self) -> None:
        for name in ("steps", "depth", "alloc", "seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"limit {name} must be a positive number, got {value!r}")
        for name in ("steps", "depth", "alloc"):
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"limit {name} must be a whole number, got {getattr(self, name)!r}")


def _annotate(exc: LispError | LimitExceeded, loc: Optional[Loc]) -> None:
    if exc.loc is None and loc is not None and loc.file not in SYSTEM_FILES:
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


def prelude_text() -> str:
    """The prelude's Lisp (loaded into every world's base)."""
    return resources.files("sexpgpu.lisp").joinpath("prelude.lisp").read_text(encoding="utf-8")


class Interpreter:
    """One compile's Lisp world: the base library (builtins and prelude) and every module
    loaded since. Not shared between compiles. IMAGE: the system texts' forms read once by a
    caller that builds many worlds (lisp/image.py); each world evaluates its own copy."""

    def __init__(self, limits: Optional[Limits] = None, image: Optional[SystemImage] = None,
                 recording: Optional[dict[TextKey, tuple[Leaf, ...]]] = None) -> None:
        self.limits = limits or Limits()
        self.image = image
        # where load_system_text records each text's leaves, for an image (lisp/image.py)
        self.recording = recording
        # no top-level form of the user's files but a require has run yet: a standard module
        # required now loads from the state every such world has (ModuleLoader.load)
        self.pristine = True
        self.base = SymbolTable("")
        self.table = self.base
        self.functions: dict[Symbol, Any] = {}
        self.macros: dict[Symbol, Macro] = {}
        self.values: dict[Symbol, Any] = {T: T, NIL: NIL}
        self.specials: set[Symbol] = set()
        self.constants: set[Symbol] = {T, NIL}
        self.setf_functions: dict[Symbol, Any] = {}
        self.setf_expanders: dict[Symbol, Any] = {}  # made by defsetf and define-setf-expander
        self.documentation: dict[tuple[Any, str], str] = {}  # (name, doc type) -> docstring
        self.vector_headers: dict[int, VectorHeader] = {}  # id of a vector with a fill pointer -> its header
        self.structs: dict[Symbol, StructType] = {}
        self.plists: dict[Symbol, Any] = {}  # each symbol's property list
        # the active handlers, innermost last: a handler-case's clause types, or a handler-bind's cluster
        self.handlers: list[tuple[Any, ...] | HandlerCluster] = []
        self.condition_types: dict[str, ConditionType] = {}  # made by define-condition
        self.symbol_macros: dict[Symbol, Any] = {}  # made by define-symbol-macro
        self.print_symbols: Optional[dict[str, Symbol]] = None  # print_string's variables, found once
        self.gensym_counter = 0
        self.gentemp_counter = 0
        self.steps_left = 0
        self.steps_reserve = 0
        self.max_depth = 0
        self.alloc_left = 0
        self.deadline = 0.0
        self.reset_budget()
        self.depth = 0
        # when code turns into generated Python: calls of a function, loops of a tagbody
        self.hot_calls = HOT_CALLS
        self.hot_loops = HOT_LOOPS
        self.warnings: list[tuple[str, Optional[Loc]]] = []
        self.catch_tags: list[Any] = []
        self.current_loc: Optional[Loc] = None
        self.call_loc: Optional[Loc] = None  # the form of the latest function call (staging stamps it on IR nodes)
        self.user_loc: Optional[Loc] = None  # the latest call in the user's own files (not the standard library)
        self.non_boolean_types: set[type] = set()
        self.truth_error: Callable[[Any], LispError] | None = None
        # objects other than functions that funcall accepts (models): type -> their function
        self.funcallable: dict[type, Callable[[Any], Any]] = {}
        # the standard two-argument tests (eq, eql, equal, string= ...) as Python predicates
        self.standard_tests: dict[Any, Callable[[Any, Any], bool]] = {}
        # builtins that extend a standard one and behave as it on non-tensors: fn -> its fn
        self.inline_aliases: dict[Any, Any] = {}
        self.require_hook: Callable[[Cons], Any] | None = None
        # called with each top-level form of the file read into hook_table (contract order)
        self.toplevel_hook: Callable[[Any, Loc], None] | None = None
        self.hook_table: Optional[SymbolTable] = None
        # where print, princ, format t ... write; the CLI points it at a stream
        self.output: list[str] = []
        self.write: Callable[[str], Any] = self.output.append
        self._expansions: dict[int, tuple[Any, Any, Macro, Optional[Scope]]] = {}
        self._lambda_lists: dict[int, tuple[Any, LambdaList]] = {}
        self._load_time_values: dict[int, tuple[Any, Any]] = {}
        self.analyzer = Analyzer(self)
        self.types = TypeSpecs(self)
        self.s_progn = self.sym("PROGN")
        install_builtins(self)
        self.load_prelude()

    @property
    def special_forms(self) -> dict[Symbol, SpecialForm]:
        return self.analyzer.special_forms

    # -- symbols -------------------------------------------------------------------------
    def sym(self, name: str) -> Symbol:
        return self.base.intern(name.upper())

    def kw(self, name: str) -> Symbol:
        return self.base.keyword(name.upper())

    def features(self) -> Any:
        """The current value of *features*, which the reader's #+ and #- test."""
        return self.values.get(self.sym("*FEATURES*"), NIL)

    def load_prelude(self) -> None:
        """Load prelude.lisp under the default limits, then give the user's file a full
        budget of its own: the prelude's cost never counts against it."""
        self.load_system_text(prelude_text())
        self.publish_base()

    def load_system_text(self, text: str) -> None:
        """Load library text into the base under the default limits; then a fresh budget.
        Its forms come from the image where it holds the text, else from reading it."""
        user_limits = self.limits
        self.limits = Limits()
        self.reset_budget()
        try:
            leaves = self.image.leaves(SYSTEM_FILE, text, self.base) if self.image is not None else None
            if leaves is not None:
                self.load_leaves(leaves)
                return
            kept = self.image.forms(SYSTEM_FILE, text, self.base) if self.image is not None else None
            if self.recording is not None:
                self.record_text(text, kept)
            elif kept is None:
                self.load_text(text, SYSTEM_FILE, self.base)
            else:
                self.load_forms(kept, self.base)
        finally:
            self.limits = user_limits
            self.reset_budget()

    def load_leaves(self, leaves: Iterable[Leaf], table: Optional[SymbolTable] = None) -> None:
        """Evaluate a system text's recorded leaves in TABLE's module (by default the base;
        lisp/image.py), each at the gensym and gentemp counters it was recorded at."""
        previous = self.table
        self.table = self.base if table is None else table
        start = self.counters()
        assert start is not None, "a system text's leaves are loaded where the counters are numbers"
        try:
            for leaf in leaves:
                self.set_counters(tuple(at + delta for at, delta in zip(start, leaf.counters)))
                self.eval_toplevel(leaf.form, leaf.loc)
        finally:
            self.table = previous

    def counters(self) -> Optional[Counters]:
        """What names the next gensym (the evaluator's own and Lisp's *gensym-counter*) and
        gentemp; None when *gensym-counter* is not a number."""
        lisp = self.values.get(self.sym("*GENSYM-COUNTER*"), 0)
        return (self.gensym_counter, self.gentemp_counter, lisp) if type(lisp) is int else None

    def set_counters(self, counters: Counters) -> None:
        self.gensym_counter, self.gentemp_counter, lisp = counters
        self.values[self.sym("*GENSYM-COUNTER*")] = lisp

    def record_text(self, text: str, kept: Optional[Iterable[ReadForm]], file: str = SYSTEM_FILE,
                    table: Optional[SymbolTable] = None, key: Optional[TextKey] = None) -> None:
        """Load a system text into TABLE's module (by default the base) as load_text does,
        recording its leaves under KEY (by default (FILE, TEXT); see recording). A text
        whose load warns is not recorded: its leaves would not warn again."""
        assert self.recording is not None
        into = self.base if table is None else table
        recording = Recording(into, self.counters())
        forms = kept if kept is not None else iter(Reader(text, file, into, features=self.features).read_next, None)
        warned = len(self.warnings)
        previous = self.table
        self.table = into
        try:
            for read in forms:
                recording.at = read.loc
                self.eval_toplevel(read.form, read.loc, recording)
        finally:
            self.table = previous
        leaves = recording.result(self.counters())
        if leaves is not None and len(self.warnings) == warned:
            self.recording[key or (file, text)] = leaves

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

    def load_text(self, text: str, file: str, table: SymbolTable) -> Any:
        """Read and evaluate a file's forms one by one (so `require` affects later reads)."""
        reader = Reader(text, file, table, features=self.features)
        return self.load_forms(iter(reader.read_next, None), table)

    def load_forms(self, forms: Iterable[ReadForm], table: SymbolTable) -> Any:
        """Evaluate FORMS in TABLE's module, each taken from FORMS just before it is evaluated."""
        previous = self.table
        self.table = table
        try:
            result: Any = NIL
            for read in forms:
                if self.pristine and table is not self.base and not table.internals and not is_require(read.form):
                    self.pristine = False
                if self.toplevel_hook is not None and table is self.hook_table:
                    self.toplevel_hook(read.form, read.loc)
                result = self.eval_toplevel(read.form, read.loc)
            return result
        finally:
            self.table = previous

    # -- budgets -------------------------------------------------------------------------
    def reset_budget(self) -> None:
        """A full budget of steps, allocation and time (for a file, or one eval'd form)."""
        grant = min(STEP_CHUNK, self.limits.steps)
        self.steps_left = grant
        self.steps_reserve = self.limits.steps - grant
        self.alloc_left = self.limits.alloc
        self.deadline = time.monotonic() + self.limits.seconds
        self.max_depth = self.limits.depth

    def out_of_steps(self) -> None:
        """steps_left went below zero: grant more from the reserve, and look at the clock."""
        while self.steps_left < 0 and self.steps_reserve > 0:
            grant = min(STEP_CHUNK, self.steps_reserve)
            self.steps_reserve -= grant
            self.steps_left += grant
        if time.monotonic() > self.deadline:
            self.steps_left = -1
            raise self.out_of_time()
        if self.steps_left < 0:
            raise self.out_of_budget()

    def out_of_budget(self) -> LimitExceeded:
        return LimitExceeded("L001", f"evaluation step budget of {self.limits.steps} steps exhausted; is there an endless loop?")

    def out_of_time(self) -> LimitExceeded:
        return LimitExceeded("L004", f"evaluation time limit of {self.limits.seconds:g} s exceeded; is there an endless loop or a very large computation?")

    def endless(self) -> NoReturn:
        """A walk that would never end (a circular list where the walk goes to its end) uses
        up the whole step budget: L001 (L004 past the deadline) now, rather than after it."""
        self.steps_left = -1
        self.steps_reserve = 0
        if time.monotonic() > self.deadline:
            raise self.out_of_time()
        raise self.out_of_budget()

    def step(self) -> None:
        self.steps_left -= 1
        if self.steps_left < 0:
            self.out_of_steps()

    def charge(self, n: int) -> None:
        """Charge N steps: the work a builtin does (elements visited)."""
        self.steps_left -= n
        if self.steps_left < 0:
            self.out_of_steps()

    def alloc(self, n: int) -> None:
        """Charge N cells (8 bytes each) of allocation."""
        self.alloc_left -= n
        if self.alloc_left < 0:
            raise LimitExceeded("L003", f"allocation limit of {self.limits.alloc} cells exceeded; is a list or string growing without bound?")

    # -- evaluation ------------------------------------------------------------------------
    def eval_toplevel(self, form: Any, loc: Loc, recording: Optional[Recording] = None) -> Any:
        self.current_loc = loc
        try:
            return self.run_toplevel(form, recording)
        except (LispError, LimitExceeded) as exc:
            _annotate(exc, loc)
            if isinstance(exc, LispError) and exc.loc is not None and exc.loc != loc and loc.file not in SYSTEM_FILES:
                exc.notes.append(f"while evaluating the top-level form at {loc}")
            raise
        except RecursionError:
            exc2 = LimitExceeded("L002", f"evaluation depth limit exceeded (the Python stack ran out before {self.limits.depth} calls)")
            _annotate(exc2, loc)
            raise exc2 from None
        except (ReturnFromSignal, GoSignal):
            raise lisp_error("E106", "return-from or go to a block or tag that is no longer active", "CONTROL-ERROR") from None

    def run_toplevel(self, form: Any, recording: Optional[Recording] = None) -> Any:
        """Evaluate FORM in the null lexical environment, as a top-level form: the forms of
        a top-level progn (also one a macro expands into) one after the other, each
        analyzed only once the ones before it have run (so a defmacro or defvar affects the
        next form). RECORDING, where given, takes each form analyzed (a leaf) just before
        it runs."""
        if type(form) is Cons:
            head = form.car
            loc = user_loc(form.loc)
            if head is self.s_progn:
                self.step()
                try:
                    result: Any = NIL
                    cell = form.cdr
                    while type(cell) is Cons:
                        result = self.run_toplevel(cell.car, recording)
                        cell = cell.cdr
                    return result
                except (LispError, LimitExceeded) as exc:
                    _annotate(exc, loc)
                    raise
            macro = self.macros.get(head) if type(head) is Symbol and head not in self.special_forms else None
            if macro is not None:
                self.step()
                try:
                    return self.run_toplevel(self.expand(macro, form, True), recording)
                except (LispError, LimitExceeded) as exc:
                    if exc.loc is None and loc is not None:
                        exc.loc = loc
                        exc.macro = exc.macro or prin1_to_string(macro.name)
                    raise
        if recording is not None:
            recording.leaf(form, self.counters())
        node = self.analyzer.analyze(form, Scope(None, runtime=True))
        return node(root_frame())

    def ev(self, form: Any) -> Any:
        """Evaluate FORM in the null lexical environment (what `eval` does)."""
        return self.run_toplevel(form)

    def expand(self, macro: Macro, form: Cons, cache: bool, scope: Optional[Scope] = None) -> Any:
        """The expansion of a macro form. A global macro's expansion is remembered per form
        (per form and scope when the macro takes its &environment)."""
        lam = macro.lam
        if lam.plan is None:
            lam.compile()
        assert lam.plan is not None
        uses_env = lam.plan.environment is not None
        if cache:
            hit = self._expansions.get(id(form))
            if hit is not None and hit[0] is form and hit[2] is macro and (not uses_env or hit[3] is scope):
                return hit[1]
        expansion = self.call_macro(macro, form, scope)
        if cache:
            self._expansions[id(form)] = (form, expansion, macro, scope)
        return expansion

    def call_macro(self, macro: Macro, form: Cons, scope: Optional[Scope] = None) -> Any:
        self.depth += 1
        try:
            if self.depth > self.limits.depth:
                raise LimitExceeded("L002", f"evaluation depth limit of {self.limits.depth} nested calls exceeded in macro {prin1_to_string(macro.name)}")
            lam = macro.lam
            if lam.plan is None:
                lam.compile()
            body = lam.body
            plan = lam.plan
            assert plan is not None
            frame: Frame = {PARENT: macro.env}
            if plan.environment is not None:
                frame[plan.environment] = LexicalEnvironment(scope) if scope is not None else NIL
            saved: list[tuple[Symbol, Any]] = []
            try:
                self.destructure(plan, form.cdr, frame, macro.name, form, saved)
                return primary(body(frame))
            finally:
                if saved:
                    self.restore(saved)
        finally:
            self.depth -= 1

    def define_macro(self, name: Symbol, macro: Macro) -> None:
        self.check_redefinition(name, "macro")
        self.macros[name] = macro
        self.functions.pop(name, None)

    def load_time_value(self, form: Cons, subform: Any) -> Any:
        hit = self._load_time_values.get(id(form))
        if hit is not None and hit[0] is form:
            return hit[1]
        value = primary(self.ev(subform))
        self._load_time_values[id(form)] = (form, value)
        return value

    # -- variables -----------------------------------------------------------------------
    def global_value(self, sym: Symbol) -> Any:
        try:
            return self.values[sym]
        except KeyError:
            pass
        if sym.package == "KEYWORD":
            return sym
        raise self.unbound_variable(sym, None)

    def unbound_variable(self, sym: Symbol, scope: Optional[Scope]) -> LispError:
        names = scope.names() if scope is not None else set()
        names.update(k.name for k in self.values)
        hint = did_you_mean(sym.name, names, 0.75)
        return lisp_error("E100", f"unbound variable `{prin1_to_string(sym)}`{hint}", "UNBOUND-VARIABLE", sym)

    def check_assignable(self, sym: Symbol) -> None:
        if sym in self.constants or sym.package == "KEYWORD":
            raise lisp_error("E107", f"`{prin1_to_string(sym)}` is a constant and cannot be assigned or bound", "PROGRAM-ERROR")

    def bind_dynamic(self, sym: Symbol, value: Any, saved: list[tuple[Symbol, Any]]) -> None:
        """Bind SYM's global value (saved, for restore)."""
        saved.append((sym, self.values.get(sym, _UNBOUND)))
        if value is _UNBOUND:
            self.values.pop(sym, None)
        else:
            self.values[sym] = value

    def restore(self, saved: list[tuple[Symbol, Any]]) -> None:
        for sym, old in reversed(saved):
            if old is _UNBOUND:
                self.values.pop(sym, None)
            else:
                self.values[sym] = old
        saved.clear()

    # -- functions -----------------------------------------------------------------------
    def undefined_function(self, sym: Symbol) -> LispError:
        if sym in self.special_forms:
            return lisp_error("E103", f"`{prin1_to_string(sym)}` is a special form, not a function", "UNDEFINED-FUNCTION", sym)
        names = [n for n in {s.name for s in self.functions} | {s.name for s in self.macros} if not n.startswith("%")]
        hint = did_you_mean(sym.name, names, 0.8)
        return lisp_error("E101", f"undefined function `{prin1_to_string(sym)}`{hint}", "UNDEFINED-FUNCTION", sym)

    def function_value(self, designator: Any) -> Any:
        """A function designator (symbol or function) as a callable object."""
        t = type(designator)
        if t is Closure or t is Builtin:
            return designator
        if t is Symbol:
            fn = self.functions.get(designator)
            if fn is None:
                if designator in self.macros:
                    raise lisp_error("E103", f"`{prin1_to_string(designator)}` is a macro, not a function", "TYPE-ERROR")
                raise self.undefined_function(designator)
            if designator in self.special_forms:
                raise lisp_error("E103", f"`{prin1_to_string(designator)}` is a macro or special form, not a function", "TYPE-ERROR")
            return fn
        if t is Undefined:
            raise self.undefined_function(designator.name)
        hook = self.funcallable.get(t)
        if hook is not None:
            return hook(designator)
        raise lisp_error("E103", f"{prin1_to_string(designator, self.print_other)} is not a function", "TYPE-ERROR", designator)

    def call(self, designator: Any, *args: Any) -> Any:
        """Call a function designator from Python; returns the primary value."""
        t = type(designator)
        if t is Closure:
            v = self.call_closure(designator, args)
        else:
            v = self.apply(designator if t is Builtin else self.function_value(designator), args)
        if type(v) is MultipleValues:
            return v[0] if v else NIL
        return v

    def apply(self, fn: Any, args: Any) -> Any:
        t = type(fn)
        if t is Builtin:
            n = len(args)
            if n < fn.min_args or (fn.max_args is not None and n > fn.max_args):
                raise self.arity_error(fn.name, fn.min_args, fn.max_args, n)
            try:
                return fn.fn(*args)
            except OverflowError:
                raise self.overflow(fn, None) from None
        if t is Closure:
            return self.call_closure(fn, args)
        return self.apply(self.function_value(fn), args)

    def overflow(self, fn: Any, loc: Optional[Loc]) -> LispError:
        err = lisp_error("E108", f"`{function_name(fn)}`: floating-point overflow (a number too large for a double)", "FLOATING-POINT-OVERFLOW")
        err.loc = loc
        return err

    def arity_error(self, name: str, lo: int, hi: Optional[int], got: int) -> LispError:
        if hi is None:
            want = f"at least {lo}"
        elif lo == hi:
            want = f"{lo}"
        else:
            want = f"{lo} to {hi}"
        plural = "" if want == "1" else "s"
        return lisp_error("E102", f"`{name}` takes {want} argument{plural}, got {got}", "PROGRAM-ERROR")

    def call_closure(self, fn: Closure, args: Any) -> Any:
        depth = self.depth + 1
        if depth > self.max_depth:
            raise LimitExceeded("L002", f"evaluation depth limit of {self.limits.depth} nested calls exceeded in {function_name(fn)}; is the recursion unbounded?")
        self.depth = depth
        try:
            lam = fn.lam
            if lam.simple:
                required = lam.required
                if len(args) != len(required):
                    raise self.arity_error(function_name(fn), len(required), len(required), len(args))
                fast = lam.fast
                if fast is not None:
                    return fast(fn.env, *args)
                if len(required) == 1:
                    return lam.body({PARENT: fn.env, required[0]: args[0]})
                frame: Frame = dict(zip(required, args))
                frame[PARENT] = fn.env
                return lam.body(frame)
            if lam.plan is None:
                lam.compile()
            plan = lam.plan
            assert plan is not None
            frame = {PARENT: fn.env}
            saved: list[tuple[Symbol, Any]] = []
            try:
                self.bind_call(plan, args, frame, fn.name, saved)
                return lam.body(frame)
            finally:
                if saved:
                    self.restore(saved)
        finally:
            self.depth = depth - 1

    # -- binding lambda lists ----------------------------------------------------------------
    def bind_call(self, plan: BindPlan, args: Any, frame: Frame, name: Any, saved: list[tuple[Symbol, Any]]) -> None:
        """Bind an ordinary lambda list to the arguments of a call."""
        n = len(args)
        nreq = len(plan.required)
        if n < nreq or (plan.max_args is not None and n > plan.max_args):
            raise self.arity_error(function_name_of(name), nreq, plan.max_args, n)
        self.bind_parameters(plan, args, args[nreq + len(plan.optional) :], True, frame, name, saved)

    def bind_parameters(self, plan: BindPlan, given: Any, more: Any, from_call: bool, frame: Frame, name: Any, saved: list[tuple[Symbol, Any]]) -> None:
        """The binding that calls and destructuring share. GIVEN starts with the positional
        values (the required ones, then the optional ones supplied); MORE is what follows them, for
        &rest and &key: the call's remaining arguments when FROM_CALL (&rest gets a fresh
        list), else the rest of the destructured list itself (&rest shares it)."""
        for pattern, value in zip(plan.required, given):
            self.bind_pattern(plan, pattern, value, frame, name, saved)
        i = len(plan.required)
        for opt in plan.optional:
            if i < len(given):
                self.bind_pattern(plan, opt.pattern, given[i], frame, name, saved)
                supplied = T
            else:
                assert opt.default is not None
                self.bind_pattern(plan, opt.pattern, primary(opt.default(frame)), frame, name, saved)
                supplied = NIL
            if opt.supplied is not None:
                self.bind_var(plan, opt.supplied, supplied, frame, saved)
            i += 1
        if plan.rest is not None:
            if from_call:
                self.alloc(len(more))
                more_list = _pylist_to_lisp(more)
            else:
                more_list = more
            self.bind_pattern(plan, plan.rest, more_list, frame, name, saved)
        if plan.has_key:
            self.bind_keys(plan, list(more) if from_call else list(_iter_list(more)), frame, name, saved, from_call)
        for var, node in plan.aux:
            self.bind_var(plan, var, primary(node(frame)), frame, saved)

    def bind_keys(self, plan: BindPlan, rest: list[Any], frame: Frame, name: Any, saved: list[tuple[Symbol, Any]], from_call: bool) -> None:
        # a call's bad keywords are a program-error; a destructured list's only an error (as SBCL)
        ctype = "PROGRAM-ERROR" if from_call else "ERROR"
        if len(rest) % 2:
            raise lisp_error("E102", f"`{function_name_of(name)}`: odd number of keyword arguments {prin1_to_string(_pylist_to_lisp(rest))}", ctype)
        given: dict[Symbol, Any] = {}
        for k, v in zip(rest[::2], rest[1::2]):
            if type(k) is not Symbol:
                raise lisp_error("E102", f"`{function_name_of(name)}`: {prin1_to_string(k)} is not a keyword", ctype)
            given.setdefault(k, v)
        allow = plan.allow_other_keys or (given.get(self.kw("allow-other-keys"), NIL) is not NIL)
        if not allow:
            known = {kp.keyword for kp in plan.keys}
            for k in given:
                if k not in known and not (k.name == "ALLOW-OTHER-KEYS" and k.package == "KEYWORD"):
                    expected = " ".join(prin1_to_string(kp.keyword) for kp in plan.keys) or "none"
                    raise lisp_error("E102", f"`{function_name_of(name)}`: unknown keyword argument {prin1_to_string(k)}; expected one of: {expected}", ctype)
        for kp in plan.keys:
            if kp.keyword in given:
                self.bind_pattern(plan, kp.pattern, given[kp.keyword], frame, name, saved)
                supplied = T
            else:
                assert kp.default is not None
                self.bind_pattern(plan, kp.pattern, primary(kp.default(frame)), frame, name, saved)
                supplied = NIL
            if kp.supplied is not None:
                self.bind_var(plan, kp.supplied, supplied, frame, saved)

    def bind_var(self, plan: BindPlan, sym: Symbol, value: Any, frame: Frame, saved: list[tuple[Symbol, Any]]) -> None:
        if sym in plan.specials:
            self.bind_dynamic(sym, value, saved)
            return
        if sym in self.constants:
            self.check_assignable(sym)
        frame[sym] = value

    def bind_pattern(self, plan: BindPlan, pattern: Pattern, value: Any, frame: Frame, name: Any, saved: list[tuple[Symbol, Any]]) -> None:
        if type(pattern) is Symbol:
            self.bind_var(plan, pattern, value, frame, saved)
        else:
            assert isinstance(pattern, BindPlan)
            self.destructure(pattern, value, frame, name, None, saved)

    def destructure(self, plan: BindPlan, value: Any, frame: Frame, name: Any, whole: Any, saved: list[tuple[Symbol, Any]]) -> None:
        """Bind a macro/destructuring lambda list to a Lisp list."""
        if plan.whole is not None:
            self.bind_pattern(plan, plan.whole, whole if whole is not None else value, frame, name, saved)
        items: list[Any] = []
        cell = value
        limit = len(plan.required) + len(plan.optional)
        while type(cell) is Cons and len(items) < limit:
            items.append(cell.car)
            cell = cell.cdr
        if cell is not NIL and type(cell) is not Cons and plan.rest is None:
            raise lisp_error("E105", f"{prin1_to_string(name)}: cannot destructure {prin1_to_string(value)} against the lambda list (dotted list)", "ERROR")
        if len(items) < len(plan.required):
            raise lisp_error("E105", f"`{prin1_to_string(name)}`: expected at least {len(plan.required)} argument{'s' if len(plan.required) != 1 else ''} in {prin1_to_string(value)}", "ERROR")
        if plan.rest is None and not plan.has_key and cell is not NIL:
            raise lisp_error("E105", f"`{prin1_to_string(name)}`: too many elements in {prin1_to_string(value)}, expected at most {limit}", "ERROR")
        self.bind_parameters(plan, items, cell, False, frame, name, saved)

    def lambda_list(self, spec: Any, macro: bool = False) -> LambdaList:
        key = id(spec)
        hit = self._lambda_lists.get(key)
        if hit is not None and hit[0] is spec and (macro or not hit[1].whole):
            return hit[1]
        ll = parse_lambda_list(spec, self.base.keyword, macro)
        if type(spec) is Cons:
            self._lambda_lists[key] = (spec, ll)
        return ll

    def check_redefinition(self, name: Symbol, what: str) -> None:
        if self.table is self.base:
            return
        if name in self.special_forms or (self.base.exported.get(name.name) is name and (name in self.functions or name in self.macros)):
            raise lisp_error(
                "E107",
                f"cannot define {what} `{prin1_to_string(name)}`: it is part of SexpGPU's standard library; choose another name",
                "PROGRAM-ERROR",
            )

    # -- truth -----------------------------------------------------------------------------
    def truth(self, v: Any) -> bool:
        if self.non_boolean_types and type(v) in self.non_boolean_types and self.truth_error is not None:
            raise self.truth_error(v)
        return v is not NIL

    def gensym(self, prefix: str = "G") -> Symbol:
        self.gensym_counter += 1
        return Symbol(f"{prefix}{self.gensym_counter}", None)

    def print_string(self, x: Any, escape: bool, **overrides: Any) -> str:
        """X as prin1 (ESCAPE) or princ print it under the current printer variables,
        each overridable by its keyword's name (base, radix, level, length, case, pretty)."""
        if not escape and type(x) is str:
            return x  # no printer variable changes how princ writes a string
        if self.print_symbols is None:
            self.print_symbols = {name: self.sym(f"*PRINT-{name.upper()}*") for name in PRINT_SETTINGS}
        values, symbols = self.values, self.print_symbols

        def setting(name: str) -> Any:
            return overrides[name] if name in overrides else values.get(symbols[name], NIL)

        base, level, length, case = setting("base"), setting("level"), setting("length"), setting("case")
        options = PrintOptions(
            base if type(base) is int and 2 <= base <= 36 else 10,
            setting("radix") is not NIL,
            level if type(level) is int and level >= 0 else None,
            length if type(length) is int and length >= 0 else None,
            case.name if type(case) is Symbol and case.name in ("UPCASE", "DOWNCASE", "CAPITALIZE") else "DOWNCASE",
            setting("pretty") is not NIL,
        )
        return print_to_string(x, escape, self.print_other, options)

    def print_other(self, x: Any, printer: Any) -> str:
        from .builtins import print_object

        return print_object(self, x, printer)


def function_name_of(name: Any) -> str:
    if name is None or name is NIL:
        return "lambda"
    return prin1_to_string(name)


def _iter_list(x: Any) -> Any:
    while type(x) is Cons:
        yield x.car
        x = x.cdr


def _pylist_to_lisp(items: Any) -> Any:
    result: Any = NIL
    for item in reversed(items):
        result = Cons(item, result)
    return result


STACK_BYTES = 512 * 1024 * 1024
RECURSION_LIMIT = 400_000
EVAL_GC_THRESHOLDS = (100_000, 50, 100)  # generation 0, 1, 2 (CPython: 700, 10, 10)


def is_require(form: Any) -> bool:
    """Whether FORM is a top-level (require ...)."""
    return type(form) is Cons and type(form.car) is Symbol and form.car.name == "REQUIRE" and form.car.package == ""


def run_with_big_stack(thunk: Callable[[], Any]) -> Any:
    """Run THUNK on a thread with a large stack, so deep Lisp recursion reaches the depth
    limit (a diagnostic) long before the Python stack runs out."""
    result: list[Any] = []
    error: list[BaseException] = []

    def target() -> None:
        old = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old, RECURSION_LIMIT))
        # Evaluation makes frames and closures by the hundred thousand, nearly all freed by
        # reference counting; at the default threshold the cycle collector would run every 700
        # allocations and rescan the whole prelude each time, doubling the time of a check.
        thresholds = gc.get_threshold()
        gc.set_threshold(*EVAL_GC_THRESHOLDS)
        try:
            result.append(thunk())
        except BaseException as exc:  # handed back to the calling thread
            error.append(exc)
        finally:
            gc.set_threshold(*thresholds)
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
