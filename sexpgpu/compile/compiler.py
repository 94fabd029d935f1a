"""The compiler's state for one file, and the %-builtins the contract macros expand into.

A Compiler is installed into a fresh interpreter before the file is read: it registers the
tensor builtins and contract forms, records what the file declares while it is evaluated,
and checks the contract's order as each top-level form arrives.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Callable, Optional

from ..ir.dtypes import DType
from ..lisp.builtins import Registry, list_items, parse_keys, short, to_lisp_list, type_error
from ..lisp.conditions import lisp_error
from ..lisp.data import as_data
from ..lisp.evaluator import Interpreter
from ..lisp.objects import Builtin, Closure
from ..lisp.reader import Reader
from ..lisp.types import NIL, T, Cons, Loc, Symbol, SymbolTable
from ..ir.selectors import glob_match
from ..ir.experiment import CheckpointPolicy, DiagnosticsSpec, EvalSpec, FieldRecord, FiniteGuard, InitSpec, KnobSpec, LoaderRecord, PrepareRecord, RunSpec, Selection, SourceRecord, StageRecord, TargetSpec
from .models import Batch, Group, Model, ModelList, Optimizer, Param
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
ORDER_TEXT = "require, defknob/defvariant/defsweep, definitions, defloader, defpart, defobjective, defevaluate/defeval/deftarget, defgroups, defcurriculum, defrun"


class Compiler:
    def __init__(self, interp: Interpreter, selection: Selection, base_dir: Path, overrides: Optional[dict[str, Any]] = None) -> None:
        self.interp = interp
        self.selection = selection
        self.overrides = overrides or {}
        self.base_dir = base_dir
        self.knobs: dict[str, KnobSpec] = {}
        self.variants: dict[str, dict[str, Any]] = {}
        self.sweeps: dict[str, dict[str, Any]] = {}
        self.loaders: dict[str, LoaderRecord] = {}
        self.parts: dict[str, Any] = {}
        self.objective: Any = None
        self.evaluate: Any = None
        self.evals: list[EvalSpec] = []
        self.ties: dict[str, tuple[str, bool]] = {}
        self.curriculum: Optional[list[tuple[str, Any, list[tuple[str, str]]]]] = None
        self.reducers: dict[str, Any] = {}
        self.warnings: list[str] = []
        self.targets: list[TargetSpec] = []
        self.groups: list[Group] = []
        self.clip: Optional[float] = None
        self.run: Optional[RunSpec] = None  # defrun's settings; :clip (defgroups) and the IR diagnostics' names come at staging
        self.path: list[str] = []
        self.model_stack: list[Model] = []
        self.seen: list[tuple[str, Loc]] = []
        self.first_of: dict[str, Loc] = {}  # form name -> where it first appears
        self.latest: dict[tuple[int, bool], tuple[int, str, Loc]] = {}  # (rank, contract form?) -> the latest such
        self.lib = TensorLib(interp)
        self.lib.install()
        self.install_builtins()
        self.load_contract_macros()

    # -- setup -----------------------------------------------------------------------------------
    def load_contract_macros(self) -> None:
        text = resources.files("sexpgpu.compile").joinpath("contract.lisp").read_text(encoding="utf-8")
        self.interp.load_system_text(text)
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

    def form_loc(self, name: str) -> Optional[Loc]:
        """Where the file's NAME form is, else its last contract form."""
        for form, loc in self.seen:
            if form == name:
                return loc
        return self.seen[-1][1] if self.seen else None

    def at(self, loc: Loc, code: str, message: str) -> Exception:
        err = lisp_error(code, message, "PROGRAM-ERROR")
        err.loc = loc
        return err

    # -- builtins --------------------------------------------------------------------------------
    def install_builtins(self) -> None:
        reg = Registry(self.interp)
        for name in [
            "%defknob", "%defvariant", "%defsweep", "%model-scope", "%defparam", "%defpart", "%forward", "%call-model",
            "%repeat", "%defpart-toplevel", "%tie", "%defloader", "%field", "%defobjective", "%defevaluate", "%metric",
            "%make-optimizer", "%defgroups", "%defrun", "schedule", "ctx", "%repeat-list", "%models", "%defeval", "%deftarget",
            "%shadow", "training-p", "part-param", "%defcurriculum", "%defdiagnostic", "%diagnostic", "run-steps",
            "%defmodel-constructor",
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

    def init_fn(self, kind: str) -> Callable[..., Any]:
        def make(*args: Any) -> Any:
            keys = parse_keys(kind, args, {"MEAN", "STD", "LOW", "HIGH", "GAIN"}, 1)
            values = {k.lower(): float(v) for k, v in keys.items()}
            return InitSpec(kind=kind, **values)

        return make

    def source_fn(self, kind: str) -> Callable[..., Any]:
        def make(*args: Any) -> Any:
            options: dict[str, Any] = {}
            rest = list(args)
            url = None
            if kind == "synthetic":
                if not rest or type(rest[0]) is not Symbol:
                    raise type_error("synthetic", 1, "a generator name such as :spirals :moons :blobs :linear", rest[0] if rest else NIL)
                options["name"] = rest.pop(0).name.lower()
            else:
                if not rest or type(rest[0]) is not str:
                    raise type_error(kind, 1, "a path or URL string", rest[0] if rest else NIL)
                url = rest.pop(0)
            for key, value in zip(rest[::2], rest[1::2]):
                if type(key) is not Symbol or not key.is_keyword:
                    raise type_error(kind, 2, "keyword options", key)
                options[key.name.lower()] = as_data(value)
            return SourceValue(SourceRecord(kind=kind, url=url, options=options))

        return make

    # -- knobs -----------------------------------------------------------------------------------------
    def b_defknob(self, name: Any, default: Any, *args: Any) -> Any:
        keys = parse_keys("defknob", args, {"TYPE", "RANGE", "CHOICES", "DOC"}, 3)
        knob = name.name.lower()
        value = default
        raw = self.selection.set.get(knob)
        if raw is not None:
            value = self.parse_knob_value(knob, raw, default)
        elif knob in self.overrides:
            value = self.from_literal(self.overrides[knob])
            if type(default) is float and type(value) is int:
                value = float(value)
        self.check_knob(knob, value, default, keys)
        doc = keys.get("DOC", NIL)
        declared = keys.get("TYPE", NIL)
        kind = declared.name.lower() if type(declared) is Symbol and declared is not NIL else None
        self.check_knob_type(knob, value, kind)
        self.knobs[knob] = KnobSpec(name=knob, default=as_data(default), value=as_data(value), type=kind, doc=doc if type(doc) is str else None)
        # a knob is a global value, not a special variable: a parameter or let of the same
        # name (an optimizer's &key lr, say) binds lexically, as the reader of the file expects
        self.interp.values[name] = value
        return name

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

    def check_knob_type(self, knob: str, value: Any, kind: Optional[str]) -> None:
        if kind is None:
            return
        check = self.KNOB_TYPES.get(kind)
        if check is None:
            raise lisp_error("C004", f"knob {knob}: :type {kind} is not one of {', '.join(':' + k for k in self.KNOB_TYPES)}", "TYPE-ERROR")
        if not check(value):
            raise lisp_error("C004", f"knob {knob}: {short(value)} is not of :type {kind}", "TYPE-ERROR")

    def check_knob(self, knob: str, value: Any, default: Any, keys: dict[str, Any]) -> None:
        if type(default) in (int, float) and type(value) not in (int, float):
            raise lisp_error("C004", f"knob {knob}: {short(value)} is not a number like its default {short(default)}", "TYPE-ERROR")
        if type(default) is int and type(value) is float:
            raise lisp_error("C004", f"knob {knob}: {short(value)} is not an integer like its default {default}", "TYPE-ERROR")
        choices = keys.get("CHOICES", NIL)
        if choices is not NIL and not any(_same(value, c) for c in list_items("defknob", 5, choices)):
            raise lisp_error("C004", f"knob {knob}: {short(value)} is not one of {short(choices)}", "TYPE-ERROR")
        bounds = keys.get("RANGE", NIL)
        if bounds is not NIL:
            lo, hi = list_items("defknob", 4, bounds)[:2]
            if not lo <= value <= hi:
                raise lisp_error("C004", f"knob {knob}: {short(value)} is outside its range [{lo}, {hi}]", "TYPE-ERROR")

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
        items = list_items(what, 2, settings)
        out = {}
        for key, value in zip(items[::2], items[1::2]):
            knob = key.name.lower()
            if knob in options:
                continue
            if knob not in self.knobs:
                raise lisp_error("C004", f"{what} {name.name.lower()}: no knob named {knob} (declared: {', '.join(self.knobs) or 'none'}); declare it with defknob first", "PROGRAM-ERROR")
            out[knob] = value
        return out

    def b_defvariant(self, name: Any, settings: Any) -> Any:
        self.variants[name.name.lower()] = self.check_settings("defvariant", name, settings, ())
        return name

    def b_defsweep(self, name: Any, settings: Any) -> Any:
        self.sweeps[name.name.lower()] = self.check_settings("defsweep", name, settings, ("zip", "variant"))
        return name

    # -- models ---------------------------------------------------------------------------------------
    def current_path(self, name: str) -> str:
        return ".".join(self.path + [name])

    def b_model_scope(self, type_name: Any, thunk: Any) -> Any:
        if not self.path:
            raise lisp_error("C008", f"model {short(type_name)} must be created inside a defpart so its parameters get paths", "PROGRAM-ERROR")
        model = Model(type_name=type_name.name.lower(), path=".".join(self.path))
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

    def b_defparam(self, name: Any, shape: Any, *args: Any) -> Any:
        model = self.current_model("defparam")
        keys = parse_keys("defparam", args, {"INIT", "WHEN", "DTYPE"}, 3)
        if keys.get("WHEN", T) is NIL:
            return NIL
        dims = self.lib.shape_arg("defparam", 2, shape)
        init = keys.get("INIT", NIL)
        spec = self.init_spec(init, len(dims))
        dtype = self.lib.dtype_arg("defparam", 5, keys["DTYPE"]) if "DTYPE" in keys else DType.f32
        param = Param(path=self.current_path(name.name.lower()), shape=tuple(dims), dtype=dtype, init=spec)
        model.params[name.name.lower()] = param
        return param

    def init_spec(self, init: Any, rank: int) -> InitSpec:
        if isinstance(init, InitSpec):
            return init
        if init is NIL:
            return InitSpec(kind="zeros") if rank <= 1 else InitSpec(kind="kaiming")
        if type(init) is Symbol and init.is_keyword and init.name in ("ZEROS", "ONES"):
            return InitSpec(kind=init.name.lower())
        if type(init) in (int, float):
            return InitSpec(kind="constant", value=float(init))
        raise type_error("defparam", 3, "an initializer (:zeros :ones (normal :std s) (uniform ...) (xavier) (kaiming))", init)

    def b_defpart(self, name: Any, thunk: Any) -> Any:
        model = self.current_model("defpart")
        self.path.append(name.name.lower())
        try:
            part = self.interp.call(thunk)
        finally:
            self.path.pop()
        model.parts[name.name.lower()] = part
        return part.as_list() if isinstance(part, ModelList) else part

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
        if isinstance(part, ModelList):
            return part.as_list()
        if part is NIL or type(part) is Cons:
            return part
        raise type_error("models", 1, "a repeated part", part)

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
        key = name.name.lower()
        if key in self.parts:
            raise lisp_error("C003", f"defpart {key} is defined twice", "PROGRAM-ERROR")
        self.path.append(key)
        try:
            part = self.interp.call(thunk)
        finally:
            self.path.pop()
        if not isinstance(part, (Model, ModelList)):
            raise lisp_error("C008", f"defpart {key}: {short(part)} is not a model; call a defmodel constructor", "PROGRAM-ERROR")
        self.parts[key] = part
        self.interp.values[name] = part.as_list() if isinstance(part, ModelList) else part
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
        self.ties[target.path] = (source.path, transpose is not NIL)
        return target

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
        keys = parse_keys("defloader", args, {"SOURCE", "PREPARE", "FIELDS", "BATCH", "SHUFFLE", "PART", "STAGES"}, 2)
        key = name.name.lower()
        source = keys.get("SOURCE", NIL)
        if not isinstance(source, SourceValue):
            raise lisp_error("C008", f"defloader {key}: :source needs a source such as (synthetic :spirals ...) or (npz \"file.npz\")", "PROGRAM-ERROR")
        batch = keys.get("BATCH", NIL)
        if type(batch) is not int or batch <= 0:
            raise lisp_error("C008", f"defloader {key}: :batch needs a positive integer, got {short(batch)}", "PROGRAM-ERROR")
        fields = []
        for spec in list_items("defloader", 4, keys.get("FIELDS", NIL)):
            fname, dtype, shape = list_items("defloader", 4, spec)
            fields.append(FieldRecord(name=fname.name.lower(), dtype=self.lib.dtype_arg("defloader", 4, dtype).value, shape=tuple(self.lib.shape_arg("defloader", 4, shape))))
        if not fields:
            raise lisp_error("C008", f"defloader {key}: :fields needs at least one (name dtype (shape...))", "PROGRAM-ERROR")
        prepare = []
        for step in list_items("defloader", 3, keys.get("PREPARE", NIL)):
            items = list_items("defloader", 3, step)
            options = {k.name.lower(): as_data(v) for k, v in zip(items[1::2], items[2::2])}
            prepare.append(PrepareRecord(kind=items[0].name.lower(), options=options))
        part = keys.get("PART", NIL)
        stages = []
        for spec in list_items("defloader", 7, keys.get("STAGES", NIL)):
            items = list_items("defloader", 7, spec)
            opts = parse_keys(f"defloader {key} stage", tuple(items[1:]), {"BATCH", "LENGTH"}, 2)
            values = {k.lower(): self.interp.call(self.interp.functions[self.interp.sym("EVAL")], v) if type(v) is Cons else v for k, v in opts.items()}
            for k, v in values.items():
                if type(v) is not int or v <= 0:
                    raise lisp_error("C008", f"defloader {key}: stage {short(items[0])} :{k} needs a positive integer, got {short(v)}", "PROGRAM-ERROR")
            stages.append(StageRecord(name=items[0].name.lower(), **values))
        self.loaders[key] = LoaderRecord(
            name=key,
            source=source.record,
            prepare=prepare,
            fields=fields,
            batch=batch,
            shuffle=keys.get("SHUFFLE", NIL) is not NIL,
            part=None if part is NIL else part.name.lower(),
            base_dir=str(self.base_dir),
            stages=stages,
        )
        return name

    def b_field(self, batch: Any, name: Any) -> Any:
        if not isinstance(batch, Batch):
            raise type_error("field", 1, "a batch (the argument of defobjective)", batch)
        value = batch.fields.get(name.name.lower())
        if value is None:
            known = ", ".join(batch.fields)
            raise lisp_error("C008", f"field: loader {batch.loader} has no field {name.name.lower()}; its fields are: {known}", "PROGRAM-ERROR")
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
        for clause in list_items("defcurriculum", 1, clauses):
            kind, test, specs = list_items("defcurriculum", 1, clause)
            pairs = []
            for spec in list_items("defcurriculum", 1, specs):
                loader, stage = list_items("defcurriculum", 1, spec)
                lname, sname = loader.name.lower(), stage.name.lower()
                record = self.loaders.get(lname)
                if record is None or not any(s.name == sname for s in record.stages):
                    known = ", ".join(s.name for s in record.stages) if record else "no such loader"
                    raise lisp_error("C008", f"defcurriculum: loader {lname} has no stage {sname} ({known})", "PROGRAM-ERROR")
                if lname != "train":
                    raise lisp_error("C008", f"defcurriculum: only the train loader changes stage during a run (got {lname})", "PROGRAM-ERROR")
                pairs.append((lname, sname))
            rules.append((kind.name.lower(), test, pairs))
        self.curriculum = rules
        return NIL

    def b_defeval(self, name: Any, *args: Any) -> Any:
        keys = parse_keys("defeval", args, {"LOADER", "EVERY", "AT", "OVERLAP"}, 2)
        key = name.name.lower()
        loader = keys.get("LOADER", name)
        every = keys.get("EVERY", NIL)
        at = keys.get("AT", NIL)
        if every is not NIL and (type(every) is not int or every <= 0):
            raise lisp_error("C008", f"defeval {key}: :every needs a positive integer, got {short(every)}", "PROGRAM-ERROR")
        if at is not NIL and not (type(at) is Symbol and at.name == "END"):
            raise lisp_error("C008", f"defeval {key}: :at takes :end, got {short(at)}", "PROGRAM-ERROR")
        if every is NIL and at is NIL:
            raise lisp_error("C008", f"defeval {key}: say when it runs, with :every N or :at :end", "PROGRAM-ERROR")
        if any(e.name == key for e in self.evals):
            raise lisp_error("C003", f"defeval {key} is defined twice", "PROGRAM-ERROR")
        self.evals.append(EvalSpec(name=key, loader=loader.name.lower(), every=every if type(every) is int else None, at_end=at is not NIL, overlap=keys.get("OVERLAP", NIL) is not NIL))
        return name

    def b_deftarget(self, name: Any, metric: Any, test: Any, value: Any) -> Any:
        if not any(e.name == name.name.lower() for e in self.evals):
            raise lisp_error("C008", f"deftarget: no defeval named {name.name.lower()} (evals: {', '.join(e.name for e in self.evals) or 'none'})", "PROGRAM-ERROR")
        if type(test) is not Symbol or test.name not in ("<=", ">=", "<", ">"):
            raise lisp_error("C008", f"deftarget: the test is one of :<= :>= :< :>, got {short(test)}", "PROGRAM-ERROR")
        if type(value) not in (int, float):
            raise lisp_error("C008", f"deftarget: the threshold must be a number, got {short(value)}", "PROGRAM-ERROR")
        self.targets.append(TargetSpec(eval=name.name.lower(), metric=metric.name.lower(), test=test.name, value=float(value)))
        return name

    def b_metric(self, name: Any, value: Any) -> Any:
        tracer = self.lib.tracer("metric")
        staged = self.lib.staged("metric", 2, value)
        if staged.type.rank != 0:
            staged = self.lib.op("metric", "mean", self.lib.cast_to("metric", staged, DType.f32) if not staged.type.dtype.is_float else staged)
        tracer.metrics[name.name.lower()] = staged.id
        return value

    def b_make_optimizer(self, name: Any, states: Any, update: Any) -> Any:
        slots = []
        for spec in list_items("defoptimizer", 2, states):
            items = list_items("defstate", 1, spec)
            keys = parse_keys("defstate", tuple(items[1:]), {"INIT"}, 2)
            init = keys.get("INIT", NIL)
            slots.append((items[0].name.lower(), self.init_spec(init, 0) if init is not NIL else InitSpec(kind="zeros")))
        return Optimizer(name=name.name.lower(), states=slots, update=update)

    def b_defgroups(self, groups: Any, *args: Any) -> Any:
        keys = parse_keys("defgroups", args, {"CLIP"}, 2)
        clip = keys.get("CLIP", NIL)
        self.clip = None if clip is NIL else float(clip)
        for spec in list_items("defgroups", 1, groups):
            gname, selector, opt = list_items("defgroups", 1, spec)
            if type(selector) is not str:
                raise lisp_error("C008", f"defgroups {short(gname)}: the selector must be a glob string like \"**\" or \"model.*.w\"", "PROGRAM-ERROR")
            if type(opt) is Symbol and opt.name == "FROZEN":
                optimizer = None
            elif isinstance(opt, Optimizer):
                optimizer = opt
            else:
                raise lisp_error("C008", f"defgroups {short(gname)}: {short(opt)} is neither an optimizer nor :frozen", "PROGRAM-ERROR")
            self.groups.append(Group(name=gname.name.lower(), selector=selector, optimizer=optimizer))
        return NIL

    def b_defrun(self, *args: Any) -> Any:
        keys = parse_keys("defrun", args, {"STEPS", "SEED", "LOG-EVERY", "META", "MICROBATCHES", "PRECISION", "CHECKPOINT", "FINITE-GUARD", "DIAGNOSTICS"}, 1)
        steps = keys.get("STEPS", NIL)
        if type(steps) is not int or steps <= 0:
            raise lisp_error("C008", f"defrun: :steps needs a positive integer, got {short(steps)}", "PROGRAM-ERROR")
        seed = keys.get("SEED", 0)
        if type(seed) is not int or seed < 0:
            raise lisp_error("C008", f"defrun: :seed needs a non-negative integer, got {short(seed)}", "PROGRAM-ERROR")
        log_every = keys.get("LOG-EVERY", 10)
        if type(log_every) is not int or log_every <= 0:
            raise lisp_error("C008", f"defrun: :log-every needs a positive integer, got {short(log_every)}", "PROGRAM-ERROR")
        micro = keys.get("MICROBATCHES", 1)
        if type(micro) is not int or micro <= 0:
            raise lisp_error("C008", f"defrun: :microbatches needs a positive integer, got {short(micro)}", "PROGRAM-ERROR")
        precision = keys.get("PRECISION", self.interp.kw("f32"))
        if not (type(precision) is Symbol and precision.name in ("F32", "BF16")):
            raise lisp_error("C008", f"defrun: :precision is :f32 or :bf16, got {short(precision)}", "PROGRAM-ERROR")
        diagnostics = self.diagnostics_option(keys.get("DIAGNOSTICS", NIL))
        checkpoint = self.plist_option("checkpoint", keys.get("CHECKPOINT", NIL), {"EVERY": None, "KEEP": 3})
        guard = self.plist_option("finite-guard", keys.get("FINITE-GUARD", NIL), {"SKIP": 0, "ROLLBACK": None, "LR-SCALE": None})
        meta = as_data(keys.get("META", NIL)) or {}
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

    def plist_option(self, name: str, option: Any, defaults: dict[str, Any]) -> Optional[dict[str, Any]]:
        """A defrun option written as a plist of numbers, e.g. :checkpoint (:every 500 :keep 3)."""
        if option is NIL:
            return None
        keys = parse_keys(f"defrun :{name}", tuple(list_items("defrun", 1, option)), set(defaults), 1)
        out = {}
        for key, default in defaults.items():
            value = keys.get(key, default)
            if value is T:
                value = True
            if value is not None and value is not True and (type(value) not in (int, float) or value < 0):
                raise lisp_error("C008", f"defrun :{name} :{key.lower()} needs a non-negative number, got {short(value)}", "PROGRAM-ERROR")
            out[key.lower()] = value
        return out

    def diagnostics_option(self, option: Any) -> Optional[DiagnosticsSpec]:
        """:diagnostics (:every N :select ("glob" ...)) from defrun."""
        if option is NIL:
            return None
        keys = parse_keys("defrun :diagnostics", tuple(list_items("defrun", 1, option)), {"EVERY", "SELECT"}, 1)
        every = keys.get("EVERY", 100)
        if type(every) is not int or every <= 0:
            raise lisp_error("C008", f"defrun :diagnostics :every needs a positive integer, got {short(every)}", "PROGRAM-ERROR")
        select = keys.get("SELECT", NIL)
        globs = [select] if type(select) is str else list_items("defrun :diagnostics :select", 1, select)
        if not globs or any(type(g) is not str for g in globs):
            raise lisp_error("C008", 'defrun :diagnostics :select needs glob strings such as ("grad-norm/**" "act/**/rms")', "PROGRAM-ERROR")
        return DiagnosticsSpec(every=every, select=globs)

    def b_defdiagnostic(self, name: Any, reducer: Any) -> Any:
        self.reducers[name.name.lower()] = reducer
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
            value: Any = float(lr)
        elif type(lr) in (Closure, Builtin):
            tracer = self.lib.tracer("schedule")
            value = self.interp.call(lr, Staged(tracer, tracer.ctx_input("step")))
        else:
            raise type_error("schedule", 1, "a learning rate: a number or a schedule", lr)
        tracer = self.lib.tracer("schedule")
        if self.run is not None and self.run.finite_guard.lr_scale is not None:
            # a finite-guard rollback scales the learning rate at run time
            value = self.lib.mul(value, Staged(tracer, tracer.ctx_input("lr-scale")))
        if tracer.group is not None:
            staged = self.lib.staged("schedule", 1, value)
            tracer.metrics[f"lr:{tracer.group}"] = staged.id
        return value

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
        out: list[Param] = []
        for part in self.parts.values():
            out.extend(part.all_params())
        return out

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


def _same(a: Any, b: Any) -> bool:
    return a == b if type(a) is type(b) else False
