"""The second tier of the evaluator: hot code as generated Python.

analyze.py turns every form into closures. A lambda body called often, or a tagbody that has
looped often, is generated again here as the source of one Python function, compiled by
Python: the forms of the body become straight-line statements, a tagbody a `while` loop
whose own gos are `continue`s, a call of a standard arithmetic builtin an inline operation
guarded by the builtin's identity. Forms this tier does not generate run as the analyzer's
closures, called from the generated code with the same frames. The semantics are those of
the closures: variables live in the same frames, each compound form costs one step (charged
when the straight-line run of forms it belongs to starts), an error points at the same form
(a table maps the position in the generated code to the form), call_loc and user_loc are set
as by a call node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from .codecache import cached_compile
from .conditions import LimitExceeded, LispError
from .objects import PARENT, Builtin, Closure, GoSignal, Macro, ReturnFromSignal
from .printer import prin1_to_string
from .scope import LEXICAL, LIBRARY_FILES, SPECIAL, BlockInfo, LocalFunction, LocalParam, Node, Scope, SymbolMacroEntry, TagbodyInfo, declared_specials, split_declarations, user_loc
from .types import NIL, T, Cons, Loc, MultipleValues, Symbol

if TYPE_CHECKING:
    from .analyze import Analyzer, LambdaNode
    from .evaluator import Interpreter

MAX_INDENT = 60  # deeper code stays closures (Python allows 100 levels of indentation)
MAX_BLOCKS = 14  # nested loops and trys (Python allows 20)


class CannotGenerate(Exception):
    """This code stays in the closure tier."""


@dataclass
class Region:
    """A straight-line run of forms: charged its steps once, where it starts."""

    line: int
    steps: int = 0


@dataclass
class Loop:
    """A tagbody being generated: its pc variable and its labels."""

    info: TagbodyInfo
    pc: str
    token: str
    needs_token: bool = False


@dataclass
class Cursor:
    """Where the steps of the next forms are charged: shared by the contexts of one
    straight-line run, replaced at a branch."""

    region: Region


@dataclass
class Ctx:
    indent: int
    frames: list[str]  # Python names of the runtime frames entered in this function, outermost first
    entry: int  # annotation entry of the enclosing form (for forms without a position of their own)
    cursor: Cursor
    loop: Optional[Loop] = None  # the innermost tagbody at this point of this function
    loops: tuple[Loop, ...] = ()  # every tagbody enclosing this point in this function
    blocks: int = 1  # nested Python loops and trys
    tail: bool = False  # the value of this form is what the function returns
    primary: bool = False  # only the primary value of this form is used
    tail_blocks: tuple[BlockInfo, ...] = ()  # blocks whose return-from can be a Python return

    def inner(self, **changes: Any) -> "Ctx":
        # a copy with CHANGES (what dataclasses.replace does, without its cost: contexts are
        # made for every form generated)
        ctx = object.__new__(Ctx)
        ctx.__dict__.update(self.__dict__)
        ctx.__dict__.update(changes)
        return ctx


@dataclass
class Emitter:
    lines: list[str] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)
    namespace: dict[str, Any] = field(default_factory=dict)
    entries: list[tuple[Optional[Loc], Optional[str], str]] = field(default_factory=lambda: [(None, None, "")])
    regions: list[Region] = field(default_factory=list)
    counter: int = 0

    def obj(self, value: Any, hint: str = "c") -> str:
        name = self.names.get(id(value))
        if name is None:
            self.counter += 1
            name = f"_{hint}{self.counter}"
            self.names[id(value)] = name
            self.namespace[name] = value
        return name

    def temp(self) -> str:
        self.counter += 1
        return f"t_{self.counter}"

    def emit(self, ctx: Ctx, text: str) -> int:
        self.lines.append("    " * ctx.indent + text)
        return len(self.lines) - 1

    def region(self, ctx: Ctx) -> Region:
        region = Region(self.emit(ctx, "#charge"))
        self.regions.append(region)
        return region

    def entry(self, loc: Optional[Loc], macro: Optional[str], name: str) -> int:
        self.entries.append((loc, macro, name))
        return len(self.entries) - 1

    def source(self) -> str:
        for region in self.regions:
            indent = self.lines[region.line][: len(self.lines[region.line]) - len("#charge")]
            if region.steps:
                self.lines[region.line] = f"{indent}_I.steps_left -= {region.steps}\n{indent}if _I.steps_left < 0: _I.out_of_steps()"
            else:
                self.lines[region.line] = f"{indent}pass"
        return "\n".join(self.lines)


class CodeGen:
    """Generates the hot code of one interpreter."""

    def __init__(self, analyzer: "Analyzer") -> None:
        self.analyzer = analyzer
        self.interp: "Interpreter" = analyzer.interp
        self.inline = self.inline_table()
        self.singles: set[str] = set()
        self.osr_token = False

    # -- units ---------------------------------------------------------------------------------
    def lambda_body(self, lam: "LambdaNode", scope: Scope) -> Optional[Node]:
        """The generated body of LAM (its frame holds the parameters), or None."""
        try:
            return self.unit(lam.forms, scope, tagbody=None)
        except CannotGenerate:
            return None

    def fast_lambda(self, lam: "LambdaNode") -> Optional[Callable[..., Any]]:
        """LAM's body as a Python function (env, *args) whose parameters are Python
        variables, when nothing in the body needs them in a frame (no lambda in it, no form
        left to the closures that reads them); else None."""
        params = [LocalParam(p, f"p_{i}") for i, p in enumerate(lam.required)]
        scope = Scope(lam.scope, vars={p.name: p for p in params})
        if lam.free_specials:
            scope = Scope(scope, vars={v: SPECIAL for v in lam.free_specials})
        lambdas = self.analyzer.lambdas_made
        try:
            source, namespace = self.unit_source(lam.forms, scope, tagbody=None, params=[p.python for p in params])
            # known before compiling: Python's compile is most of a promotion's cost
            if self.analyzer.lambdas_made != lambdas or any(p.captured for p in params):
                return None
            return self.load_unit(source, namespace)
        except CannotGenerate:
            return None

    def tagbody_loop(self, items: list[Any], scope: Scope, info: TagbodyInfo, has_token: bool) -> Optional[Callable[[Any, int], Any]]:
        """A generated runner (f, pc) -> nil of a tagbody the closures run, or None. ITEMS
        are its tags and statements, SCOPE the scope around it."""
        try:
            return self.unit(items, scope, tagbody=(info, has_token))
        except CannotGenerate:
            return None

    def unit(self, forms: Any, scope: Scope, tagbody: Optional[tuple[TagbodyInfo, bool]], params: Optional[list[str]] = None) -> Any:
        return self.load_unit(*self.unit_source(forms, scope, tagbody, params))

    def unit_source(self, forms: Any, scope: Scope, tagbody: Optional[tuple[TagbodyInfo, bool]],
                    params: Optional[list[str]] = None) -> tuple[str, dict[str, Any]]:
        """The source of the Python function `_unit` for FORMS, and the namespace it runs in."""
        em = Emitter()
        ctx = Ctx(indent=2, frames=["f0"], entry=0, cursor=Cursor(Region(0)))
        self.singles = set()
        args = "f0, _pc0" if tagbody is not None else ", ".join(["f0", *(params or [])])
        em.lines += [f"def _unit({args}):", "    _at = 0", "    try:"]
        ctx.cursor.region = em.region(ctx)
        if tagbody is not None:
            info, has_token = tagbody
            self.osr_token = has_token
            self.tagbody_statements(em, list(forms), scope, ctx, info, osr=has_token, start="_pc0")
            em.emit(ctx, "return _NIL")
        else:
            ctx.tail = True
            result = self.body(em, forms, scope, ctx)
            em.emit(ctx, f"return {result}")
        em.lines += [
            "    except (_LispError, _LimitExceeded) as _e:",
            "        if _e.loc is None: _annotate(_e, _entries[_at])",
            "        raise",
            "    except OverflowError:",
            "        raise _overflow(_entries[_at]) from None",
        ]
        return em.source(), self.namespace(em)

    def load_unit(self, source: str, namespace: dict[str, Any]) -> Any:
        try:
            code = cached_compile(source, "<sexpgpu generated>")
        except (SyntaxError, RecursionError, MemoryError, ValueError):
            raise CannotGenerate() from None
        exec(code, namespace)
        unit = namespace["_unit"]
        unit.source = source  # for reading what was generated
        return unit

    def namespace(self, em: Emitter) -> dict[str, Any]:
        interp = self.interp
        ns = dict(em.namespace)
        ns.update(
            _I=interp, _NIL=NIL, _T=T, _P=PARENT, _MV=MultipleValues, _Cons=Cons, _Closure=Closure, _Builtin=Builtin,
            _LispError=LispError, _LimitExceeded=LimitExceeded, _GoSignal=GoSignal, _ReturnFromSignal=ReturnFromSignal,
            _entries=em.entries, _annotate=_annotate, _overflow=lambda e: _overflow(interp, e),
            _get=interp.functions.get, _values=interp.values, _MISSING=_MISSING, _call_closure=interp.call_closure,
            _apply=interp.apply, _nb=interp.non_boolean_types, _object=object, _control=_control_error,
        )
        return ns

    # -- forms ---------------------------------------------------------------------------------
    def body(self, em: Emitter, forms: Any, scope: Scope, ctx: Ctx) -> str:
        items = list(_iter(forms))
        if not items:
            return "_NIL"
        for form in items[:-1]:
            self.expr(em, form, scope, ctx.inner(tail=False))
        return self.expr(em, items[-1], scope, ctx)

    def value(self, em: Emitter, form: Any, scope: Scope, ctx: Ctx, loc: Optional[Loc] = None) -> str:
        """An atom holding FORM's primary value."""
        atom = self.expr(em, form, scope, ctx.inner(tail=False, primary=True), loc)
        if atom in self.singles or not atom.startswith("t_"):
            return atom
        em.emit(ctx, f"if type({atom}) is _MV: {atom} = {atom}[0] if {atom} else _NIL")
        return atom

    def expr(self, em: Emitter, form: Any, scope: Scope, ctx: Ctx, loc: Optional[Loc] = None) -> str:
        """Emit FORM's code; return an atom (a temporary, a name or a literal) holding its
        values."""
        t = type(form)
        if t is Symbol:
            return self.variable(em, form, scope, ctx, loc)
        if t is not Cons:
            return self.literal(em, form)
        if ctx.indent > MAX_INDENT or ctx.blocks > MAX_BLOCKS:
            return self.fallback(em, form, scope, ctx)
        where = user_loc(form.loc)
        head = form.car
        name = prin1_to_string(head) if type(head) is Symbol else "lambda"
        entry = em.entry(where, None, name) if where is not None else ctx.entry
        here = ctx.inner(entry=entry)
        if type(head) is Symbol:
            special = self.special(head)
            if special is not None:
                return special(em, form, scope, here)
            fentry, depth = scope.find_fun(head)
            if type(fentry) is Macro:
                return self.macro(em, fentry, form, scope, here, cache=False)
            if fentry is not None:
                return self.call(em, form, scope, here, local=(fentry, depth))
            macro = self.interp.macros.get(head)
            if macro is not None:
                return self.macro(em, macro, form, scope, here, cache=True)
            return self.call(em, form, scope, here)
        return self.fallback(em, form, scope, here)

    def literal(self, em: Emitter, value: Any) -> str:
        if type(value) is int and -(10**18) < value < 10**18:
            return repr(value)
        if value is NIL:
            return "_NIL"
        if value is T:
            return "_T"
        return em.obj(value)

    def fallback(self, em: Emitter, form: Any, scope: Scope, ctx: Ctx) -> str:
        """FORM as the analyzer's closure, called with the current frame."""
        node = self.analyzer.analyze(form, scope)
        out = em.temp()
        em.emit(ctx, f"_at = {ctx.entry}")
        em.emit(ctx, f"{out} = {em.obj(node, 'n')}({ctx.frames[-1]})")
        return out

    def frame(self, ctx: Ctx, depth: int) -> str:
        if depth < len(ctx.frames):
            return ctx.frames[-1 - depth]
        return ctx.frames[0] + "[_P]" * (depth - len(ctx.frames) + 1)

    def variable(self, em: Emitter, sym: Symbol, scope: Scope, ctx: Ctx, loc: Optional[Loc]) -> str:
        if sym is NIL or sym is T or sym.package == "KEYWORD":
            return self.literal(em, sym)
        entry, depth = scope.find_var(sym)
        if type(entry) is SymbolMacroEntry:
            return self.expr(em, entry.expansion, scope, ctx, loc)
        out = em.temp()
        self.singles.add(out)
        if isinstance(entry, LocalParam):
            em.emit(ctx, f"{out} = {entry.python}")
            return out
        if entry is LEXICAL:
            em.emit(ctx, f"{out} = {self.frame(ctx, depth)}[{em.obj(sym, 'k')}]")
            return out
        where = user_loc(loc)
        at = em.entry(where, None, "") if where is not None else ctx.entry
        k = em.obj(sym, "k")
        em.emit(ctx, f"{out} = _values.get({k}, _MISSING)")
        em.emit(ctx, f"if {out} is _MISSING: _at = {at}; raise _I.unbound_variable({k}, {em.obj(scope, 's')})")
        return out

    def macro(self, em: Emitter, macro: Macro, form: Cons, scope: Scope, ctx: Ctx, cache: bool) -> str:
        where = user_loc(form.loc)
        try:
            expansion = self.interp.expand(macro, form, cache, scope)
        except LispError:
            return self.fallback(em, form, scope, ctx)
        ctx.cursor.region.steps += 1
        if where is not None:
            ctx = ctx.inner(entry=em.entry(where, prin1_to_string(macro.name), ""))
        return self.expr(em, expansion, scope, ctx)

    # -- special forms ---------------------------------------------------------------------------
    def special(self, head: Symbol) -> Optional[Callable[..., str]]:
        if head not in self.analyzer.special_forms:
            return None
        name = head.name
        table: dict[str, Callable[..., str]] = {
            "QUOTE": self.sf_quote,
            "IF": self.sf_if,
            "PROGN": self.sf_progn,
            "SETQ": self.sf_setq,
            "LET": self.sf_let,
            "LET*": self.sf_let_star,
            "TAGBODY": self.sf_tagbody,
            "GO": self.sf_go,
            "BLOCK": self.sf_block,
            "RETURN-FROM": self.sf_return_from,
            "FUNCTION": self.sf_function,
            "LAMBDA": self.sf_lambda,
            "MACROLET": self.sf_macrolet,
            "SYMBOL-MACROLET": self.sf_symbol_macrolet,
        }
        return table.get(name, self.fallback)

    def sf_quote(self, em: Emitter, form: Cons, scope: Scope, ctx: Ctx) -> str:
        if type(form.cdr) is not Cons or form.cdr.cdr is not NIL:
            return self.fallback(em, form, scope, ctx)
        ctx.cursor.region.steps += 1
        return self.literal(em, form.cdr.car)

    def sf_progn(self, em: Emitter, form: Cons, scope: Scope, ctx: Ctx) -> str:
        ctx.cursor.region.steps += 1
        return self.body(em, form.cdr, scope, ctx)

    def sf_if(self, em: Emitter, form: Cons, scope: Scope, ctx: Ctx) -> str:
        parts = list(_iter(form.cdr))
        if len(parts) not in (2, 3) or _last_cdr(form) is not NIL:
            return self.fallback(em, form, scope, ctx)
        ctx.cursor.region.steps += 1
        test = self.value(em, parts[0], scope, ctx)
        out = em.temp()
        em.emit(ctx, f"if {test} is not _NIL:")
        branch = ctx.inner(indent=ctx.indent + 1)
        em.emit(branch, f"if _nb and type({test}) in _nb: _at = {ctx.entry}; _I.truth({test})")
        branch.cursor = Cursor(em.region(branch))
        then = self.expr(em, parts[1], scope, branch)
        em.emit(branch, f"{out} = {then}")
        em.emit(ctx, "else:")
        branch = ctx.inner(indent=ctx.indent + 1)
        branch.cursor = Cursor(em.region(branch))
        other = self.expr(em, parts[2], scope, branch) if len(parts) == 3 else "_NIL"
        em.emit(branch, f"{out} = {other}")
        ctx.cursor.region = em.region(ctx)
        return out

    def sf_setq(self, em: Emitter, form: Cons, scope: Scope, ctx: Ctx) -> str:
        items = list(_iter(form.cdr))
        if len(items) % 2 or _last_cdr(form) is not NIL or not all(type(v) is Symbol for v in items[::2]):
            return self.fallback(em, form, scope, ctx)
        ctx.cursor.region.steps += 1
        result = "_NIL"
        for var, value_form in zip(items[::2], items[1::2]):
            entry, depth = scope.find_var(var)
            if type(entry) is SymbolMacroEntry:
                place = Cons(self.analyzer.s_setf, Cons(entry.expansion, Cons(value_form, NIL)))
                result = self.value(em, place, scope, ctx)
                continue
            value = self.value(em, value_form, scope, ctx)
            if isinstance(entry, LocalParam):
                em.emit(ctx, f"{entry.python} = {value}")
            elif entry is LEXICAL:
                em.emit(ctx, f"{self.frame(ctx, depth)}[{em.obj(var, 'k')}] = {value}")
            else:
                em.emit(ctx, f"_at = {ctx.entry}")
                em.emit(ctx, f"_I.check_assignable({em.obj(var, 'k')}); _values[{em.obj(var, 'k')}] = {value}")
            result = value
        return result

    def bindings(self, form: Cons) -> Optional[tuple[list[tuple[Symbol, Any]], Any]]:
        """The bindings and body of a let whose variables are all plain lexical ones."""
        try:
            bindings, body = self.analyzer.parse_bindings(form)
        except LispError:
            return None
        decls, forms = split_declarations(body)
        if declared_specials(decls) or any(v in self.interp.specials for v, _, _ in bindings):
            return None
        return [(v, init) for v, init, _ in bindings], forms

    def new_frame(self, em: Emitter, ctx: Ctx, pairs: list[tuple[Symbol, str]]) -> str:
        name = f"f{len(ctx.frames)}_{em.counter}"
        em.counter += 1
        items = ", ".join([f"_P: {ctx.frames[-1]}"] + [f"{em.obj(v, 'k')}: {a}" for v, a in pairs])
        em.emit(ctx, f"{name} = {{{items}}}")
        return name

    def sf_let(self, em: Emitter, form: Cons, scope: Scope, ctx: Ctx) -> str:
        parsed = self.bindings(form)
        if parsed is None:
            return self.fallback(em, form, scope, ctx)
        bindings, forms = parsed
        ctx.cursor.region.steps += 1
        values = [self.value(em, init, scope, ctx) for _, init in bindings]
        if not bindings:
            return self.body(em, forms, scope, ctx)
        frame = self.new_frame(em, ctx, [(v, a) for (v, _), a in zip(bindings, values)])
        inner = Scope(scope, runtime=True, vars={v: LEXICAL for v, _ in bindings})
        return self.body(em, forms, inner, ctx.inner(frames=ctx.frames + [frame]))

    def sf_let_star(self, em: Emitter, form: Cons, scope: Scope, ctx: Ctx) -> str:
        parsed = self.bindings(form)
        if parsed is None:
            return self.fallback(em, form, scope, ctx)
        bindings, forms = parsed
        ctx.cursor.region.steps += 1
        current, inner = scope, ctx
        names: Optional[set[Symbol]] = None
        for var, init in bindings:
            value = self.value(em, init, current, inner)
            if names is None or var in names:
                frame = self.new_frame(em, inner, [(var, value)])
                names = {var}
                current = Scope(current, runtime=True, vars={var: LEXICAL})
                inner = inner.inner(frames=inner.frames + [frame])
            else:
                names.add(var)
                em.emit(inner, f"{inner.frames[-1]}[{em.obj(var, 'k')}] = {value}")
                current = Scope(current, vars={var: LEXICAL})
        return self.body(em, forms, current, inner)

    def sf_macrolet(self, em: Emitter, form: Cons, scope: Scope, ctx: Ctx) -> str:
        return self.fallback(em, form, scope, ctx)

    def sf_symbol_macrolet(self, em: Emitter, form: Cons, scope: Scope, ctx: Ctx) -> str:
        return self.fallback(em, form, scope, ctx)

    def sf_function(self, em: Emitter, form: Cons, scope: Scope, ctx: Ctx) -> str:
        if type(form.cdr) is not Cons or form.cdr.cdr is not NIL:
            return self.fallback(em, form, scope, ctx)
        name = form.cdr.car
        if type(name) is Cons and name.car is self.analyzer.s_lambda:
            return self.make_closure(em, name, scope, ctx)
        if type(name) is Symbol:
            entry, depth = scope.find_fun(name)
            if type(entry) is LocalFunction:
                ctx.cursor.region.steps += 1
                out = em.temp()
                self.singles.add(out)
                em.emit(ctx, f"{out} = {self.frame(ctx, depth)}[{em.obj(entry, 'e')}]")
                return out
        return self.fallback(em, form, scope, ctx)

    def sf_lambda(self, em: Emitter, form: Cons, scope: Scope, ctx: Ctx) -> str:
        return self.make_closure(em, form, scope, ctx)

    def make_closure(self, em: Emitter, lambda_form: Cons, scope: Scope, ctx: Ctx) -> str:
        try:
            lam = self.analyzer.lambda_node(lambda_form, scope, NIL)
        except LispError:
            return self.fallback(em, Cons(self.analyzer.s_lambda, lambda_form.cdr), scope, ctx)
        ctx.cursor.region.steps += 1
        out = em.temp()
        self.singles.add(out)
        em.emit(ctx, f"{out} = _Closure(_NIL, {em.obj(lam, 'l')}, {ctx.frames[-1]})")
        return out

    # -- blocks and tagbodies ----------------------------------------------------------------------
    def sf_block(self, em: Emitter, form: Cons, scope: Scope, ctx: Ctx) -> str:
        rest = form.cdr
        if type(rest) is not Cons or type(rest.car) is not Symbol:
            return self.fallback(em, form, scope, ctx)
        if user_loc(form.loc) is not None:
            ctx.cursor.region.steps += 1
        info = BlockInfo(rest.car)
        lambdas = self.analyzer.lambdas_made
        inner_scope = Scope(scope, blocks={rest.car: info})
        out = em.temp()
        token_line = em.emit(ctx, "pass")
        try_line = em.emit(ctx, "if True:")
        body_ctx = ctx.inner(indent=ctx.indent + 1, blocks=ctx.blocks + 1, tail_blocks=ctx.tail_blocks + ((info,) if ctx.tail else ()))
        value = self.body(em, rest.cdr, inner_scope, body_ctx)
        em.emit(body_ctx, f"{out} = {value}")
        if self.analyzer.lambdas_made != lambdas:
            info.used = True
        if info.used:
            home = ctx.frames[-1]
            key = em.obj(info, "b")
            token = f"_tok{em.counter}"
            em.counter += 1
            pad = "    " * ctx.indent
            em.lines[token_line] = f"{pad}_prev{token} = {home}.get({key}); {token} = {home}[{key}] = _object()"
            em.lines[try_line] = f"{pad}try:"
            handler = ctx.inner(indent=ctx.indent + 1)
            em.emit(ctx, "except _ReturnFromSignal as _r:")
            em.emit(handler, f"if _r.token is not {token}: raise")
            em.emit(handler, f"{out} = _r.value")
            em.emit(ctx, "finally:")
            em.emit(handler, f"if _prev{token} is None: del {home}[{key}]")
            em.emit(handler, f"else: {home}[{key}] = _prev{token}")
        ctx.cursor.region = em.region(ctx)
        return out

    def sf_return_from(self, em: Emitter, form: Cons, scope: Scope, ctx: Ctx) -> str:
        items = list(_iter(form.cdr))
        if not 1 <= len(items) <= 2 or type(items[0]) is not Symbol or _last_cdr(form) is not NIL:
            return self.fallback(em, form, scope, ctx)
        info, depth = scope.find_block(items[0])
        if info is None:
            return self.fallback(em, form, scope, ctx)
        ctx.cursor.region.steps += 1
        value = self.expr(em, items[1], scope, ctx.inner(tail=False)) if len(items) > 1 else "_NIL"
        if info in ctx.tail_blocks:
            em.emit(ctx, f"return {value}")
            return "_NIL"
        info.used = True
        token = em.temp()
        em.emit(ctx, f"{token} = {self.frame(ctx, depth)}.get({em.obj(info, 'b')})")
        em.emit(ctx, f"if {token} is None: _at = {ctx.entry}; raise _control()")
        em.emit(ctx, f"raise _ReturnFromSignal({token}, {value})")
        return "_NIL"

    def sf_tagbody(self, em: Emitter, form: Cons, scope: Scope, ctx: Ctx) -> str:
        ctx.cursor.region.steps += 1
        info = TagbodyInfo()
        self.tagbody_statements(em, list(_iter(form.cdr)), scope, ctx.inner(tail=False), info, osr=False, start="0")
        ctx.cursor.region = em.region(ctx)
        return "_NIL"

    def tagbody_statements(self, em: Emitter, items: list[Any], scope: Scope, ctx: Ctx, info: TagbodyInfo, osr: bool, start: str) -> None:
        """A tagbody as a state machine: `pc` says where to go on; each label starts a
        segment; a go inside this loop is `pc = k; continue`, one from deeper code an
        exception carrying the activation's token (caught below)."""
        labels: dict[Any, tuple[TagbodyInfo, int]] = {}
        statements: list[Any] = []
        for item in items:
            if type(item) is Symbol or type(item) is int:
                labels.setdefault(item, (info, len(statements)))
            else:
                statements.append(item)
        inner_scope = Scope(scope, tags=labels) if labels else scope
        pc = f"_pc{em.counter}"
        em.counter += 1
        loop = Loop(info, pc, f"_tok{em.counter}")
        em.counter += 1
        home = ctx.frames[-1]
        key = em.obj(info, "g")
        token_line = em.emit(ctx, "pass")
        em.emit(ctx, f"{pc} = {start}")
        em.emit(ctx, "while True:")
        outer = ctx.inner(indent=ctx.indent + 1, blocks=ctx.blocks + 1)
        em.emit(outer, "try:")
        loop_ctx = ctx.inner(indent=ctx.indent + 2, blocks=ctx.blocks + 3, loop=loop, loops=ctx.loops + (loop,), tail=False)
        em.emit(loop_ctx, "while True:")
        seg_ctx = loop_ctx.inner(indent=loop_ctx.indent + 1)
        starts = sorted({index for _, index in labels.values()} | {0})
        lambdas = self.analyzer.lambdas_made
        for i, statement in enumerate(statements):
            if i in starts:
                em.emit(seg_ctx, f"if {pc} <= {i}:")
                stmt_ctx = seg_ctx.inner(indent=seg_ctx.indent + 1)
                stmt_ctx.cursor = Cursor(em.region(stmt_ctx))
            self.expr(em, statement, inner_scope, stmt_ctx)
        if not statements:
            em.emit(seg_ctx, "pass")
        em.emit(seg_ctx, "break")
        em.emit(loop_ctx, "break")
        if self.analyzer.lambdas_made != lambdas and labels:
            info.nested = True
        if osr and (loop.needs_token or info.nested) and not self.osr_token:
            raise CannotGenerate()
        if osr and (loop.needs_token or info.nested):
            # the closures' runner keeps the token and catches the gos: only read it here
            em.lines[token_line] = "    " * ctx.indent + f"{loop.token} = {home}.get({key})"
        elif loop.needs_token or info.nested:
            em.lines[token_line] = "    " * ctx.indent + f"_prev_{loop.token} = {home}.get({key}); {loop.token} = {home}[{key}] = _object()"
        if osr:
            em.emit(outer, "finally:")
            em.emit(outer.inner(indent=outer.indent + 1), "pass")
            return
        em.emit(outer, "except _GoSignal as _g:")
        handler = outer.inner(indent=outer.indent + 1)
        if loop.needs_token or info.nested:
            em.emit(handler, f"if _g.token is not {loop.token}: raise")
            em.emit(handler, f"{pc} = _g.index")
        else:
            em.emit(handler, "raise")
        if loop.needs_token or info.nested:
            em.emit(ctx, f"if _prev_{loop.token} is None: del {home}[{key}]")
            em.emit(ctx, f"else: {home}[{key}] = _prev_{loop.token}")

    def sf_go(self, em: Emitter, form: Cons, scope: Scope, ctx: Ctx) -> str:
        if type(form.cdr) is not Cons or form.cdr.cdr is not NIL:
            return self.fallback(em, form, scope, ctx)
        hit, depth = scope.find_tag(form.cdr.car)
        if hit is None:
            return self.fallback(em, form, scope, ctx)
        info, index = hit
        ctx.cursor.region.steps += 1
        if ctx.loop is not None and ctx.loop.info is info:
            em.emit(ctx, f"{ctx.loop.pc} = {index}; continue")
            return "_NIL"
        own = next((loop for loop in ctx.loops if loop.info is info), None)
        if own is not None:
            own.needs_token = True
            em.emit(ctx, f"raise _GoSignal({own.token}, {index})")
            return "_NIL"
        info.nested = True
        token = em.temp()
        em.emit(ctx, f"{token} = {self.frame(ctx, depth)}.get({em.obj(info, 'g')})")
        em.emit(ctx, f"if {token} is None: _at = {ctx.entry}; raise _control()")
        em.emit(ctx, f"raise _GoSignal({token}, {index})")
        return "_NIL"

    # -- calls -------------------------------------------------------------------------------------
    def call(self, em: Emitter, form: Cons, scope: Scope, ctx: Ctx, local: Optional[tuple[Any, int]] = None) -> str:
        if _last_cdr(form) is not NIL:
            return self.fallback(em, form, scope, ctx)
        ctx.cursor.region.steps += 1
        fn = em.temp()
        out = em.temp()
        if local is not None:
            entry, depth = local
            em.emit(ctx, f"{fn} = {self.frame(ctx, depth)}[{em.obj(entry, 'e')}]")
            self.call_rest(em, form, scope, ctx, fn, out, None)
            return out
        sym = form.car
        em.emit(ctx, f"{fn} = _get({em.obj(sym, 'k')})")
        em.emit(ctx, f"if {fn} is None:")
        slow = _Late(self.analyzer, form, scope)  # the closure resolves again: signals, or expands a late macro
        em.emit(ctx.inner(indent=ctx.indent + 1), f"_at = {ctx.entry}; {out} = {em.obj(slow, 'n')}({ctx.frames[-1]})")
        em.emit(ctx, "else:")
        inner = ctx.inner(indent=ctx.indent + 1)
        current = self.interp.functions.get(sym)
        self.call_rest(em, form, scope, inner, fn, out, current if type(current) is Builtin else None)
        return out

    def call_rest(self, em: Emitter, form: Cons, scope: Scope, ctx: Ctx, fn: str, out: str, builtin: Optional[Builtin]) -> None:
        # each argument is a temporary or a constant, never a frame read, so a later
        # argument's side effects cannot change an earlier one
        args: list[str] = []
        cell = form.cdr
        while type(cell) is Cons:
            args.append(self.value(em, cell.car, scope, ctx, cell.loc))
            cell = cell.cdr
        em.emit(ctx, f"_at = {ctx.entry}")
        n = len(args)
        arglist = ", ".join(args)
        tup = f"({arglist},)" if n == 1 else f"({arglist})"
        inline = None
        if builtin is not None:
            inline = self.inline.get(builtin.fn) or self.inline.get(self.interp.inline_aliases.get(builtin.fn))
        generic = ctx
        line = inline(out, em.obj(builtin.fn, "bf"), args) if inline is not None and builtin is not None else None
        if line is not None:
            assert builtin is not None
            em.emit(ctx, f"if {fn} is {em.obj(builtin, 'b')}:")
            em.emit(ctx.inner(indent=ctx.indent + 1), line)
            em.emit(ctx, "else:")
            generic = ctx.inner(indent=ctx.indent + 1)
        loc = form.loc
        if loc is not None:
            em.emit(generic, f"_I.call_loc = {em.obj(loc, 'loc')}")
            if not loc.file.startswith(LIBRARY_FILES):
                em.emit(generic, f"_I.user_loc = {em.obj(loc, 'loc')}")
        # a closure with a generated fast entry is called inline (the depth as call_closure
        # keeps it); any other goes through call_closure
        lam = em.temp()
        depth = em.temp()
        em.emit(generic, f"if type({fn}) is _Closure:")
        closure = generic.inner(indent=generic.indent + 1)
        em.emit(closure, f"{lam} = {fn}.lam")
        em.emit(closure, f"if {lam}.fast is not None and len({lam}.required) == {n} and _I.depth < _I.max_depth:")
        fast = closure.inner(indent=closure.indent + 1)
        em.emit(fast, f"{depth} = _I.depth = _I.depth + 1")
        em.emit(fast, f"try: {out} = {lam}.fast({', '.join([f'{fn}.env', *args])})")
        em.emit(fast, f"finally: _I.depth = {depth} - 1")
        em.emit(closure, f"else: {out} = _call_closure({fn}, {tup})")
        if n < 8:
            em.emit(generic, f"elif type({fn}) is _Builtin and {fn}.accepts[{n}]: {out} = {fn}.fn({arglist})")
        em.emit(generic, f"else: {out} = _apply({fn}, [{arglist}])")
        if ctx.primary:
            em.emit(generic, f"if type({out}) is _MV: {out} = {out}[0] if {out} else _NIL")
            self.singles.add(out)

    def inline_table(self) -> dict[Any, "Inline"]:
        """Inline code for the standard builtins, keyed by their Python function. Each
        falls back to the builtin itself when its arguments are not of the inlined kind."""
        by_name: dict[str, Inline] = {
            "+": _arith("+"), "-": _arith("-"), "<": _compare("<"), ">": _compare(">"), "<=": _compare("<="),
            ">=": _compare(">="), "=": _compare("=="), "1+": _step("+ 1"), "1-": _step("- 1"),
            "car": _field("car"), "cdr": _field("cdr"), "first": _field("car"), "rest": _field("cdr"),
            "eq": _eq, "null": _null, "endp": _null, "consp": _consp,
        }
        table: dict[Any, Inline] = {}
        for name, inline in by_name.items():
            builtin = self.interp.functions.get(self.interp.sym(name))
            if type(builtin) is Builtin:
                table[builtin.fn] = inline
        return table


# An inline template: (result, the builtin's function, argument atoms) -> a line, or None
# when it does not apply to that many arguments.
Inline = Callable[[str, str, list[str]], Optional[str]]


def _ints(atoms: list[str]) -> str:
    """The test that the atoms are integers (integer literals are)."""
    return " and ".join(f"type({a}) is int" for a in atoms if not _is_int_literal(a)) or "True"


def _arith(op: str) -> Inline:
    def inline(out: str, bf: str, a: list[str]) -> Optional[str]:
        return f"{out} = {a[0]} {op} {a[1]} if {_ints(a)} else {bf}({a[0]}, {a[1]})" if len(a) == 2 else None

    return inline


def _compare(op: str) -> Inline:
    def inline(out: str, bf: str, a: list[str]) -> Optional[str]:
        if len(a) != 2:
            return None
        return f"{out} = (_T if {a[0]} {op} {a[1]} else _NIL) if {_ints(a)} else {bf}({a[0]}, {a[1]})"

    return inline


def _step(op: str) -> Inline:
    def inline(out: str, bf: str, a: list[str]) -> Optional[str]:
        return f"{out} = {a[0]} {op} if {_ints(a)} else {bf}({a[0]})" if len(a) == 1 else None

    return inline


def _field(name: str) -> Inline:
    def inline(out: str, bf: str, a: list[str]) -> Optional[str]:
        return f"{out} = {a[0]}.{name} if type({a[0]}) is _Cons else {bf}({a[0]})" if len(a) == 1 else None

    return inline


def _eq(out: str, bf: str, a: list[str]) -> Optional[str]:
    return f"{out} = _T if {a[0]} is {a[1]} else {bf}({a[0]}, {a[1]})" if len(a) == 2 else None


def _null(out: str, bf: str, a: list[str]) -> Optional[str]:
    if len(a) != 1:
        return None
    return f"{out} = (_T if {a[0]} is _NIL else _NIL) if {a[0]} is _NIL or type({a[0]}) is _Cons else {bf}({a[0]})"


def _consp(out: str, bf: str, a: list[str]) -> Optional[str]:
    return f"{out} = _T if type({a[0]}) is _Cons else _NIL" if len(a) == 1 else None


_MISSING = object()


def _is_int_literal(atom: str) -> bool:
    return atom.lstrip("-").isdigit()


class _Late:
    """The closure of a call whose function was missing when the generated code ran."""

    __slots__ = ("analyzer", "form", "scope", "node")

    def __init__(self, analyzer: "Analyzer", form: Cons, scope: Scope) -> None:
        self.analyzer = analyzer
        self.form = form
        self.scope = scope
        self.node: Optional[Node] = None

    def __call__(self, f: Any) -> Any:
        if self.node is None:
            self.node = self.analyzer.analyze(self.form, self.scope)
        return self.node(f)


def _iter(x: Any) -> Any:
    while type(x) is Cons:
        yield x.car
        x = x.cdr


def _last_cdr(x: Any) -> Any:
    while type(x) is Cons:
        x = x.cdr
    return x


def _annotate(exc: Any, entry: tuple[Optional[Loc], Optional[str], str]) -> None:
    loc, macro, _ = entry
    if loc is not None:
        exc.loc = loc
        if macro is not None:
            exc.macro = exc.macro or macro


def _overflow(interp: "Interpreter", entry: tuple[Optional[Loc], Optional[str], str]) -> LispError:
    from .conditions import lisp_error

    err = lisp_error("E108", f"`{entry[2] or 'lambda'}`: floating-point overflow (a number too large for a double)", "FLOATING-POINT-OVERFLOW")
    err.loc = entry[0]
    return err


def _control_error() -> LispError:
    from .conditions import lisp_error

    return lisp_error("E106", "return-from or go to a block or tag that is no longer active", "CONTROL-ERROR")

