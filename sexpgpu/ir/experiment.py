"""The compiled experiment: everything the runtime needs, as pydantic records (so bundles
and workers can carry it as JSON). It lives beside the IR because the runtime reads it
without knowing the compiler."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, Field

from .dtypes import DType
from .graph import Module


class InitSpec(BaseModel):
    """How a parameter's initial values are drawn (deterministically from the run seed and
    the parameter path; see runtime/init.py)."""

    kind: Literal["zeros", "ones", "constant", "normal", "uniform", "trunc-normal", "xavier", "kaiming"]
    mean: float = 0.0
    std: Optional[float] = None
    low: float = -1.0
    high: float = 1.0
    value: float = 0.0
    gain: float = 1.0

    def lisp_print(self) -> str:
        return f"#<init {self.kind}>"


class ParamSpec(BaseModel):
    path: str
    shape: tuple[int, ...]
    dtype: DType = DType.f32
    init: InitSpec
    tied_to: Optional[str] = None


class Selection(BaseModel):
    """What varies a run from outside the file: --variant, --set, --sweep/--point."""

    variant: Optional[str] = None
    set: dict[str, str] = Field(default_factory=dict)
    sweep: Optional[str] = None
    point: Optional[int] = None


class KnobSpec(BaseModel):
    name: str
    default: Any
    value: Any
    type: Optional[str] = None
    doc: Optional[str] = None


class FieldRecord(BaseModel):
    name: str
    dtype: str
    shape: tuple[int, ...]


class LoaderRecord(BaseModel):
    name: str
    source: dict[str, Any]
    prepare: list[dict[str, Any]] = Field(default_factory=list)
    fields: list[FieldRecord]
    batch: int
    shuffle: bool = False
    part: Optional[str] = None
    base_dir: str = "."


class StateSpec(BaseModel):
    name: str
    init: InitSpec


class GroupSpec(BaseModel):
    name: str
    selector: str
    optimizer: Optional[str]  # None: frozen
    params: list[str]
    states: list[StateSpec] = Field(default_factory=list)


class EvalSpec(BaseModel):
    """(defeval NAME :loader L :every N :at :end): a pass over a whole loader."""

    name: str
    loader: str
    every: Optional[int] = None
    at_end: bool = False
    overlap: bool = False  # declared: this loader may share examples with train
    metrics: list[str] = Field(default_factory=list)


class TargetSpec(BaseModel):
    """(deftarget EVAL METRIC :<= VALUE): the run stops, successful, when it first holds."""

    eval: str
    metric: str
    test: Literal["<=", ">=", "<", ">"]
    value: float

    def holds(self, observed: float) -> bool:
        return {"<=": observed <= self.value, ">=": observed >= self.value, "<": observed < self.value, ">": observed > self.value}[self.test]


class RunSpec(BaseModel):
    steps: int
    seed: int = 0
    log_every: int = 10
    microbatches: int = 1  # gradient accumulation: the loader's batch is per microbatch
    clip: Optional[float] = None
    meta: dict[str, Any] = Field(default_factory=dict)


class Experiment(BaseModel):
    file: str
    file_stem: str
    selection: Selection
    knobs: list[KnobSpec]
    params: list[ParamSpec]
    loaders: dict[str, LoaderRecord]
    groups: list[GroupSpec]
    run: RunSpec
    metrics: list[str]
    evals: list[EvalSpec] = Field(default_factory=list)
    ties: dict[str, str] = Field(default_factory=dict)  # tied place -> the parameter it reads ("T" suffix: transposed)
    targets: list[TargetSpec] = Field(default_factory=list)
    module: Module
    ir_hash: str
    source_hash: str

    def knob_values(self) -> dict[str, Any]:
        return {k.name: k.value for k in self.knobs}
