"""The analyzing evaluator: a form is analyzed once into a Python closure (a node), and the
node is run each time the code runs, as in SICP's analyzing evaluator and Norvig's lis.py.

Analysis resolves what is lexical (variables to a frame depth, local functions and macros,
symbol macros, blocks and tags) and expands each macro call once. A node then does only the
work of its form. Each compound form still costs one step of the budget when it runs; an error
still points at the innermost form of the user's code, and names the macro it came from. An
error found while analyzing a form is raised when that form runs, as if it had been evaluated.

The body of a lambda is analyzed when the function is first called, so a function may use a
macro defined after it, as in the interpreter this replaces.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

from .conditions import LimitExceeded, LispError, lisp_error
from .lambda_list import LambdaList
from .lambda_list import Pattern as ListPattern
from .objects import PARENT, Builtin, Closure, Frame, GoSignal, Macro, ReturnFromSignal, ThrowSignal, Undefined, root_frame
from .codegen import CodeGen
from .printer import prin1_to_string
from .scope import (
    LEXICAL,
    LIBRARY_FILES,
    SPECIAL,
    BindPlan,
    BlockInfo,
    LocalFunction,
    LocalParam,
    Node,
    ParamPlan,
    Pattern,
    Scope,
    SymbolMacroEntry,
    TagbodyInfo,
    declared_specials,
    frame_at,
    split_declarations,
    user_loc,
)
from .types import NIL, QUASIQUOTE, QUOTE, UNQUOTE, UNQUOTE_SPLICING, T, Cons, Loc, MultipleValues, Symbol

if TYPE_CHECKING:
    from .evaluator import Interpreter

_MISSING = object()
_UNBOUND = object()

SpecialForm = Callable[[Cons, Scope], Node]


def constant(value: Any) -> Node:
    def node(f: Frame) -> Any:
        return value

    node.constant = True  # type: ignore[attr-defined]
    node.value = value  # type: ignore[attr-defined]
    return node


def primary(v: Any) -> Any:
    if type(v) is MultipleValues:
        return v[0] if v else NIL
    return v


class LambdaNode:
    """A lambda form, analyzed: its parsed lambda list, and its body, analyzed at the first
    call. Every closure made from the form shares it. After interp.hot_calls calls the body
    is generated as Python (codegen.py): `fast` takes (env, *args) for a lambda of required
    parameters that nothing captures, else `body` is replaced."""

    __slots__ = (
        "analyzer", "scope", "ll", "forms", "name", "macro", "specials", "free_specials", "simple", "required",
        "body", "closure_body", "fast", "plan", "body_scope", "calls",
    )

    def __init__(self, analyzer: "Analyzer", scope: Scope, ll: LambdaList, forms: Any, name: Any, macro: bool) -> None:
        self.analyzer = analyzer
        self.scope = scope
        self.ll = ll
        self.name = name
        self.macro = macro
        decls, self.forms = split_declarations(forms)
        analyzer.lambdas_made += 1
        interp = analyzer.interp
        declared = declared_specials(decls)
        self.specials = frozenset(v for v in ll.variables() if v in declared or v in interp.specials)
        self.simple = (
            not macro and not ll.optional and ll.rest is None and not ll.has_key and not ll.aux
            and all(type(p) is Symbol for p in ll.required) and not self.specials
        )
        self.required: tuple[Symbol, ...] = tuple(p for p in ll.required if type(p) is Symbol) if self.simple else ()
        self.body: Node = self.first_call
        self.closure_body: Optional[Node] = None
        self.fast: Optional[Callable[..., Any]] = None
        self.plan: Optional[BindPlan] = None
        self.free_specials = declared
        self.body_scope: Optional[Scope] = None
        self.calls = 0

    def first_call(self, frame: Frame) -> Any:
        return self.compile()(frame)

    def compile(self) -> Node:
        """Analyze the lambda list's defaults and the body (once)."""
        if self.closure_body is not None:
            return self.closure_body
        analyzer = self.analyzer
        scope = Scope(self.scope, runtime=True, vars={})
        plan, inner = analyzer.bind_plan(self.ll, scope, self.specials)
        body_scope = Scope(inner, vars={v: SPECIAL for v in self.free_specials}) if self.free_specials else inner
        self.plan = plan
        self.body_scope = body_scope
        self.closure_body = analyzer.body(self.forms, body_scope)
        self.body = self.counting
        return self.closure_body

    def counting(self, frame: Frame) -> Any:
        self.calls += 1
        if self.calls >= self.analyzer.interp.hot_calls:
            self.promote()
        assert self.closure_body is not None
        return self.closure_body(frame)

    def promote(self) -> None:
        """Called often: generate the body as Python (the second tier), when it can be."""
        assert self.body_scope is not None and self.closure_body is not None
        codegen = self.analyzer.codegen()
        self.body = self.closure_body
        if self.simple:
            self.fast = codegen.fast_lambda(self)
            if self.fast is not None:
                return
        generated = codegen.lambda_body(self, self.body_scope)
        if generated is not None:
            self.body = generated


def _iter(x: Any) -> Any:
    while type(x) is Cons:
        yield x.car
        x = x.cdr


class Analyzer:
    """Turns forms into nodes for one interpreter."""

    def __init__(self, interp: "Interpreter") -> None:
        self.interp = interp
        self.special_forms: dict[Symbol, SpecialForm] = {}
        self.s_lambda = interp.sym("LAMBDA")
        self.s_setf = interp.sym("SETF")
        self.s_block = interp.sym("BLOCK")
        self.s_progn = interp.sym("PROGN")
        self.s_if = interp.sym("IF")
        self.s_go = interp.sym("GO")
        self.lambdas_made = 0  # a block or tagbody whose body made a lambda may be left from it later
        self._codegen: Optional["CodeGen"] = None
        self._install()

    def codegen(self) -> "CodeGen":
        if self._codegen is None:
            self._codegen = CodeGen(self)
        return self._codegen

    # -- entry points ------------------------------------------------------------------------
    def analyze(self, x: Any, scope: Scope, loc: Optional[Loc] = None) -> Node:
        """The node of form X. LOC is where X stands as an argument of a call: an unbound
        variable there points at it."""
        t = type(x)
        if t is Symbol:
            return self.variable(x, scope, loc)
        if t is not Cons:
            return constant(x)
        try:
            return self.compound(x, scope)
        except LispError as exc:
            return self.failing(x, exc)

    def body(self, forms: Any, scope: Scope) -> Node:
        """Nodes of the forms of a body, run in order: the values of the last."""
        nodes = [self.analyze(f, scope) for f in _iter(forms)]
        if not nodes:
            return constant(NIL)
        if len(nodes) == 1:
            return nodes[0]
        if len(nodes) == 2:
            first, second = nodes

            def progn2(f: Frame) -> Any:
                first(f)
                return second(f)

            return progn2
        init, last = tuple(nodes[:-1]), nodes[-1]

        def progn(f: Frame) -> Any:
            for n in init:
                n(f)
            return last(f)

        return progn

    def failing(self, form: Cons, exc: LispError) -> Node:
        """A node that signals, when it runs, the error that analyzing FORM found."""
        interp = self.interp
        loc = user_loc(form.loc)

        def node(f: Frame) -> Any:
            interp.step()
            err = LispError(exc.condition, exc.loc or loc)
            err.macro = exc.macro
            err.notes = list(exc.notes)
            raise err

        return node

    # -- variables ---------------------------------------------------------------------------
    def variable(self, sym: Symbol, scope: Scope, loc: Optional[Loc]) -> Node:
        if sym is NIL or sym is T or sym.package == "KEYWORD":
            return constant(sym)
        entry, depth = scope.find_var(sym)
        if entry is LEXICAL:
            return self.lexical_ref(sym, depth)
        if type(entry) is SymbolMacroEntry:
            return self.analyze(entry.expansion, scope, loc)
        if type(entry) is LocalParam:
            entry.captured = True
            return constant(NIL)
        if entry is None and sym in self.interp.symbol_macros:
            return self.analyze(self.interp.symbol_macros[sym], scope, loc)
        return self.global_ref(sym, scope, loc)

    def lexical_ref(self, sym: Symbol, depth: int) -> Node:
        if depth == 0:
            def ref0(f: Frame) -> Any:
                return f[sym]

            return ref0
        if depth == 1:
            def ref1(f: Frame) -> Any:
                return f[PARENT][sym]

            return ref1
        if depth == 2:
            def ref2(f: Frame) -> Any:
                return f[PARENT][PARENT][sym]

            return ref2
        if depth == 3:
            def ref3(f: Frame) -> Any:
                return f[PARENT][PARENT][PARENT][sym]

            return ref3

        def ref(f: Frame) -> Any:
            return frame_at(f, depth)[sym]

        return ref

    def global_ref(self, sym: Symbol, scope: Scope, loc: Optional[Loc]) -> Node:
        values = self.interp.values
        interp = self.interp
        where = user_loc(loc)

        def ref(f: Frame) -> Any:
            v = values.get(sym, _MISSING)
            if v is _MISSING:
                err = interp.unbound_variable(sym, scope)
                err.loc = where
                raise err
            return v

        return ref

    def setter(self, sym: Symbol, scope: Scope) -> Callable[[Frame, Any], Any]:
        """How to assign SYM here: a function of the frame and the value."""
        entry, depth = scope.find_var(sym)
        if type(entry) is LocalParam:
            entry.captured = True
        if entry is LEXICAL:
            if depth == 0:
                def set0(f: Frame, v: Any) -> Any:
                    f[sym] = v
                    return v

                return set0
            if depth == 1:
                def set1(f: Frame, v: Any) -> Any:
                    f[PARENT][sym] = v
                    return v

                return set1
            if depth == 2:
                def set2(f: Frame, v: Any) -> Any:
                    f[PARENT][PARENT][sym] = v
                    return v

                return set2

            def set_at(f: Frame, v: Any) -> Any:
                frame_at(f, depth)[sym] = v
                return v

            return set_at
        interp = self.interp

        def set_global(f: Frame, v: Any) -> Any:
            interp.check_assignable(sym)
            interp.values[sym] = v
            return v

        return set_global

    # -- compound forms ----------------------------------------------------------------------
    def compound(self, form: Cons, scope: Scope) -> Node:
        head = form.car
        if type(head) is Symbol:
            special = self.special_forms.get(head)
            if special is not None:
                return special(form, scope)
            entry, depth = scope.find_fun(head)
            if type(entry) is Macro:
                return self.macro_call(entry, form, scope, cache=False)
            if entry is not None:
                return self.call(form, scope, local=(entry, depth))
            macro = self.interp.macros.get(head)
            if macro is not None:
                return self.macro_call(macro, form, scope, cache=True)
            return self.call(form, scope)
        if type(head) is Cons and head.car is self.s_lambda:
            return self.call(form, scope, lam=self.lambda_node(head, scope, NIL))
        raise lisp_error("E101", f"illegal function call: {prin1_to_string(head)} is not a function name", "UNDEFINED-FUNCTION")

    def macro_call(self, macro: Macro, form: Cons, scope: Scope, cache: bool) -> Node:
        interp = self.interp
        loc = user_loc(form.loc)
        try:
            expansion = interp.expand(macro, form, cache, scope)
        except LispError as exc:
            if exc.loc is None and loc is not None:
                exc.loc = loc
                exc.macro = exc.macro or prin1_to_string(macro.name)
            raise
        inner = self.analyze(expansion, scope)
        name = macro.name

        def node(f: Frame) -> Any:
            interp.steps_left -= 1
            if interp.steps_left < 0:
                interp.out_of_steps()
            try:
                return inner(f)
            except (LispError, LimitExceeded) as exc:
                if exc.loc is None and loc is not None:
                    exc.loc = loc
                    exc.macro = exc.macro or prin1_to_string(name)
                raise

        return node

    def call(self, form: Cons, scope: Scope, local: Optional[tuple[Any, int]] = None, lam: Optional[LambdaNode] = None) -> Node:
        """A function call: the function, then the arguments left to right, then the call."""
        args: list[Node] = []
        cell = form.cdr
        while type(cell) is Cons:
            args.append(self.analyze(cell.car, scope, cell.loc))
            cell = cell.cdr
        if cell is not NIL:
            raise lisp_error("E105", f"a function call cannot be a dotted list: {prin1_to_string(form)}", "PROGRAM-ERROR")
        interp = self.interp
        if lam is not None:
            resolve = self.lambda_resolver(lam)
        elif local is not None:
            resolve = self.local_resolver(local[0], local[1])
        else:
            resolve = self.global_resolver(form, scope)
        return make_call(interp, resolve, args, form.loc)

    def lambda_resolver(self, lam: LambdaNode) -> Callable[[Frame], Any]:
        def resolve(f: Frame) -> Any:
            return Closure(NIL, lam, f)

        return resolve

    def local_resolver(self, entry: Any, depth: int) -> Callable[[Frame], Any]:
        if depth == 0:
            def resolve0(f: Frame) -> Any:
                return f[entry]

            return resolve0
        if depth == 1:
            def resolve1(f: Frame) -> Any:
                return f[PARENT][entry]

            return resolve1
        if depth == 2:
            def resolve2(f: Frame) -> Any:
                return f[PARENT][PARENT][entry]

            return resolve2

        def resolve(f: Frame) -> Any:
            return frame_at(f, depth)[entry]

        return resolve

    def global_resolver(self, form: Cons, scope: Scope) -> Callable[[Frame], Any]:
        """The global function named by FORM's head, looked up at each call. A name that is
        no function but has become a macro since the form was analyzed is expanded then."""
        sym = form.car
        functions = self.interp.functions
        interp = self.interp
        late: list[Node] = []

        undefined = Undefined(sym)

        def resolve(f: Frame) -> Any:
            fn = functions.get(sym)
            if fn is not None:
                return fn
            macro = interp.macros.get(sym)
            if macro is None:
                return undefined
            if not late:
                late.append(self.macro_call(macro, form, scope, cache=True))
            return _LateMacro(late[0])

        return resolve

    # -- lambda ------------------------------------------------------------------------------
    def lambda_node(self, form: Cons, scope: Scope, name: Any, block: Any = None) -> LambdaNode:
        rest = form.cdr
        if type(rest) is not Cons:
            raise lisp_error("E105", "lambda needs a lambda list: (lambda (args...) body...)", "PROGRAM-ERROR")
        ll = self.interp.lambda_list(rest.car)
        body = rest.cdr
        if block is not None:
            decls, forms = split_declarations(body)
            body = _list(*decls, Cons(self.s_block, Cons(block, forms)))
        return LambdaNode(self, scope, ll, body, name, macro=False)

    def bind_plan(self, ll: LambdaList, scope: Scope, specials: frozenset[Symbol]) -> tuple[BindPlan, Scope]:
        """BindPlan of LL, its defaults analyzed where the parameters before them are bound
        (all in the runtime scope SCOPE, which gets the lexical names). Returns the plan and
        the scope of the body."""
        plan = BindPlan(has_key=ll.has_key, allow_other_keys=ll.allow_other_keys, environment=ll.environment, specials=specials)
        current = scope

        def add(pattern: ListPattern) -> None:
            nonlocal current
            names = _pattern_names(pattern)
            current = Scope(current, vars={v: (SPECIAL if v in specials else LEXICAL) for v in names})

        def pattern_of(p: ListPattern) -> Pattern:
            if isinstance(p, Symbol):
                return p
            sub, _ = self.bind_plan(p, current, specials)
            return sub

        if ll.environment is not None:  # bound before the others (CLHS 3.4.4), so defaults see it
            add(ll.environment)
        if ll.whole is not None:
            plan.whole = pattern_of(ll.whole)
            add(ll.whole)
        for p in ll.required:
            plan.required.append(pattern_of(p))
            add(p)
        for opt in ll.optional:
            default = self.analyze(opt.default, current)
            plan.optional.append(ParamPlan(pattern_of(opt.pattern), default, opt.supplied))
            add(opt.pattern)
            if opt.supplied is not None:
                add(opt.supplied)
        if ll.rest is not None:
            plan.rest = pattern_of(ll.rest)
            add(ll.rest)
        for kp in ll.keys:
            default = self.analyze(kp.default, current)
            plan.keys.append(ParamPlan(pattern_of(kp.pattern), default, kp.supplied, kp.keyword))
            add(kp.pattern)
            if kp.supplied is not None:
                add(kp.supplied)
        for var, form in ll.aux:
            plan.aux.append((var, self.analyze(form, current)))
            add(var)
        return plan, current

    # -- special forms -----------------------------------------------------------------------
    def _install(self) -> None:
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
            "PROGV": self.sf_progv,
            "DECLARE": self.sf_declare,
            "QUASIQUOTE": self.sf_quasiquote,
            "UNQUOTE": self.sf_unquote,
            "UNQUOTE-SPLICING": self.sf_unquote,
            "REQUIRE": self.sf_require,
            "HANDLER-CASE": self.sf_handler_case,
            "%DEFMACRO": self.sf_defmacro,
            "%SETF-FUNCTION": self.sf_setf_function,
            "DESTRUCTURING-BIND": self.sf_destructuring_bind,
        }
        for name, fn in table.items():
            self.special_forms[self.interp.sym(name)] = fn

    def stepped(self, form: Cons, inner: Node) -> Node:
        """INNER as the node of FORM: one step, and errors located at FORM."""
        interp = self.interp
        loc = user_loc(form.loc)

        def node(f: Frame) -> Any:
            interp.steps_left -= 1
            if interp.steps_left < 0:
                interp.out_of_steps()
            try:
                return inner(f)
            except (LispError, LimitExceeded) as exc:
                if exc.loc is None:
                    exc.loc = loc
                raise

        return node

    def args_of(self, form: Cons, lo: int, hi: Optional[int], usage: str) -> list[Any]:
        items: list[Any] = []
        cell = form.cdr
        while type(cell) is Cons:
            items.append(cell.car)
            cell = cell.cdr
        if cell is not NIL or len(items) < lo or (hi is not None and len(items) > hi):
            raise lisp_error("E105", f"malformed {prin1_to_string(form.car)}: expected {usage}", "PROGRAM-ERROR")
        return items

    def sf_quote(self, form: Cons, scope: Scope) -> Node:
        value = self.args_of(form, 1, 1, "(quote object)")[0]
        interp = self.interp

        def node(f: Frame) -> Any:
            interp.steps_left -= 1
            if interp.steps_left < 0:
                interp.out_of_steps()
            return value

        node.constant = True  # type: ignore[attr-defined]
        node.value = value  # type: ignore[attr-defined]
        return node

    def sf_function(self, form: Cons, scope: Scope) -> Node:
        (name,) = self.args_of(form, 1, 1, "(function name) or #'name")
        interp = self.interp
        if type(name) is Cons and name.car is self.s_lambda:
            lam = self.lambda_node(name, scope, NIL)
            return self.stepped(form, lambda f: Closure(NIL, lam, f))
        if type(name) is Cons and name.car is self.s_setf and type(name.cdr) is Cons:
            target = name.cdr.car
            entry, depth = scope.find_fun((self.s_setf, target))
            if entry is not None:
                return self.stepped(form, self.local_resolver(entry, depth))

            def setf_fn(f: Frame) -> Any:
                fn = interp.setf_functions.get(target)
                if fn is None:
                    raise interp.undefined_function(target)
                return fn

            return self.stepped(form, setf_fn)
        if type(name) is not Symbol:
            raise lisp_error("E105", f"function: {prin1_to_string(name)} is not a function name", "PROGRAM-ERROR")
        entry, depth = scope.find_fun(name)
        if type(entry) is LocalFunction:
            return self.stepped(form, self.local_resolver(entry, depth))
        if type(entry) is Macro:
            return self.stepped(form, lambda f: _raise(lisp_error("E103", f"`{prin1_to_string(name)}` is a macro or special form, not a function", "TYPE-ERROR")))
        return self.stepped(form, lambda f: interp.function_value(name))

    def sf_setf_function(self, form: Cons, scope: Scope) -> Node:
        """(%setf-function 'name): the (setf name) function, local first, for setf's
        expansion of a place it does not know."""
        (quoted,) = self.args_of(form, 1, 1, "(%setf-function 'name)")
        name = quoted.cdr.car if type(quoted) is Cons and quoted.car is QUOTE and type(quoted.cdr) is Cons else quoted
        entry, depth = scope.find_fun((self.s_setf, name))
        if entry is not None:
            return self.stepped(form, self.local_resolver(entry, depth))
        interp = self.interp

        def node(f: Frame) -> Any:
            fn = interp.setf_functions.get(name)
            if fn is None:
                shown = prin1_to_string(name)
                raise lisp_error("E101", f"setf: `{shown}` is not a place: no (setf {shown}) function and no setf expansion", "UNDEFINED-FUNCTION")
            return fn

        return self.stepped(form, node)

    def sf_if(self, form: Cons, scope: Scope) -> Node:
        rest = form.cdr
        if type(rest) is not Cons or type(rest.cdr) is not Cons or (type(rest.cdr.cdr) is Cons and rest.cdr.cdr.cdr is not NIL):
            raise lisp_error("E105", "malformed if: expected (if test then [else])", "PROGRAM-ERROR")
        test = self.analyze(rest.car, scope)
        then = self.analyze(rest.cdr.car, scope)
        tail = rest.cdr.cdr
        else_ = self.analyze(tail.car, scope) if type(tail) is Cons else constant(NIL)
        interp = self.interp
        loc = user_loc(form.loc)
        non_boolean = interp.non_boolean_types

        def node(f: Frame) -> Any:
            interp.steps_left -= 1
            if interp.steps_left < 0:
                interp.out_of_steps()
            try:
                v = test(f)
                if v is NIL:
                    return else_(f)
                if type(v) is MultipleValues:
                    if not v or v[0] is NIL:
                        return else_(f)
                    v = v[0]
                if non_boolean and type(v) in non_boolean:
                    interp.truth(v)
                return then(f)
            except (LispError, LimitExceeded) as exc:
                if exc.loc is None:
                    exc.loc = loc
                raise

        return node

    def sf_progn(self, form: Cons, scope: Scope) -> Node:
        return self.stepped(form, self.body(form.cdr, scope))

    # -- binding forms -------------------------------------------------------------------------
    def parse_bindings(self, form: Cons) -> tuple[list[tuple[Symbol, Any, Optional[Loc]]], Any]:
        rest = form.cdr
        if type(rest) is not Cons or (rest.car is not NIL and type(rest.car) is not Cons):
            raise lisp_error("E105", f"malformed {prin1_to_string(form.car)}: expected ({prin1_to_string(form.car)} ((var value)...) body...)", "PROGRAM-ERROR")
        bindings: list[tuple[Symbol, Any, Optional[Loc]]] = []
        cell = rest.car
        while type(cell) is Cons:
            b = cell.car
            if type(b) is Symbol:
                bindings.append((b, NIL, cell.loc))
            elif type(b) is Cons and type(b.car) is Symbol and (b.cdr is NIL or (type(b.cdr) is Cons and b.cdr.cdr is NIL)):
                bindings.append((b.car, b.cdr.car if type(b.cdr) is Cons else NIL, b.cdr.loc if type(b.cdr) is Cons else None))
            else:
                raise lisp_error("E105", f"malformed binding {prin1_to_string(b)} in {prin1_to_string(form.car)}: expected var or (var value)", "PROGRAM-ERROR")
            var = bindings[-1][0]
            if var is NIL or var is T or var.package == "KEYWORD" or var in self.interp.constants:
                self.interp.check_assignable(var)
            cell = cell.cdr
        return bindings, rest.cdr

    def sf_let(self, form: Cons, scope: Scope) -> Node:
        bindings, body = self.parse_bindings(form)
        decls, forms = split_declarations(body)
        declared = declared_specials(decls)
        specials = self.interp.specials
        inits = [self.analyze(init, scope) for _, init, _ in bindings]
        lexical = [(v, n) for (v, _, _), n in zip(bindings, inits) if v not in declared and v not in specials]
        dynamic = [(v, n) for (v, _, _), n in zip(bindings, inits) if v in declared or v in specials]
        names: dict[Symbol, Any] = {v: LEXICAL for v, _ in lexical}
        names.update({v: SPECIAL for v in declared})
        names.update({v: SPECIAL for v, _ in dynamic})
        inner = Scope(scope, runtime=bool(lexical), vars=names or None)
        run_body = self.body(forms, inner)
        if not dynamic:
            return self.stepped(form, self.lexical_let(lexical, run_body))
        return self.stepped(form, self.dynamic_let(bindings, inits, declared | specials, run_body))

    def lexical_let(self, lexical: list[tuple[Symbol, Node]], run_body: Node) -> Node:
        if not lexical:
            return run_body
        if len(lexical) == 1:
            ((var, init),) = lexical

            def let1(f: Frame) -> Any:
                v = init(f)
                if type(v) is MultipleValues:
                    v = v[0] if v else NIL
                return run_body({PARENT: f, var: v})

            return let1
        pairs = tuple(lexical)

        def let(f: Frame) -> Any:
            values = []
            for _, init in pairs:
                v = init(f)
                if type(v) is MultipleValues:
                    v = v[0] if v else NIL
                values.append(v)
            frame: Frame = {PARENT: f}
            for (var, _), v in zip(pairs, values):
                frame[var] = v
            return run_body(frame)

        return let

    def dynamic_let(self, bindings: list[tuple[Symbol, Any, Optional[Loc]]], inits: list[Node], dynamic: frozenset[Symbol] | set[Symbol], run_body: Node) -> Node:
        interp = self.interp
        plan = tuple((v, n, v in dynamic) for (v, _, _), n in zip(bindings, inits))
        any_lexical = any(not d for _, _, d in plan)

        def let(f: Frame) -> Any:
            values = [primary(n(f)) for _, n, _ in plan]
            frame: Frame = {PARENT: f} if any_lexical else f
            saved: list[tuple[Symbol, Any]] = []
            try:
                for (var, _, is_dynamic), v in zip(plan, values):
                    if is_dynamic:
                        interp.bind_dynamic(var, v, saved)
                    else:
                        frame[var] = v
                return run_body(frame)
            finally:
                interp.restore(saved)

        return let

    def sf_let_star(self, form: Cons, scope: Scope) -> Node:
        bindings, body = self.parse_bindings(form)
        decls, forms = split_declarations(body)
        declared = declared_specials(decls)
        specials = self.interp.specials
        steps: list[tuple[Symbol, Node, str]] = []  # var, init, kind: "new" frame / "same" frame / "dynamic"
        current = scope
        frame_names: Optional[set[Symbol]] = None
        for var, init, _ in bindings:
            node = self.analyze(init, current)
            if var in declared or var in specials:
                steps.append((var, node, "dynamic"))
                current = Scope(current, vars={var: SPECIAL})
            elif frame_names is None or var in frame_names:
                steps.append((var, node, "new"))
                frame_names = {var}
                current = Scope(current, runtime=True, vars={var: LEXICAL})
            else:
                steps.append((var, node, "same"))
                frame_names.add(var)
                current = Scope(current, vars={var: LEXICAL})
        if declared:
            current = Scope(current, vars={v: SPECIAL for v in declared})
        run_body = self.body(forms, current)
        interp = self.interp
        plan = tuple(steps)
        if all(kind != "dynamic" for _, _, kind in plan) and len(plan) == 1:
            return self.stepped(form, self.lexical_let([(plan[0][0], plan[0][1])], run_body))

        def let_star(f: Frame) -> Any:
            saved: list[tuple[Symbol, Any]] = []
            try:
                for var, init, kind in plan:
                    v = init(f)
                    if type(v) is MultipleValues:
                        v = v[0] if v else NIL
                    if kind == "same":
                        f[var] = v
                    elif kind == "new":
                        f = {PARENT: f, var: v}
                    else:
                        interp.bind_dynamic(var, v, saved)
                return run_body(f)
            finally:
                if saved:
                    interp.restore(saved)

        return self.stepped(form, let_star)

    def function_definitions(self, form: Cons) -> tuple[list[tuple[Any, Cons]], Any]:
        rest = form.cdr
        if type(rest) is not Cons or (rest.car is not NIL and type(rest.car) is not Cons):
            raise lisp_error("E105", f"malformed {prin1_to_string(form.car)}: expected ({prin1_to_string(form.car)} ((name (args) body...)...) body...)", "PROGRAM-ERROR")
        defs: list[tuple[Any, Cons]] = []
        for d in _iter(rest.car):
            name = d.car if type(d) is Cons else None
            setf_name = type(name) is Cons and name.car is self.s_setf and type(name.cdr) is Cons and type(name.cdr.car) is Symbol
            if type(d) is not Cons or not (type(name) is Symbol or setf_name) or type(d.cdr) is not Cons:
                raise lisp_error("E105", f"malformed definition {prin1_to_string(d)} in {prin1_to_string(form.car)}: expected (name (args) body...)", "PROGRAM-ERROR")
            defs.append(((self.s_setf, name.cdr.car) if setf_name else name, d.cdr))  # type: ignore[union-attr]
        return defs, rest.cdr

    def local_lambda(self, name: Any, spec: Cons, scope: Scope) -> LambdaNode:
        block = name[1] if type(name) is tuple else name
        return self.lambda_node(Cons(self.s_lambda, spec), scope, name if type(name) is Symbol else name[1], block=block)

    def sf_flet(self, form: Cons, scope: Scope) -> Node:
        defs, body = self.function_definitions(form)
        entries = {name: LocalFunction(name) for name, _ in defs}
        lams = [(entries[name], self.local_lambda(name, spec, scope)) for name, spec in defs]
        return self.stepped(form, self.local_functions(lams, body, Scope(scope, runtime=True, funs=dict(entries)), closes_over_new=False))

    def sf_labels(self, form: Cons, scope: Scope) -> Node:
        defs, body = self.function_definitions(form)
        entries = {name: LocalFunction(name) for name, _ in defs}
        inner = Scope(scope, runtime=True, funs=dict(entries))
        lams = [(entries[name], self.local_lambda(name, spec, inner)) for name, spec in defs]
        return self.stepped(form, self.local_functions(lams, body, inner, closes_over_new=True))

    def local_functions(self, lams: list[tuple[LocalFunction, LambdaNode]], body: Any, inner: Scope, closes_over_new: bool) -> Node:
        decls, forms = split_declarations(body)
        declared = declared_specials(decls)
        if declared:
            inner = Scope(inner, vars={v: SPECIAL for v in declared})
        run_body = self.body(forms, inner)
        defs = tuple(lams)

        def node(f: Frame) -> Any:
            frame: Frame = {PARENT: f}
            env = frame if closes_over_new else f
            for entry, lam in defs:
                frame[entry] = Closure(entry.name, lam, env)
            return run_body(frame)

        return node

    def macro_body(self, name: Any, body: Any) -> Any:
        """An expander's body: its declarations (a special one makes a parameter a dynamic
        binding), then its forms in a block named NAME."""
        decls, forms = split_declarations(body)
        return _list(*decls, Cons(self.s_block, Cons(name, forms)))

    def sf_macrolet(self, form: Cons, scope: Scope) -> Node:
        defs, body = self.function_definitions(form)
        expander_scope = scope.macros_only()
        macros: dict[Any, Any] = {}
        for name, spec in defs:
            ll = self.interp.lambda_list(spec.car, macro=True)
            lam = LambdaNode(self, expander_scope, ll, self.macro_body(name, spec.cdr), name, macro=True)
            macros[name] = Macro(name, lam, root_frame())
        decls, forms = split_declarations(body)
        declared = declared_specials(decls)
        inner = Scope(scope, funs=macros, vars={v: SPECIAL for v in declared} or None)
        return self.stepped(form, self.body(forms, inner))

    def sf_symbol_macrolet(self, form: Cons, scope: Scope) -> Node:
        rest = form.cdr
        if type(rest) is not Cons:
            raise lisp_error("E105", "malformed symbol-macrolet: expected (symbol-macrolet ((name expansion)...) body...)", "PROGRAM-ERROR")
        names: dict[Symbol, Any] = {}
        for d in _iter(rest.car):
            if type(d) is not Cons or type(d.car) is not Symbol or type(d.cdr) is not Cons:
                raise lisp_error("E105", f"malformed symbol-macrolet binding {prin1_to_string(d)}", "PROGRAM-ERROR")
            names[d.car] = SymbolMacroEntry(d.cdr.car)
        decls, forms = split_declarations(rest.cdr)
        return self.stepped(form, self.body(forms, Scope(scope, vars=names)))

    def sf_setq(self, form: Cons, scope: Scope) -> Node:
        items = self.args_of(form, 0, None, "(setq var value ...)")
        if len(items) % 2:
            raise lisp_error("E105", "setq needs an even number of arguments: (setq var value ...)", "PROGRAM-ERROR")
        pairs: list[tuple[Any, Node]] = []
        for var, value_form in zip(items[::2], items[1::2]):
            if type(var) is not Symbol:
                raise lisp_error("E105", f"setq: {prin1_to_string(var)} is not a variable name", "PROGRAM-ERROR")
            entry, _ = scope.find_var(var)
            expansion = entry.expansion if type(entry) is SymbolMacroEntry else self.interp.symbol_macros.get(var) if entry is None else None
            if expansion is not None:
                place = Cons(self.s_setf, Cons(expansion, Cons(value_form, NIL)))
                pairs.append((None, self.analyze(place, scope)))
            else:
                pairs.append((self.setter(var, scope), self.analyze(value_form, scope)))
        interp = self.interp
        loc = user_loc(form.loc)
        if len(pairs) == 1 and pairs[0][0] is not None:
            store, value = pairs[0]
            assert store is not None

            def setq1(f: Frame) -> Any:
                interp.steps_left -= 1
                if interp.steps_left < 0:
                    interp.out_of_steps()
                try:
                    v = value(f)
                    if type(v) is MultipleValues:
                        v = v[0] if v else NIL
                    return store(f, v)
                except (LispError, LimitExceeded) as exc:
                    if exc.loc is None:
                        exc.loc = loc
                    raise

            return setq1
        plan = tuple(pairs)

        def setq(f: Frame) -> Any:
            result: Any = NIL
            for store, value in plan:
                v = primary(value(f))
                result = v if store is None else store(f, v)
            return result

        return self.stepped(form, setq)

    def sf_lambda(self, form: Cons, scope: Scope) -> Node:
        lam = self.lambda_node(form, scope, NIL)
        return self.stepped(form, lambda f: Closure(NIL, lam, f))

    def sf_destructuring_bind(self, form: Cons, scope: Scope) -> Node:
        rest = form.cdr
        if type(rest) is not Cons or type(rest.cdr) is not Cons:
            raise lisp_error("E105", "malformed destructuring-bind: expected (destructuring-bind lambda-list expression body...)", "PROGRAM-ERROR")
        ll = self.interp.lambda_list(rest.car, macro=True)
        value = self.analyze(rest.cdr.car, scope)
        decls, forms = split_declarations(rest.cdr.cdr)
        declared = declared_specials(decls)
        specials = frozenset(v for v in ll.variables() if v in declared or v in self.interp.specials)
        plan, inner = self.bind_plan(ll, Scope(scope, runtime=True, vars={}), specials)
        if declared:
            inner = Scope(inner, vars={v: SPECIAL for v in declared})
        run_body = self.body(forms, inner)
        interp = self.interp
        name = interp.sym("DESTRUCTURING-BIND")

        def node(f: Frame) -> Any:
            v = primary(value(f))
            frame: Frame = {PARENT: f}
            saved: list[tuple[Symbol, Any]] = []
            try:
                interp.destructure(plan, v, frame, name, None, saved)
                return run_body(frame)
            finally:
                if saved:
                    interp.restore(saved)

        return self.stepped(form, node)

    # -- exits ---------------------------------------------------------------------------------
    def sf_block(self, form: Cons, scope: Scope) -> Node:
        rest = form.cdr
        if type(rest) is not Cons or type(rest.car) is not Symbol:
            raise lisp_error("E105", "malformed block: expected (block name body...)", "PROGRAM-ERROR")
        info = BlockInfo(rest.car)
        lambdas = self.lambdas_made
        run_body = self.body(rest.cdr, Scope(scope, blocks={rest.car: info}))
        if self.lambdas_made != lambdas:
            info.used = True  # a lambda in the body, analyzed when first called, may return from it
        if not info.used:
            # the blocks defun and flet make have no position: nothing to point at, no step
            return self.stepped(form, run_body) if user_loc(form.loc) is not None else run_body

        def block(f: Frame) -> Any:
            previous = f.get(info)
            token = f[info] = object()
            try:
                return run_body(f)
            except ReturnFromSignal as signal:
                if signal.token is token:
                    return signal.value
                raise
            finally:
                if previous is None:
                    del f[info]
                else:
                    f[info] = previous

        return self.stepped(form, block)

    def sf_return_from(self, form: Cons, scope: Scope) -> Node:
        items = self.args_of(form, 1, 2, "(return-from name [value])")
        info, depth = scope.find_block(items[0])
        if info is None:
            what = "return: no enclosing block nil" if items[0] is NIL else f"return-from: no enclosing block named `{prin1_to_string(items[0])}`"
            raise lisp_error("E106", what, "CONTROL-ERROR")
        info.used = True
        value = self.analyze(items[1], scope) if len(items) > 1 else constant(NIL)

        def node(f: Frame) -> Any:
            v = value(f)
            token = frame_at(f, depth).get(info)
            if token is None:
                raise lisp_error("E106", "return-from or go to a block or tag that is no longer active", "CONTROL-ERROR")
            raise ReturnFromSignal(token, v)

        return self.stepped(form, node)

    def sf_tagbody(self, form: Cons, scope: Scope) -> Node:
        statements: list[Any] = []
        info = TagbodyInfo()
        labels: dict[Any, tuple[TagbodyInfo, int]] = {}
        for item in _iter(form.cdr):
            if type(item) is Symbol or type(item) is int:
                labels.setdefault(item, (info, len(statements)))
            else:
                statements.append(item)
        inner = Scope(scope, tags=labels) if labels else scope
        lambdas = self.lambdas_made
        program = tuple(self.tagbody_op(s, inner, info) for s in statements)
        if labels and self.lambdas_made != lambdas:
            info.nested = True  # a lambda in the body, analyzed when first called, may go to a tag
        hot = HotLoop(self, list(_iter(form.cdr)), scope, info)
        return self.stepped(form, self.tagbody_runner(program, info, len(statements), hot))

    def tagbody_op(self, statement: Any, scope: Scope, info: TagbodyInfo) -> tuple[Any, ...]:
        """One statement of a tagbody as an instruction: (0, node), or a jump inside this
        tagbody that needs no exception: (1, target, steps) for (go tag), and
        (2, test, jump_if_true, target, steps_before, steps_if_jumping) for an if whose
        branch is such a go (when and unless expand to it)."""
        expanded, layers = self.expand_statement(statement, scope)
        target = self.own_go(expanded, scope, info)
        if target is not None:
            return (1, target, layers + 1)
        if type(expanded) is Cons and expanded.car is self.s_if and self.special_forms.get(self.s_if) is not None:
            parts = list(_iter(expanded.cdr))
            if len(parts) in (2, 3):
                then_go = self.own_go_steps(parts[1], scope, info)
                else_go = self.own_go_steps(parts[2], scope, info) if len(parts) == 3 else None
                empty_else = len(parts) == 2 or parts[2] is NIL
                if then_go is not None and empty_else:
                    return (2, self.analyze(parts[0], scope), True, then_go[0], layers + 1, then_go[1])
                if else_go is not None and parts[1] is NIL:
                    return (2, self.analyze(parts[0], scope), False, else_go[0], layers + 1, else_go[1])
        return (0, self.analyze(statement, scope))

    def expand_statement(self, form: Any, scope: Scope) -> tuple[Any, int]:
        """FORM with its global macros expanded at the head (when, unless ...), and how many
        expansions that took. Local names and special forms stop it."""
        layers = 0
        while type(form) is Cons and type(form.car) is Symbol and form.car not in self.special_forms:
            entry, _ = scope.find_fun(form.car)
            macro = self.interp.macros.get(form.car)
            if entry is not None or macro is None or macro.name is not form.car:
                break
            try:
                form = self.interp.expand(macro, form, True, scope)
            except LispError:
                break
            layers += 1
        return form, layers

    def own_go(self, form: Any, scope: Scope, info: TagbodyInfo) -> Optional[int]:
        if type(form) is Cons and form.car is self.s_go and type(form.cdr) is Cons and form.cdr.cdr is NIL:
            hit, _ = scope.find_tag(form.cdr.car)
            if hit is not None and hit[0] is info:
                return hit[1]
        return None

    def own_go_steps(self, form: Any, scope: Scope, info: TagbodyInfo) -> Optional[tuple[int, int]]:
        """(target, steps) when FORM is (go tag) of this tagbody, or (progn (go tag))."""
        target = self.own_go(form, scope, info)
        if target is not None:
            return target, 1
        if type(form) is Cons and form.car is self.s_progn and type(form.cdr) is Cons and form.cdr.cdr is NIL:
            target = self.own_go(form.cdr.car, scope, info)
            if target is not None:
                return target, 2
        return None

    def tagbody_runner(self, program: tuple[tuple[Any, ...], ...], info: TagbodyInfo, n: int, hot: "HotLoop") -> Node:
        interp = self.interp
        plain = all(op[0] == 0 for op in program)
        if plain and not info.nested:
            nodes = tuple(op[1] for op in program)

            def progn_nil(f: Frame) -> Any:
                for node in nodes:
                    node(f)
                return NIL

            return progn_nil

        non_boolean = interp.non_boolean_types
        hot.has_token = info.nested

        def run(f: Frame, pc: int) -> None:
            while pc < n:
                op = program[pc]
                kind = op[0]
                if kind == 0:
                    op[1](f)
                    pc += 1
                    continue
                if kind == 1:
                    interp.steps_left -= op[2]
                    if interp.steps_left < 0:
                        interp.out_of_steps()
                    target = op[1]
                else:
                    interp.steps_left -= op[4]
                    if interp.steps_left < 0:
                        interp.out_of_steps()
                    v = op[1](f)
                    if type(v) is MultipleValues:
                        v = v[0] if v else NIL
                    if v is not NIL and non_boolean and type(v) in non_boolean:
                        interp.truth(v)
                    if (v is not NIL) is not op[2]:
                        pc += 1
                        continue
                    interp.steps_left -= op[5]
                    if interp.steps_left < 0:
                        interp.out_of_steps()
                    target = op[3]
                if target <= pc:
                    hot.count += 1
                    if hot.count == interp.hot_loops and hot.generate() is not None:
                        assert hot.generated is not None
                        hot.generated(f, target)
                        return
                pc = target

        def start(f: Frame) -> None:
            if hot.generated is not None:
                hot.generated(f, 0)
            else:
                run(f, 0)

        if not info.nested:
            def tagbody(f: Frame) -> Any:
                start(f)
                return NIL

            return tagbody

        def tagbody_with_exits(f: Frame) -> Any:
            previous = f.get(info)
            token = f[info] = object()
            try:
                try:
                    start(f)
                    return NIL
                except GoSignal as signal:
                    if signal.token is not token:
                        raise
                    pc = signal.index
                while True:
                    try:
                        if hot.generated is not None:
                            hot.generated(f, pc)
                        else:
                            run(f, pc)
                        return NIL
                    except GoSignal as signal:
                        if signal.token is not token:
                            raise
                        pc = signal.index
            finally:
                if previous is None:
                    del f[info]
                else:
                    f[info] = previous

        return tagbody_with_exits

    def sf_go(self, form: Cons, scope: Scope) -> Node:
        (label,) = self.args_of(form, 1, 1, "(go tag)")
        hit, depth = scope.find_tag(label)
        if hit is None:
            raise lisp_error("E106", f"go: no enclosing tagbody has the tag `{prin1_to_string(label)}`", "CONTROL-ERROR")
        info, index = hit
        info.nested = True

        def node(f: Frame) -> Any:
            token = frame_at(f, depth).get(info)
            if token is None:
                raise lisp_error("E106", "return-from or go to a block or tag that is no longer active", "CONTROL-ERROR")
            raise GoSignal(token, index)

        return self.stepped(form, node)

    def sf_catch(self, form: Cons, scope: Scope) -> Node:
        rest = form.cdr
        if type(rest) is not Cons:
            raise lisp_error("E105", "malformed catch: expected (catch tag body...)", "PROGRAM-ERROR")
        tag_node = self.analyze(rest.car, scope)
        run_body = self.body(rest.cdr, scope)
        interp = self.interp

        def node(f: Frame) -> Any:
            tag = primary(tag_node(f))
            interp.catch_tags.append(tag)
            try:
                return run_body(f)
            except ThrowSignal as signal:
                if signal.tag is tag or (type(tag) is int and type(signal.tag) is int and tag == signal.tag):
                    return signal.value
                raise
            finally:
                interp.catch_tags.pop()

        return self.stepped(form, node)

    def sf_throw(self, form: Cons, scope: Scope) -> Node:
        tag_form, value_form = self.args_of(form, 2, 2, "(throw tag value)")
        tag_node = self.analyze(tag_form, scope)
        value = self.analyze(value_form, scope)
        interp = self.interp

        def node(f: Frame) -> Any:
            tag = primary(tag_node(f))
            if not any(t is tag or (type(t) is int and type(tag) is int and t == tag) for t in interp.catch_tags):
                raise lisp_error("E106", f"throw: no catch is active for the tag {prin1_to_string(tag, interp.print_other)}", "CONTROL-ERROR")
            raise ThrowSignal(tag, value(f))

        return self.stepped(form, node)

    def sf_unwind_protect(self, form: Cons, scope: Scope) -> Node:
        rest = form.cdr
        if type(rest) is not Cons:
            raise lisp_error("E105", "malformed unwind-protect: expected (unwind-protect protected cleanup...)", "PROGRAM-ERROR")
        protected = self.analyze(rest.car, scope)
        cleanup = self.body(rest.cdr, scope)

        def node(f: Frame) -> Any:
            try:
                return protected(f)
            finally:
                cleanup(f)

        return self.stepped(form, node)

    # -- types and values ----------------------------------------------------------------------
    def sf_the(self, form: Cons, scope: Scope) -> Node:
        type_spec, value_form = self.args_of(form, 2, 2, "(the type form)")
        value = self.analyze(value_form, scope)
        if type(type_spec) is Cons and type_spec.car is self.interp.sym("VALUES"):
            return self.stepped(form, value)
        interp = self.interp

        def node(f: Frame) -> Any:
            v = value(f)
            from .builtins import typep

            primary_value = v[0] if type(v) is MultipleValues and v else v
            if not typep(interp, primary_value, type_spec):
                raise lisp_error("E103", f"the: {prin1_to_string(primary_value, interp.print_other)} is not of type {prin1_to_string(type_spec)}", "TYPE-ERROR", primary_value)
            return v

        return self.stepped(form, node)

    def sf_locally(self, form: Cons, scope: Scope) -> Node:
        decls, forms = split_declarations(form.cdr)
        declared = declared_specials(decls)
        inner = Scope(scope, vars={v: SPECIAL for v in declared}) if declared else scope
        return self.stepped(form, self.body(forms, inner))

    def sf_multiple_value_call(self, form: Cons, scope: Scope) -> Node:
        rest = form.cdr
        if type(rest) is not Cons:
            raise lisp_error("E105", "malformed multiple-value-call: expected (multiple-value-call function form...)", "PROGRAM-ERROR")
        fn_node = self.analyze(rest.car, scope)
        arg_nodes = tuple(self.analyze(x, scope) for x in _iter(rest.cdr))
        interp = self.interp

        def node(f: Frame) -> Any:
            fn = interp.function_value(primary(fn_node(f)))
            args: list[Any] = []
            for a in arg_nodes:
                v = a(f)
                if type(v) is MultipleValues:
                    args.extend(v)
                else:
                    args.append(v)
            return interp.apply(fn, args)

        return self.stepped(form, node)

    def sf_multiple_value_prog1(self, form: Cons, scope: Scope) -> Node:
        rest = form.cdr
        if type(rest) is not Cons:
            raise lisp_error("E105", "malformed multiple-value-prog1: expected (multiple-value-prog1 form forms...)", "PROGRAM-ERROR")
        first = self.analyze(rest.car, scope)
        others = self.body(rest.cdr, scope)

        def node(f: Frame) -> Any:
            result = first(f)
            others(f)
            return result

        return self.stepped(form, node)

    def sf_eval_when(self, form: Cons, scope: Scope) -> Node:
        rest = form.cdr
        if type(rest) is not Cons:
            raise lisp_error("E105", "malformed eval-when: expected (eval-when (situations...) body...)", "PROGRAM-ERROR")
        names = {s.name for s in _iter(rest.car) if type(s) is Symbol}
        # as SBCL's eval and load of a source file: the body runs for :execute or :load-toplevel
        if names & {"EXECUTE", "EVAL", "LOAD-TOPLEVEL", "LOAD"}:
            return self.stepped(form, self.body(rest.cdr, scope))
        return self.stepped(form, constant(NIL))

    def sf_load_time_value(self, form: Cons, scope: Scope) -> Node:
        items = self.args_of(form, 1, 2, "(load-time-value form [read-only-p])")
        interp = self.interp

        def node(f: Frame) -> Any:
            return interp.load_time_value(form, items[0])

        return self.stepped(form, node)

    def sf_progv(self, form: Cons, scope: Scope) -> Node:
        rest = form.cdr
        if type(rest) is not Cons or type(rest.cdr) is not Cons:
            raise lisp_error("E105", "malformed progv: expected (progv symbols values body...)", "PROGRAM-ERROR")
        symbols_node = self.analyze(rest.car, scope)
        values_node = self.analyze(rest.cdr.car, scope)
        run_body = self.body(rest.cdr.cdr, scope)
        interp = self.interp

        def node(f: Frame) -> Any:
            from .builtins import list_items, type_error

            symbols = list_items("progv", 1, primary(symbols_node(f)))
            values = list_items("progv", 2, primary(values_node(f)))
            saved: list[tuple[Symbol, Any]] = []
            try:
                for i, sym in enumerate(symbols):
                    if type(sym) is not Symbol:
                        raise type_error("progv", 1, "a list of symbols", sym)
                    interp.check_assignable(sym)
                    interp.bind_dynamic(sym, values[i] if i < len(values) else _UNBOUND, saved)
                return run_body(f)
            finally:
                interp.restore(saved)

        return self.stepped(form, node)

    def sf_declare(self, form: Cons, scope: Scope) -> Node:
        raise lisp_error("E105", "declare is only allowed at the start of a body (let, defun, lambda ...)", "PROGRAM-ERROR")

    def sf_unquote(self, form: Cons, scope: Scope) -> Node:
        mark = "," if form.car is UNQUOTE else ",@"
        raise lisp_error("E105", f"`{mark}` outside of a backquote", "PROGRAM-ERROR")

    def sf_require(self, form: Cons, scope: Scope) -> Node:
        interp = self.interp

        def node(f: Frame) -> Any:
            if interp.require_hook is None:
                raise lisp_error("M005", "require is only available when compiling a file", "PROGRAM-ERROR")
            return interp.require_hook(form)

        return self.stepped(form, node)

    def sf_defmacro(self, form: Cons, scope: Scope) -> Node:
        """(%defmacro name lambda-list body...) — the core of the prelude's defmacro."""
        rest = form.cdr
        if type(rest) is not Cons or type(rest.car) is not Symbol or type(rest.cdr) is not Cons:
            raise lisp_error("E105", "malformed defmacro: expected (defmacro name (args...) body...)", "PROGRAM-ERROR")
        name = rest.car
        interp = self.interp
        ll = interp.lambda_list(rest.cdr.car, macro=True)
        lam = LambdaNode(self, scope, ll, self.macro_body(name, rest.cdr.cdr), name, macro=True)

        def node(f: Frame) -> Any:
            interp.define_macro(name, Macro(name, lam, f))
            return name

        return self.stepped(form, node)

    def sf_handler_case(self, form: Cons, scope: Scope) -> Node:
        rest = form.cdr
        if type(rest) is not Cons:
            raise lisp_error("E105", "malformed handler-case: expected (handler-case form (type (var) body...)...)", "PROGRAM-ERROR")
        clauses: list[tuple[Any, Optional[Symbol], Node]] = []
        no_error: Optional[LambdaNode] = None
        for clause in _iter(rest.cdr):
            if type(clause) is not Cons or type(clause.car) not in (Symbol, Cons) or type(clause.cdr) is not Cons:
                raise lisp_error("E105", f"malformed handler-case clause {prin1_to_string(clause)}: expected (type ([var]) body...)", "PROGRAM-ERROR")
            if type(clause.car) is Symbol and clause.car.is_keyword and clause.car.name == "NO-ERROR":
                no_error = self.lambda_node(Cons(self.s_lambda, clause.cdr), scope, NIL)
                continue
            params = list(_iter(clause.cdr.car))
            var = params[0] if params else None
            decls, forms = split_declarations(clause.cdr.cdr)
            inner = Scope(scope, runtime=True, vars={var: LEXICAL}) if var is not None else scope
            clauses.append((clause.car, var, self.body(forms, inner)))
        protected = self.analyze(rest.car, scope)
        handlers = tuple(clauses)
        interp = self.interp
        specs = tuple(ctype for ctype, _, _ in clauses)
        typep = interp.types.typep

        def node(f: Frame) -> Any:
            interp.handlers.append(specs)
            try:
                value = protected(f)
            except LispError as exc:
                interp.handlers.pop()
                for ctype, var, handler in handlers:
                    if typep(exc.condition, ctype):
                        return handler({PARENT: f, var: exc.condition} if var is not None else f)
                raise
            except BaseException:
                interp.handlers.pop()
                raise
            interp.handlers.pop()
            if no_error is not None:
                return interp.call_closure(Closure(NIL, no_error, f), list(value) if type(value) is MultipleValues else [value])
            return value

        return self.stepped(form, node)

    # -- backquote -----------------------------------------------------------------------------
    def sf_quasiquote(self, form: Cons, scope: Scope) -> Node:
        (template,) = self.args_of(form, 1, 1, "`template")
        return self.stepped(form, self.quasi(template, 1, scope))

    def quasi(self, x: Any, depth: int, scope: Scope) -> Node:
        """A node building backquote template X at nesting DEPTH (1 = innermost active).
        Every cons of the template is made afresh each time, as the interpreter did."""
        if type(x) is list:
            inner = self.quasi(_list(*x), depth, scope)
            return lambda f: list(_iter(inner(f)))
        if type(x) is not Cons:
            return constant(x)
        head = x.car
        if head is UNQUOTE and type(x.cdr) is Cons and x.cdr.cdr is NIL:
            if depth == 1:
                value = self.analyze(x.cdr.car, scope)
                return lambda f: primary(value(f))
            inner = self.quasi(x.cdr.car, depth - 1, scope)
            return lambda f: Cons(UNQUOTE, Cons(inner(f), NIL))
        if head is QUASIQUOTE and type(x.cdr) is Cons and x.cdr.cdr is NIL:
            inner = self.quasi(x.cdr.car, depth + 1, scope)
            return lambda f: Cons(QUASIQUOTE, Cons(inner(f), NIL))
        if head is UNQUOTE_SPLICING and depth == 1:
            raise lisp_error("E105", "`,@` must be inside a list in a backquote", "PROGRAM-ERROR")
        parts: list[tuple[bool, Node]] = []  # (spliced, node)
        cell: Any = x
        tail: Node = constant(NIL)
        while True:
            if type(cell) is not Cons:
                tail = self.quasi(cell, depth, scope) if cell is not NIL else constant(NIL)
                break
            if cell.car is UNQUOTE and type(cell.cdr) is Cons and cell.cdr.cdr is NIL and cell is not x:
                tail = self.quasi(cell, depth, scope)
                break
            item = cell.car
            splice = type(item) is Cons and item.car is UNQUOTE_SPLICING and type(item.cdr) is Cons and item.cdr.cdr is NIL
            if splice and depth == 1:
                parts.append((True, self.analyze(item.cdr.car, scope)))
            elif splice:
                inner = self.quasi(item.cdr.car, depth - 1, scope)
                parts.append((False, _wrap_splice(inner)))
            else:
                parts.append((False, self.quasi(item, depth, scope)))
            cell = cell.cdr
        interp = self.interp
        plan = tuple(parts)

        def build(f: Frame) -> Any:
            items: list[Any] = []
            for spliced, node in plan:
                if spliced:
                    items.extend(_splice_items(primary(node(f))))
                else:
                    items.append(node(f))
            interp.alloc(len(items))
            result = tail(f)
            for item in reversed(items):
                result = Cons(item, result)
            return result

        return build


class HotLoop:
    """A tagbody's loop count, and its generated runner once it is hot."""

    __slots__ = ("analyzer", "items", "scope", "info", "count", "generated", "has_token")

    def __init__(self, analyzer: Analyzer, items: list[Any], scope: Scope, info: TagbodyInfo) -> None:
        self.analyzer = analyzer
        self.items = items
        self.scope = scope
        self.info = info
        self.count = 0
        self.generated: Optional[Callable[[Frame, int], Any]] = None
        self.has_token = False

    def generate(self) -> Optional[Callable[[Frame, int], Any]]:
        self.generated = self.analyzer.codegen().tagbody_loop(self.items, self.scope, self.info, self.has_token)
        return self.generated


class _LateMacro:
    """What a call node finds when its function became a macro after the node was made."""

    __slots__ = ("node",)

    def __init__(self, node: Node) -> None:
        self.node = node


def _wrap_splice(inner: Node) -> Node:
    return lambda f: Cons(UNQUOTE_SPLICING, Cons(inner(f), NIL))


def _raise(exc: BaseException) -> Any:
    raise exc


def _list(*items: Any) -> Any:
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


def _pattern_names(p: Any) -> list[Symbol]:
    if type(p) is Symbol:
        return [p]
    return p.variables()


# -- call nodes ----------------------------------------------------------------------------------


def make_call(interp: "Interpreter", resolve: Callable[[Frame], Any], args: list[Node], loc: Optional[Loc]) -> Node:
    """The node of a call: one step, RESOLVE gives the function, the arguments are evaluated
    left to right (primary values), the call's form becomes the interpreter's call_loc (and
    user_loc, in the user's own files) for staging, then the function is applied."""
    where = user_loc(loc)
    user = loc is not None and not loc.file.startswith(LIBRARY_FILES)
    n = len(args)
    call_closure = interp.call_closure
    apply = interp.apply

    if n == 0:
        def call0(f: Frame) -> Any:
            interp.steps_left -= 1
            if interp.steps_left < 0:
                interp.out_of_steps()
            try:
                fn = resolve(f)
                if type(fn) is _LateMacro:
                    return fn.node(f)
                if loc is not None:
                    interp.call_loc = loc
                    if user:
                        interp.user_loc = loc
                t = type(fn)
                if t is Builtin:
                    if fn.accepts[0]:
                        return fn.fn()
                elif t is Closure:
                    return call_closure(fn, ())
                return apply(fn, [])
            except (LispError, LimitExceeded) as exc:
                if exc.loc is None:
                    exc.loc = where
                raise
            except OverflowError:
                raise interp.overflow(fn, where) from None

        return call0
    if n == 1:
        (a0,) = args

        def call1(f: Frame) -> Any:
            interp.steps_left -= 1
            if interp.steps_left < 0:
                interp.out_of_steps()
            try:
                fn = resolve(f)
                if type(fn) is _LateMacro:
                    return fn.node(f)
                x = a0(f)
                if type(x) is MultipleValues:
                    x = x[0] if x else NIL
                if loc is not None:
                    interp.call_loc = loc
                    if user:
                        interp.user_loc = loc
                t = type(fn)
                if t is Builtin:
                    if fn.accepts[1]:
                        return fn.fn(x)
                elif t is Closure:
                    return call_closure(fn, (x,))
                return apply(fn, [x])
            except (LispError, LimitExceeded) as exc:
                if exc.loc is None:
                    exc.loc = where
                raise
            except OverflowError:
                raise interp.overflow(fn, where) from None

        return call1
    if n == 2:
        a0, a1 = args

        def call2(f: Frame) -> Any:
            interp.steps_left -= 1
            if interp.steps_left < 0:
                interp.out_of_steps()
            try:
                fn = resolve(f)
                if type(fn) is _LateMacro:
                    return fn.node(f)
                x = a0(f)
                if type(x) is MultipleValues:
                    x = x[0] if x else NIL
                y = a1(f)
                if type(y) is MultipleValues:
                    y = y[0] if y else NIL
                if loc is not None:
                    interp.call_loc = loc
                    if user:
                        interp.user_loc = loc
                t = type(fn)
                if t is Builtin:
                    if fn.accepts[2]:
                        return fn.fn(x, y)
                elif t is Closure:
                    return call_closure(fn, (x, y))
                return apply(fn, [x, y])
            except (LispError, LimitExceeded) as exc:
                if exc.loc is None:
                    exc.loc = where
                raise
            except OverflowError:
                raise interp.overflow(fn, where) from None

        return call2
    arg_nodes = tuple(args)

    def calln(f: Frame) -> Any:
        interp.steps_left -= 1
        if interp.steps_left < 0:
            interp.out_of_steps()
        try:
            fn = resolve(f)
            if type(fn) is _LateMacro:
                return fn.node(f)
            values = []
            for a in arg_nodes:
                x = a(f)
                if type(x) is MultipleValues:
                    x = x[0] if x else NIL
                values.append(x)
            if loc is not None:
                interp.call_loc = loc
                if user:
                    interp.user_loc = loc
            if type(fn) is Closure:
                return call_closure(fn, values)
            return apply(fn, values)
        except (LispError, LimitExceeded) as exc:
            if exc.loc is None:
                exc.loc = where
            raise
        except OverflowError:
            raise interp.overflow(fn, where) from None

    return calln
