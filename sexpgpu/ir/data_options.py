"""The options of every data source and prepare step, declared once.

The compiler checks a defloader's :source and :prepare against this table at `check`, with
the position of the offending option; the data layer checks the same table before it reads
anything (for a loader record that reached it another way), with the same messages. Values
are the plain data the records carry (lisp/data.py's as_data): numbers, strings, a keyword
as ":name", a symbol as "name", a plist as a dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional

Kind = Literal["positive-integer", "integer", "number", "fraction", "string", "field", "plist"]

KIND_TEXT: dict[str, str] = {
    "positive-integer": "a positive integer",
    "integer": "an integer",
    "number": "a number",
    "fraction": "a fraction F with 0 < F < 1",
    "string": "a string",
    "field": "the name of a declared field",
    "plist": "a quoted plist such as '(:field \"name\")",
}


@dataclass(frozen=True)
class Option:
    name: str
    kind: Kind
    required: bool = False
    default: Optional[str] = None  # what it is when left out, in words

    def describe(self) -> str:
        """`:train, a fraction F with 0 < F < 1 (required)`, as the lists of options show it."""
        when = "required" if self.required else f"default: {self.default}" if self.default else "optional"
        return f":{self.name}, {KIND_TEXT[self.kind]} ({when})"


@dataclass(frozen=True)
class Declared:
    """A source kind or a prepare step: its options, and how it is written."""

    name: str
    options: tuple[Option, ...]
    written: str  # the form, as the docs and the messages show it
    positional: Optional[str] = None  # the option its first argument is, as (normalize FIELD)

    def option(self, name: str) -> Optional[Option]:
        return next((o for o in self.options if o.name == name), None)

    def listing(self) -> str:
        return "; ".join(o.describe() for o in self.options) if self.options else "none"


PREPARE_STEPS: dict[str, Declared] = {
    step.name: step
    for step in (
        Declared("char-vocab", (), "(char-vocab)"),
        Declared("windows", (Option("length", "positive-integer", required=True), Option("stride", "positive-integer", default="the length")), "(windows :length L [:stride S])"),
        Declared("split", (Option("train", "fraction", required=True), Option("seed", "integer", default="0")), "(split :train F [:seed S])"),
        Declared("normalize", (Option("field", "field", required=True),), "(normalize FIELD)", positional="field"),
    )
}

SYNTHETIC_NAMES = ("spirals", "moons", "blobs", "linear")

SOURCES: dict[str, Declared] = {
    source.name: source
    for source in (
        Declared("synthetic", (Option("n", "positive-integer", required=True), Option("classes", "positive-integer", default="3 (2 for moons)"),
                               Option("seed", "integer", default="0"), Option("noise", "number", default="the generator's"),
                               Option("dim", "positive-integer", default="the inputs field's size")), "(synthetic :NAME :n N ...)", positional="name"),
        Declared("npz", (Option("map", "plist"),), '(npz "file.npz" [:map \'(:field "array")])'),
        Declared("npy", (Option("field", "field"),), '(npy "file.npy" [:field NAME])'),
        Declared("csv", (Option("columns", "plist"), Option("delimiter", "string", default='","')), '(csv "file.csv" [:columns ...] [:delimiter ";"])'),
        Declared("jsonl", (), '(jsonl "file.jsonl")'),
        Declared("text", (), '(text "file.txt")'),
    )
}


@dataclass(frozen=True)
class Problem:
    """What is wrong with one source or step: the option it concerns (None: the form
    itself), whether its value (rather than its name) is at fault, and the message."""

    option: Optional[str]
    message: str
    at_value: bool = False


def step_problem(kind: str, options: dict[str, Any], fields: list[str]) -> Optional[Problem]:
    """The first problem of the prepare step KIND with OPTIONS, for a loader whose declared
    fields are FIELDS; None when it is well formed."""
    step = PREPARE_STEPS.get(kind)
    if step is None:
        steps = ", ".join(s.written for s in PREPARE_STEPS.values())
        return Problem(None, f"unknown prepare step ({kind}); the steps are {steps}")
    return options_problem(step, f"({kind})", options, fields)


def source_problem(kind: str, options: dict[str, Any], fields: list[str]) -> Optional[Problem]:
    """The first problem of a source of KIND with OPTIONS (synthetic's name among them)."""
    source = SOURCES.get(kind)
    if source is None:
        return Problem(None, f"unknown source kind {kind}; the sources are {', '.join(SOURCES)}")
    if kind == "synthetic":
        name = options.get("name")
        if name not in SYNTHETIC_NAMES:
            return Problem("name", f"(synthetic): unknown data set :{name}; the data sets are {', '.join(':' + n for n in SYNTHETIC_NAMES)}", at_value=True)
        options = {k: v for k, v in options.items() if k != "name"}
    return options_problem(source, f"a {kind} source", options, fields)


def options_problem(declared: Declared, what: str, options: dict[str, Any], fields: list[str]) -> Optional[Problem]:
    for name in options:
        if declared.option(name) is None:
            return Problem(name, f"{what}: unknown option :{name}; its options are: {declared.listing()}")
    for option in declared.options:
        if option.name not in options:
            if option.required:
                return Problem(None, f"{what} needs :{option.name}, {KIND_TEXT[option.kind]}; write {declared.written}")
            continue
        wrong = value_problem(option, options[option.name], fields)
        if wrong is not None:
            return Problem(option.name, f"{what}: :{option.name} must be {wrong}", at_value=True)
    return None


def value_problem(option: Option, value: Any, fields: list[str]) -> Optional[str]:
    """What VALUE should have been, when it is not a value of OPTION's kind."""
    if fits(option.kind, value, fields):
        return None
    if option.kind == "field":
        return f"{KIND_TEXT['field']} ({', '.join(fields)}), got {value if isinstance(value, str) else shown(value)}"
    return f"{KIND_TEXT[option.kind]}, got {shown(value)}"


def fits(kind: Kind, value: Any, fields: list[str]) -> bool:
    integer = isinstance(value, int) and not isinstance(value, bool)
    number = integer or isinstance(value, float)
    if kind == "positive-integer":
        return integer and value >= 1
    if kind == "integer":
        return integer
    if kind == "number":
        return number
    if kind == "fraction":
        return number and 0.0 < value < 1.0
    if kind == "string":
        return isinstance(value, str)
    if kind == "field":
        return isinstance(value, str) and value in fields
    return isinstance(value, dict)


def shown(value: Any) -> str:
    """A record's value as the Lisp wrote it."""
    if value is None:
        return "nil"
    if value is True:
        return "t"
    if isinstance(value, str):
        return value if value.startswith(":") else repr(value).replace("'", '"')
    if isinstance(value, list):
        return "(" + " ".join(shown(v) for v in value) + ")"
    if isinstance(value, dict):
        return "(" + " ".join(f":{k} {shown(v)}" for k, v in value.items()) + ")"
    return str(value)
