"""What a run file declares, as compile-time objects: parameters, models, optimizers, and
the initializer specs (records that cross into the runtime are in ir/experiment.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

from ..ir.dtypes import DType
from ..ir.experiment import InitSpec, ParamSpec
from ..lisp.builtins import to_lisp_list


@dataclass(eq=False)
class Param:
    path: str
    shape: tuple[int, ...]
    dtype: DType
    init: InitSpec
    tie: Optional[tuple["Param", bool]] = None  # (source, transposed): this place reads source

    def lisp_print(self) -> str:
        dims = ",".join(map(str, self.shape))
        return f"#<param {self.path} {self.dtype.value}[{dims}]>"

    def spec(self) -> ParamSpec:
        return ParamSpec(path=self.path, shape=self.shape, dtype=self.dtype, init=self.init)

    def source(self) -> "Param":
        return self.tie[0].source() if self.tie is not None else self


@dataclass(eq=False)
class Model:
    type_name: str
    path: str
    params: dict[str, Param] = field(default_factory=dict)
    parts: dict[str, "Part"] = field(default_factory=dict)
    forward: Any = None

    def lisp_print(self) -> str:
        return f"#<model {self.type_name} {self.path or '(top)'}>"

    def all_params(self) -> list[Param]:
        return [p for p in self.places() if p.tie is None]

    def places(self) -> list[Param]:
        """Every parameter place of the model and its parts, tied ones included."""
        out = list(self.params.values())
        for part in self.parts.values():
            if isinstance(part, (Model, ModelList)):
                out.extend(part.places())
        return out

    def children(self) -> list[Union["Model", "ModelList"]]:
        return [part for part in self.parts.values() if isinstance(part, (Model, ModelList))]


@dataclass(eq=False)
class ModelList:
    """`(repeat n (ctor ...))`, or a list of models a defpart collected: parts named
    0..n-1; calling it applies each in turn. Lisp code sees it as a list of its parts
    (`elements`), so dolist, nth, length and mapcar work on it."""

    path: str
    models: list[Any] = field(default_factory=list)
    elements: Any = None  # the Lisp list of the parts, made once so it stays eq to itself

    def lisp_print(self) -> str:
        return f"#<repeat {len(self.models)} {self.path}>"

    def as_list(self) -> Any:
        if self.elements is None:
            self.elements = to_lisp_list(list(self.models))
        return self.elements

    def all_params(self) -> list[Param]:
        return [p for p in self.places() if p.tie is None]

    def places(self) -> list[Param]:
        out: list[Param] = []
        for m in self.children():
            out.extend(m.places())
        return out

    def children(self) -> list[Union[Model, "ModelList"]]:
        return [m for m in self.models if isinstance(m, (Model, ModelList))]


def rebase(part: Union[Model, ModelList], old: str, new: str, seen: set[int]) -> None:
    """Move PART and everything under it from path OLD to path NEW (OLD.x becomes NEW.x);
    an object met twice (a model shared by two parts) moves once."""
    if id(part) in seen:
        return
    seen.add(id(part))
    part.path = moved(part.path, old, new)
    if isinstance(part, Model):
        for param in part.params.values():
            if id(param) not in seen:
                seen.add(id(param))
                param.path = moved(param.path, old, new)
    for child in part.children():
        rebase(child, old, new, seen)


def moved(path: str, old: str, new: str) -> str:
    return new + path[len(old):] if path == old or path.startswith(old + ".") else path


Part = Union[Model, ModelList, Any]


@dataclass(eq=False)
class Optimizer:
    """What `(optim:adamw :lr ...)` returns: its state slots and its traced update."""

    name: str
    states: list[tuple[str, InitSpec]]
    update: Any  # a Lisp closure (param grad ctx state...) -> (values new-param new-state...)
    made_at: Any = None  # the user's call that made it (a Loc): where errors in its update are reported

    def lisp_print(self) -> str:
        return f"#<optimizer {self.name}>"


class Frozen:
    def lisp_print(self) -> str:
        return "#<frozen>"


@dataclass
class Group:
    name: str
    selector: str
    optimizer: Optional[Optimizer]  # None: frozen
    params: list[str] = field(default_factory=list)


@dataclass
class Batch:
    """The value a defobjective/defevaluate receives: its fields are staged data inputs."""

    loader: str
    fields: dict[str, Any]

    def lisp_print(self) -> str:
        return f"#<batch {self.loader}>"


@dataclass
class Ctx:
    """`ctx` inside an optimizer update or schedule: staged scalars read at run time."""

    values: dict[str, Any]

    def lisp_print(self) -> str:
        return "#<ctx>"
