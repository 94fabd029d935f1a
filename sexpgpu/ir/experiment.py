"""The compiled experiment: everything the runtime needs, as records (dataclasses that
sexpgpu/records.py validates and writes as JSON, so bundles and workers can carry them). It
lives beside the IR because the runtime reads it without knowing the compiler."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, Optional

from ..records import as_floats, plain
from .dtypes import DType
from .graph import Module, Program


InitKind = Literal["zeros", "ones", "constant", "normal", "uniform", "trunc-normal", "xavier", "kaiming"]
TargetTest = Literal["<=", ">=", "<", ">"]


@dataclass(kw_only=True, slots=True)
class InitSpec:
    """How a parameter's initial values are drawn (deterministically from the run seed and
    the parameter path; see runtime/init.py)."""

    kind: InitKind
    mean: float = 0.0
    std: Optional[float] = None
    low: float = -1.0
    high: float = 1.0
    value: float = 0.0
    gain: float = 1.0

    def __post_init__(self) -> None:
        as_floats(self, "mean", "std", "low", "high", "value", "gain")

    def lisp_print(self) -> str:
        return f"#<init {self.kind}>"


@dataclass(kw_only=True, slots=True)
class ParamSpec:
    path: str
    shape: tuple[int, ...]
    dtype: DType = DType.f32
    init: InitSpec
    tied_to: Optional[str] = None

    def __post_init__(self) -> None:
        self.shape = tuple(self.shape)
        self.dtype = DType(self.dtype)


@dataclass(kw_only=True, slots=True)
class Selection:
    """What varies a run from outside the file: --variant, --set, --sweep/--point."""

    variant: Optional[str] = None
    set: dict[str, str] = field(default_factory=dict)
    sweep: Optional[str] = None
    point: Optional[int] = None


Scheduler = Literal["sync", "asha", "median"]
HalvingMode = Literal["min", "max"]


@dataclass(kw_only=True, slots=True)
class Halving:
    """defsweep :halving (:metric EVAL/METRIC :mode :min :rungs (100 300 900) :keep 1/3
    :scheduler :sync): early stopping at rungs (step counts), decided by a scheduler
    (sexpgpu/sweeps/schedulers.py). :sync, successive halving: the points that reached a
    rung are ranked by the metric's value there; the best fraction KEEP (at least one) goes
    on, the rest are pruned. :asha decides each point as it reaches the rung, among the
    points decided there before it; :median stops a point worse than the median of the
    others' values at the rung. Decided from the runs' results in the store, so a re-run of
    the sweep decides alike."""

    metric: str  # EVAL/METRIC, e.g. val/loss
    mode: HalvingMode
    rungs: list[int]
    keep: float  # 0 < keep < 1 (the median rule: 1/2)
    keep_text: str  # as the file writes it, e.g. 1/3
    scheduler: Scheduler = "sync"

    def __post_init__(self) -> None:
        as_floats(self, "keep")

    @property
    def eval(self) -> str:
        return self.metric.split("/", 1)[0]

    def kept(self, ranked: int) -> int:
        """How many of RANKED points at a rung go on: floor(ranked * keep), at least one."""
        return max(1, int(ranked * self.keep + 1e-9))


@dataclass(kw_only=True, slots=True)
class KnobSpec:
    name: str
    default: Any
    value: Any
    type: Optional[str] = None
    doc: Optional[str] = None


@dataclass(kw_only=True, slots=True)
class FieldRecord:
    name: str
    dtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        self.shape = tuple(self.shape)


@dataclass(kw_only=True, slots=True)
class StageRecord:
    """A named alternative shape of a loader (:stages ((name :batch B :length L) ...))."""

    name: str
    batch: Optional[int] = None
    length: Optional[int] = None


@dataclass(kw_only=True, slots=True)
class SourceRecord:
    """A loader's :source, as (synthetic :spirals ...), (npz "file.npz") and friends state it."""

    kind: str
    url: Optional[str] = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True, slots=True)
class SourceFingerprint:
    """What a loader's file or URL held when the run was made: its size and a hash of its
    content (a local file's sha256, an object's ETag). The slug is made from it, so changed
    data is a new run (docs/run.md, "The slug"); run.json records it, so a resume across
    changed data can name the file (runtime/data/fingerprint.py computes it)."""

    source: str  # the file or URL, resolved (named in messages; not part of the slug)
    bytes: Optional[int] = None
    sha256: Optional[str] = None
    etag: Optional[str] = None
    problem: Optional[str] = None  # why it could not be read: the loader says so when it runs (exit 5)

    def identity(self) -> dict[str, Any]:
        """The part the slug is made from: the content, not where it lies."""
        return {"bytes": self.bytes, "sha256": self.sha256, "etag": self.etag, "readable": self.problem is None}

    def describe(self) -> str:
        if self.problem is not None:
            return f"unreadable: {self.problem}"
        digest = f"sha256 {self.sha256[:12]}" if self.sha256 else f"ETag {self.etag}"
        return f"{self.bytes:,} bytes, {digest}" if self.bytes is not None else digest


@dataclass(kw_only=True, slots=True)
class PrepareRecord:
    """One step of a loader's :prepare, such as (windows :length 17)."""

    kind: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True, slots=True)
class LoaderRecord:
    name: str
    source: SourceRecord
    prepare: list[PrepareRecord] = field(default_factory=list)
    fields: list[FieldRecord]
    batch: int
    shuffle: bool = False
    part: Optional[str] = None
    base_dir: str = "."  # the run file's folder: relative sources resolve against it
    root: str = ""  # the project root: local sources must stay inside it or a declared data root
    stages: list[StageRecord] = field(default_factory=list)

    def staged(self, stage: Optional[str]) -> "LoaderRecord":
        """This loader as STAGE reshapes it: a new batch and/or window length. With a new
        length L, the windows step cuts L tokens and each 1-D field that took a window (of
        the old length, or one less in the language-model convention) takes the new one."""
        if stage is None:
            return self
        spec = next((s for s in self.stages if s.name == stage), None)
        if spec is None:
            raise ValueError(f"loader {self.name} has no stage {stage}")
        update: dict[str, Any] = {"stages": []}
        if spec.batch is not None:
            update["batch"] = spec.batch
        if spec.length is not None:
            old = next((int(p.options.get("length", 0)) for p in self.prepare if p.kind == "windows"), None)
            if old is None:
                raise ValueError(f"loader {self.name}: stage {stage} sets :length but the loader has no (windows ...) step")
            update["prepare"] = [
                replace(p, options={**p.options, "length": spec.length}) if p.kind == "windows" else p for p in self.prepare
            ]
            update["fields"] = [
                replace(f, shape=(spec.length - (old - f.shape[0]),)) if len(f.shape) == 1 and old - f.shape[0] in (0, 1) else f
                for f in self.fields
            ]
        return replace(self, **update)


@dataclass(kw_only=True, slots=True)
class StateSpec:
    name: str
    init: InitSpec


@dataclass(kw_only=True, slots=True)
class GroupSpec:
    name: str
    selector: str
    optimizer: Optional[str]  # None: frozen
    params: list[str]
    states: list[StateSpec] = field(default_factory=list)


@dataclass(kw_only=True, slots=True)
class EvalSpec:
    """(defeval NAME :loader L :every N :at :end): a pass over a whole loader."""

    name: str
    loader: str
    every: Optional[int] = None
    at_end: bool = False
    overlap: bool = False  # declared: this loader may share examples with train
    metrics: list[str] = field(default_factory=list)


@dataclass(kw_only=True, slots=True)
class TargetSpec:
    """(deftarget EVAL METRIC :<= VALUE): the run stops, successful, when it first holds."""

    eval: str
    metric: str
    test: TargetTest
    value: float

    def __post_init__(self) -> None:
        as_floats(self, "value")

    def holds(self, observed: float) -> bool:
        return {"<=": observed <= self.value, ">=": observed >= self.value, "<": observed < self.value, ">": observed > self.value}[self.test]


@dataclass(kw_only=True, slots=True)
class CurriculumSpec:
    """defcurriculum: the starting stage of each loader, and rules (programs "curriculum"
    output rule:I booleans) whose stages apply, later rules winning, at step boundaries."""

    start: dict[str, str] = field(default_factory=dict)
    rules: list[dict[str, str]] = field(default_factory=list)


@dataclass(kw_only=True, slots=True)
class DiagnosticsSpec:
    """defrun :diagnostics: which names to compute, on which steps. Names in the IR (act/,
    defdiagnostic taps) are outputs of the train:diagnostics program; grad-norm/,
    param-norm/, update-ratio/ and optim/ are computed by the loop from values it has."""

    every: int
    select: list[str]
    ir_names: list[str] = field(default_factory=list)


@dataclass(kw_only=True, slots=True)
class CheckpointPolicy:
    every: Optional[int] = None  # steps between checkpoints; a final one is always written
    keep: int = 3


@dataclass(kw_only=True, slots=True)
class FiniteGuard:
    """:finite-guard (:skip N :rollback t :lr-scale S): skip up to N non-finite steps in a
    row; then roll back to the last checkpoint (scaling the learning rate by S) once; then
    stop (exit 1)."""

    skip: int = 0
    rollback: bool = False
    lr_scale: Optional[float] = None

    def __post_init__(self) -> None:
        as_floats(self, "lr_scale")


@dataclass(kw_only=True, slots=True)
class RunSpec:
    steps: int
    seed: int = 0
    log_every: int = 10
    microbatches: int = 1  # gradient accumulation: the loader's batch is per microbatch
    precision: Literal["f32", "bf16"] = "f32"
    checkpoint: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    finite_guard: FiniteGuard = field(default_factory=FiniteGuard)
    diagnostics: Optional[DiagnosticsSpec] = None
    clip: Optional[float] = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        as_floats(self, "clip")


# defrun options and evaluation settings that say how long to train or how often to record,
# not what is computed: they stay out of the slug (Experiment.identity_hash)
RECORDING_ONLY = ("steps", "log_every", "checkpoint", "diagnostics", "meta")
EVAL_CADENCE = ("every", "at_end")


@dataclass(kw_only=True, slots=True)
class Experiment:
    file: str
    file_stem: str
    selection: Selection
    knobs: list[KnobSpec]
    params: list[ParamSpec]
    loaders: dict[str, LoaderRecord]
    groups: list[GroupSpec]
    run: RunSpec
    metrics: list[str]
    evals: list[EvalSpec] = field(default_factory=list)
    curriculum: Optional[CurriculumSpec] = None
    ties: dict[str, str] = field(default_factory=dict)  # tied place -> the parameter it reads ("T" suffix: transposed)
    targets: list[TargetSpec] = field(default_factory=list)
    module: Module
    # data parallel: each rank's train programs at batch/world (not part of the identity)
    rank_programs: dict[str, Program] = field(default_factory=dict)
    world: int = 1
    ir_hash: str
    source_hash: str
    # each loader's file or URL, by loader name (runtime/data/fingerprint.py); None until the
    # session fingerprints them: `check` and `compile` read no data
    data_sources: Optional[dict[str, SourceFingerprint]] = None

    def knob_values(self) -> dict[str, Any]:
        return {k.name: k.value for k in self.knobs}

    def identity_hash(self, with_data: bool = True) -> str:
        """What makes two runs the same run: everything that changes the numbers it computes
        (the programs but the diagnostics variant, the loaders and the content of their
        files (data_sources; left out WITH_DATA false: what a resume across changed data
        compares), parameters, groups,
        :seed, :microbatches, :precision, :clip, the finite guard, evaluations' loaders and
        metrics, targets, curriculum; the knob values join it in the slug), without source
        positions or the folder the file sits in. Left out is what says only how long to
        train or how often to record (RECORDING_ONLY), so raising :steps or adding a
        diagnostic continues the same run folder (docs/run.md, "The slug")."""
        import hashlib
        import json

        def without(record: Any, names: tuple[str, ...]) -> dict[str, Any]:
            return {k: v for k, v in plain(record).items() if k not in names}

        loaders = {name: without(record, ("base_dir", "root")) for name, record in self.loaders.items()}
        data = {
            "ir": self.module.numbers_hash(),
            "loaders": loaders,
            "params": [plain(p) for p in self.params],
            "groups": [plain(g) for g in self.groups],
            "run": without(self.run, RECORDING_ONLY),
            "evals": [without(e, EVAL_CADENCE) for e in self.evals],
            "targets": [plain(t) for t in self.targets],
            "curriculum": plain(self.curriculum) if self.curriculum else None,
            "ties": self.ties,
        }
        if with_data and self.data_sources:  # no file sources (synthetic data): the options say it all
            data["data"] = {name: source.identity() for name, source in self.data_sources.items()}
        return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
