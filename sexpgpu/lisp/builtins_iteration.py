"""Iteration (CLHS 6): `loop`'s expander. The `loop` macro is the prelude's; it hands its
clauses to `%loop-expand` here, which parses them and builds the expansion (a Python parser
costs a large file's check a fraction of what the same parser written in Lisp did).

The clauses: for/as (in, on, across, = [then], being the hash-keys/values of [using],
from/upfrom/downfrom to/upto/below/downto/above by, joined by and), repeat, with [and],
named, initially, finally, do, return, collect append nconc count sum maximize minimize
[into] [type], when/if/unless [and] [else] [end] with it, while, until, always, never,
thereis, loop-finish.

The expansion:
  (block NAME
    (let* (BINDINGS)                 every variable, in the order of the clauses
      (tagbody
         INITIALLY FIRST             the initially forms, then each iteration clause's
       NEXT                          first setting and termination test
         BODY STEPS (go NEXT)        the main clauses, then each iteration clause's step
       END                           and test (clauses joined by `and` in parallel)
         FINALLY)
      RESULT))

The gensyms are made in the order, and with the prefixes, the Lisp expander used, so that
*gensym-counter* and every name in an expansion are as they were.
"""

from __future__ import annotations

from typing import Any, NoReturn, Optional

from .builtins import Lib
from .builtins_symbols import gensym
from .checks import is_num, list_items
from .registry import builtin
from .types import NIL, T, Cons, Symbol, from_iter

SIMPLE_TYPES = frozenset(
    "FIXNUM FLOAT T NIL INTEGER NUMBER REAL RATIONAL RATIO BIT DOUBLE-FLOAT SINGLE-FLOAT SHORT-FLOAT LONG-FLOAT "
    "CHARACTER SYMBOL STRING LIST CONS BOOLEAN".split()
)
INTEGER_TYPES = frozenset("FIXNUM INTEGER NUMBER REAL RATIONAL BIT BIGNUM UNSIGNED-BYTE SIGNED-BYTE MOD".split())
FLOAT_TYPES = frozenset("FLOAT DOUBLE-FLOAT SINGLE-FLOAT SHORT-FLOAT LONG-FLOAT".split())
LIST_WORDS = frozenset("COLLECT COLLECTING APPEND APPENDING NCONC NCONCING".split())
SUM_WORDS = frozenset("SUM SUMMING COUNT COUNTING".split())
ACCUMULATION_WORDS = LIST_WORDS | SUM_WORDS | frozenset("MAXIMIZE MAXIMIZING MINIMIZE MINIMIZING".split())
ARITHMETIC_WORDS = frozenset("FROM UPFROM DOWNFROM TO UPTO BELOW DOWNTO ABOVE BY".split())
# the symbols an expansion is made of
FORM_WORDS = (
    "BLOCK LET LET* TAGBODY GO SETQ PSETQ WHEN UNLESS IF PROGN RETURN-FROM MACROLET QUOTE LOOP-FINISH LIST RPLACD "
    "COPY-LIST CONSP LAST + - 1+ 1- > < >= <= ENDP ATOM CAR CDR AREF LENGTH FUNCALL NOT %HASH-ENTRIES THE-RESULT "
    "ERROR PROGRAM-ERROR"
).split()


def lst(*items: Any) -> Any:
    return from_iter(items)


def word(x: Any) -> Optional[str]:
    """The name a loop keyword is recognized by (in any package), or None."""
    return x.name if type(x) is Symbol and x is not NIL else None


class Iteration(Lib):
    """What an expansion is made of: the interpreter's symbols of FORM_WORDS."""

    def __init__(self, interp: Any) -> None:
        super().__init__(interp)
        self.s = {name: interp.sym(name) for name in FORM_WORDS}


@builtin("%loop-expand", context=Iteration)
def loop_expand(ctx: Iteration, clauses: Any) -> Any:
    return LoopParser(ctx, list_items("loop", 1, clauses)).expand()


class LoopParser:
    """One loop form's clauses, parsed left to right into the parts of its expansion."""

    def __init__(self, ctx: Iteration, clauses: list[Any]) -> None:
        self.ctx = ctx
        self.s = ctx.s
        self.clauses = clauses
        self.pos = 0
        self.name: Any = NIL
        self.bindings: list[Any] = []  # let* bindings, in order
        self.seen: list[Any] = []  # variables of with and for clauses
        self.initially: list[Any] = []
        self.firsts: list[Any] = []  # first settings and tests
        self.body: list[Any] = []  # main clauses
        self.steps: list[Any] = []  # steps and tests
        self.finally_: list[Any] = []
        self.accumulators: list[list[Any]] = []  # [var, class, tail, flag], newest first
        self.default_acc: Optional[list[Any]] = None  # the accumulator of clauses without into
        self.boolean_clause: Optional[str] = None  # always, never or thereis: returns a boolean
        self.result_form: Any = NIL
        self.next_tag = self.gensym("NEXT")
        self.end = self.gensym("END")

    # -- the clause stream ----------------------------------------------------------------------
    def gensym(self, prefix: str) -> Any:
        return gensym(self.ctx, prefix)

    def more(self) -> bool:
        return self.pos < len(self.clauses)

    def peek(self) -> Any:
        return self.clauses[self.pos] if self.pos < len(self.clauses) else NIL

    def next(self) -> Any:
        if not self.more():
            self.error("the clauses end too early")
        self.pos += 1
        return self.clauses[self.pos - 1]

    def kw_p(self, *names: str) -> bool:
        return self.more() and word(self.peek()) in names

    def keyword(self) -> Optional[str]:
        """The next clause word's name (None at the end or for a form)."""
        return word(self.peek()) if self.more() else None

    def found(self) -> Any:
        return self.peek() if self.more() else "the end"

    def error(self, control: str, *args: Any) -> NoReturn:
        """Signal the program-error the Lisp expander did, through `error`, so that handlers
        and diagnostics see the same condition."""
        s = self.s
        interp = self.ctx.interp
        interp.apply(interp.function_value(s["ERROR"]),
                     (s["PROGRAM-ERROR"], interp.kw("FORMAT-CONTROL"), "loop: " + control, interp.kw("FORMAT-ARGUMENTS"), lst(*args)))
        raise AssertionError("error returned")

    def bind(self, var: Any, value: Any) -> None:
        self.bindings.append(lst(var, value))

    def note_var(self, var: Any) -> None:
        if any(v is var for v in self.seen) or self.assoc(var) is not None:
            self.error("the variable ~s is bound twice", var)
        self.seen.append(var)

    def note_pattern(self, pattern: Any) -> None:
        for var in self.pattern_vars(pattern):
            self.note_var(var)

    def assoc(self, var: Any) -> Optional[list[Any]]:
        return next((entry for entry in self.accumulators if entry[0] is var), None)

    def compound_forms(self) -> list[Any]:
        forms = []
        while self.more() and type(self.peek()) is Cons:
            forms.append(self.next())
        return forms

    def skip_type(self) -> None:
        """An optional type after a variable: (of-type TYPE) or a simple type name."""
        if self.kw_p("OF-TYPE"):
            self.next()
            self.next()
        elif self.more() and type(self.peek()) is Symbol and self.peek().name in SIMPLE_TYPES:
            self.next()

    # -- patterns ---------------------------------------------------------------------------------
    def pattern_vars(self, pattern: Any) -> list[Any]:
        if pattern is NIL:
            return []
        if type(pattern) is Symbol:
            return [pattern]
        if type(pattern) is Cons:
            return self.pattern_vars(pattern.car) + self.pattern_vars(pattern.cdr)
        self.error("~s is not a variable or a destructuring pattern", pattern)

    def destructure(self, pattern: Any, value: Any) -> list[Any]:
        """setq forms giving the variables of PATTERN their parts of the form VALUE."""
        s = self.s
        if pattern is NIL:
            return []
        if type(pattern) is Symbol:
            return [lst(s["SETQ"], pattern, value)]
        g = self.gensym("D")
        parts = self.destructure(pattern.car, lst(s["CAR"], g)) + self.destructure(pattern.cdr, lst(s["CDR"], g))
        return [Cons(s["LET"], Cons(lst(lst(g, value)), from_iter(parts)))]

    def destructure_bindings(self, pattern: Any, value: Any) -> list[Any]:
        """let* bindings giving the variables of PATTERN their parts of the form VALUE."""
        s = self.s
        if pattern is NIL:
            return []
        if type(pattern) is Symbol:
            return [lst(pattern, value)]
        g = self.gensym("D")
        return [lst(g, value), *self.destructure_bindings(pattern.car, lst(s["CAR"], g)), *self.destructure_bindings(pattern.cdr, lst(s["CDR"], g))]

    def setq(self, pairs: list[Any]) -> list[Any]:
        """One assignment form for PAIRS [(place value) ...], in parallel when there are several."""
        if not pairs:
            return []
        if len(pairs) == 1:
            return [lst(self.s["SETQ"], pairs[0][0], pairs[0][1])]
        return [from_iter([self.s["PSETQ"], *(x for pair in pairs for x in pair)])]

    # -- accumulation -----------------------------------------------------------------------------
    def accumulator(self, klass: str, into: Any) -> list[Any]:
        entry = (self.assoc(into) if into is not None else self.default_acc)
        if entry is not None:
            if entry[1] != klass:
                self.error("~s accumulates both ~a and ~a values", into if into is not None else self.s["THE-RESULT"], entry[1], klass)
            return entry
        if into is not None and any(v is into for v in self.seen):
            self.error("the variable ~s is bound twice", into)
        var = into if into is not None else self.gensym("RESULT")
        new = [var, klass, self.gensym("TAIL"), self.gensym("FLAG")]
        self.bind(var, NIL if klass == "LIST" else 0)
        if klass == "LIST":
            self.bind(new[2], NIL)
        elif klass == "MAX":
            self.bind(new[3], NIL)
        self.accumulators.insert(0, new)
        if into is None:
            self.default_acc = new
            self.result_form = var
        return new

    def accumulate(self, kind: str, form: Any, into: Any) -> Any:
        s = self.s
        klass = "LIST" if kind in LIST_WORDS else "SUM" if kind in SUM_WORDS else "MAX"
        var, _, tail, flag = self.accumulator(klass, into)
        if kind in ("COLLECT", "COLLECTING"):
            cell = self.gensym("CELL")
            return lst(s["LET"], lst(lst(cell, lst(s["LIST"], form))),
                       lst(s["IF"], tail, lst(s["RPLACD"], tail, cell), lst(s["SETQ"], var, cell)),
                       lst(s["SETQ"], tail, cell))
        if kind in LIST_WORDS:
            new = self.gensym("NEW")
            value = lst(s["COPY-LIST"], form) if kind in ("APPEND", "APPENDING") else form
            return lst(s["LET"], lst(lst(new, value)),
                       lst(s["WHEN"], lst(s["CONSP"], new),
                           lst(s["IF"], tail, lst(s["RPLACD"], tail, new), lst(s["SETQ"], var, new)),
                           lst(s["SETQ"], tail, lst(s["LAST"], new))))
        if kind in ("SUM", "SUMMING"):
            return lst(s["SETQ"], var, lst(s["+"], var, form))
        if kind in ("COUNT", "COUNTING"):
            return lst(s["WHEN"], form, lst(s["SETQ"], var, lst(s["1+"], var)))
        v = self.gensym("V")
        test = s[">"] if kind in ("MAXIMIZE", "MAXIMIZING") else s["<"]
        return lst(s["LET"], lst(lst(v, form)),
                   lst(s["IF"], flag, lst(s["WHEN"], lst(test, v, var), lst(s["SETQ"], var, v)), lst(s["SETQ"], var, v, flag, T)))

    # -- main clauses -----------------------------------------------------------------------------
    def clause_form(self, it: Optional[list[Any]]) -> Any:
        """The form of an accumulation or return clause; `it` is the test's value."""
        form = self.next()
        if it is not None and word(form) == "IT":
            it[0] = True
            return it[1]
        return form

    def parse_selectable(self, it: Optional[list[Any]]) -> Any:
        s = self.s
        key = self.keyword()
        if key in ACCUMULATION_WORDS:
            kind = self.next().name
            form = self.clause_form(it)
            into = None
            if self.kw_p("INTO"):
                self.next()
                into = self.next()
                if into is NIL:
                    into = None
                elif type(into) is not Symbol:
                    self.error("into needs a variable, got ~s", into)
            self.skip_type()
            return self.accumulate(kind, form, into)
        if key in ("DO", "DOING"):
            self.next()
            forms = self.compound_forms()
            if not forms:
                self.error("do needs at least one form")
            return from_iter([s["PROGN"], *forms])
        if key == "RETURN":
            self.next()
            return lst(s["RETURN-FROM"], self.name, self.clause_form(it))
        if key in ("WHEN", "IF"):
            self.next()
            return self.parse_conditional(False)
        if key == "UNLESS":
            self.next()
            return self.parse_conditional(True)
        self.error("expected a clause such as collect, do, when or return, found ~s", self.found())

    def parse_clause_group(self, it: Optional[list[Any]]) -> list[Any]:
        forms = [self.parse_selectable(it)]
        while self.kw_p("AND"):
            self.next()
            forms.append(self.parse_selectable(None))
        return forms

    def parse_conditional(self, negate: bool) -> Any:
        s = self.s
        test = self.next()
        it: list[Any] = [False, self.gensym("IT")]
        then = self.parse_clause_group(it)
        otherwise: list[Any] = []
        if self.kw_p("ELSE"):
            self.next()
            otherwise = self.parse_clause_group(None)
        if self.kw_p("END"):
            self.next()
        first, second = (otherwise, then) if negate else (then, otherwise)
        branch = lst(s["IF"], it[1] if it[0] else test, from_iter([s["PROGN"], *first]), from_iter([s["PROGN"], *second]))
        return lst(s["LET"], lst(lst(it[1], test)), branch) if it[0] else branch

    # -- iteration clauses ------------------------------------------------------------------------
    def emit_group(self, entries: list[tuple[list[Any], ...]]) -> None:
        """Each entry: (first-advance first-tests first-sets step-advance step-tests step-sets)."""
        def part(n: int) -> list[Any]:
            return [x for e in entries for x in e[n]]

        self.firsts.extend(self.setq(part(0)) + part(1) + part(2))
        self.steps.extend(self.setq(part(3)) + part(4) + part(5))

    def parse_for_group(self) -> None:
        entries = [self.parse_for()]
        while self.kw_p("AND"):
            self.next()
            entries.append(self.parse_for())
        self.emit_group(entries)

    def end_test(self, test: Any) -> Any:
        return lst(self.s["WHEN"], test, lst(self.s["GO"], self.end))

    def parse_for(self) -> tuple[list[Any], ...]:
        pattern = self.next()
        self.note_pattern(pattern)
        self.skip_type()
        key = self.keyword()
        kinds = {"IN": self.for_in, "ON": self.for_on, "ACROSS": self.for_across, "=": self.for_equals, "BEING": self.for_being}
        if key in kinds:
            self.next()
            return kinds[key](pattern)
        if key in ARITHMETIC_WORDS:
            if type(pattern) is not Symbol or pattern is NIL:
                self.error("an arithmetic for needs a variable, got ~s", pattern)
            return self.for_arithmetic(pattern)
        self.error("unknown for clause after ~s: ~s", pattern, self.found())

    def step_by(self, tail: Any, by: Any) -> Any:
        return lst(self.s["FUNCALL"], by, tail) if by is not None else lst(self.s["CDR"], tail)

    def by_form(self) -> Any:
        if not self.kw_p("BY"):
            return None
        self.next()
        g = self.gensym("BY")
        self.bind(g, self.next())
        return g

    def bind_pattern(self, pattern: Any) -> None:
        for var in self.pattern_vars(pattern):
            self.bind(var, NIL)

    def for_in(self, pattern: Any) -> tuple[list[Any], ...]:
        s = self.s
        tail = self.gensym("LIST")
        self.bind(tail, self.next())
        by = self.by_form()
        test = self.end_test(lst(s["ENDP"], tail))
        sets = self.destructure(pattern, lst(s["CAR"], tail))
        self.bind_pattern(pattern)
        return [], [test], sets, [[tail, self.step_by(tail, by)]], [test], sets

    def for_on(self, pattern: Any) -> tuple[list[Any], ...]:
        s = self.s
        if type(pattern) is Symbol and pattern is not NIL:
            self.bind(pattern, self.next())
            by = self.by_form()
            test = self.end_test(lst(s["ATOM"], pattern))
            return [], [test], [], [[pattern, self.step_by(pattern, by)]], [test], []
        tail = self.gensym("LIST")
        self.bind(tail, self.next())
        by = self.by_form()
        test = self.end_test(lst(s["ATOM"], tail))
        sets = self.destructure(pattern, tail)
        self.bind_pattern(pattern)
        return [], [test], sets, [[tail, self.step_by(tail, by)]], [test], sets

    def for_across(self, pattern: Any) -> tuple[list[Any], ...]:
        s = self.s
        vec, index, length = self.gensym("VECTOR"), self.gensym("INDEX"), self.gensym("LENGTH")
        self.bind(vec, self.next())
        self.bind(length, lst(s["LENGTH"], vec))
        self.bind(index, 0)
        self.bind_pattern(pattern)
        test = self.end_test(lst(s[">="], index, length))
        sets = self.destructure(pattern, lst(s["AREF"], vec, index))
        return [], [test], sets, [[index, lst(s["1+"], index)]], [test], sets

    def for_equals(self, pattern: Any) -> tuple[list[Any], ...]:
        init = self.next()
        then = init
        if self.kw_p("THEN"):
            self.next()
            then = self.next()
        self.bind_pattern(pattern)
        if type(pattern) is Symbol and pattern is not NIL:
            return [[pattern, init]], [], [], [[pattern, then]], [], []
        g = self.gensym("VALUE")
        self.bind(g, NIL)
        first_sets = self.destructure(pattern, g)
        return [[g, init]], [], first_sets, [[g, then]], [], self.destructure(pattern, g)

    def for_being(self, pattern: Any) -> tuple[list[Any], ...]:
        s = self.s
        if not self.kw_p("THE", "EACH"):
            self.error("expected the or each after being, found ~s", self.found())
        self.next()
        if not self.kw_p("HASH-KEY", "HASH-KEYS", "HASH-VALUE", "HASH-VALUES"):
            self.error("SexpGPU's loop iterates with being only over hash-keys or hash-values, found ~s", self.found())
        keys_p = self.kw_p("HASH-KEY", "HASH-KEYS")
        entries = self.gensym("ENTRIES")
        other = None
        self.next()
        if not self.kw_p("OF", "IN"):
            self.error("expected of or in, found ~s", self.found())
        self.next()
        self.bind(entries, lst(s["%HASH-ENTRIES"], self.next()))
        if self.kw_p("USING"):
            self.next()
            spec = self.next()
            if not (type(spec) is Cons and type(spec.cdr) is Cons):
                self.error("using needs (hash-value var) or (hash-key var), got ~s", spec)
            other = spec.cdr.car
            self.note_var(other)
        self.bind_pattern(pattern)
        if other is not None:
            self.bind(other, NIL)
        test = self.end_test(lst(s["ENDP"], entries))
        entry = lst(s["CAR"], entries)
        key, value = lst(s["CAR"], entry), lst(s["CDR"], entry)
        sets = self.destructure(pattern, key if keys_p else value)
        if other is not None:
            sets.append(lst(s["SETQ"], other, lst(s["CDR"], lst(s["CAR"], entries)) if keys_p else lst(s["CAR"], lst(s["CAR"], entries))))
        return [], [test], sets, [[entries, lst(s["CDR"], entries)]], [test], sets

    def for_arithmetic(self, var: Any) -> tuple[list[Any], ...]:
        """The from, to and by forms are evaluated once each, in the order written."""
        s = self.s
        start: Any = None
        start_kind: Optional[str] = None
        limit: Any = None
        limit_kind: Optional[str] = None
        by: Any = 1
        order: list[str] = []
        while True:
            if self.kw_p("FROM", "UPFROM", "DOWNFROM"):
                if start_kind is not None:
                    self.error("~s has two starting values", var)
                start_kind = self.next().name
                start = self.next()
                order.append("start")
            elif self.kw_p("TO", "UPTO", "BELOW", "DOWNTO", "ABOVE"):
                if limit_kind is not None:
                    self.error("~s has two limits", var)
                limit_kind = self.next().name
                limit = self.next()
                order.append("limit")
            elif self.kw_p("BY"):
                if "by" in order:
                    self.error("~s has two by values", var)
                self.next()
                by = self.next()
                order.append("by")
            else:
                break
        down = start_kind == "DOWNFROM" or limit_kind in ("DOWNTO", "ABOVE")
        up = start_kind == "UPFROM" or limit_kind in ("UPTO", "BELOW")
        if down and up:
            self.error("~s both counts up and down", var)
        if "start" not in order:
            self.bind(var, 0)
        for part in order:
            if part == "start":
                self.bind(var, start)
            elif part == "limit":
                if not is_num(limit):
                    g = self.gensym("LIMIT")
                    self.bind(g, limit)
                    limit = g
            elif not is_num(by):
                g = self.gensym("BY")
                self.bind(g, by)
                by = g
        test: list[Any] = []
        if limit_kind is not None:
            op = (s["<="] if down else s[">="]) if limit_kind in ("BELOW", "ABOVE") else s["<"] if down else s[">"]
            test = [self.end_test(lst(op, var, limit))]
        return [], test, [], [[var, lst(s["-"] if down else s["+"], var, by)]], test, []

    def parse_repeat(self) -> None:
        s = self.s
        count = self.gensym("REPEAT")
        self.bind(count, self.next())
        test = [self.end_test(lst(s["<="], count, 0))]
        self.emit_group([([], test, [], [[count, lst(s["1-"], count)]], test, [])])

    def parse_with(self) -> None:
        specs: list[tuple[Any, Any]] = []
        while True:
            pattern = self.next()
            self.note_pattern(pattern)
            kind: Any = NIL
            if self.kw_p("OF-TYPE"):
                self.next()
                kind = self.next()
            elif self.more() and type(self.peek()) is Symbol and self.peek() is not NIL and self.peek().name in SIMPLE_TYPES:
                kind = self.next()
            if self.kw_p("="):
                self.next()
                init = self.next()
            else:
                init = type_default(kind)
            specs.append((pattern, init))
            if not self.kw_p("AND"):
                break
            self.next()
        if len(specs) == 1:
            self.bindings.extend(self.destructure_bindings(*specs[0]))
            return
        # with ... and ...: every form first, then the bindings
        temps = [self.gensym("WITH") for _ in specs]
        for g, (_, init) in zip(temps, specs):
            self.bind(g, init)
        for g, (pattern, _) in zip(temps, specs):
            self.bindings.extend(self.destructure_bindings(pattern, g))

    # -- the whole loop ---------------------------------------------------------------------------
    def parse_clause(self) -> None:
        s = self.s
        key = self.keyword()
        if key in ("FOR", "AS"):
            self.next()
            self.parse_for_group()
        elif key == "WITH":
            self.next()
            self.parse_with()
        elif key == "REPEAT":
            self.next()
            self.parse_repeat()
        elif key == "WHILE":
            self.next()
            self.body.append(self.end_test(lst(s["NOT"], self.next())))
        elif key == "UNTIL":
            self.next()
            self.body.append(self.end_test(self.next()))
        elif key in ("ALWAYS", "NEVER"):
            self.next()
            self.boolean_clause = key.lower()
            self.body.append(lst(s["UNLESS" if key == "ALWAYS" else "WHEN"], self.next(), lst(s["RETURN-FROM"], self.name, NIL)))
            if self.default_acc is None:
                self.result_form = T
        elif key == "THEREIS":
            self.next()
            self.boolean_clause = "thereis"
            v = self.gensym("V")
            self.body.append(lst(s["LET"], lst(lst(v, self.next())), lst(s["WHEN"], v, lst(s["RETURN-FROM"], self.name, v))))
        elif key == "INITIALLY":
            self.next()
            self.initially.extend(self.compound_forms())
        elif key == "FINALLY":
            self.next()
            self.finally_.extend(self.compound_forms())
        elif key == "NAMED":
            self.error("named must be the first clause")
        else:
            self.body.append(self.parse_selectable(None))

    def expand(self) -> Any:
        s = self.s
        if self.kw_p("NAMED"):
            self.next()
            self.name = self.next()
        while self.more():
            self.parse_clause()
        # CLHS 6.1.4: both would return the loop's value
        if self.boolean_clause is not None and self.default_acc is not None:
            self.error("~a and an accumulation clause without into cannot be in one loop", self.boolean_clause)
        tagbody = from_iter([s["TAGBODY"], *self.initially, *self.firsts, self.next_tag, *self.body, *self.steps,
                             lst(s["GO"], self.next_tag), self.end, *self.finally_])
        expansion = lst(s["BLOCK"], self.name, lst(s["LET*"], from_iter(self.bindings), tagbody, self.result_form))
        if tree_has_name(self.ctx.interp, lst(from_iter(self.body), from_iter(self.finally_)), "LOOP-FINISH"):
            finish = lst(s["LOOP-FINISH"], NIL, lst(s["QUOTE"], lst(s["GO"], self.end)))
            return lst(s["MACROLET"], lst(finish), expansion)
        return expansion


def type_default(kind: Any) -> Any:
    """The value `with var TYPE` starts with when no form is given."""
    head = kind.car if type(kind) is Cons else kind
    if type(head) is not Symbol:
        return NIL
    if head.name in INTEGER_TYPES:
        return 0
    if head.name in FLOAT_TYPES:
        return 0.0
    return NIL


def tree_has_name(interp: Any, tree: Any, name: str) -> bool:
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
