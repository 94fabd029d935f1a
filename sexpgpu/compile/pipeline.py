"""The one way to compile a file: read and evaluate it with the contract forms installed,
check the contract, stage the objective, differentiate it, lower the optimizer groups, and
check every program. The CLI, bundles and workers all call compile_file."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from ..ir.check import IRError, check_program
from ..ir.dtypes import DType
from ..ir.graph import Module, Program, TensorType, prune, shape_size
from ..ir.selectors import selects
from ..lisp.conditions import LispError, lisp_error
from ..lisp.diagnostics import Diagnostic
from ..lisp.evaluator import Limits
from ..lisp.program import Program as LispProgram
from ..lisp.program import display_path, guarded, has_errors, load_file
from ..lisp.types import NIL, MultipleValues
from .autodiff import backward
from .compiler import Compiler
from .selection import overrides, prescan
from ..ir.experiment import CheckpointPolicy, CurriculumSpec, DiagnosticsSpec, EvalSpec, FiniteGuard, Experiment, GroupSpec, RunSpec, Selection, StateSpec
from .models import Batch, Ctx
from .tensors import Staged, Tracer


# the contract form a whole-file problem is reported at
BLAME = {"C001": "DEFRUN", "C005": "DEFGROUPS", "C006": "DEFOBJECTIVE", "C007": "DEFGROUPS", "C008": "DEFEVAL"}


@dataclass
class CompileResult:
    diagnostics: list[Diagnostic] = field(default_factory=list)
    experiment: Optional[Experiment] = None
    program: Optional[LispProgram] = None
    compiler: Optional[Compiler] = None

    @property
    def ok(self) -> bool:
        return not has_errors(self.diagnostics)


def compile_file(path: Path, selection: Optional[Selection] = None, limits: Optional[Limits] = None, output: Any = None, world: int = 1) -> CompileResult:
    """Read, evaluate, stage and check PATH. WORLD > 1 also stages each data-parallel rank's
    train programs at batch/WORLD (the experiment's identity stays the single-device IR's)."""
    selection = selection or Selection()
    holder: dict[str, Compiler] = {}
    try:
        declared = prescan(path)
        imposed = overrides(declared, selection)
        sweep = declared.sweeps.get(selection.sweep or "")
        if sweep is not None and sweep.variant and selection.variant is None:
            selection = selection.model_copy(update={"variant": sweep.variant})
    except LispError as exc:
        from ..lisp.program import diagnostic_from

        return CompileResult(diagnostics=[diagnostic_from(exc)])

    def setup(program: LispProgram) -> None:
        compiler = Compiler(program.interp, selection, path.resolve().parent, imposed)
        compiler.declared = declared  # type: ignore[attr-defined]
        compiler.watch(program.table)
        holder["compiler"] = compiler

    program, diagnostics = load_file(path, limits, output=output, setup=setup)
    result = CompileResult(diagnostics=list(diagnostics), program=program, compiler=holder.get("compiler"))
    compiler = result.compiler
    if program is None or compiler is None or not result.ok:
        return result
    unknown = sorted(set(selection.set) - set(compiler.knobs))
    if unknown:
        result.diagnostics.append(Diagnostic(code="C004", message=f"--set {unknown[0]}: no knob named {unknown[0]} (declared: {', '.join(compiler.knobs) or 'none'})"))
        return result
    if not compiler.is_run_file:
        return result
    def build() -> Experiment:
        try:
            return build_experiment(path, program, compiler, selection, world)
        except LispError as exc:
            if exc.loc is None:
                exc.loc = compiler.form_loc(BLAME.get(exc.condition.code, "DEFRUN"))
            raise

    experiment, problem = guarded(build)
    for message in compiler.warnings:
        result.diagnostics.append(Diagnostic.at("W002", message, compiler.form_loc("DEFGROUPS"), severity="warning"))
    if problem is not None:
        result.diagnostics.append(problem)
    result.experiment = experiment
    return result


def new_world(limits: Optional[Limits] = None, output: Any = None) -> LispProgram:
    """A fresh world with no file, with the tensor builtins and contract forms installed
    (what `sexpgpu eval` without a file evaluates in)."""
    from ..lisp.program import new_program

    program = new_program(None, limits, output=output)
    Compiler(program.interp, Selection(), Path.cwd())
    return program


def build_experiment(path: Path, program: LispProgram, compiler: Compiler, selection: Selection, world: int = 1) -> Experiment:
    check_presence(compiler)
    interp = program.interp
    compiler.assign_groups()
    train_loader = compiler.loaders["train"]
    compiler.lib.precision = DType(compiler.run["precision"]) if compiler.run else DType.f32
    forward, train, metrics, trainable = stage_train(compiler, train_loader)
    diagnostics = compiler.diagnostic_program  # type: ignore[attr-defined]
    compiler.lib.precision = DType.f32  # master weights, gradients and optimizer state are f32
    update = stage_update(compiler, trainable)
    compiler.lib.precision = DType(compiler.run["precision"])
    programs = {"forward": forward, "train": train, "update": update}
    if diagnostics is not None:
        programs["train:diagnostics"] = diagnostics
    for stage in train_loader.stages:
        try:
            loader = train_loader.staged(stage.name)
        except ValueError as exc:
            raise lisp_error("C008", str(exc), "PROGRAM-ERROR") from None
        _, staged, _, _ = stage_train(compiler, loader)
        staged.name = f"train@{stage.name}"
        programs[staged.name] = staged
        add_stage_diagnostics(compiler, programs, stage.name)
    rank_programs = stage_rank_programs(compiler, train_loader, world) if world > 1 else {}
    curriculum = stage_curriculum(compiler, programs)
    evals = stage_evals(compiler, programs)
    programs = {name: prune(prog) for name, prog in programs.items()}
    module = Module(programs=programs)
    for prog in module.programs.values():
        try:
            check_program(prog)
        except IRError as exc:
            raise lisp_error("X001", f"internal error: the IR does not check: {exc}", "ERROR") from None
    sources = b"".join(f.read_bytes() for f in program.files)
    assert compiler.run is not None
    groups = [
        GroupSpec(
            name=g.name,
            selector=g.selector,
            optimizer=g.optimizer.name if g.optimizer else None,
            params=g.params,
            states=[StateSpec(name=n, init=i) for n, i in (g.optimizer.states if g.optimizer else [])],
        )
        for g in compiler.groups
    ]
    del interp
    return Experiment(
        file=display_path(path),
        file_stem=path.stem,
        selection=selection,
        knobs=list(compiler.knobs.values()),
        params=[p.spec() for p in compiler.all_params()],
        loaders=dict(compiler.loaders),
        groups=groups,
        run=RunSpec(
            steps=compiler.run["steps"], seed=compiler.run["seed"], log_every=compiler.run["log_every"], microbatches=compiler.run["microbatches"],
            clip=compiler.clip, meta=compiler.run["meta"], precision=compiler.run["precision"],
            checkpoint=CheckpointPolicy(**(compiler.run["checkpoint"] or {})), finite_guard=FiniteGuard(**(compiler.run["finite_guard"] or {})),
            diagnostics=DiagnosticsSpec(**compiler.run["diagnostics"]) if compiler.run.get("diagnostics") else None,
        ),
        metrics=metrics,
        evals=evals,
        curriculum=curriculum,
        ties={k: v[0] + (" (transposed)" if v[1] else "") for k, v in compiler.ties.items()},
        targets=list(compiler.targets),
        module=module,
        rank_programs=rank_programs,
        world=world,
        ir_hash=module.hash(),
        source_hash=hashlib.sha256(sources).hexdigest(),
    )


def stage_rank_programs(compiler: Compiler, train_loader: Any, world: int) -> dict[str, Program]:
    """Each data-parallel rank's train programs (and stages, and the diagnostics program),
    traced at the rank's share of the batch: the global batch stays what the file says."""
    programs: dict[str, Program] = {}
    for stage in [None, *(s.name for s in train_loader.stages)]:
        loader = train_loader if stage is None else train_loader.staged(stage)
        if loader.batch % world:
            where = "" if stage is None else f" (stage {stage})"
            err = lisp_error(
                "C008", f"defloader train{where}: :batch {loader.batch} does not split over {world} data-parallel ranks; "
                f"use a number of devices that divides {loader.batch}, or a batch that {world} divides", "PROGRAM-ERROR")
            err.loc = compiler.form_loc("DEFLOADER")
            raise err
        _, train, _, _ = stage_train(compiler, loader.model_copy(update={"batch": loader.batch // world}))
        train.name = "train" if stage is None else f"train@{stage}"
        programs[train.name] = prune(train)
        add_stage_diagnostics(compiler, programs, stage, prune)
    for prog in programs.values():
        check_program(prog)
    return programs


def add_stage_diagnostics(compiler: Compiler, programs: dict[str, Program], stage: Optional[str], finish: Callable[[Program], Program] = lambda p: p) -> None:
    """The diagnostics program of the train program just staged (for STAGE, or the base one),
    as `train:diagnostics` or `train:diagnostics@STAGE`: sampled steps of every stage compute
    the selected IR diagnostics."""
    diagnostics = compiler.diagnostic_program  # type: ignore[attr-defined]
    if diagnostics is not None:
        diagnostics.name = "train:diagnostics" if stage is None else f"train:diagnostics@{stage}"
        programs[diagnostics.name] = finish(diagnostics)


def check_presence(compiler: Compiler) -> None:
    seen = {name for name, _ in compiler.seen}
    for form, what in [("DEFLOADER", "at least one defloader, named train"), ("DEFPART", "at least one defpart"), ("DEFOBJECTIVE", "exactly one defobjective"), ("DEFGROUPS", "exactly one defgroups"), ("DEFRUN", "exactly one defrun, last")]:
        if form not in seen:
            raise lisp_error("C001", f"the file has no {form.lower()}: a run file needs {what}", "PROGRAM-ERROR")
    if "train" not in compiler.loaders:
        raise lisp_error("C001", f"no loader is named train (loaders: {', '.join(compiler.loaders)}); name the training loader train", "PROGRAM-ERROR")


def data_inputs(tracer: Tracer, loader: Any, precision: DType = DType.f32) -> Batch:
    fields = {}
    for f in loader.fields:
        nid = tracer.builder.input(f"data.{f.name}", "data", TensorType(dtype=DType(f.dtype), shape=(loader.batch, *f.shape)))
        if precision == DType.bf16 and DType(f.dtype) == DType.f32:
            nid = tracer.builder.op("cast", nid, dtype="bf16")
        fields[f.name] = Staged(tracer, nid)
    return Batch(loader=loader.name, fields=fields)


def stage_train(compiler: Compiler, loader: Any) -> tuple[Program, Program, list[str], list[str]]:
    assert compiler.run is not None
    tracer = Tracer("train", seed=int(compiler.run["seed"]), training=True)
    batch = data_inputs(tracer, loader, compiler.lib.precision)
    compiler.tracer = tracer
    try:
        loss = compiler.interp.call(compiler.objective, batch)
        if type(loss) is MultipleValues:
            loss = loss[0]
        if type(loss) is Staged and loss.type.dtype in (DType.bf16, DType.f16):
            loss = compiler.lib.cast_to("defobjective", loss, DType.f32)
    finally:
        compiler.tracer = None
    if type(loss) is not Staged or loss.type.rank != 0 or loss.type.dtype != DType.f32:
        what = str(loss.type) if type(loss) is Staged else "a Lisp value"
        raise lisp_error("C006", f"defobjective must return one f32 scalar loss, got {what}", "TYPE-ERROR")
    builder = tracer.builder
    outputs = {"loss": loss.id, **{f"metric:{k}": v for k, v in tracer.metrics.items()}}
    forward = builder.program(outputs)
    forward.name = "forward"
    frozen = {p for g in compiler.groups if g.optimizer is None for p in g.params}
    all_paths = [p.path for p in compiler.all_params()]
    trainable = [p for p in all_paths if p not in frozen]
    missing = [p for p in trainable if p not in tracer.params]
    if missing:
        raise lisp_error("C007", f"parameter {missing[0]} is not used by the objective, so it gets no gradient; use it or freeze it in defgroups", "PROGRAM-ERROR")
    grads = backward(builder, loss.id, [tracer.params[p] for p in trainable])
    for p in trainable:
        if grads[tracer.params[p]] is None:
            raise lisp_error("C007", f"parameter {p} gets no gradient from the loss (it only reaches it through non-differentiable ops); freeze it in defgroups", "PROGRAM-ERROR")
    for path in all_paths:
        if path not in tracer.params:
            builder.input(path, "param", TensorType(dtype=DType.f32, shape=next(p.shape for p in compiler.all_params() if p.path == path)))
    train_outputs = dict(outputs)
    for p in trainable:
        train_outputs[f"grad:{p}"] = grads[tracer.params[p]]  # type: ignore[assignment]
    train = builder.program(train_outputs)
    compiler.diagnostic_program = diagnostic_program(compiler, tracer, train_outputs)  # type: ignore[attr-defined]
    return forward, train, list(tracer.metrics), trainable


ACT_REDUCERS = ("mean", "rms", "max-abs", "frac-zero")


def diagnostic_program(compiler: Compiler, tracer: Tracer, outputs: dict[str, int]) -> Optional[Program]:
    """The train program plus the selected IR diagnostics (act/PATH/..., defdiagnostic
    taps) as extra outputs; None when none is selected, so unselected diagnostics leave
    the IR, and its hash, unchanged."""
    assert compiler.run is not None
    option = compiler.run.get("diagnostics")
    if option is None:
        return None

    def selected(name: str) -> bool:
        return selects(option["select"], name)

    lib = compiler.lib
    extra: dict[str, int] = {}
    compiler.tracer = tracer
    try:
        for path, nid in tracer.activations.items():
            x = Staged(tracer, nid)
            if not x.type.dtype.is_float:
                continue
            for reducer in ACT_REDUCERS:
                name = f"act/{path}/{reducer}"
                if selected(name):
                    extra[f"diag:{name}"] = act_reduce(lib, x, reducer).id
        for name, reducer, nid in tracer.taps:
            if selected(name):
                value = lib.staged("diagnostic", 1, compiler.interp.call(compiler.reducers[reducer], Staged(tracer, nid)))
                if value.type.rank != 0:
                    value = lib.op("diagnostic", "mean", lib.cast_to("diagnostic", value, DType.f32))
                extra[f"diag:{name}"] = value.id
    finally:
        compiler.tracer = None
    option["ir_names"] = [k[5:] for k in extra]
    if not extra:
        return None
    program = tracer.builder.program({**outputs, **extra})
    program.name = "train:diagnostics"
    return program


def act_reduce(lib: Any, x: Staged, reducer: str) -> Staged:
    if reducer == "mean":
        return lib.op("act", "mean", x)
    if reducer == "rms":
        return lib.op("act", "sqrt", lib.op("act", "mean", lib.mul(x, x)))
    if reducer == "max-abs":
        return lib.op("act", "max", lib.op("act", "abs", x))
    zero = lib.op("act", "eq", x, lib.staged("act", 1, 0.0, x.type))
    return lib.op("act", "mean", lib.cast_to("act", zero, x.type.dtype))


def stage_curriculum(compiler: Compiler, programs: dict[str, Program]) -> Optional[CurriculumSpec]:
    """defcurriculum's tests, staged over ctx into one program with a boolean per rule."""
    if compiler.curriculum is None:
        return None
    assert compiler.run is not None
    tracer = Tracer("curriculum", seed=int(compiler.run["seed"]))
    tracer.ctx_allowed = True  # type: ignore[attr-defined]
    spec = CurriculumSpec()
    outputs: dict[str, int] = {}
    compiler.tracer = tracer
    try:
        for kind, test, pairs in compiler.curriculum:
            if kind == "start":
                spec.start.update(dict(pairs))
                continue
            value = compiler.interp.call(test)
            if type(value) is not Staged:
                value = compiler.lib.staged("defcurriculum", 1, 1.0 if value is not NIL else 0.0)
                value = compiler.lib.op("defcurriculum", "gt", value, compiler.lib.staged("defcurriculum", 1, 0.0))
            if value.type.dtype != DType.bool or value.type.rank != 0:
                raise lisp_error("T001", f"defcurriculum: a test must be a boolean scalar, got {value.type}", "TYPE-ERROR")
            outputs[f"rule:{len(spec.rules)}"] = value.id
            spec.rules.append(dict(pairs))
    finally:
        compiler.tracer = None
    programs["curriculum"] = tracer.builder.program(outputs)
    return spec


def stage_evals(compiler: Compiler, programs: dict[str, Program]) -> list[EvalSpec]:
    """Each defeval's program, traced from defevaluate at the loader's batch and at batch 1:
    full batches run the first, the examples of the last partial batch the second, so the
    metrics are exact example-weighted means over the whole loader."""
    if compiler.evals and compiler.evaluate is None:
        raise lisp_error("C001", "defeval needs a defevaluate (the function that computes the eval metrics)", "PROGRAM-ERROR")
    out = []
    for spec in compiler.evals:
        loader = compiler.loaders.get(spec.loader)
        if loader is None:
            raise lisp_error("C008", f"defeval {spec.name}: no loader named {spec.loader} (loaders: {', '.join(compiler.loaders)})", "PROGRAM-ERROR")
        names: list[str] = []
        for batch, key in ((loader.batch, f"eval:{spec.name}"), (1, f"eval:{spec.name}:1")):
            program, names = stage_evaluate(compiler, loader.model_copy(update={"batch": batch}), key)
            programs[key] = program
        if not names:
            raise lisp_error("C008", "defevaluate records no metric: use (metric name value) in its body", "PROGRAM-ERROR")
        out.append(spec.model_copy(update={"metrics": names}))
    for target in compiler.targets:
        spec = next(e for e in out if e.name == target.eval)
        if target.metric not in spec.metrics:
            raise lisp_error("C008", f"deftarget {target.eval} {target.metric}: defevaluate records no metric {target.metric} (it records: {', '.join(spec.metrics)})", "PROGRAM-ERROR")
    return out


def stage_evaluate(compiler: Compiler, loader: Any, name: str) -> tuple[Program, list[str]]:
    assert compiler.run is not None
    tracer = Tracer(name, seed=int(compiler.run["seed"]))
    batch = data_inputs(tracer, loader, compiler.lib.precision)
    compiler.tracer = tracer
    try:
        compiler.interp.call(compiler.evaluate, batch)
    finally:
        compiler.tracer = None
    outputs = {f"metric:{k}": v for k, v in tracer.metrics.items()}
    return tracer.builder.program(outputs), list(tracer.metrics)


def stage_update(compiler: Compiler, trainable: list[str]) -> Program:
    tracer = Tracer("update")
    b = tracer.builder
    params = {p.path: p for p in compiler.all_params()}
    tracer.ctx_input("step")
    tracer.ctx_allowed = True  # type: ignore[attr-defined]
    ctx = Ctx(values={})
    grads = {p: b.input(f"grad:{p}", "value", TensorType(dtype=DType.f32, shape=params[p].shape)) for p in trainable}
    squares = [b.op("sum", b.op("mul", g, g), axis=None, keepdims=False) for g in grads.values()]
    total = squares[0] if squares else b.const(0.0, DType.f32)
    for sq in squares[1:]:
        total = b.op("add", total, sq)
    norm = b.op("sqrt", total)
    outputs: dict[str, int] = {"grad-norm": norm}
    if compiler.clip is not None:
        scale = b.op("minimum", b.const(1.0, DType.f32), b.op("div", b.const(compiler.clip, DType.f32), b.op("add", norm, b.const(1e-6, DType.f32))))
        grads = {p: b.op("mul", g, scale) for p, g in grads.items()}
    compiler.tracer = tracer
    try:
        for group in compiler.groups:
            if group.optimizer is None:
                continue
            compiler.current_group = group.name
            if not group.params:
                continue
            by_dtype: dict[DType, list[str]] = {}
            for path in group.params:
                by_dtype.setdefault(params[path].dtype, []).append(path)
            for paths in by_dtype.values():  # parameters are joined only with their own dtype
                update_group(compiler, tracer, group, paths, params, grads, ctx, outputs)
    finally:
        compiler.tracer = None
        compiler.current_group = None
    for key, nid in tracer.metrics.items():
        outputs[key] = nid
    return b.program(outputs)


def update_group(compiler: Compiler, tracer: Tracer, group: Any, paths: list[str], params: dict[str, Any], grads: dict[str, int], ctx: Any, outputs: dict[str, int]) -> None:
    """One traced update for the whole group (multi-tensor): the group's parameters,
    gradients and states are flattened and joined into one vector each, the optimizer's
    update runs once on them, and the results are split back. Updates are elementwise, so
    this equals updating each parameter alone, with a few kernels instead of a few per
    parameter."""
    b = tracer.builder
    sizes = [shape_size(params[p].shape) for p in paths]
    total = sum(sizes)

    def joined(ids: list[int]) -> int:
        flat = [b.op("reshape", i, shape=[n]) for i, n in zip(ids, sizes)]
        return flat[0] if len(flat) == 1 else b.op("concat", *flat, axis=0)

    param_ids = [tracer.param(params[p]).id for p in paths]
    state_ids = {name: [b.input(f"state:{p}:{name}", "state", TensorType(dtype=DType.f32, shape=params[p].shape)) for p in paths] for name, _ in group.optimizer.states}
    flat_param = Staged(tracer, joined(param_ids))
    flat_grad = Staged(tracer, joined([grads[p] for p in paths]))
    flat_states = [Staged(tracer, joined(ids)) for ids in state_ids.values()]
    tracer.path_stack.append(group.name)
    try:
        result = compiler.interp.apply(group.optimizer.update, [flat_param, flat_grad, ctx, *flat_states])
    finally:
        tracer.path_stack.pop()
    values = list(result) if type(result) is MultipleValues else [result]
    new_param = compiler.lib.staged("optimizer-update", 1, values[0], flat_param.type)
    if new_param.type != flat_param.type:
        raise lisp_error("T001", f"optimizer {group.optimizer.name}: its update returned {new_param.type} for parameters {flat_param.type}; updates must keep the parameter's shape and dtype", "TYPE-ERROR")
    new_states = [compiler.lib.staged("optimizer-update", 1, v, flat_param.type) for v in values[1:]]

    def split(flat: Staged, key: str) -> None:
        start = 0
        for path, n in zip(paths, sizes):
            piece = flat.id if len(paths) == 1 else b.op("slice", flat.id, starts=[start], stops=[start + n])
            outputs[key.format(path=path)] = b.op("reshape", piece, shape=list(params[path].shape))
            start += n

    split(new_param, "param:{path}")
    for (name, _), value in zip(group.optimizer.states, new_states):
        split(value, "state:{path}:" + name)
    del total
