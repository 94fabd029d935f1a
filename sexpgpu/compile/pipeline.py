"""The one way to compile a file: read and evaluate it with the contract forms installed,
check the contract, stage the objective, differentiate it, lower the optimizer groups, and
check every program. The CLI, bundles and workers all call compile_file.

Each stage returns what it makes: stage_train a TrainPrograms (forward, train and the train
program with the selected IR diagnostics), stage_update the update program, stage_curriculum
and stage_evals their specs (adding their programs to the module's), and build_experiment
the Experiment. Tensor builtins stage into the tracer of the `lib.tracing` block around them.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Iterator, Mapping, Optional

from ..ir.check import IRError, check_program
from ..ir.dtypes import DType
from ..ir.experiment import CurriculumSpec, EvalSpec, Experiment, GroupSpec, LoaderRecord, RunSpec, Selection, StateSpec
from ..ir.graph import Module, Program, TensorType, prune, shape_size
from ..ir.selectors import selects
from ..lisp.conditions import LispError, lisp_error
from ..lisp.diagnostics import Diagnostic, Note, SourceMap
from ..lisp.evaluator import Limits, prelude_text
from ..cachefiles import package_signature
from ..lisp.image import SYSTEM_FILE, Leaf, SystemImage, TextKey
from ..lisp.imagefile import store_image, stored_image
from ..lisp.modules import standard_context, standard_module_texts
from ..lisp.program import Program as LispProgram
from ..lisp.program import diagnostic_from, display_path, evaluate_file, guarded, has_errors, new_program
from ..lisp.types import NIL, Loc, MultipleValues
from ..records import plain
from .autodiff import backward
from .compiler import Compiler, contract_text
from .models import Batch, Ctx, Group, Param
from .probes import Probing
from ..sweeps.search import halving_problem
from .sweep_groups import Binding, group_key, numeric, split_by
from .selection import Declared, Written, located, overrides, prescan, written_values
from .tensors import Staged, TensorLib, Tracer

# the contract form a whole-file problem is reported at
BLAME = {"C001": "DEFRUN", "C005": "DEFGROUPS", "C006": "DEFOBJECTIVE", "C007": "DEFGROUPS", "C008": "DEFEVAL", "C009": "DEFPART"}


@dataclass
class CompileResult:
    diagnostics: list[Diagnostic] = field(default_factory=list)
    experiment: Optional[Experiment] = None
    program: Optional[LispProgram] = None
    compiler: Optional[Compiler] = None

    @property
    def ok(self) -> bool:
        return not has_errors(self.diagnostics)


def compile_file(path: Path, selection: Optional[Selection] = None, limits: Optional[Limits] = None, output: Any = None, world: int = 1,
                 probing: Optional[Probing] = None, declared: Optional[Declared] = None, image: Optional[SystemImage] = None,
                 recording: Optional[dict[TextKey, tuple[Leaf, ...]]] = None) -> CompileResult:
    """Read, evaluate, stage and check PATH. WORLD > 1 also stages each data-parallel rank's
    train programs at batch/WORLD (the experiment's identity stays the single-device IR's).
    PROBING: a probe compile for a group of sweep points (compile_points); DECLARED: the
    file's pre-read selection, when the caller has it; IMAGE: the system texts, read once by
    a caller that compiles many times (system_image); RECORDING: where the world records
    the expansions of the system texts it loads (lisp/image.py). Without IMAGE, the disk's
    (system_image) is the one, and what the world records is kept there for the next process."""
    if image is None:
        recorded: dict[TextKey, tuple[Leaf, ...]] = {}
        image = system_image(expand=False, forms=False)
        result = compile_file(path, selection, limits, output, world, probing, declared, image, recorded)
        if recorded:
            remembered(image, recorded)
        return result
    try:
        chosen, imposed, written = resolve_selection(path, selection or Selection(), declared)
    except LispError as exc:
        return CompileResult(diagnostics=[diagnostic_from(exc)])
    made, problem = guarded(lambda: compiling_world(path, limits, output, chosen, imposed, written, probing, image, recording))
    if made is None:
        return CompileResult(diagnostics=[problem] if problem else [])
    fresh, compiler = made
    program, diagnostics = evaluate_file(fresh)
    result = CompileResult(diagnostics=[at_users_call(d, fresh.interp.user_loc) for d in diagnostics], program=program, compiler=compiler)
    if program is None or not result.ok:
        return result
    unknown = sorted(set(chosen.set) - set(compiler.knobs))
    if unknown:
        result.diagnostics.append(Diagnostic(code="C004", message=f"--set {unknown[0]}: no knob named {unknown[0]} (declared: {', '.join(compiler.knobs) or 'none'})"))
        return result
    if not compiler.is_run_file:
        return result

    def build() -> Experiment:
        try:
            return build_experiment(path, program, compiler, chosen, world)
        except LispError as exc:
            if exc.loc is None:
                exc.loc = compiler.form_loc(BLAME.get(exc.condition.code, "DEFRUN"))
            raise

    experiment, problem = guarded(build)
    for message in compiler.warnings:
        result.diagnostics.append(Diagnostic.at("W002", message, compiler.form_loc("DEFGROUPS"), severity="warning"))
    if problem is not None:
        result.diagnostics.append(at_users_call(problem, fresh.interp.user_loc))
    result.experiment = experiment
    return result


LIBRARY = "sexpgpu/lib/"  # the standard modules, as diagnostics name their files


def at_users_call(diagnostic: Diagnostic, user: Optional[Loc]) -> Diagnostic:
    """An error raised inside a standard module (sexpgpu/nn, sexpgpu/optim) is reported at
    USER, the latest call the user's own files made before the library took over: that is
    where the arguments came from. The library's line becomes a note."""
    if diagnostic.severity != "error" or user is None or not (diagnostic.file or "").startswith(LIBRARY) or diagnostic.line is None:
        return diagnostic
    inside = Note(message="raised here, inside the standard library", file=diagnostic.file, line=diagnostic.line, col=diagnostic.col)
    toplevel = f"while evaluating the top-level form at {user}"
    notes = [inside, *(n for n in diagnostic.notes if n.message != toplevel)]
    return replace(diagnostic, file=user.file, line=user.line, col=user.col, macro=None, notes=notes)


@dataclass
class Checked:
    """What `check` reports for a file: the diagnostics of every selection it checked, the
    sources to show them, the files read (for watch), and how many selections it checked
    (the file as it is, and each selection with knob values of its own)."""

    diagnostics: list[Diagnostic]
    sources: SourceMap
    files: list[Path]
    compiled: int


@contextmanager
def compiles_in_a_row() -> Iterator[Callable[[], None]]:
    """Several compiles in one call: the function it gives, called after each compile, freezes
    what survives it (the results keep their worlds alive), so that the next compiles'
    collections do not walk the earlier worlds again (about a third of search.lisp's check).
    On the way out every frozen object goes back to the collector: what the caller drops
    later is freed as before."""
    try:
        yield gc.freeze
    finally:
        gc.unfreeze()


def check_every_selection(path: Path, limits: Optional[Limits] = None, output: Any = None, image: Optional[SystemImage] = None,
                          recording: Optional[dict[TextKey, tuple[Leaf, ...]]] = None) -> Checked:
    """Compile PATH as it is, then with every defvariant and every point of every defsweep:
    a problem only one selection has is reported once, with a note naming the selections
    that have it. Selections that give the knobs the same values as one already compiled are
    the same compile and are skipped. What the file prints is shown for the first compile only.
    Every compile takes the system texts from IMAGE (watch keeps one for all its checks);
    without one, a file with variants or sweeps reads them once for all its compiles.
    RECORDING (watch's, with IMAGE): where the base compile records the expansions of the
    modules the file requires first that IMAGE does not hold, for the next check."""
    try:
        declared: Optional[Declared] = prescan(path)
    except LispError:
        declared = None  # the base compile reports it
    recorded = recording if image is not None else {}
    if image is None:  # the base compile's world records what the disk's image lacks
        image = system_image(expand=False, forms=declared is not None and bool(declared.variants or declared.sweeps))
    with compiles_in_a_row() as compiled:
        base = compile_file(path, None, limits, output, declared=declared, image=image, recording=recorded)
        if recorded:
            image = remembered(image, recorded) if recording is None else image.with_expansions(recorded)
        compiled()
        return check_selections(path, base, limits, declared, image)


def system_texts() -> list[TextKey]:
    """The system texts every world may load: the prelude, the contract macros, the standard
    modules, each under the file name a world reads it as."""
    return [(SYSTEM_FILE, prelude_text()), (SYSTEM_FILE, contract_text()), *standard_module_texts()]


def kept_on_disk(key: TextKey) -> bool:
    """Whether an expansion recorded under KEY is one the disk's image keeps: the prelude's,
    the contract macros', a standard module's loaded after standard modules only."""
    return key[0] == SYSTEM_FILE or standard_context(key[0])


def system_image(expand: bool = True, forms: bool = True) -> SystemImage:
    """The system texts' image for the worlds of one caller, as the disk keeps it
    (lisp/imagefile.py), completed where it lacks what is asked for and kept again: FORMS,
    every text's read forms (a caller that builds many worlds; without, each world reads the
    texts it loads); EXPAND, the prelude's and the contract macros' expansions, recorded in a
    world built here (a caller that builds a world anyway passes False and records them in
    it: remembered)."""
    texts = system_texts()
    signature = package_signature()
    stored = stored_image(texts, signature)
    image = stored if stored is not None else SystemImage(MappingProxyType({}))
    if forms and not image.texts:
        image = SystemImage(SystemImage.read(texts).texts, image.expanded)
    if expand and not all((SYSTEM_FILE, text) in image.expanded for _, text in texts[:2]):
        recorded: dict[TextKey, tuple[Leaf, ...]] = {}
        expanding = image

        def record() -> None:
            program = new_program(None, image=expanding, recording=recorded)
            Compiler(program.interp, Selection(), Path.cwd())

        _, problem = guarded(record)
        image = image if problem is not None else image.with_expansions(recorded)
    if image is not stored:
        store_image(image, texts, signature, kept_on_disk)
    return image


def remembered(image: SystemImage, recorded: Mapping[TextKey, tuple[Leaf, ...]]) -> SystemImage:
    """IMAGE with the expansions a world RECORDED from it; kept on disk again when they add
    one the disk keeps (kept_on_disk), so that the next process replays it too."""
    merged = image.with_expansions(recorded)
    if any(kept_on_disk(key) and key not in image.expanded for key in recorded):
        store_image(merged, system_texts(), package_signature(), kept_on_disk)
    return merged


def check_selections(path: Path, base: CompileResult, limits: Optional[Limits], declared: Optional[Declared], image: Optional[SystemImage]) -> Checked:
    """check_every_selection past the base compile: every variant and sweep point
    (DECLARED: the file's pre-read, None where it failed)."""
    diagnostics = list(base.diagnostics)
    sources = base.program.sources if base.program is not None else SourceMap()
    files = base.program.files if base.program is not None else [path]
    if declared is None:
        return Checked(diagnostics, sources, files, 1)  # the base compile reported it
    for sweep in declared.sweeps.values():  # a halving the base run cannot rank is wrong for every point
        problem = halving_problem(sweep.halving, base.experiment) if sweep.halving and base.experiment else None
        if problem is not None:
            diagnostics.append(diagnostic_from(located(lisp_error("C008", f"defsweep {sweep.name} {problem}", "PROGRAM-ERROR"), sweep.loc)))
    seen: dict[tuple[Any, ...], list[str]] = {same(d): [] for d in diagnostics}
    from_base = set(seen)
    defaults = {k.name: k.value for k in base.compiler.knobs.values()} if base.compiler is not None else {}
    done = {json.dumps(defaults, sort_keys=True, default=str)}
    chosen: list[tuple[Selection, str]] = []
    for selection, label in declared_selections(declared):
        try:
            values = json.dumps({**defaults, **overrides(declared, selection)}, sort_keys=True, default=str)
        except LispError:
            continue  # a sweep prescan refused is reported by the base compile
        if values in done:
            continue
        done.add(values)
        chosen.append((selection, label))
    results = compile_points(path, [selection for selection, _ in chosen], limits, output=lambda _: None, experiments=False, image=image)
    for (_, label), result in zip(chosen, results):
        for diagnostic in result.diagnostics:
            key = same(diagnostic)
            if key not in seen:
                seen[key] = []
                diagnostics.append(diagnostic)
            if key not in from_base:
                seen[key].append(label)
    compiled = 1 + len(chosen)
    return Checked([with_selections(d, seen[same(d)]) for d in diagnostics], sources, files, compiled)


def compile_points(path: Path, selections: list[Selection], limits: Optional[Limits] = None, output: Any = None, world: int = 1,
                   experiments: bool = True, image: Optional[SystemImage] = None) -> list[CompileResult]:
    """Each of SELECTIONS compiled, as compile_file(PATH, selection) compiles it, with one
    staging per shape: points that differ only in numeric knobs no shape, dtype or structure
    depends on share one probe compile (sweep_groups.py), checked against a real compile of
    their first point. Without EXPERIMENTS a shared point's result has its diagnostics only.
    What the file prints reaches OUTPUT from the compiles that ran. IMAGE: as stream_points."""
    results = dict(stream_points(path, selections, limits, output, world, experiments, freeze=True, image=image))
    return [results[i] for i in range(len(selections))]


def stream_points(path: Path, selections: list[Selection], limits: Optional[Limits] = None, output: Any = None, world: int = 1,
                  experiments: bool = True, freeze: bool = False, image: Optional[SystemImage] = None) -> Iterator[tuple[int, CompileResult]]:
    """compile_points' results as each shape group is compiled: (index, result), a group's
    points together, groups in the order their first point appears; what the caller has taken
    is not kept here (a sweep's first points train while the later ones compile). A point is
given once its result is final, so points may come out of index order. With FREEZE (a caller
that keeps every result anyway, as compile_points does) what survives each compile is frozen
(compiles_in_a_row); a stream keeps nothing, so it freezes nothing: frozen worlds the caller
has dropped would never be collected until the stream ends. Every world of the stream takes
the system texts from IMAGE (read here when not given and there is more than one point)."""
    if image is None and len(selections) > 1:
        image = system_image()
    try:
        declared = prescan(path)
        resolved = [resolve_selection(path, selection, declared) for selection in selections]
    except LispError:
        for i, selection in enumerate(selections):
            yield i, compile_file(path, selection, limits, output, world, image=image)
        return
    if not freeze:
        yield from compile_groups(path, selections, resolved, declared, limits, output, world, experiments, lambda: None, image)
        return
    with compiles_in_a_row() as compiled:
        yield from compile_groups(path, selections, resolved, declared, limits, output, world, experiments, compiled, image)


def compile_groups(path: Path, selections: list[Selection], resolved: list[tuple[Selection, dict[str, Any], dict[str, Written]]], declared: Declared,
                   limits: Optional[Limits], output: Any, world: int, experiments: bool,
                   compiled: Callable[[], None], image: Optional[SystemImage]) -> Iterator[tuple[int, CompileResult]]:
    """stream_points past the pre-read: COMPILED is called after each compile; every world
    takes the system texts from IMAGE."""
    results: dict[int, CompileResult] = {}

    def own(i: int) -> CompileResult:
        if i not in results:
            results[i] = compile_file(path, selections[i], limits, output, world, declared=declared, image=image)
            compiled()
        return results[i]

    def settled(i: int) -> tuple[int, CompileResult]:
        own(i)
        return i, results.pop(i)

    # the first point is given before any group is planned (its own compile, which is what
    # its group gives it in any case): a sweep's first point trains while its group's probe
    # compile, with every point's values, runs
    if selections:
        yield 0, own(0)
    for indices, shared in plan_groups(path, selections, resolved, declared, limits, world, own, compiled, image=image):
        for i in indices if shared is None else indices[:1]:
            if i == 0:  # given already
                results.pop(i, None)
            else:
                yield settled(i)
        if shared is not None:
            for i in indices[1:]:
                bound = shared.result(i, experiments)
                yield settled(i) if bound is None else (i, bound)


@dataclass
class SharedCompile:
    """A shape group's probe compile, checked against its first point's own compile: the
    result of each of its points bound from it, without compiling."""

    indices: list[int]  # the group's points, the first one compiled on its own
    first: CompileResult
    binding: Binding
    chosen: list[Selection]  # each point's resolved selection, in the order of INDICES

    def result(self, i: int, experiments: bool = True) -> Optional[CompileResult]:
        """Point I's result (without EXPERIMENTS, its diagnostics only); None: a point the
        binding refuses, which needs a compile of its own."""
        at = self.indices.index(i)
        if at == 0:
            return self.first
        if self.binding.refuses(at):
            return None
        experiment = self.binding.experiment_for(at, self.chosen[at]) if experiments else None
        return CompileResult(diagnostics=list(self.first.diagnostics), experiment=experiment, program=self.first.program, compiler=self.first.compiler)


def plan_groups(path: Path, selections: list[Selection], resolved: list[tuple[Selection, dict[str, Any], dict[str, Written]]], declared: Declared,
                limits: Optional[Limits], world: int, own: Callable[[int], CompileResult], compiled: Callable[[], None],
                only: Optional[int] = None, image: Optional[SystemImage] = None) -> Iterator[tuple[list[int], Optional[SharedCompile]]]:
    """SELECTIONS' shape groups, in the order their first point appears: (the group's points,
    their shared compile, or None where each point compiles on its own). OWN is a point's own
    compile (the first point of a probed group gets one, to check the probe against);
    COMPILED is called after each probe compile. ONLY: the group of that point alone (a
    worker given one point of a sweep: the other groups are neither probed nor compiled);
    every world takes the system texts from IMAGE."""
    imposed = [r[1] for r in resolved]

    def wanted(indices: list[int]) -> bool:
        return only is None or only in indices

    def settle(indices: list[int], numbers: set[str]) -> Iterator[tuple[list[int], Optional[SharedCompile]]]:
        varying = {k for k in numbers if len({repr(imposed[i].get(k)) for i in indices}) > 1}
        if len(indices) <= 2 or not varying:
            yield indices, None
            return
        first = own(indices[0])
        probing = Probing(values={k: [imposed[i][k] for i in indices] for k in varying},
                          written={k: [resolved[i][2].get(k) for i in indices] for k in varying})
        probe = compile_file(path, selections[indices[0]], limits, lambda _: None, world, probing=probing, declared=declared, image=image)
        compiled()
        if probing.observed:  # those knobs reach the structure: their values group the points
            for group in split_by(indices, probing.observed, imposed):
                if wanted(group):
                    yield from settle(group, numbers - probing.observed)
            return
        binding = Binding(probing, probe.diagnostics, probe.experiment)
        if not reproduces(binding, first, resolved[indices[0]][0]):
            integers = {k for k in varying if type(imposed[indices[0]][k]) is int}
            if integers:  # seen where no probe could say: an integer is the likelier shape
                for group in split_by(indices, integers, imposed):
                    if wanted(group):
                        yield from settle(group, numbers - integers)
            else:
                yield indices, None
            return
        yield indices, SharedCompile(indices, first, binding, [resolved[i][0] for i in indices])

    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, (chosen, values, _) in enumerate(resolved):
        groups.setdefault(group_key(chosen, values), []).append(i)
    for indices in groups.values():
        if wanted(indices):
            yield from settle(indices, {k for k, v in imposed[indices[0]].items() if numeric(v)})


def reproduces(binding: Binding, real: CompileResult, selection: Selection) -> bool:
    """Whether the probe compile, bound to its first point's values, is that point's own
    compile: the same diagnostics and the same experiment, byte for byte."""
    if binding.diagnostics != real.diagnostics:
        return False
    if (binding.experiment is None) != (real.experiment is None):
        return False
    if binding.refuses(0):
        return False
    bound = binding.data_for(0, selection)  # as plain data: a check that binds no point validates no record
    return bound is None or real.experiment is None or json.dumps(bound, sort_keys=True) == json.dumps(plain(real.experiment), sort_keys=True)


def declared_selections(declared: Declared) -> list[tuple[Selection, str]]:
    """Every variant and every sweep point, with the flags that choose it."""
    out = [(Selection(variant=name), f"--variant {name}") for name in declared.variants]
    for name, sweep in declared.sweeps.items():
        try:
            count = len(sweep.points())
        except LispError:
            continue
        out.extend((Selection(sweep=name, point=i), f"--sweep {name} --point {i}") for i in range(count))
    return out


def same(diagnostic: Diagnostic) -> tuple[Any, ...]:
    return (diagnostic.severity, diagnostic.code, diagnostic.message, diagnostic.file, diagnostic.line, diagnostic.col)


def with_selections(diagnostic: Diagnostic, labels: list[str], most: int = 3) -> Diagnostic:
    """DIAGNOSTIC with a note naming the selections it was found in (none: the file as it is)."""
    if not labels:
        return diagnostic
    shown = ", ".join(labels[:most]) + (f" and {len(labels) - most} more" if len(labels) > most else "")
    note = Note(message=f"found when checking the selection{'s' if len(labels) > 1 else ''} {shown}")
    return replace(diagnostic, notes=[*diagnostic.notes, note])


def resolve_selection(path: Path, selection: Selection, declared: Optional[Declared] = None) -> tuple[Selection, dict[str, Any], dict[str, Written]]:
    """SELECTION with its sweep's variant filled in, the knob values it imposes (from the
    pre-read of PATH's variants and sweeps, DECLARED when given), and where those values are
    written."""
    declared = declared if declared is not None else prescan(path)
    imposed = overrides(declared, selection)
    written = written_values(declared, selection)
    sweep = declared.sweeps.get(selection.sweep or "")
    if sweep is not None and sweep.variant and selection.variant is None:
        selection = replace(selection, variant=sweep.variant)
    return selection, imposed, written


def compiling_world(path: Path, limits: Optional[Limits], output: Any, selection: Selection, imposed: dict[str, Any],
                    written: Optional[dict[str, Written]] = None, probing: Optional[Probing] = None,
                    image: Optional[SystemImage] = None, recording: Optional[dict[TextKey, tuple[Leaf, ...]]] = None) -> tuple[LispProgram, Compiler]:
    """A fresh world for PATH with the compiler installed, watching the file's contract order."""
    program = new_program(path, limits, output=output, image=image, recording=recording)
    compiler = Compiler(program.interp, selection, path.resolve().parent, imposed, root=program.loader.root, written=written, probing=probing)
    compiler.watch(program.table)
    return program, compiler


def new_world(limits: Optional[Limits] = None, output: Any = None) -> LispProgram:
    """A fresh world with no file, with the tensor builtins and contract forms installed
    (what `sexpgpu eval` without a file evaluates in)."""
    program = new_program(None, limits, output=output)
    Compiler(program.interp, Selection(), Path.cwd())
    return program


@dataclass
class TrainPrograms:
    """One staging of the objective (for one shape of the train loader)."""

    forward: Program
    train: Program
    diagnostics: Optional[Program]  # train plus the selected IR diagnostics; None when none is selected
    diagnostic_names: list[str]  # the IR diagnostics computed (run.diagnostics.ir_names)
    ir_available: list[str]  # every IR diagnostic a selection could pick (act/ names, taps)
    metrics: list[str]
    trainable: list[str]


def build_experiment(path: Path, program: LispProgram, compiler: Compiler, selection: Selection, world: int = 1) -> Experiment:
    """Stage, check and describe the run PROGRAM's file declared (its contract evaluated
    into COMPILER)."""
    run = defined_run(compiler)
    compiler.check_unique_paths()
    compiler.assign_groups()
    check_fits_in_memory(compiler, machine_memory())
    precision = DType(run.precision)
    train_loader = compiler.loaders["train"]
    base = stage_train(compiler, train_loader, precision)
    check_selection(compiler, base)
    update = stage_update(compiler, base.trainable)
    programs = {"forward": base.forward, "train": base.train, "update": update}
    add_diagnostics(programs, base, None)
    for stage in train_loader.stages:
        staged = stage_train(compiler, stage_loader(train_loader, stage.name), precision)
        staged.train.name = f"train@{stage.name}"
        programs[staged.train.name] = staged.train
        add_diagnostics(programs, staged, stage.name)
    rank_programs = stage_rank_programs(compiler, train_loader, world, precision) if world > 1 else {}
    curriculum = stage_curriculum(compiler, programs, run.seed, precision)
    evals = stage_evals(compiler, programs, run.seed, precision)
    module = Module(programs={name: prune(prog) for name, prog in programs.items()})
    for prog in module.programs.values():
        try:
            check_program(prog)
        except IRError as exc:
            raise lisp_error("X001", f"internal error: the IR does not check: {exc}", "ERROR") from None
    sources = b"".join(f.read_bytes() for f in program.files)
    return Experiment(
        file=display_path(path),
        file_stem=path.stem,
        selection=selection,
        knobs=list(compiler.knobs.values()),
        params=[p.spec() for p in compiler.all_params()],
        loaders=dict(compiler.loaders),
        groups=[group_spec(g) for g in compiler.groups],
        run=staged_run(run, compiler.clip, base.diagnostic_names),
        metrics=base.metrics,
        evals=evals,
        curriculum=curriculum,
        ties={k: v[0] + (" (transposed)" if v[1] else "") for k, v in compiler.ties().items()},
        targets=list(compiler.targets),
        module=module,
        rank_programs=rank_programs,
        world=world,
        ir_hash=module.hash(),
        source_hash=hashlib.sha256(sources).hexdigest(),
    )


def machine_memory() -> Optional[int]:
    """This machine's physical memory in bytes, where the system says."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def plan_bytes(compiler: Compiler) -> int:
    """The bytes training keeps resident, from the shapes alone: every parameter, and for a
    trainable one its gradient and its optimizer's state slots (each the parameter's shape)."""
    slots = {p: (1 + len(g.optimizer.states)) if g.optimizer is not None else 0 for g in compiler.groups for p in g.params}
    total = 0
    for param in compiler.all_params():
        total += shape_size(param.shape) * param.dtype.bits // 8 * (1 + slots.get(param.path, 0))
    return total


def check_fits_in_memory(compiler: Compiler, available: Optional[int]) -> None:
    """A plan larger than the machine is refused at check (C009), before anything allocates."""
    needed = plan_bytes(compiler)
    if available is not None and needed > available:
        raise lisp_error(
            "C009",
            f"the parameters, gradients and optimizer state need {human_bytes(needed)}, more than this machine's "
            f"{human_bytes(available)} of memory; make the model smaller",
            "STORAGE-CONDITION",
        )


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000:
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} PB"


def defined_run(compiler: Compiler) -> RunSpec:
    """defrun's settings, once the file is known to state the whole contract."""
    check_presence(compiler)
    assert compiler.run is not None, "check_presence saw the defrun form"
    return compiler.run


def staged_run(run: RunSpec, clip: Optional[float], diagnostic_names: list[str]) -> RunSpec:
    """defrun's record completed by what is known only after staging: defgroups' :clip and
    the names of the IR diagnostics the train program computes."""
    diagnostics = replace(run.diagnostics, ir_names=diagnostic_names) if run.diagnostics is not None else None
    return replace(run, clip=clip, diagnostics=diagnostics)


def group_spec(group: Group) -> GroupSpec:
    optimizer = group.optimizer
    return GroupSpec(
        name=group.name,
        selector=group.selector,
        optimizer=optimizer.name if optimizer else None,
        params=group.params,
        states=[StateSpec(name=n, init=i) for n, i in (optimizer.states if optimizer else [])],
    )


def stage_loader(loader: LoaderRecord, stage: str) -> LoaderRecord:
    try:
        return loader.staged(stage)
    except ValueError as exc:
        raise lisp_error("C008", str(exc), "PROGRAM-ERROR") from None


def stage_rank_programs(compiler: Compiler, train_loader: LoaderRecord, world: int, precision: DType) -> dict[str, Program]:
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
        staged = stage_train(compiler, replace(loader, batch=loader.batch // world), precision)
        staged.train.name = "train" if stage is None else f"train@{stage}"
        programs[staged.train.name] = prune(staged.train)
        add_diagnostics(programs, staged, stage, prune)
    for prog in programs.values():
        check_program(prog)
    return programs


def add_diagnostics(programs: dict[str, Program], staged: TrainPrograms, stage: Optional[str], finish: Callable[[Program], Program] = lambda p: p) -> None:
    """STAGED's diagnostics program, if any, as `train:diagnostics` or
    `train:diagnostics@STAGE`: sampled steps of every stage compute the selected IR
    diagnostics."""
    if staged.diagnostics is not None:
        staged.diagnostics.name = "train:diagnostics" if stage is None else f"train:diagnostics@{stage}"
        programs[staged.diagnostics.name] = finish(staged.diagnostics)


def check_presence(compiler: Compiler) -> None:
    seen = {name for name, _ in compiler.seen}
    for form, what in [("DEFLOADER", "at least one defloader, named train"), ("DEFPART", "at least one defpart"), ("DEFOBJECTIVE", "exactly one defobjective"), ("DEFGROUPS", "exactly one defgroups"), ("DEFRUN", "exactly one defrun, last")]:
        if form not in seen:
            raise lisp_error("C001", f"the file has no {form.lower()}: a run file needs {what}", "PROGRAM-ERROR")
    if "train" not in compiler.loaders:
        raise lisp_error("C001", f"no loader is named train (loaders: {', '.join(compiler.loaders)}); name the training loader train", "PROGRAM-ERROR")


def data_inputs(tracer: Tracer, loader: LoaderRecord) -> Batch:
    fields = {}
    for f in loader.fields:
        nid = tracer.builder.input(f"data.{f.name}", "data", TensorType(dtype=DType(f.dtype), shape=(loader.batch, *f.shape)))
        if tracer.precision == DType.bf16 and DType(f.dtype) == DType.f32:
            nid = tracer.builder.op("cast", nid, dtype="bf16")
        fields[f.name] = Staged(tracer, nid)
    return Batch(loader=loader.name, fields=fields)


def stage_train(compiler: Compiler, loader: LoaderRecord, precision: DType) -> TrainPrograms:
    assert compiler.run is not None
    tracer = Tracer("train", seed=compiler.run.seed, training=True, precision=precision)
    batch = data_inputs(tracer, loader)
    with compiler.lib.tracing(tracer):
        loss = compiler.interp.call(compiler.objective, batch)
        if type(loss) is MultipleValues:
            loss = loss[0]
        if type(loss) is Staged and loss.type.dtype in (DType.bf16, DType.f16):
            loss = compiler.lib.cast_to("defobjective", loss, DType.f32)
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
    train_outputs = dict(outputs)
    for p in trainable:
        grad = grads[tracer.params[p]]
        if grad is None:
            raise lisp_error("C007", f"parameter {p} gets no gradient from the loss (it only reaches it through non-differentiable ops); freeze it in defgroups", "PROGRAM-ERROR")
        train_outputs[f"grad:{p}"] = grad
    for path in all_paths:
        if path not in tracer.params:
            builder.input(path, "param", TensorType(dtype=DType.f32, shape=next(p.shape for p in compiler.all_params() if p.path == path)))
    train = builder.program(train_outputs)
    diagnostics, names = diagnostic_program(compiler, tracer, train_outputs)
    available = ir_diagnostic_names(tracer) if compiler.run.diagnostics is not None else []
    return TrainPrograms(forward, train, diagnostics, names, available, list(tracer.metrics), trainable)


ACT_REDUCERS = ("mean", "rms", "max-abs", "frac-zero")


def ir_diagnostic_names(tracer: Tracer) -> list[str]:
    """The names of every IR diagnostic of the traced train program: the act/ statistics
    of each part whose forward returned a float tensor, and each defdiagnostic tap."""
    acts = [f"act/{path}/{r}" for path, nid in tracer.activations.items() if tracer.builder.type(nid).dtype.is_float for r in ACT_REDUCERS]
    return acts + list(dict.fromkeys(name for name, _, _ in tracer.taps))


def loop_diagnostic_names(compiler: Compiler, trainable: list[str]) -> list[str]:
    """The names the loop computes (runtime/trainer.py's diagnose): grad-norm/ of each
    trained parameter, param-norm/ and update-ratio/ of each, optim/STATE/ of each
    parameter an optimizer with that state updates."""
    paths = [p.path for p in compiler.all_params()]
    names = [f"grad-norm/{p}" for p in trainable] + [f"param-norm/{p}" for p in paths] + [f"update-ratio/{p}" for p in paths]
    for group in compiler.groups:
        if group.optimizer is not None:
            names.extend(f"optim/{slot}/{p}" for slot, _ in group.optimizer.states for p in group.params)
    return names


def check_selection(compiler: Compiler, base: TrainPrograms) -> None:
    """Each glob of defrun :diagnostics :select must pick at least one diagnostic this run
    has (a typo would otherwise give diagnostic events without it): C008 at the glob,
    listing what there is."""
    option = compiler.run.diagnostics if compiler.run is not None else None
    if option is None:
        return
    names = loop_diagnostic_names(compiler, base.trainable) + base.ir_available
    for glob in option.select:
        if not any(selects([glob], name) for name in names):
            err = lisp_error("C008", f'defrun :diagnostics :select "{glob}" matches no diagnostic of this run; it has {diagnostics_listing(names)}', "PROGRAM-ERROR")
            err.loc = compiler.select_locs.get(glob) or compiler.form_loc("DEFRUN")
            raise err


def diagnostics_listing(names: list[str], most: int = 8) -> str:
    """NAMES grouped by what varies in them: `grad-norm/PATH, param-norm/PATH for PATH in
    a.w, a.b; act/PART/mean ... for PART in net`, each list cut after MOST."""
    families: dict[str, list[str]] = {}
    for name in names:
        head, _, rest = name.partition("/")
        if head == "optim":
            state, _, path = rest.partition("/")
            families.setdefault(f"optim/{state}/PATH", []).append(path)
        elif head in ("grad-norm", "param-norm", "update-ratio"):
            families.setdefault(f"{head}/PATH", []).append(rest)
        elif head == "act":
            part, _, reducer = rest.rpartition("/")
            families.setdefault(f"act/PART/{reducer}", []).append(part)
        else:
            families.setdefault(f"{head}/PART", []).append(rest)
    groups: dict[tuple[str, ...], list[str]] = {}
    for family, subjects in families.items():
        groups.setdefault(tuple(subjects), []).append(family)
    parts = []
    for subjects_key, members in groups.items():
        subjects = list(subjects_key)
        word = "PART" if "PART" in members[0] else "PATH"
        shown = ", ".join(subjects[:most]) + (f", ... ({len(subjects)} in all)" if len(subjects) > most else "")
        parts.append(f"{', '.join(members)} for {word} in {shown}")
    return "; ".join(parts)


def diagnostic_program(compiler: Compiler, tracer: Tracer, outputs: dict[str, int]) -> tuple[Optional[Program], list[str]]:
    """The train program plus the selected IR diagnostics (act/PATH/..., defdiagnostic
    taps) as extra outputs, and their names; None when none is selected, so unselected
    diagnostics leave the IR, and its hash, unchanged."""
    assert compiler.run is not None
    option = compiler.run.diagnostics
    if option is None:
        return None, []

    def selected(name: str) -> bool:
        return selects(option.select, name)

    lib = compiler.lib
    extra: dict[str, int] = {}
    with lib.tracing(tracer):
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
    names = [k[5:] for k in extra]
    if not extra:
        return None, names
    program = tracer.builder.program({**outputs, **extra})
    program.name = "train:diagnostics"
    return program, names


def act_reduce(lib: TensorLib, x: Staged, reducer: str) -> Staged:
    if reducer == "mean":
        return lib.op("act", "mean", x)
    if reducer == "rms":
        return lib.op("act", "sqrt", lib.op("act", "mean", lib.mul(x, x)))
    if reducer == "max-abs":
        return lib.op("act", "max", lib.op("act", "abs", x))
    zero = lib.op("act", "eq", x, lib.staged("act", 1, 0.0, x.type))
    return lib.op("act", "mean", lib.cast_to("act", zero, x.type.dtype))


def stage_curriculum(compiler: Compiler, programs: dict[str, Program], seed: int, precision: DType) -> Optional[CurriculumSpec]:
    """defcurriculum's tests, staged over ctx into one program with a boolean per rule."""
    if compiler.curriculum is None:
        return None
    tracer = Tracer("curriculum", seed=seed, precision=precision, ctx_allowed=True)
    spec = CurriculumSpec()
    outputs: dict[str, int] = {}
    lib = compiler.lib
    with lib.tracing(tracer):
        for kind, test, pairs in compiler.curriculum:
            if kind == "start":
                spec.start.update(dict(pairs))
                continue
            value = compiler.interp.call(test)
            if type(value) is not Staged:
                value = lib.staged("defcurriculum", 1, 1.0 if value is not NIL else 0.0)
                value = lib.op("defcurriculum", "gt", value, lib.staged("defcurriculum", 1, 0.0))
            if value.type.dtype != DType.bool or value.type.rank != 0:
                raise lisp_error("T001", f"defcurriculum: a test must be a boolean scalar, got {value.type}", "TYPE-ERROR")
            outputs[f"rule:{len(spec.rules)}"] = value.id
            spec.rules.append(dict(pairs))
    programs["curriculum"] = tracer.builder.program(outputs)
    return spec


def stage_evals(compiler: Compiler, programs: dict[str, Program], seed: int, precision: DType) -> list[EvalSpec]:
    """Each defeval's program, traced from defevaluate at the loader's batch and at batch 1:
    full batches run the first, the examples of the last partial batch the second, so the
    metrics are exact example-weighted means over the whole loader."""
    compiler.unresolved_targets()
    if compiler.evals and compiler.evaluate is None:
        raise lisp_error("C001", "defeval needs a defevaluate (the function that computes the eval metrics)", "PROGRAM-ERROR")
    out = []
    for spec in compiler.evals:
        loader = compiler.loaders.get(spec.loader)
        if loader is None:
            raise lisp_error("C008", f"defeval {spec.name}: no loader named {spec.loader} (loaders: {', '.join(compiler.loaders)})", "PROGRAM-ERROR")
        names: list[str] = []
        for batch, key in ((loader.batch, f"eval:{spec.name}"), (1, f"eval:{spec.name}:1")):
            tracer = Tracer(key, seed=seed, precision=precision)
            programs[key], names = stage_evaluate(compiler, tracer, replace(loader, batch=batch))
        if not names:
            raise lisp_error("C008", "defevaluate records no metric: use (metric name value) in its body", "PROGRAM-ERROR")
        out.append(replace(spec, metrics=names))
    for i, target in enumerate(compiler.targets):
        spec = next(e for e in out if e.name == target.eval)
        if target.metric not in spec.metrics:
            err = lisp_error("C008", f"deftarget {target.eval} {target.metric}: defevaluate records no metric {target.metric} (it records: {', '.join(spec.metrics)})", "PROGRAM-ERROR")
            err.loc = compiler.target_locs.get(i)
            raise err
    return out


def stage_evaluate(compiler: Compiler, tracer: Tracer, loader: LoaderRecord) -> tuple[Program, list[str]]:
    batch = data_inputs(tracer, loader)
    with compiler.lib.tracing(tracer):
        compiler.interp.call(compiler.evaluate, batch)
    outputs = {f"metric:{k}": v for k, v in tracer.metrics.items()}
    return tracer.builder.program(outputs), list(tracer.metrics)


def stage_update(compiler: Compiler, trainable: list[str]) -> Program:
    """The optimizer step, in f32: master weights, gradients and optimizer state are f32."""
    tracer = Tracer("update", ctx_allowed=True)
    b = tracer.builder
    params = {p.path: p for p in compiler.all_params()}
    tracer.ctx_input("step")
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
    with compiler.lib.tracing(tracer):
        for group in compiler.groups:
            if group.optimizer is None or not group.params:
                continue
            tracer.group = group.name
            by_dtype: dict[DType, list[str]] = {}
            for path in group.params:
                by_dtype.setdefault(params[path].dtype, []).append(path)
            for paths in by_dtype.values():  # parameters are joined only with their own dtype
                update_group(compiler, tracer, group, paths, params, grads, ctx, outputs)
    for key, nid in tracer.metrics.items():
        outputs[key] = nid
    return b.program(outputs)


def update_group(compiler: Compiler, tracer: Tracer, group: Group, paths: list[str], params: dict[str, Param], grads: dict[str, int], ctx: Ctx, outputs: dict[str, int]) -> None:
    """One traced update for the whole group (multi-tensor): the group's parameters,
    gradients and states are flattened and joined into one vector each, the optimizer's
    update runs once on them, and the results are split back. Updates are elementwise, so
    this equals updating each parameter alone, with a few kernels instead of a few per
    parameter."""
    optimizer = group.optimizer
    assert optimizer is not None, "frozen groups have no update"
    b = tracer.builder
    sizes = [shape_size(params[p].shape) for p in paths]

    def joined(ids: list[int]) -> int:
        flat = [b.op("reshape", i, shape=[n]) for i, n in zip(ids, sizes)]
        return flat[0] if len(flat) == 1 else b.op("concat", *flat, axis=0)

    param_ids = [tracer.param(params[p]).id for p in paths]
    state_ids = {name: [b.input(f"state:{p}:{name}", "state", TensorType(dtype=DType.f32, shape=params[p].shape)) for p in paths] for name, _ in optimizer.states}
    flat_param = Staged(tracer, joined(param_ids))
    flat_grad = Staged(tracer, joined([grads[p] for p in paths]))
    flat_states = [Staged(tracer, joined(ids)) for ids in state_ids.values()]
    tracer.path_stack.append(group.name)
    compiler.interp.user_loc = optimizer.made_at  # the update is entered from here, not from the user's code
    try:
        result = compiler.interp.apply(optimizer.update, [flat_param, flat_grad, ctx, *flat_states])
    finally:
        tracer.path_stack.pop()
    values = list(result) if type(result) is MultipleValues else [result]
    new_param = compiler.lib.staged("optimizer-update", 1, values[0], flat_param.type)
    if new_param.type != flat_param.type:
        raise lisp_error("T001", f"optimizer {optimizer.name}: its update returned {new_param.type} for parameters {flat_param.type}; updates must keep the parameter's shape and dtype", "TYPE-ERROR")
    new_states = [compiler.lib.staged("optimizer-update", 1, v, flat_param.type) for v in values[1:]]

    def split(flat: Staged, key: str) -> None:
        start = 0
        for path, n in zip(paths, sizes):
            piece = flat.id if len(paths) == 1 else b.op("slice", flat.id, starts=[start], stops=[start + n])
            outputs[key.format(path=path)] = b.op("reshape", piece, shape=list(params[path].shape))
            start += n

    split(new_param, "param:{path}")
    for (name, _), value in zip(optimizer.states, new_states):
        split(value, "state:{path}:" + name)
