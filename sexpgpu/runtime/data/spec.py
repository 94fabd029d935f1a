"""What the compiler hands the data layer (loader specs), the data error, and a prepared dataset."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ...ir.dtypes import DType
from ...ir.experiment import LoaderRecord
from ...records import dump

MASK_FIELD = "__mask__"



class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FieldSpec(_Spec):
    name: str
    dtype: DType
    shape: tuple[int, ...]  # per example

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class SourceSpec(_Spec):
    kind: str  # one of ir/data_options.py's SOURCES, checked by load_dataset
    url: Optional[str] = None
    options: dict[str, Any] = {}


class PrepareStep(_Spec):
    kind: str  # one of ir/data_options.py's PREPARE_STEPS, checked by load_dataset
    options: dict[str, Any] = {}


class LoaderSpec(_Spec):
    name: str
    source: SourceSpec
    prepare: list[PrepareStep] = []
    fields: list[FieldSpec] = Field(min_length=1)
    batch: int = Field(gt=0)
    shuffle: bool = False
    seed: int = 0
    part: Optional[str] = None  # "train" or "val" (checked when a split selects it)
    base_dir: str = "."
    # where sources may be read: the project root, and the data roots the user declared
    # (folders, or URL prefixes such as the store's); empty: anywhere (tests of the data layer)
    roots: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _distinct_fields(self) -> "LoaderSpec":
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"loader {self.name!r}: field names repeat: {names}")
        if MASK_FIELD in names:
            raise ValueError(f"loader {self.name!r}: {MASK_FIELD!r} is reserved for the evaluation mask")
        for f in self.fields:
            if any(d < 1 for d in f.shape):
                raise ValueError(f"loader {self.name!r}: field {f.name!r} has a dimension < 1: {f.shape}")
        return self

    def resolved_part(self) -> str:
        """The part a split selects: spec.part, else "train" for the loader named train, else "val"."""
        if self.part is not None:
            return self.part
        return "train" if self.name == "train" else "val"


class DataError(Exception):
    """The data is missing, unreadable or does not match the declared fields: what and where.

    The CLI maps it to exit code 5. The location parts are kept separately so that callers
    higher up (load_dataset) can fill in the loader name without rewording the message.
    """

    def __init__(
        self,
        what: str,
        *,
        source: Optional[str] = None,
        line: Optional[int] = None,
        example: Optional[int] = None,
        field: Optional[str] = None,
        loader: Optional[str] = None,
    ) -> None:
        self.what = what
        self.source = source
        self.line = line
        self.example = example
        self.field = field
        self.loader = loader
        super().__init__(what)

    def where(self) -> str:
        place = " ".join(
            part
            for part in (
                self.source,
                f"line {self.line}" if self.line is not None else None,
                f"example {self.example}" if self.line is None and self.example is not None else None,
            )
            if part
        )
        if self.field is not None:
            place = f"{place}, field '{self.field}'" if place else f"field '{self.field}'"
        if self.loader is not None:
            place = f"loader '{self.loader}': {place}" if place else f"loader '{self.loader}'"
        return place

    def __str__(self) -> str:
        place = self.where()
        return f"{place}: {self.what}" if place else self.what

    def __reduce__(self) -> Any:
        # Keyword-only state survives pickling (errors cross process boundaries under Ray).
        state = dict(source=self.source, line=self.line, example=self.example, field=self.field, loader=self.loader)
        return (_rebuild_error, (self.what, state))


def _rebuild_error(what: str, state: dict[str, Any]) -> DataError:
    return DataError(what, **state)


@dataclass
class Dataset:
    """Prepared examples: every field's leading axis is the example, dtype/shape as declared."""

    fields: dict[str, np.ndarray]
    n: int
    content_hash: str
    vocab: Optional[list[str]] = None
    meta: dict[str, Any] = field(default_factory=dict)

    def example_hashes(self) -> list[str]:
        """One sha256 per example over all its fields, to compare loaders for shared examples."""
        arrays = [np.ascontiguousarray(a) for a in self.fields.values()]
        return [hashlib.sha256(b"".join(a[i].tobytes() for a in arrays)).hexdigest() for i in range(self.n)]


def hash_arrays(fields: dict[str, np.ndarray]) -> str:
    """sha256 over names, dtypes, shapes and bytes of the arrays, in order."""
    digest = hashlib.sha256()
    for name, array in fields.items():
        digest.update(f"{name}|{array.dtype.name}|{array.shape};".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def shared_examples(reference: Dataset, other: Dataset) -> list[int]:
    """Indices of OTHER's examples that also occur in REFERENCE (same bytes in every field)."""
    seen = set(reference.example_hashes())
    return [i for i, h in enumerate(other.example_hashes()) if h in seen]


def loader_spec(record: LoaderRecord, seed: int, data_roots: tuple[str, ...] = ()) -> LoaderSpec:
    """What the data layer needs of a compiled loader, with the run's seed."""
    return LoaderSpec(
        name=record.name,
        source=SourceSpec.model_validate(dump(record.source, mode="python")),
        prepare=[PrepareStep.model_validate(dump(p, mode="python")) for p in record.prepare],
        fields=[FieldSpec(name=f.name, dtype=DType(f.dtype), shape=tuple(f.shape)) for f in record.fields],
        batch=record.batch,
        shuffle=record.shuffle,
        seed=seed,
        part=record.part,
        base_dir=record.base_dir,
        roots=(record.root or record.base_dir, *data_roots),
    )
