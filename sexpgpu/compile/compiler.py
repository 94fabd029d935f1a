"""The compiler's state for one file, and the %-builtins the contract macros expand into.

A Compiler is installed into a fresh interpreter before the file is read: it registers the
tensor builtins and contract forms, records what the file declares while it is evaluated,
and checks the contract's order as each top-level form arrives.
"""

from __future__ import annotations

from functools import partial

from fractions import Fraction
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Optional, Union, cast

from ..ir.dtypes import DType
from ..lisp.builtins import Registry, list_items, parse_keys, short, to_lisp_list, type_error
from ..lisp.conditions import LispError, lisp_error
from ..lisp.data import as_data
from ..lisp.evaluator import Interpreter
from ..lisp.objects import Builtin, Closure
from ..lisp.reader import Reader
from ..lisp.types import NIL, T, Cons, Loc, Symbol, SymbolTable
from ..ir.data_options import PREPARE_STEPS, SOURCES, Problem, source_problem, step_problem
from ..ir.selectors import glob_match
from ..ir.experiment import CheckpointPolicy, DiagnosticsSpec, EvalSpec, FieldRecord, FiniteGuard, InitKind, InitSpec, KnobSpec, LoaderRecord, PrepareRecord, RunSpec, Selection, SourceRecord, StageRecord, TargetSpec, TargetTest
from .models import Batch, Group, Model, ModelList, Optimizer, Param, rebase
from .probes import FloatProbe, Probing, is_probe, observe_within
from .selection import Written
from .tensors import Staged, TensorLib

# contract order: (rank, form names); forms not listed may appear anywhere
ORDER: list[tuple[int, tuple[str, ...]]] = [
    (1, ("REQUIRE",)),
    (2, ("DEFKNOB", "DEFVARIANT", "DEFSWEEP")),
    (3, ("DEFUN", "DEFMACRO", "DEFVAR", "DEFPARAMETER", "DEFSTRUCT", "DEFMODEL", "DEFOPTIMIZER", "DEFDIAGNOSTIC")),
    (4, ("DEFLOADER",)),
    (5, ("DEFPART",)),
    (6, ("DEFOBJECTIVE",)),
    (7, ("DEFEVALUATE", "DEFEVAL", "DEFTARGET")),
    (8, ("DEFGROUPS",)),
    (9, ("DEFCURRICULUM",)),
    (10, ("DEFRUN",)),
]
RANK = {name: rank for rank, names in ORDER for name in names}
CONTRACT_FORMS = {"DEFKNOB", "DEFLOADER", "DEFPART", "DEFOBJECTIVE", "DEFGROUPS", "DEFRUN", "DEFEVALUATE", "DEFEVAL", "DEFTARGET", "DEFCURRICULUM", "DEFVARIANT", "DEFSWEEP"}
ONCE = {"DEFOBJECTIVE", "DEFGROUPS", "DEFRUN", "DEFCURRICULUM", "DEFEVALUATE"}
# every key runfile.md lists; the loop feeds each as an f32 scalar
CTX_KEYS = ("step", "epoch", "examples", "tokens", "stage", "elapsed", "loss", "lr", "eval", "rank", "world-size", "seed", "microbatch", "lr-scale")
TARGET_TESTS = ("<=", ">=", "<", ">")
# a curriculum's name for the loader as declared, without a stage: `(stage train :declared)`;
# CurriculumSpec holds it as "" (the name checkpoints give the declared loader's stream)
DECLARED_STAGE = ""
ORDER_TEXT = "require, defknob/defvariant/defsweep, definitions, defloader, defpart, defobjective, defevaluate/defeval/deftarget, defgroups, defcurriculum, defrun"


def misplaced_in_model(form: str, name: str, model: str) -> Exception:
    """A defparam or defpart inside a let, when or other form of a defmodel body, where it
    would name nothing for the body (and a defpart would become a top-level part)."""
    return lisp_error(
        "C008",
        f"{form} {name} in defmodel {model} is inside another form: {form} must be a direct form of the defmodel body; "
        f"compute its arguments in the lambda list instead, e.g. (defmodel {model} (d &aux (h (* 2 d))) ...)",
        "PROGRAM-ERROR",
    )


# the Lisp builtins that only move a value along (a probe given to them is not looked at)
MOVES_VALUES = frozenset("LIST LIST* CONS VALUES VECTOR IDENTITY FUNCALL APPLY APPEND".split())


def watch_probes(interp: Interpreter) -> None:
    """In a probe compile (probes.py): every Lisp builtin given a knob's probe sees the knob,
    but those that only move values along; so does printing one. (The compile layer's own
    builtins take probes through number_of, count_of and TensorLib.staged.)"""
    for sym, fn in interp.functions.items():
        if type(fn) is Builtin and lisp_builtin(fn.fn) and sym.name not in MOVES_VALUES:
            fn.fn = seeing_probes(fn.fn)  # in place: code made from the prelude holds the Builtin
    printing = interp.print_other

    def print_other(x: Any, printer: Any) -> str:
        if is_probe(x):
            x.probing.observe(x.knob)
        return printing(x, printer)

    interp.print_other = print_other  # type: ignore[method-assign]


def lisp_builtin(fn: Callable[..., Any]) -> bool:
    """Whether FN is one of lisp/'s builtins (a registered function, or one bound to its
    context with functools.partial, whose own __module__ is functools')."""
    target = fn.func if isinstance(fn, partial) else fn
    return getattr(target, "__module__", "").startswith("sexpgpu.lisp.")


def seeing_probes(fn: Callable[..., Any]) -> Callable[..., Any]:
    def seeing(*args: Any) -> Any:
        observe_within(args)
        return fn(*args)

    return seeing


def contract_text() -> str:
    """The contract macros' Lisp (loaded into every compile's world)."""
    return resources.files("sexpgpu.compile").joinpath("contract.lisp").read_text(encoding="utf-8")


class Compiler:
    def __init__(self, interp: Interpreter, selection: Selection, base_dir: Path, overrides: Optional[dict[str, Any]] = None, root: Optional[Path] = None,
                 written: Optional[dict[str, Written]] = None, probing: Optional[Probing] = None) -> None:
        self.interp = interp
        self.probing = probing  # a probe compile for a group of sweep points (probes.py), or None
        self.selection = selection
        self.overrides = overrides or {}
        self.written = written or {}  # where the variant's and sweep point's values are written
        self.base_dir = base_dir
        self.root = root or base_dir  # the project root, where loader sources must stay
        self.knobs: dict[str, KnobSpec] = {}
        self.variants: dict[str, dict[str, Any]] = {}
        self.sweeps: dict[str, dict[str, Any]] = {}
        self.loaders: dict[str, LoaderRecord] = {}
        self.parts: dict[str, Any] = {}
        self.part_locs: dict[str, Loc] = {}  # where each top-level defpart is
        self.objective: Any = None
        self.evaluate: Any = None
        self.evals: list[EvalSpec] = []
        self.curriculum: Optional[list[tuple[str, Any, list[tuple[str, str]]]]] = None
        self.reducers: dict[str, Any] = {}
        self.warnings: list[str] = []
        self.targets: list[TargetSpec] = []
        self.target_locs: dict[int, Loc] = {}  # where each deftarget is, by its index in targets
        self.early_targets: dict[str, tuple[str, Optional[Loc]]] = {}  # eval name -> a deftarget naming it before any defeval did
        self.select_locs: dict[str, Loc] = {}  # where each glob of defrun :diagnostics :select is written
        self.groups: list[Group] = []
        self.clip: Optional[float] = None
        self.run: Optional[RunSpec] = None  # defrun's settings; :clip (defgroups) and the IR diagnostics' names come at staging
        self.path: list[str] = []
        self.model_stack: list[Model] = []
        self.seen: list[tuple[str, Loc]] = []
        self.toplevel: tuple[Any, Optional[Loc]] = (None, None)  # the main file's top-level form being evaluated
        self.first_of: dict[str, Loc] = {}  # form name -> where it first appears
        self.latest: dict[tuple[int, bool], tuple[int, str, Loc]] = {}  # (rank, contract form?) -> the latest such
        self.lib = TensorLib(interp)
        self.lib.probing = probing
        self.lib.install()
        self.install_builtins()
        if probing is not None:
            watch_probes(interp)
        self.load_contract_macros()

    # -- setup -----------------------------------------------------------------------------------
    def load_contract_macros(self) -> None:
        self.interp.load_system_text(contract_text())
        self.interp.publish_base()

    def watch(self, table: SymbolTable) -> None:
        """Check the contract order of the forms read into TABLE (the main file)."""
        self.interp.hook_table = table
        self.interp.toplevel_hook = self.on_toplevel

    @property
    def is_run_file(self) -> bool:
        return any(name in CONTRACT_FORMS for name, _ in self.seen)

    def on_toplevel(self, form: Any, loc: Loc) -> None:
        """Check the contract order as each top-level form arrives, in time independent of
        how many came before: the latest form of each rank is kept."""
        self.toplevel = (form, loc)
        if type(form) is not Cons or type(form.car) is not Symbol:
            return
        name = form.car.name
        rank = RANK.get(name)
        if rank is None:
            return
        first = self.first_of.get(name)
        if name in ONCE and first is not None:
            raise self.at(loc, "C003", f"{name.lower()} may appear once; the first is at {first}")
        if "DEFRUN" in self.first_of:
            raise self.at(loc, "C002", f"{name.lower()} after defrun: defrun must be the last form (order: {ORDER_TEXT})")
        contract = name in CONTRACT_FORMS
        offending = [
            entry
            for (prev_rank, prev_contract), entry in self.latest.items()
            if prev_rank > rank and (prev_contract or contract)
        ]
        if offending:
            _, prev_name, prev_loc = max(offending, key=lambda e: e[0])
            raise self.at(loc, "C002", f"{name.lower()} must come before {prev_name.lower()} (at {prev_loc}); the order is: {ORDER_TEXT}")
        self.latest[(rank, contract)] = (len(self.seen), name, loc)
        self.first_of.setdefault(name, loc)
        self.seen.append((name, loc))

    def source_form(self, head: str) -> Optional[Cons]:
        """The top-level form being evaluated, as read, when it is a HEAD form of the main
        file (a form a macro made, or one of another file, is not at hand: None)."""
        form, loc = self.toplevel
        if type(form) is Cons and type(form.car) is Symbol and form.car.name == head and loc == self.interp.current_loc:
            return form
        return None

    def form_loc(self, name: str) -> Optional[Loc]:
        """Where the file's NAME form is, else its last contract form."""
        for form, loc in self.seen:
            if form == name:
                return loc
        return self.seen[-1][1] if self.seen else None

    def at(self, loc: Optional[Loc], code: str, message: str) -> Exception:
        err = lisp_error(code, message, "PROGRAM-ERROR")
        err.loc = loc
        return err

    # -- the contract's argument checks: each wrong-typed value is a C008 naming the form -----------
    def name_of(self, what: str, x: Any, role: str = "name") -> str:
        """A symbol's name in lower case: the name of a knob, loader, part, field, eval ..."""
        if type(x) is not Symbol or x is NIL or x is T:
            raise malformed(f"{what}: the {role} must be a symbol, got {short(x)}")
        return x.name.lower()

    def items_of(self, what: str, x: Any, expected: str = "a list") -> list[Any]:
        try:
            return list_items(what, 1, x)
        except LispError:
            raise malformed(f"{what} needs {expected}, got {short(x)}") from None

    def keys_of(self, what: str, args: tuple[Any, ...], allowed: set[str]) -> dict[str, Any]:
        try:
            return parse_keys(what, args, allowed, 1)
        except LispError as exc:
            raise malformed(f"{what}: {exc.condition.message.replace(f'`{what}`: ', '')} (its keywords: {', '.join(':' + k.lower() for k in sorted(allowed))})") from None

    def number_of(self, what: str, x: Any, kept: bool = False) -> float:
        """A real number as a double; a value too large for a double is refused, not overflowed.
        KEPT: the caller only keeps the number (a record, an IR constant), so a knob's probe
        passes unobserved and each point's own value is checked the same way (probes.py)."""
        x = self.unprobed(x, kept, lambda v: self.number_of(what, v))
        if type(x) not in (int, float, Fraction):
            raise malformed(f"{what} needs a number, got {short(x)}")
        try:
            return float(x)
        except OverflowError:
            raise malformed(f"{what}: {short(x)} is too large for a double") from None

    def unprobed(self, x: Any, kept: bool, check: Callable[[Any], Any]) -> Any:
        """X, or a probe's poison: observed, unless the caller only KEPT it; then CHECK is
        replayed on each point's value."""
        if not is_probe(x):
            return x
        assert self.probing is not None
        if kept:
            self.probing.guard(x.knob, check)
        else:
            self.probing.observe(x.knob)
        return x.plain()

    def count_of(self, what: str, x: Any, least: int = 1, kept: bool = False) -> int:
        """A positive (or, with LEAST 0, non-negative) integer that fits in 64 bits (KEPT: as
        number_of's)."""
        x = self.unprobed(x, kept, lambda v: self.count_of(what, v, least))
        if type(x) is not int or x < least:
            kind = "a positive integer" if least == 1 else "a non-negative integer"
            raise malformed(f"{what} needs {kind}, got {short(x)}")
        if x >= 2**63:
            raise malformed(f"{what}: {short(x)} is too large; it must be below 2^63")
        return x

    # -- builtins --------------------------------------------------------------------------------
    def install_builtins(self) -> None:
        reg = Registry(self.interp)
        for name in [
            "%defknob", "%defvariant", "%defsweep", "%model-scope", "%defparam", "%defpart", "%forward", "%call-model",
            "%repeat", "%defpart-toplevel", "%tie", "%defloader", "%field", "%defobjective", "%defevaluate", "%metric",
            "%make-optimizer", "%defgroups", "%defrun", "schedule", "ctx", "%repeat-list", "%models", "%defeval", "%deftarget",
            "%shadow", "training-p", "part-param", "part-models", "%defcurriculum", "%defdiagnostic", "%diagnostic", "run-steps",
            "%defmodel-constructor", "%defparam-misplaced",
        ]:
            reg.add(name, getattr(self, "b_" + name.lstrip("%").replace("-", "_")))
        for kind in ["zeros", "ones"]:
            reg.add(f"%init-{kind}", lambda kind=kind: InitSpec(kind=kind))
        reg.add("normal", self.init_fn("normal"))
        reg.add("uniform", self.init_fn("uniform"))
        reg.add("trunc-normal", self.init_fn("trunc-normal"))
        reg.add("xavier", self.init_fn("xavier"))
        reg.add("kaiming", self.init_fn("kaiming"))
        for kind in ["synthetic", "text", "npz", "npy", "csv", "jsonl"]:
            reg.add(kind, self.source_fn(kind))
        reg.add("param-count", self.b_param_count)
        # a part is a function of its inputs: (funcall block x)
        self.interp.funcallable[Model] = lambda model: Builtin(model.type_name, lambda *args: self.call_model(model, list(args)), 0, None)
        self.interp.funcallable[ModelList] = lambda models: Builtin(f"repeat {models.path}", lambda *args: self.call_model(models, list(args)), 0, None)

    def init_fn(self, kind: str) -> Callable[..., Any]:
        def make(*args: Any) -> Any:
            keys = self.keys_of(kind, args, {"MEAN", "STD", "LOW", "HIGH", "GAIN"})
            values = {k.lower(): self.number_of(f"{kind} :{k.lower()}", v) for k, v in keys.items()}
            return InitSpec(kind=cast(InitKind, kind), **values)

        return make

    def source_fn(self, kind: str) -> Callable[..., Any]:
        def make(*args: Any) -> Any:
            options: dict[str, Any] = {}
            rest = list(args)
            url = None
            if kind == "synthetic":
                if not rest or type(rest[0]) is not Symbol or not rest[0].is_keyword:
                    raise malformed(f"synthetic: the first argument must be a generator name such as :spirals :moons :blobs :linear, got {short(rest[0] if rest else NIL)}")
                options["name"] = rest.pop(0).name.lower()
            else:
                if not rest or type(rest[0]) is not str:
                    raise malformed(f"{kind}: the first argument must be a path or URL string, got {short(rest[0] if rest else NIL)}")
                url = rest.pop(0)
                if "\0" in url or len(url) > 4096:
                    raise malformed(f"{kind}: {short(url)} is not a usable path: it has a NUL character or more than 4096 characters")
            if len(rest) % 2:
                raise malformed(f"{kind}: its options are :keyword value pairs, got an odd number of values")
            for key, value in zip(rest[::2], rest[1::2]):
                if type(key) is not Symbol or not key.is_keyword:
                    raise malformed(f"{kind}: its options are :keyword value pairs; {short(key)} is not a keyword")
                options[key.name.lower()] = self.data_of(f"{kind} :{key.name.lower()}", value)
            return SourceValue(SourceRecord(kind=kind, url=url, options=options))

        return make

    # -- knobs -----------------------------------------------------------------------------------------
    def b_defknob(self, name: Any, default: Any, *args: Any) -> Any:
        knob = self.name_of("defknob", name)
        keys = self.keys_of(f"defknob {knob}", args, {"TYPE", "RANGE", "CHOICES", "DOC"})
        default = literal_default(self.interp, default)
        self.check_knob_options(knob, default, keys)
        value, self.knobs[knob] = self.knob_setting(knob, default, keys, self.overrides, self.written.get(knob))
        if self.probing is not None and knob in self.probing.values:
            self.probe_points(knob, default, keys, self.probing)
            value = self.probing.probe(knob, value)
        # a knob is a global value, not a special variable: a parameter or let of the same
        # name (an optimizer's &key lr, say) binds lexically, as the reader of the file expects
        self.interp.values[name] = value
        return name

    def knob_setting(self, knob: str, default: Any, keys: dict[str, Any], overrides: dict[str, Any], written_at: Optional[Written]) -> tuple[Any, KnobSpec]:
        """The knob's value (from --set, else OVERRIDES, else its default), checked against
        its declaration, and its record."""
        value = default
        raw = self.selection.set.get(knob)
        if raw is not None:
            value = self.parse_knob_value(knob, raw, default)
        elif knob in overrides:
            value = self.from_literal(overrides[knob])
            if type(default) is float and type(value) is int:
                value = float(value)
        written = written_at if raw is None and knob in overrides else None
        shown = written.text if written is not None else short(value)
        doc = keys.get("DOC", NIL)
        declared = keys.get("TYPE", NIL)
        kind = declared.name.lower() if type(declared) is Symbol and declared is not NIL else None
        try:
            self.check_knob(knob, value, default, keys, shown)
            self.check_knob_type(knob, value, kind, shown)
        except LispError as err:
            if written is None:
                raise
            raise self.blamed_on_value(err, written) from None
        return value, KnobSpec(name=knob, default=self.data_of(f"defknob {knob}", default), value=self.data_of(f"knob {knob}", value), type=kind, doc=doc if type(doc) is str else None)

    def probe_points(self, knob: str, default: Any, keys: dict[str, Any], probing: Probing) -> None:
        """Each point's value of a probed knob, checked and recorded as the point's own compile
        would; a point whose value is refused is left to compile on its own."""
        specs: list[Optional[KnobSpec]] = []
        bound: list[Any] = []
        for i, literal in enumerate(probing.values[knob]):
            try:
                value, spec = self.knob_setting(knob, default, keys, {knob: literal}, probing.written[knob][i])
            except LispError:
                probing.refused.add(i)
                value, spec = None, None
            specs.append(spec)
            bound.append(value)
        probing.specs[knob] = specs
        probing.bound[knob] = bound

    def blamed_on_value(self, err: LispError, written: Written) -> LispError:
        """ERR, about a value a defvariant or a defsweep gives a knob, at that value (the
        evaluator's note names the defknob)."""
        err.loc = written.loc
        note = f"this value comes from {written.by}; defvariant and defsweep values are literal data, read and never evaluated"
        if written.axis is not None:
            note += f": {written.axis} is a list of values, not a call; write the values themselves"
        err.notes.append(note)
        return err

    def parse_knob_value(self, knob: str, raw: str, default: Any) -> Any:
        try:
            form = Reader(raw, f"--set {knob}", self.interp.table).read_next()
        except Exception:
            form = None
        if form is None:
            raise lisp_error("C004", f"--set {knob}={raw}: not a value", "TYPE-ERROR")
        value = form.form
        if type(default) is float and type(value) is int:
            value = float(value)
        return value

    KNOB_TYPES = {
        "float": lambda v: type(v) in (int, float), "integer": lambda v: type(v) is int, "int": lambda v: type(v) is int,
        "string": lambda v: type(v) is str, "keyword": lambda v: type(v) is Symbol and v.is_keyword,
        "symbol": lambda v: type(v) is Symbol, "boolean": lambda v: v is T or v is NIL, "bool": lambda v: v is T or v is NIL,
    }

    def check_knob_type(self, knob: str, value: Any, kind: Optional[str], shown: str) -> None:
        if kind is None:
            return
        check = self.KNOB_TYPES.get(kind)
        if check is None:
            raise lisp_error("C004", f"knob {knob}: :type {kind} is not one of {', '.join(':' + k for k in self.KNOB_TYPES)}", "TYPE-ERROR")
        if not check(value):
            raise lisp_error("C004", f"knob {knob}: {shown} is not of :type {kind}", "TYPE-ERROR")

    def check_knob(self, knob: str, value: Any, default: Any, keys: dict[str, Any], shown: str) -> None:
        if type(default) in (int, float) and type(value) not in (int, float):
            raise lisp_error("C004", f"knob {knob}: {shown} is not a number like its default {short(default)}", "TYPE-ERROR")
        if type(default) is int and type(value) is float:
            raise lisp_error("C004", f"knob {knob}: {shown} is not an integer like its default {default}", "TYPE-ERROR")
        choices = keys.get("CHOICES", NIL)
        if choices is not NIL and not any(_same(value, c) for c in list_items("defknob", 5, choices)):
            raise lisp_error("C004", f"knob {knob}: {shown} is not one of {short(choices)}", "TYPE-ERROR")
        bounds = keys.get("RANGE", NIL)
        if bounds is not NIL:
            lo, hi = list_items("defknob", 4, bounds)[:2]
            if type(value) not in (int, float, Fraction):
                raise lisp_error("C004", f"knob {knob}: {short(value)} is not a number, so it has no place in its range [{lo}, {hi}]", "TYPE-ERROR")
            if not lo <= value <= hi:
                raise lisp_error("C004", f"knob {knob}: {shown} is outside its range [{lo}, {hi}]", "TYPE-ERROR")

    def check_knob_options(self, knob: str, default: Any, keys: dict[str, Any]) -> None:
        """The declaration itself: :type a symbol, :range two numbers, :choices a list, :doc a string."""
        what = f"defknob {knob}"
        declared = keys.get("TYPE", NIL)
        if type(declared) is not Symbol:
            raise malformed(f"{what}: :type must be a type name such as float or integer, got {short(declared)}")
        bounds = keys.get("RANGE", NIL)
        if bounds is not NIL:
            pair = self.items_of(f"{what} :range", bounds, "a list of two numbers (low high)")
            if len(pair) != 2 or any(type(b) not in (int, float, Fraction) for b in pair):
                raise malformed(f"{what} :range needs a list of two numbers (low high), got {short(bounds)}")
        if keys.get("CHOICES", NIL) is not NIL:
            self.items_of(f"{what} :choices", keys["CHOICES"], "a list of the allowed values")
        doc = keys.get("DOC", NIL)
        if doc is not NIL and type(doc) is not str:
            raise malformed(f"{what}: :doc must be a string, got {short(doc)}")
        self.data_of(f"defknob {knob}: the default", default)

    def data_of(self, what: str, value: Any) -> Any:
        """VALUE as plain data for a record (numbers, strings, keywords, lists): a function, a
        circular list or a float too large to store is a C008."""
        try:
            return as_data(value)
        except (LispError, ValueError, TypeError, OverflowError, RecursionError) as exc:
            detail = exc.condition.message if isinstance(exc, LispError) else "it is not plain data (numbers, strings, symbols and lists of them)"
            raise malformed(f"{what}: {short(value)} cannot be recorded: {detail}") from None

    def from_literal(self, value: Any) -> Any:
        if value is None:
            return NIL
        if value is True:
            return T
        if isinstance(value, str) and value.startswith(":"):
            return self.interp.kw(value[1:])
        if isinstance(value, list):
            return to_lisp_list([self.from_literal(v) for v in value])
        return value

    def check_settings(self, what: str, name: Any, settings: Any, options: tuple[str, ...]) -> dict[str, Any]:
        label = f"{what} {self.name_of(what, name)}"
        items = self.items_of(label, settings, "knob-value pairs")
        if len(items) % 2:
            raise malformed(f"{label}: settings are knob-value pairs, got an odd number of items")
        out = {}
        for key, value in zip(items[::2], items[1::2]):
            knob = self.name_of(label, key, "knob name")
            if knob in options:
                continue
            if knob not in self.knobs:
                raise lisp_error("C004", f"{what} {name.name.lower()}: no knob named {knob} (declared: {', '.join(self.knobs) or 'none'}); declare it with defknob first", "PROGRAM-ERROR")
            out[knob] = value
        return out

    def b_defvariant(self, name: Any, settings: Any) -> Any:
        self.variants[self.name_of("defvariant", name)] = self.check_settings("defvariant", name, settings, ())
        return name

    def b_defsweep(self, name: Any, settings: Any) -> Any:
        self.sweeps[self.name_of("defsweep", name)] = self.check_settings("defsweep", name, settings, ("zip", "variant", "sample", "seed", "halving"))
        return name

    # -- models ---------------------------------------------------------------------------------------
    def current_path(self, name: str) -> str:
        return ".".join(self.path + [name])

    def b_model_scope(self, type_name: Any, thunk: Any) -> Any:
        if not self.path:
            raise lisp_error("C008", f"model {short(type_name)} must be created inside a defpart so its parameters get paths", "PROGRAM-ERROR")
        model = Model(type_name=self.name_of("defmodel", type_name), path=".".join(self.path))
        self.model_stack.append(model)
        try:
            self.interp.call(thunk)
        finally:
            self.model_stack.pop()
        if model.forward is None:
            raise lisp_error("C008", f"defmodel {model.type_name} has no (forward (args) ...) form", "PROGRAM-ERROR")
        return model

    def current_model(self, what: str) -> Model:
        if not self.model_stack:
            raise lisp_error("C008", f"{what} is only allowed inside defmodel", "PROGRAM-ERROR")
        return self.model_stack[-1]

    def b_defparam_misplaced(self, name: Any) -> Any:
        """`defparam` anywhere but as a direct form of a defmodel body."""
        if self.model_stack:
            raise misplaced_in_model("defparam", name.name.lower(), self.model_stack[-1].type_name)
        raise lisp_error("C008", f"defparam {name.name.lower()} is only allowed as a direct form of a defmodel body", "PROGRAM-ERROR")

    def b_defparam(self, name: Any, shape: Any, *args: Any) -> Any:
        model = self.current_model("defparam")
        pname = self.name_of("defparam", name)
        keys = self.keys_of(f"defparam {pname}", args, {"INIT", "WHEN", "DTYPE"})
        if keys.get("WHEN", T) is NIL:
            return NIL
        dims = self.lib.shape_arg("defparam", 2, shape)
        init = keys.get("INIT", NIL)
        spec = self.init_spec(init, len(dims))
        dtype = self.lib.dtype_arg("defparam", 5, keys["DTYPE"]) if "DTYPE" in keys else DType.f32
        param = Param(path=self.current_path(pname), shape=tuple(dims), dtype=dtype, init=spec)
        model.params[pname] = param
        return param

    def init_spec(self, init: Any, rank: int) -> InitSpec:
        if isinstance(init, InitSpec):
            return init
        if init is NIL:
            return InitSpec(kind="zeros") if rank <= 1 else InitSpec(kind="kaiming")
        if type(init) is Symbol and init.is_keyword and init.name in ("ZEROS", "ONES"):
            return InitSpec(kind=cast(InitKind, init.name.lower()))
        if type(init) in (int, float, Fraction):
            return InitSpec(kind="constant", value=self.number_of("defparam :init", init, kept=True))
        raise type_error("defparam", 3, "an initializer (:zeros :ones (normal :std s) (uniform ...) (xavier) (kaiming))", init)

    def b_defpart(self, name: Any, thunk: Any) -> Any:
        model = self.current_model("defpart")
        key = self.name_of("defpart", name)
        value, part = self.made_part(name, thunk)
        model.parts[key] = part
        return value if type(value) is Cons else lisp_view(part)

    def made_part(self, name: Any, thunk: Any) -> tuple[Any, Any]:
        """What defpart NAME's constructor form returns, and the part it makes: a list of
        models made by the form (a `loop ... collect`, say) is numbered as repeat's copies
        are, NAME.0, NAME.1 ..., each with parameters of its own."""
        self.path.append(name.name.lower())
        try:
            value = self.interp.call(thunk)
            here = ".".join(self.path)
        finally:
            self.path.pop()
        if type(value) is Cons and made_at(value, here):
            return value, numbered(value, here, here, set())
        return value, value

    def b_forward(self, fn: Any) -> Any:
        self.current_model("forward").forward = fn
        return NIL

    def b_repeat(self, n: Any, thunk: Any) -> Any:
        """(repeat n (ctor ...)): parts 0..n-1, each made by the same constructor."""
        return self.numbered_parts([thunk] * self.lib.int_arg("repeat", 1, n))

    def b_repeat_list(self, thunks: Any) -> Any:
        """Parts 0..n-1 made by a list of constructors (layers of different sizes)."""
        return self.numbered_parts(list_items("repeat", 1, thunks))

    def numbered_parts(self, thunks: list[Any]) -> ModelList:
        models = []
        for i, thunk in enumerate(thunks):
            self.path.append(str(i))
            try:
                models.append(self.interp.call(thunk))
            finally:
                self.path.pop()
        return ModelList(path=".".join(self.path), models=models)

    def b_models(self, part: Any) -> Any:
        """(part-models PART): the copies of a repeated part, in order, as a list (a list of
        models is its own list), so that `nth`, `length`, `dolist` and `mapcar` reach them."""
        if type(part) is Cons and all(isinstance(m, (Model, ModelList)) for m in list_items("part-models", 1, part)):
            return part
        if not isinstance(part, ModelList):
            raise type_error("part-models", 1, "a repeated part (a defpart of (repeat N ...))", part)
        return part.as_list()

    def b_call_model(self, model: Any, args: Any) -> Any:
        return self.call_model(model, list_items("call model", 2, args))

    def call_model(self, model: Any, args: list[Any]) -> Any:
        if isinstance(model, ModelList) or type(model) is Cons:
            # a repeated part (or the list of its parts): each applied to the last one's result
            value = args[0] if len(args) == 1 else to_lisp_list(args)
            for m in model.models if isinstance(model, ModelList) else list_items("call model", 1, model):
                value = self.call_model(m, [value])
            return value
        if not isinstance(model, Model):
            raise type_error("call", 1, "a model", model)
        tracer = self.lib.tracer(model.type_name)
        tracer.path_stack.append(model.path)
        try:
            result = self.interp.apply(model.forward, args)
        finally:
            tracer.path_stack.pop()
        if type(result) is Staged:
            tracer.activations.setdefault(model.path, result.id)
        return result

    def b_defpart_toplevel(self, name: Any, thunk: Any) -> Any:
        key = self.name_of("defpart", name)
        if self.model_stack:  # a defpart nested in a let or when of a defmodel body
            raise misplaced_in_model("defpart", key, self.model_stack[-1].type_name)
        if key in self.parts:
            raise lisp_error("C003", f"defpart {key} is defined twice", "PROGRAM-ERROR")
        value, part = self.made_part(name, thunk)
        if not isinstance(part, (Model, ModelList)):
            raise lisp_error("C008", f"defpart {key}: {short(part)} is not a model; call a defmodel constructor", "PROGRAM-ERROR")
        self.parts[key] = part
        if self.interp.current_loc is not None:
            self.part_locs[key] = self.interp.current_loc
        self.interp.values[name] = value if type(value) is Cons else lisp_view(part)
        self.interp.functions[name] = Builtin(key, lambda *args: self.call_model(part, list(args)), 0, None)
        return name

    def b_tie(self, target: Any, source: Any, transpose: Any) -> Any:
        """Make TARGET read SOURCE (transposed if asked): one parameter, two places; the
        gradient is the sum of both uses because both read the same input."""
        if not isinstance(target, Param) or not isinstance(source, Param):
            raise type_error("tie", 1 if not isinstance(target, Param) else 2, "a parameter (a defparam of some part)", target if not isinstance(target, Param) else source)
        shape = source.shape[:-2] + (source.shape[-1], source.shape[-2]) if transpose is not NIL else source.shape
        if shape != target.shape:
            raise lisp_error("T001", f"tie: {target.path} is {list(target.shape)} but {source.path}{' transposed' if transpose is not NIL else ''} is {list(shape)}", "TYPE-ERROR")
        if source.source() is target:
            raise lisp_error("C008", f"tie: {target.path} and {source.path} would read each other", "PROGRAM-ERROR")
        target.tie = (source, transpose is not NIL)
        return target

    def b_part_models(self, part: Any) -> Any:
        return self.b_models(part)

    def b_part_param(self, part: Any, name: Any) -> Any:
        """(part-param embed 'table): a part's parameter, e.g. to tie it."""
        if not isinstance(part, Model):
            raise type_error("part-param", 1, "a model part", part)
        key = name.name.lower() if type(name) is Symbol else str(name).lower()
        param = part.params.get(key)
        if param is None:
            raise lisp_error("C008", f"part-param: {part.type_name} at {part.path} has no parameter {key} (it has: {', '.join(part.params) or 'none'})", "PROGRAM-ERROR")
        return param

    def b_shadow(self, *names: Any) -> Any:
        """(%shadow "NAME" ...): this module defines its own NAME, hiding the standard one."""
        table = self.interp.table
        for name in names:
            table.own[name] = Symbol(name, table.package)
        return NIL

    def b_defmodel_constructor(self, name: Symbol, fn: Any) -> Any:
        """defmodel's function. A name the standard library already uses is shadowed in the
        defining file (a new symbol of that file), so later forms call the model."""
        interp, table = self.interp, self.interp.table
        symbol = name
        taken = name in interp.special_forms or name in interp.macros or name in interp.functions
        if table is not interp.base and interp.base.exported.get(name.name) is name and taken:
            symbol = Symbol(name.name, table.package)
            table.own[name.name] = symbol
        if type(fn) is Closure:
            fn.name = symbol
        interp.functions[symbol] = fn
        return symbol

    def b_run_steps(self) -> Any:
        """The run's :steps, for schedules whose length defaults to the run (read when the
        update is staged, after defrun)."""
        if self.run is None:
            raise lisp_error("C008", "(run-steps) is only known once defrun has been read: call it inside a schedule", "PROGRAM-ERROR")
        return self.run.steps

    def b_training_p(self) -> Any:
        tracer = self.lib.tracer("training-p")
        return T if tracer.training else NIL

    def b_param_count(self, part: Any) -> Any:
        if type(part) is Cons:
            return sum(self.b_param_count(p) for p in list_items("param-count", 1, part))
        if isinstance(part, (Model, ModelList)):
            total = 0
            for p in part.all_params():
                n = 1
                for d in p.shape:
                    n *= d
                total += n
            return total
        raise type_error("param-count", 1, "a model (a defpart)", part)

    # -- data -----------------------------------------------------------------------------------------
    def b_defloader(self, name: Any, *args: Any) -> Any:
        key = self.name_of("defloader", name)
        keys = self.keys_of(f"defloader {key}", args, {"SOURCE", "PREPARE", "FIELDS", "BATCH", "SHUFFLE", "PART", "STAGES"})
        source = keys.get("SOURCE", NIL)
        if not isinstance(source, SourceValue):
            raise lisp_error("C008", f"defloader {key}: :source needs a source such as (synthetic :spirals ...) or (npz \"file.npz\")", "PROGRAM-ERROR")
        batch = keys.get("BATCH", NIL)
        if type(batch) is not int or batch <= 0:
            raise lisp_error("C008", f"defloader {key}: :batch needs a positive integer, got {short(batch)}", "PROGRAM-ERROR")
        if batch >= 2**31:
            raise malformed(f"defloader {key}: :batch {short(batch)} is too large; it must be below 2^31")
        fields = [self.field_record(key, spec) for spec in self.items_of(f"defloader {key} :fields", keys.get("FIELDS", NIL), "a list of (name dtype (shape...))")]
        if not fields:
            raise lisp_error("C008", f"defloader {key}: :fields needs at least one (name dtype (shape...))", "PROGRAM-ERROR")
        prepare = []
        for step in self.items_of(f"defloader {key} :prepare", keys.get("PREPARE", NIL), "a list of steps such as (normalize x)"):
            items = self.items_of(f"defloader {key} :prepare", step, "steps written (name :key value ...)")
            if not items:
                raise malformed(f"defloader {key} :prepare: a step is (name :key value ...), got ()")
            kind = self.name_of(f"defloader {key} :prepare", items[0], "step name")
            if len(items) % 2 == 0:
                raise malformed(f"defloader {key} :prepare: step {kind} takes :key value pairs, got an odd number")
            options = {self.name_of(f"defloader {key} :prepare {kind}", k, "option"): self.data_of(f"defloader {key} :prepare {kind}", v) for k, v in zip(items[1::2], items[2::2])}
            prepare.append(PrepareRecord(kind=kind, options=options))
        self.check_data_options(key, source.record, prepare, fields)
        part = keys.get("PART", NIL)
        if part is not NIL:
            self.name_of(f"defloader {key} :part", part, "part (a symbol such as train or val)")
        stages = []
        for spec in self.items_of(f"defloader {key} :stages", keys.get("STAGES", NIL), "a list of (name :batch n :length n)"):
            items = self.items_of(f"defloader {key} :stages", spec, "stages written (name :batch n :length n)")
            if not items:
                raise malformed(f"defloader {key} :stages: a stage is (name :batch n :length n), got ()")
            sname = self.name_of(f"defloader {key} :stages", items[0], "stage name")
            opts = self.keys_of(f"defloader {key} stage {sname}", tuple(items[1:]), {"BATCH", "LENGTH"})
            values = {k.lower(): self.interp.call(self.interp.functions[self.interp.sym("EVAL")], v) if type(v) is Cons else v for k, v in opts.items()}
            for k, v in values.items():
                if type(v) is not int or v <= 0:
                    raise lisp_error("C008", f"defloader {key}: stage {sname} :{k} needs a positive integer, got {short(v)}", "PROGRAM-ERROR")
                if v >= 2**31:
                    raise malformed(f"defloader {key}: stage {sname} :{k} {short(v)} is too large; it must be below 2^31")
            stages.append(StageRecord(name=sname, **values))
        self.loaders[key] = LoaderRecord(
            name=key,
            source=source.record,
            prepare=prepare,
            fields=fields,
            batch=batch,
            shuffle=keys.get("SHUFFLE", NIL) is not NIL,
            part=None if part is NIL else self.name_of(f"defloader {key} :part", part),
            base_dir=str(self.base_dir),
            root=str(self.root),
            stages=stages,
        )
        return name

    def check_data_options(self, loader: str, source: SourceRecord, prepare: list[PrepareRecord], declared: list[FieldRecord]) -> None:
        """The source's and each prepare step's options against their declarations (the
        table the data layer reads too), at the option in the defloader form."""
        fields = [f.name for f in declared]
        dtypes = {f.name: f.dtype for f in declared}
        form = self.source_form("DEFLOADER")
        problem = source_problem(source.kind, source.options, fields)
        if problem is not None:
            where = option_loc(form_value(form, "SOURCE"), problem, [SOURCES[source.kind].positional if source.kind in SOURCES else None])
            raise self.at(where or self.interp.current_loc, "C008", f"defloader {loader}: {problem.message}")
        steps = form_value(form, "PREPARE")
        step_forms = list_cells(steps.car) if steps is not None and type(steps.car) is Cons else []
        for i, step in enumerate(prepare):
            problem = step_problem(step.kind, step.options, fields) or float_field_problem(step, dtypes)
            if problem is not None:
                cell = step_forms[i] if i < len(step_forms) else None
                step_decl = PREPARE_STEPS.get(step.kind)
                where = option_loc(cell, problem, [step_decl.positional] if step_decl and step_decl.positional else [])
                raise self.at(where or self.interp.current_loc, "C008", f"defloader {loader}: {problem.message}")

    def field_record(self, loader: str, spec: Any) -> FieldRecord:
        what = f"defloader {loader} :fields"
        parts = self.items_of(what, spec, "fields written (name dtype (shape...))")
        if len(parts) != 3:
            raise malformed(f"{what}: a field is (name dtype (shape...)), got {short(spec)}")
        fname, dtype, shape = parts
        name = self.name_of(what, fname, "field name")
        dims = self.items_of(f"{what} {name}", shape, "a shape: a list of non-negative integers") if type(shape) is not int else [shape]
        if any(type(d) is not int or d < 0 or d >= 2**31 for d in dims):
            raise malformed(f"{what} {name}: the shape must be a list of non-negative integers below 2^31, got {short(shape)}")
        if not (type(dtype) is Symbol and dtype.is_keyword and dtype.name.lower() in {d.value for d in DType}):
            raise malformed(f"{what} {name}: the dtype must be one of {' '.join(':' + d.value for d in DType)}, got {short(dtype)}")
        return FieldRecord(name=name, dtype=DType(dtype.name.lower()).value, shape=tuple(dims))

    def b_field(self, batch: Any, name: Any) -> Any:
        if not isinstance(batch, Batch):
            raise type_error("field", 1, "a batch (the argument of defobjective)", batch)
        key = self.name_of("field", name, "field name")
        value = batch.fields.get(key)
        if value is None:
            known = ", ".join(batch.fields)
            raise lisp_error("C008", f"field: loader {batch.loader} has no field {key}; its fields are: {known}", "PROGRAM-ERROR")
        return value

    # -- objective, groups, run ----------------------------------------------------------------------
    def b_defobjective(self, fn: Any) -> Any:
        self.objective = fn
        return NIL

    def b_defevaluate(self, fn: Any) -> Any:
        self.evaluate = fn
        return NIL

    def b_defcurriculum(self, clauses: Any) -> Any:
        rules = []
        for clause in self.items_of("defcurriculum", clauses, "clauses"):
            kind, test, specs = self.items_of("defcurriculum", clause, "clauses")
            pairs = []
            for spec in self.items_of("defcurriculum", specs, "(stage loader name) forms"):
                loader, stage = self.items_of("defcurriculum", spec, "(stage loader name) forms")
                lname, sname = self.name_of("defcurriculum stage", loader, "loader name"), self.name_of("defcurriculum stage", stage, "stage name")
                record = self.loaders.get(lname)
                declared = getattr(stage, "is_keyword", False) and sname == "declared"
                if declared and record is not None:
                    sname = DECLARED_STAGE  # (stage train :declared): the loader as declared
                elif record is None or not any(s.name == sname for s in record.stages):
                    known = ", ".join([s.name for s in record.stages] + [":declared"]) if record else "no such loader"
                    raise lisp_error("C008", f"defcurriculum: loader {lname} has no stage {sname} ({known})", "PROGRAM-ERROR")
                if lname != "train":
                    raise lisp_error("C008", f"defcurriculum: only the train loader changes stage during a run (got {lname})", "PROGRAM-ERROR")
                pairs.append((lname, sname))
            rules.append((kind.name.lower(), test, pairs))
        self.curriculum = rules
        return NIL

    def b_defeval(self, name: Any, *args: Any) -> Any:
        key = self.name_of("defeval", name)
        keys = self.keys_of(f"defeval {key}", args, {"LOADER", "EVERY", "AT", "OVERLAP"})
        loader = keys.get("LOADER", name)
        every = keys.get("EVERY", NIL)
        at = keys.get("AT", NIL)
        if every is not NIL and (type(every) is not int or every <= 0 or every >= 2**63):
            raise lisp_error("C008", f"defeval {key}: :every needs a positive integer, got {short(every)}", "PROGRAM-ERROR")
        if at is not NIL and not (type(at) is Symbol and at.name == "END"):
            raise lisp_error("C008", f"defeval {key}: :at takes :end, got {short(at)}", "PROGRAM-ERROR")
        if every is NIL and at is NIL:
            raise lisp_error("C008", f"defeval {key}: say when it runs, with :every N or :at :end", "PROGRAM-ERROR")
        if any(e.name == key for e in self.evals):
            raise lisp_error("C003", f"defeval {key} is defined twice", "PROGRAM-ERROR")
        if key in self.early_targets:
            what, target_loc = self.early_targets[key]
            here = f", at {self.interp.current_loc}" if self.interp.current_loc is not None else ""
            raise self.at(target_loc, "C008", f"{what}: the defeval {key} comes later{here}; move it above the deftarget (a deftarget names a defeval defined before it)")
        self.evals.append(EvalSpec(name=key, loader=self.name_of(f"defeval {key} :loader", loader, "loader name"), every=every if type(every) is int else None, at_end=at is not NIL, overlap=keys.get("OVERLAP", NIL) is not NIL))
        return name

    def b_deftarget(self, name: Any, metric: Any, test: Any, value: Any) -> Any:
        """(deftarget EVAL METRIC TEST VALUE); every problem is reported at the form, and the
        check of METRIC against defevaluate's metrics (at staging) too."""
        loc = self.interp.current_loc
        if type(name) is not Symbol or type(metric) is not Symbol:
            raise self.at(loc, "C008", f"deftarget: write (deftarget EVAL METRIC TEST VALUE) with the names of a defeval and of a metric, got {short(name)} {short(metric)}")
        key, what = name.name.lower(), f"deftarget {name.name.lower()} {metric.name.lower()}"
        if not any(e.name == key for e in self.evals):
            self.early_targets.setdefault(key, (what, loc))  # a defeval later in the file is a wrong order, at the end none is
        tests = " ".join(":" + t for t in TARGET_TESTS)
        if type(test) is not Symbol or not test.is_keyword or test.name not in TARGET_TESTS:
            if type(test) is Symbol and test.name in TARGET_TESTS:
                raise self.at(loc, "C008", f"{what}: the test must be a keyword such as :{test.name}, not the symbol {test.name}; the tests are {tests}")
            raise self.at(loc, "C008", f"{what}: the test must be a keyword, one of {tests}; got {short(test)}")
        if type(value) not in (int, float):
            raise self.at(loc, "C008", f"{what}: the threshold must be a number, got {short(value)}")
        if loc is not None:
            self.target_locs[len(self.targets)] = loc
        self.targets.append(TargetSpec(eval=key, metric=metric.name.lower(), test=cast(TargetTest, test.name), value=self.number_of(f"{what}: the threshold", value, kept=True)))
        return name

    def unresolved_targets(self) -> None:
        """Once the file is evaluated: a deftarget whose defeval never came is C008 at the deftarget."""
        for key, (what, loc) in self.early_targets.items():
            if not any(e.name == key for e in self.evals):
                raise self.at(loc, "C008", f"{what}: no defeval named {key} (evals: {', '.join(e.name for e in self.evals) or 'none'})")

    def b_metric(self, name: Any, value: Any) -> Any:
        tracer = self.lib.tracer("metric")
        staged = self.lib.staged("metric", 2, value)
        if staged.type.rank != 0:
            staged = self.lib.op("metric", "mean", self.lib.cast_to("metric", staged, DType.f32) if not staged.type.dtype.is_float else staged)
        tracer.metrics[self.name_of("metric", name)] = staged.id
        return value

    def b_make_optimizer(self, name: Any, states: Any, update: Any) -> Any:
        slots = []
        for spec in list_items("defoptimizer", 2, states):
            items = list_items("defstate", 1, spec)
            keys = self.keys_of("defstate", tuple(items[1:]), {"INIT"})
            init = keys.get("INIT", NIL)
            slots.append((self.name_of("defstate", items[0] if items else NIL), self.init_spec(init, 0) if init is not NIL else InitSpec(kind="zeros")))
        return Optimizer(name=self.name_of("defoptimizer", name), states=slots, update=update, made_at=self.interp.user_loc)

    def b_defgroups(self, groups: Any, *args: Any) -> Any:
        keys = self.keys_of("defgroups", args, {"CLIP"})
        clip = keys.get("CLIP", NIL)
        self.clip = None if clip is NIL else self.number_of("defgroups :clip", clip)
        if self.clip is not None and not 0 < self.clip < float("inf"):
            raise malformed(f"defgroups :clip needs a positive finite number, got {short(clip)}")
        for spec in self.items_of("defgroups", groups, "groups written (name \"selector\" optimizer)"):
            parts = self.items_of("defgroups", spec, "groups written (name \"selector\" optimizer)")
            extra = parts.pop() if len(parts) == 4 else NIL  # the defgroups macro passes what follows the optimizer
            if extra is not NIL:
                raise lisp_error(
                    "C008",
                    f"defgroups {short(parts[0])}: a group is (NAME \"SELECTOR\" OPTIMIZER) and reads nothing after the optimizer, "
                    f"got {short(extra)}; :clip belongs to the whole defgroups, after the last group: (defgroups (...) (...) :clip 1.0)",
                    "PROGRAM-ERROR",
                )
            if len(parts) != 3:
                raise malformed(f"defgroups: a group is (name \"selector\" optimizer), got {short(spec)}")
            gname, selector, opt = parts
            group_name = self.name_of("defgroups", gname, "group name")
            if type(selector) is not str:
                raise lisp_error("C008", f"defgroups {short(gname)}: the selector must be a glob string like \"**\" or \"model.*.w\"", "PROGRAM-ERROR")
            if type(opt) is Symbol and opt.name == "FROZEN":
                optimizer = None
            elif isinstance(opt, Optimizer):
                optimizer = opt
            else:
                raise lisp_error("C008", f"defgroups {short(gname)}: {short(opt)} is neither an optimizer nor :frozen", "PROGRAM-ERROR")
            self.groups.append(Group(name=group_name, selector=selector, optimizer=optimizer))
        return NIL

    def b_defrun(self, *args: Any) -> Any:
        keys = self.keys_of("defrun", args, {"STEPS", "SEED", "LOG-EVERY", "META", "MICROBATCHES", "PRECISION", "CHECKPOINT", "FINITE-GUARD", "DIAGNOSTICS"})
        steps = self.count_of("defrun: :steps", keys.get("STEPS", NIL))
        seed = self.count_of("defrun: :seed", keys.get("SEED", 0), least=0, kept=True)
        log_every = self.count_of("defrun: :log-every", keys.get("LOG-EVERY", 10))
        micro = self.count_of("defrun: :microbatches", keys.get("MICROBATCHES", 1))
        precision = keys.get("PRECISION", self.interp.kw("f32"))
        if not (type(precision) is Symbol and precision.name in ("F32", "BF16")):
            raise lisp_error("C008", f"defrun: :precision is :f32 or :bf16, got {short(precision)}", "PROGRAM-ERROR")
        diagnostics = self.diagnostics_option(keys.get("DIAGNOSTICS", NIL))
        checkpoint = self.plist_option("checkpoint", keys.get("CHECKPOINT", NIL), {"EVERY": None, "KEEP": 3})
        guard = self.plist_option("finite-guard", keys.get("FINITE-GUARD", NIL), {"SKIP": 0, "ROLLBACK": None, "LR-SCALE": None})
        meta = self.meta_option(keys.get("META", NIL))
        self.run = RunSpec(
            steps=steps,
            seed=seed,
            log_every=log_every,
            microbatches=micro,
            precision="bf16" if precision.name == "BF16" else "f32",
            checkpoint=CheckpointPolicy(**(checkpoint or {})),
            finite_guard=finite_guard(guard),
            diagnostics=diagnostics,
            meta=meta,
        )
        return NIL

    def meta_option(self, option: Any) -> dict[str, Any]:
        """:meta (:question "..." :owner "...") from defrun: a plist of plain data, kept as given."""
        if option is NIL:
            return {}
        items = self.items_of("defrun :meta", option, 'a plist such as (:question "does warmup matter?")')
        if len(items) % 2 or any(type(k) is not Symbol or not k.is_keyword for k in items[::2]):
            raise malformed(f'defrun :meta needs a plist of :keyword value pairs such as (:question "does warmup matter?"), got {short(option)}')
        meta = self.data_of("defrun :meta", option)
        if not isinstance(meta, dict):
            raise malformed(f"defrun :meta needs a plist of :keyword value pairs, got {short(option)}")
        return meta

    def plist_option(self, name: str, option: Any, defaults: dict[str, Any]) -> Optional[dict[str, Any]]:
        """A defrun option written as a plist of numbers, e.g. :checkpoint (:every 500 :keep 3)."""
        if option is NIL:
            return None
        keys = self.keys_of(f"defrun :{name}", tuple(self.items_of(f"defrun :{name}", option, "a plist")), set(defaults))
        out = {}
        for key, default in defaults.items():
            value = keys.get(key, default)
            if value is T:
                value = True
            if value is not None and value is not True and (type(value) not in (int, float) or not 0 <= value < 2**63):
                raise lisp_error("C008", f"defrun :{name} :{key.lower()} needs a non-negative number, got {short(value)}", "PROGRAM-ERROR")
            out[key.lower()] = value
        return out

    def diagnostics_option(self, option: Any) -> Optional[DiagnosticsSpec]:
        """:diagnostics (:every N :select ("glob" ...)) from defrun."""
        if option is NIL:
            return None
        keys = self.keys_of("defrun :diagnostics", tuple(self.items_of("defrun :diagnostics", option, "a plist such as (:every 100 :select (\"grad-norm/**\"))")), {"EVERY", "SELECT"})
        every = keys.get("EVERY", 100)
        if type(every) is not int or every <= 0 or every >= 2**63:
            raise lisp_error("C008", f"defrun :diagnostics :every needs a positive integer, got {short(every)}", "PROGRAM-ERROR")
        select = keys.get("SELECT", NIL)
        globs = [select] if type(select) is str else self.items_of("defrun :diagnostics :select", select, 'glob strings such as ("grad-norm/**" "act/**/rms")')
        if not globs or any(type(g) is not str for g in globs):
            raise lisp_error("C008", 'defrun :diagnostics :select needs glob strings such as ("grad-norm/**" "act/**/rms")', "PROGRAM-ERROR")
        self.select_locs = glob_locs(self.source_form("DEFRUN"))
        return DiagnosticsSpec(every=every, select=globs)

    def b_defdiagnostic(self, name: Any, reducer: Any) -> Any:
        self.reducers[self.name_of("defdiagnostic", name)] = reducer
        return name

    def b_diagnostic(self, name: Any, value: Any) -> Any:
        """(diagnostic NAME x): tap X for the reducer NAME (defdiagnostic) at the current
        model path; returns X unchanged. Costs nothing unless selected."""
        key = name.name.lower() if type(name) is Symbol else str(name)
        if key not in self.reducers:
            raise lisp_error("C008", f"diagnostic: no defdiagnostic named {key} (defined: {', '.join(self.reducers) or 'none'})", "PROGRAM-ERROR")
        tracer = self.lib.tracer("diagnostic")
        if not tracer.training:
            return value  # taps sample the training step; the same forward in evaluation passes through
        staged = self.lib.staged("diagnostic", 2, value)
        path = tracer.path_stack[-1] if tracer.path_stack else "objective"
        tracer.taps.append((f"{key}/{path}", key, staged.id))
        return value

    def b_schedule(self, lr: Any, ctx: Any) -> Any:
        if isinstance(lr, (int, float)):
            value: Any = self.number_of("schedule: the learning rate", lr, kept=type(lr) is FloatProbe)
        elif type(lr) in (Closure, Builtin):
            tracer = self.lib.tracer("schedule")
            value = self.interp.call(lr, Staged(tracer, tracer.ctx_input("step")))
        else:
            raise malformed(f"the learning rate must be a number or a schedule, got {short(lr)}")
        tracer = self.lib.tracer("schedule")
        if self.run is not None and self.run.finite_guard.lr_scale is not None:
            # a finite-guard rollback scales the learning rate at run time
            value = self.lib.mul(value, Staged(tracer, tracer.ctx_input("lr-scale")))
        if tracer.group is not None:
            staged = self.lib.staged("schedule", 1, value)
            tracer.metrics[f"lr:{tracer.group}"] = staged.id
        # a float knob's probe stays one for what the caller does with the rate (probes.py)
        return lr if type(lr) is FloatProbe and type(value) is float else value

    def b_ctx(self, key: Any, *rest: Any) -> Any:
        tracer = self.lib.tracer("ctx")
        name = key.name.lower() if type(key) is Symbol and key.is_keyword else ""
        if name not in CTX_KEYS:
            raise lisp_error("C008", f"(ctx {short(key)}): ctx keys are {', '.join(':' + k for k in CTX_KEYS)}", "PROGRAM-ERROR")
        if name in ("lr", "eval"):
            raise lisp_error("C008", f"(ctx :{name}) is not available where it is read: the learning rate is what a schedule computes, and eval metrics reach defcurriculum in a later release", "PROGRAM-ERROR")
        if not tracer.ctx_allowed:
            raise lisp_error("C008", f"(ctx :{name}) is read in optimizer updates, schedules and defcurriculum, not in the model or objective", "PROGRAM-ERROR")
        return Staged(tracer, tracer.ctx_input(name))

    # -- queries for the pipeline ------------------------------------------------------------------------------
    def all_params(self) -> list[Param]:
        """The run's parameters, each once (a model shared by two parts has its parameters once)."""
        out: dict[int, Param] = {}
        for part in self.parts.values():
            for param in part.all_params():
                out.setdefault(id(param), param)
        return list(out.values())

    def ties(self) -> dict[str, tuple[str, bool]]:
        """Each tied place: the path of the parameter it reads, and whether transposed."""
        return {p.path: (p.tie[0].path, p.tie[1]) for part in self.parts.values() for p in part.places() if p.tie is not None}

    def check_unique_paths(self) -> None:
        """Two parameters never share a path: the path keys the initial values, the
        checkpoints and the optimizer groups."""
        seen: set[str] = set()
        for param in self.all_params():
            if param.path in seen:
                top = param.path.split(".")[0]
                raise self.at(
                    self.part_locs.get(top) or self.form_loc("DEFPART"), "C008",
                    f"two parameters have the path {param.path}: two models made inside one defpart are both parts of the run; "
                    "make numbered copies with (repeat n (constructor ...)), or return the models as one list from that defpart's form, which numbers them")
            seen.add(param.path)

    def assign_groups(self) -> None:
        for param in self.all_params():
            for group in self.groups:
                if glob_match(group.selector, param.path):
                    group.params.append(param.path)
                    break
            else:
                raise lisp_error("C005", f"parameter {param.path} matches no group in defgroups; add a group such as (rest \"**\" ...)", "PROGRAM-ERROR")
        for group in self.groups:
            if not group.params:
                self.warnings.append(f"group {group.name} (\"{group.selector}\") gets no parameter: earlier groups took every match (first match wins)")


class SourceValue:
    """What (synthetic ...), (npz "...") and friends return: a data source, as the Lisp
    sees it (defloader :source takes its record)."""

    def __init__(self, record: SourceRecord) -> None:
        self.record = record

    def lisp_print(self) -> str:
        return f"#<source {self.record.kind} {self.record.url or self.record.options.get('name', '')}>"


def finite_guard(settings: Optional[dict[str, Any]]) -> FiniteGuard:
    """defrun :finite-guard's checked settings (plist_option) as the record."""
    if settings is None:
        return FiniteGuard()
    return FiniteGuard(skip=settings["skip"], rollback=settings["rollback"] not in (None, False), lr_scale=settings["lr-scale"])


def literal_default(interp: Interpreter, form: Any) -> Any:
    """defknob's default as the datum it is written as: never evaluated, so a list is a list
    (like defsweep values and --set), and a quoted datum 'x stands for x."""
    if type(form) is Cons and form.car is interp.sym("QUOTE") and type(form.cdr) is Cons and form.cdr.cdr is NIL:
        return form.cdr.car
    return form


def float_field_problem(step: PrepareRecord, dtypes: dict[str, str]) -> Optional[Problem]:
    """(normalize FIELD) standardizes a float field: an integer or boolean one is refused."""
    name = step.options.get("field")
    if step.kind != "normalize" or name not in dtypes or DType(dtypes[name]).is_float:
        return None
    return Problem("field", f"(normalize): field {name} is {dtypes[name]}; normalize standardizes a float field", at_value=True)


def glob_locs(defrun: Optional[Cons]) -> dict[str, Loc]:
    """Where each string of defrun :diagnostics's :select is written."""
    option = form_value(defrun, "DIAGNOSTICS", named=False)
    cells = list_cells(option.car) if option is not None else []
    for key, value in zip(cells[::2], cells[1::2]):
        if type(key.car) is Symbol and key.car.is_keyword and key.car.name == "SELECT":
            strings = [value] if type(value.car) is str else list_cells(value.car)
            return {cell.car: cell.loc for cell in strings if type(cell.car) is str and cell.loc is not None}
    return {}


def list_cells(form: Any) -> list[Cons]:
    """The cells of a proper list, each holding one element (and its position)."""
    out = []
    while type(form) is Cons:
        out.append(form)
        form = form.cdr
    return out


def form_value(form: Optional[Cons], key: str, named: bool = True) -> Optional[Cons]:
    """The cell holding the value of keyword KEY in a (head name :key value ...) form, or
    in a (head :key value ...) form when not NAMED."""
    cells = list_cells(form)[2 if named else 1:] if form is not None else []
    for key_cell, value_cell in zip(cells[::2], cells[1::2]):
        if type(key_cell.car) is Symbol and key_cell.car.is_keyword and key_cell.car.name == key:
            return value_cell
    return None


def option_loc(cell: Optional[Cons], problem: Problem, positional: list[Optional[str]]) -> Optional[Loc]:
    """Where PROBLEM is in the form held by CELL, (kind positional... :option value ...),
    whose positional arguments are the options POSITIONAL names (None: not an option, as a
    source's path): the option's keyword, or its value when the value is at fault, or the
    form itself."""
    if cell is None or type(cell.car) is not Cons:
        return None
    form = cell.car
    cells = list_cells(form)[1:]
    for name, arg in zip(positional, cells):
        if name is not None and name == problem.option:
            return arg.loc
    rest = cells[len(positional):]
    for key_cell, value_cell in zip(rest[::2], rest[1::2]):
        if type(key_cell.car) is Symbol and key_cell.car.is_keyword and key_cell.car.name.lower() == problem.option:
            return value_cell.loc if problem.at_value else key_cell.loc
    return form.loc


def made_at(value: Any, path: Optional[str]) -> bool:
    """Whether VALUE is a model made at PATH (any path when None), or a non-empty proper list
    of such values."""
    if type(value) is Cons:
        items = []
        cell: Any = value
        while type(cell) is Cons:
            items.append(cell.car)
            cell = cell.cdr
        return cell is NIL and all(made_at(item, path) for item in items)
    return isinstance(value, (Model, ModelList)) and (path is None or value.path == path)


def numbered(value: Any, made: str, target: str, seen: set[int]) -> Union[Model, ModelList]:
    """VALUE (made_at MADE) moved to TARGET: a list becomes the parts TARGET.0, TARGET.1 ..."""
    if type(value) is Cons:
        return ModelList(path=target, models=[numbered(item, made, f"{target}.{i}", seen) for i, item in enumerate(value)])
    rebase(value, made, target, seen)
    return value


def lisp_view(part: Any) -> Any:
    """What Lisp code sees of a part: a repeated part is the list of its copies."""
    return part.as_list() if isinstance(part, ModelList) else part


def _same(a: Any, b: Any) -> bool:
    return a == b if type(a) is type(b) else False


def malformed(message: str) -> LispError:
    """C008: a malformed contract form, or a value of the wrong type for one of its keywords."""
    return lisp_error("C008", message, "PROGRAM-ERROR")
