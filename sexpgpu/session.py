"""The one way to start a run: compile a file (or a bundle) with a selection, then hand it to
the runtime.

`sexpgpu run`, a local `sweep`, a Ray `TrainWorker` and a submitted job all start their runs
here. The session resolves the device once, compiles once, checks the memory plan, starts
the attempt, and turns whatever happens into one `AttemptOutcome` with its `Exit` code, so
the same failure reads the same on every path (docs/command-line.md, "Exit codes").
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Optional, Protocol, TypeVar, Union

from .bundle import BundleCompiles, BundleError, compile_unpacked, data_changed, unpacked
from .compile.pipeline import CompileResult, compile_file, compile_points, stream_points
from .ir.experiment import Experiment, Selection
from .lisp.diagnostics import Diagnostic, SourceMap
from .lisp.evaluator import Limits
from .lisp.program import Program as LispProgram
from .outcome import AttemptOutcome, Exit, refused
from .runtime.attempt import RunOptions, train
from .runtime.backend import Backend, DeviceError
from .runtime.checkpoint import ResumeError
from .runtime.data.fingerprint import fingerprinted
from .runtime.data.raw import has_protocol
from .runtime.data.spec import DataError
from .runtime.devices import DEVICE_FORMS, is_device_spec, is_host, open_device
from .runtime.memory import host_memory_problem
from .runtime.ranks import Collective
from .runtime.runfolder import FolderHeld, RunFolder, run_slug
from .runtime.stops import EarlyStop, StopRequests
from .runtime.threads import ThreadPlan, blas_threads, departs_from, pieces_in_use, plan_threads, products_library
from .runtime.store import DEFAULT_PATIENCE_S, Store, is_store_failure, store_problem

T = TypeVar("T")


class Reporter(Protocol):
    """Where a session's words go: the CLI prints them, a worker keeps none."""

    def say(self, text: str) -> None:
        """A progress line: the slug and the run folder, a resume, a warning."""

    def notice(self, text: str) -> None:
        """A note on the device: the NumPy fallback, how each program runs there, what
        compiling its kernels cost (not the run's results: stderr on the command line)."""

    def output(self, text: str) -> None:
        """What the run file itself prints while it is evaluated."""

    def diagnostics(self, diagnostics: list[Diagnostic], sources: SourceMap) -> None:
        """The compiler's diagnostics (the errors of a file that does not check included)."""

    def refusal(self, reason: str) -> None:
        """Why the attempt ends before training (a data error, a store, a device...)."""


class Silent:
    """A Reporter that keeps nothing: a worker's outcome carries what matters."""

    def say(self, text: str) -> None:
        pass

    def notice(self, text: str) -> None:
        pass

    def output(self, text: str) -> None:
        pass

    def diagnostics(self, diagnostics: list[Diagnostic], sources: SourceMap) -> None:
        pass

    def refusal(self, reason: str) -> None:
        pass


@dataclass(frozen=True)
class Settings:
    """What the user chose for the attempt, beyond the file and its selection."""

    store: str = "./runs"
    device: str = "cpu"  # cpu, cuda, cuda:N or auto; resolved once by the session
    max_steps: Optional[int] = None
    max_steps_by: str = "--max-steps"  # what sets max_steps (a sweep's halving rung), for a truncated run's reason
    resume: Optional[str] = None
    progress: bool = False
    signals: bool = True  # SIGINT/SIGTERM stop the attempt resumably (main thread only)
    limits: Optional[Limits] = None
    world: int = 1  # data-parallel ranks the programs are compiled for
    take_over: bool = False  # the run folder's last writer is known to be gone (a preempted attempt)
    data_roots: tuple[str, ...] = ()  # where loader sources may be read besides the project (--data-root)
    threads: Optional[int] = None  # the BLAS threads (--threads); None: the runtime's plan
    thread_share: Optional[int] = None  # the most cores the plan may give (a point of a sweep run side by side: sweep --jobs)
    fresh: bool = False  # --fresh: a new run, the slug's earlier folder kept as SLUG~N
    worker: Optional[str] = None  # who trains, for status.json (a Ray worker says which actor)
    store_patience_s: float = DEFAULT_PATIENCE_S  # how long a run waits for an unreachable store


@dataclass(frozen=True)
class Compiled:
    """A run file that checks and has a defrun: what the runtime trains, and its sources."""

    path: Path  # the run file (inside the unpacked bundle, for a bundle)
    experiment: Experiment
    program: LispProgram
    result: CompileResult

    def sources(self) -> dict[str, bytes]:
        """Every file the compile read, by its path relative to the run file's folder (what
        the run folder's source/ keeps)."""
        base = self.path.resolve().parent
        return {f.name if i == 0 else os.path.relpath(f, base): f.read_bytes() for i, f in enumerate(self.program.files)}


Prepared = Union[Compiled, AttemptOutcome]


class Session:
    """Attempts started with one Settings: the device is resolved when the session opens
    (every attempt of a local sweep shares it), each file is compiled once."""

    def __init__(self, settings: Settings, reporter: Optional[Reporter] = None, opened: Optional[tuple[str, Backend]] = None,
                 stores: Optional[Callable[[str], Store]] = None) -> None:
        """OPENED: the device SETTINGS name, opened before (a worker's, kept between its
        attempts: the kernels it loaded are not compiled again). STORES: how the stores are
        opened (a worker's KeptStores, its clients kept between its attempts); else Store.open."""
        self.settings = settings
        self.stores: Callable[[str], Store] = stores or Store.open
        self.reporter: Reporter = reporter or Silent()
        self.device = settings.device
        self.backend: Optional[Backend] = None
        if opened is not None:
            self.device, self.backend = opened
        self.stops: Optional[StopRequests] = None  # while the session listens for SIGINT/SIGTERM

    # -- the device -----------------------------------------------------------------------------
    def open_device(self) -> Optional[AttemptOutcome]:
        """Resolve `auto` and open the device; the refusal when this machine cannot."""
        if self.backend is not None:
            return None
        if not is_device_spec(self.settings.device):
            return self.refuse(Exit.USAGE, f"--device {self.settings.device}: use {DEVICE_FORMS}")
        try:
            self.device, self.backend = open_device(self.settings.device, self.reporter.notice)
        except DeviceError as exc:
            return self.refuse(Exit.CANNOT_START, f"cannot start here: {exc}")
        return None

    # -- compiling ------------------------------------------------------------------------------
    def compile(self, path: Path, selection: Selection) -> Prepared:
        result = self.interruptible(lambda: compile_file(path, selection, self.settings.limits, output=self.reporter.output, world=self.settings.world))
        return self.checked(path, result)

    def compile_sweep(self, path: Path, sweep: str, count: int, base: Optional[Selection] = None) -> tuple[list[Compiled], Optional[AttemptOutcome]]:
        """The COUNT points of SWEEP (on BASE's --variant and --set), compiled in order before
        any trains: the compiled points, and the refusal of the first one that does not check
        (then no later one is compiled)."""
        selections = [replace(base or Selection(), sweep=sweep, point=i) for i in range(count)]
        results = self.interruptible(lambda: compile_points(path, selections, self.settings.limits, output=self.reporter.output, world=self.settings.world))
        points: list[Compiled] = []
        for result in results:
            prepared = self.checked(path, result)
            if isinstance(prepared, AttemptOutcome):
                return points, prepared
            points.append(prepared)
        return points, None

    def stream_sweep(self, path: Path, sweep: str, count: int, base: Optional[Selection] = None) -> Iterator[tuple[int, Prepared]]:
        """compile_sweep's points as each is compiled (pipeline.stream_points: a shape group at
        a time, so the first points can train while later ones compile): (index, the compiled
        point or its refusal). Nothing is kept here once given."""
        selections = [replace(base or Selection(), sweep=sweep, point=i) for i in range(count)]
        for i, result in stream_points(path, selections, self.settings.limits, output=self.reporter.output, world=self.settings.world):
            yield i, self.checked(path, result)

    def with_bundle(self, location: str, then: Callable[[Compiled], AttemptOutcome], compiles: Optional[BundleCompiles] = None) -> AttemptOutcome:
        """Unpack the bundle at LOCATION into a temporary project, recompile it with its
        selection (another IR is refused), and THEN (train it, for instance); the temporary
        project is removed when THEN returns. With COMPILES (a worker's), the project is kept
        for the next points of its sweep, and a point whose shape group COMPILES compiled
        before is bound from it instead of compiled."""
        opened = unpacked(location) if compiles is None else compiles.unpacked(location)
        compile = compile_unpacked if compiles is None else compiles.compile
        try:
            with opened as bundle:
                result = self.interruptible(lambda: compile(bundle, world=self.settings.world))
                prepared = self.checked(bundle.main, result, bundle.manifest.slug)
                if isinstance(prepared, AttemptOutcome):
                    return prepared
                changed = data_changed(bundle.manifest, prepared.experiment)
                if changed is not None:
                    raise BundleError(changed, Exit.DATA)
                # run.json's `file` is the run file in the bundle, not in the temporary project
                # (gone once the attempt ends)
                file = self.stores(location).url_of(f"source/{bundle.manifest.main}")
                return then(replace(prepared, experiment=replace(prepared.experiment, file=file)))
        except BundleError as exc:
            return self.refuse(exc.code, f"bundle refused: {exc}")

    def checked(self, path: Path, result: CompileResult, slug: Optional[str] = None) -> Prepared:
        sources = result.program.sources if result.program is not None else SourceMap()
        self.reporter.diagnostics(result.diagnostics, sources)
        errors = [d for d in result.diagnostics if d.severity == "error"]
        if errors:
            # a selection naming what the file does not declare has no position: a usage error
            usage = all(d.code == "C004" and d.file is None for d in errors)
            return refused(Exit.USAGE if usage else Exit.CHECK_FAILED, "does not check: " + "; ".join(d.headline() for d in errors), slug)
        if result.experiment is None or result.program is None:
            return self.refuse(Exit.CHECK_FAILED, f"{path} is not a run file: it has no defrun (see `sexpgpu docs the-run-file`)", slug)
        # the slug covers the data: each loader's file is fingerprinted (a first read of a large
        # one takes a while, so a stop request ends the wait) once the file checks
        experiment = result.experiment
        return Compiled(path, self.interruptible(lambda: fingerprinted(experiment, self.data_roots())), result.program, result)

    # -- training -------------------------------------------------------------------------------
    def train(self, compiled: Compiled, ranks: Optional[Collective] = None, max_steps: Optional[int] = None,
              max_steps_by: Optional[str] = None, early_stop: Optional[EarlyStop] = None) -> AttemptOutcome:
        """Train COMPILED (as one of the data-parallel RANKS, when given); MAX_STEPS, set by
        MAX_STEPS_BY (a halving sweep's rung), instead of the session's --max-steps; EARLY_STOP:
        a sweep's scheduler, asked at its rungs whether the run goes on."""
        refusal = self.open_device()
        if refusal is not None:
            return refusal
        assert self.backend is not None
        slug = run_slug(compiled.experiment)
        problem = host_memory_problem(compiled.experiment) if is_host(self.device) else self.device_memory_problem(compiled.experiment)
        if problem is not None:
            return self.refuse(Exit.CANNOT_START, f"cannot start here: {problem}", slug)
        settings = self.settings
        recorded = None if settings.fresh else self.recorded_threads(slug)
        threads = plan_threads(compiled.experiment.module.programs.values(), settings.threads, share=settings.thread_share, recorded=recorded,
                               pieces=pieces_in_use(self.backend)).model_copy(update={"library": products_library(self.backend)})
        departure = departs_from(threads, recorded)
        if departure is not None:
            self.reporter.say(f"warning: {departure}")
        options = RunOptions(threads=threads, store=settings.store, device=self.device, backend=self.backend, stops=self.stops,
                             max_steps=max_steps if max_steps is not None else settings.max_steps,
                             max_steps_by=max_steps_by if max_steps is not None and max_steps_by else settings.max_steps_by,
                             progress=settings.progress, sources=compiled.sources(), resume=settings.resume,
                             signals=settings.signals, store_patience_s=settings.store_patience_s, ranks=ranks,
                             take_over=settings.take_over, data_roots=self.data_roots(), fresh=settings.fresh, worker=settings.worker,
                             notice=self.reporter.notice, early_stop=early_stop, stores=self.stores)
        with blas_threads(threads, self.backend):
            return self.guarded(slug, lambda: train(compiled.experiment, options, say=self.reporter.say))

    def recorded_threads(self, slug: str) -> Optional[ThreadPlan]:
        """The thread plan SLUG's earlier attempts recorded in run.json (an attempt that
        continues the run keeps its count, which changes the products' last bits), or None
        for a run not started yet."""
        try:
            folder = RunFolder(self.stores(self.settings.store), slug)
            return folder.read_run_info().threads if folder.exists() else None
        except ValueError:  # a run.json this sexpgpu cannot read: the attempt itself refuses it or starts over
            return None
        except Exception as exc:  # the store: the attempt itself will say what is wrong
            if not is_store_failure(exc):
                raise
            return None

    def failed_before(self, compiled: Compiled) -> Optional[AttemptOutcome]:
        """The outcome an earlier attempt of COMPILED's run ended with, when it failed (a
        sweep runs such a point again only when asked: --retry-failed)."""
        try:
            status = RunFolder(self.stores(self.settings.store), run_slug(compiled.experiment)).read_status()
        except Exception as exc:  # the store: the attempt itself will say what is wrong
            if not is_store_failure(exc):
                raise
            return None
        if status is None or status.state != "failed" or status.summary is None:
            return None
        return AttemptOutcome(exit_code=status.summary.exit_code, reason=status.summary.reason, slug=run_slug(compiled.experiment),
                              steps=status.step, final_loss=status.metrics.get("loss"))

    def run_file(self, path: Path, selection: Selection, max_steps: Optional[int] = None, max_steps_by: Optional[str] = None,
                 early_stop: Optional[EarlyStop] = None) -> AttemptOutcome:
        """`sexpgpu run FILE`: open the device, compile, train (to MAX_STEPS, set by
        MAX_STEPS_BY, for a point of a sweep run side by side: see train)."""
        with self.listening():
            try:
                prepared = self.open_device() or self.compile(path, selection)
            except Stopped as stop:
                return self.refuse(stop.outcome.exit_code, stop.outcome.reason)
            return prepared if isinstance(prepared, AttemptOutcome) else self.train(prepared, max_steps=max_steps, max_steps_by=max_steps_by, early_stop=early_stop)

    def run_bundle(self, location: str) -> AttemptOutcome:
        """`sexpgpu run BUNDLE`: the same, from a bundle."""
        with self.listening():
            try:
                return self.open_device() or self.with_bundle(location, self.train)
            except Stopped as stop:
                return self.refuse(stop.outcome.exit_code, stop.outcome.reason)

    @contextmanager
    def listening(self) -> Iterator[None]:
        """SIGINT/SIGTERM recorded for the whole block (when Settings.signals, on the main
        thread): a request while the session compiles ends it with 130/143 (nothing was
        written), one while it trains is the attempt's to honour (a checkpoint, then 75)."""
        if not self.settings.signals or self.stops is not None:
            yield
            return
        stops = StopRequests()
        with stops.listening():
            self.stops = stops
            try:
                yield
            finally:
                self.stops = None

    def interruptible(self, work: Callable[[], T]) -> T:
        """WORK's result; while the session listens, WORK runs on a thread of its own and a
        stop request ends the wait at once (Stopped; the abandoned thread ends with the
        process)."""
        stops = self.stops
        if stops is None or threading.current_thread() is not threading.main_thread():
            return work()
        done: list[T] = []
        failed: list[BaseException] = []

        def target() -> None:
            try:
                done.append(work())
            except BaseException as exc:  # handed back to the waiting thread
                failed.append(exc)

        worker = threading.Thread(target=target, name="sexpgpu-compile", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.05)
            if stops.signal is not None:
                raise Stopped(stops)
        if failed:
            raise failed[0]
        return done[0]

    def data_roots(self) -> tuple[str, ...]:
        """The declared data roots, and a URL store itself (its objects may be read)."""
        store = (self.settings.store,) if has_protocol(self.settings.store) else ()
        return (*self.settings.data_roots, *store)

    def device_memory_problem(self, experiment: Experiment) -> Optional[str]:
        from .runtime.devices import free_device_memory
        from .runtime.memory import device_memory_problem

        return device_memory_problem(experiment, free_device_memory())

    # -- outcomes -------------------------------------------------------------------------------
    def guarded(self, slug: Optional[str], attempt: Callable[[], AttemptOutcome]) -> AttemptOutcome:
        """ATTEMPT's outcome; the failures that end it before its end, mapped to theirs."""
        try:
            return attempt()
        except DataError as exc:
            return self.refuse(Exit.DATA, f"data error: {exc}", slug)
        except ResumeError as exc:
            return self.refuse(Exit.RESUME_REFUSED, f"resume refused: {exc}", slug)
        except (DeviceError, FolderHeld) as exc:
            return self.refuse(Exit.CANNOT_START, f"cannot start here: {exc}", slug)
        except Exception as exc:
            if not is_store_failure(exc):
                raise
            return self.refuse(Exit.CANNOT_START, f"cannot start here: {store_problem(self.settings.store, exc)}", slug)

    def refuse(self, code: Exit, reason: str, slug: Optional[str] = None) -> AttemptOutcome:
        self.reporter.refusal(reason)
        return refused(code, reason, slug)

class Stopped(Exception):
    """A stop request arrived before the attempt wrote anything: its outcome (130 or 143)."""

    def __init__(self, stops: StopRequests) -> None:
        super().__init__(stops.name)
        code = Exit.INTERRUPTED if stops.signal == signal.SIGINT else Exit.TERMINATED
        self.outcome = refused(code, f"stopped by {stops.name} before training: nothing was written")


def store_check(url: str) -> Optional[str]:
    """Before anything is sent to a cluster: the store takes a write and reads it back. The
    problem when it does not, in the words an attempt would end with."""
    from .runtime.store import Store

    probe = f".sexpgpu-probe-{os.getpid()}-{threading.get_ident()}"
    try:
        store = Store.open(url)
        store.write_text(probe, "ok")
        back = store.read_text(probe)
        store.delete(probe)
    except Exception as exc:
        if not is_store_failure(exc):
            raise
        return store_problem(url, exc)
    return None if back == "ok" else f"the store {url} read back something else than it was given"
