"""`require`: standard modules from sexpgpu/lib/, relative libraries inside the project root.

Each module is read and evaluated once per compile into its own symbol table (its own scope);
its top-level definitions, except names starting with `%`, are its exports.
"""

from __future__ import annotations

import hashlib
import os
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Optional

from .conditions import lisp_error
from .diagnostics import SourceMap
from .printer import prin1_to_string
from .reader import decode_source
from .hints import did_you_mean
from .types import MODULE_NAME_CUTOFF, NIL, Cons, Symbol, SymbolTable

if TYPE_CHECKING:
    from .evaluator import Interpreter

STANDARD_PREFIX = "sexpgpu/"
PROJECT_MARKERS = (".git", "pyproject.toml", "sexpgpu.toml")


def find_project_root(main_file: Path) -> Path:
    """The nearest ancestor of the main file holding .git, pyproject.toml or sexpgpu.toml;
    the file's own folder when there is none."""
    start = main_file.resolve().parent
    for folder in (start, *start.parents):
        if any((folder / marker).exists() for marker in PROJECT_MARKERS):
            return folder
    return start


def standard_library() -> Any:
    """The folder of the standard modules (sexpgpu/lib/)."""
    return resources.files("sexpgpu.lib")


def standard_module_names(lib: Any = None) -> list[str]:
    lib = lib if lib is not None else standard_library()
    return sorted(p.name[:-5] for p in lib.iterdir() if p.name.endswith(".lisp"))


def standard_file_name(name: str) -> str:
    """The file a standard module's diagnostics name."""
    return f"sexpgpu/lib/{name}.lisp"


def standard_module_texts() -> list[tuple[str, str]]:
    """(file name, text) of every standard module, as a compile loads it."""
    lib = standard_library()
    return [(standard_file_name(name), lib.joinpath(f"{name}.lisp").read_text(encoding="utf-8")) for name in standard_module_names(lib)]


class ModuleLoader:
    """Resolves and loads the modules of one compile. Installed as the interpreter's
    require hook."""

    def __init__(self, interp: "Interpreter", project_root: Path, sources: SourceMap, stdlib: Any = None) -> None:
        self.interp = interp
        self.stdlib = stdlib if stdlib is not None else standard_library()
        self.root = project_root.resolve()
        self.sources = sources
        self.loaded: dict[str, SymbolTable] = {}
        self.loading: list[str] = []
        self.digests: dict[str, str] = {}  # each module's key: its text's digest
        self.files: list[Path] = []
        self.current_file: list[Path] = []
        interp.require_hook = self.require

    # -- the require form ------------------------------------------------------------------
    def require(self, form: Cons) -> Any:
        spec, alias, imports = self.parse(form)
        key, display, text, path = self.resolve(spec)
        table = self.load(key, display, text, path)
        current = self.interp.table
        current.aliases[alias] = table
        for name in imports:
            self.import_name(current, table, name, display)
        return spec

    def parse(self, form: Cons) -> tuple[str, str, list[str]]:
        usage = 'expected (require "sexpgpu/NAME" :as prefix [:import (names...)]) or (require "./file.lisp" :as prefix)'
        items: list[Any] = []
        cell: Any = form.cdr
        while type(cell) is Cons:
            items.append(cell.car)
            cell = cell.cdr
        if not items or type(items[0]) is not str or len(items) % 2 != 1:
            raise lisp_error("M005", f"malformed require: {usage}", "PROGRAM-ERROR")
        spec = items[0]
        alias: Optional[str] = None
        imports: list[str] = []
        for key, value in zip(items[1::2], items[2::2]):
            if type(key) is not Symbol or key.package != "KEYWORD" or key.name not in ("AS", "IMPORT"):
                raise lisp_error("M005", f"malformed require: unknown option {prin1_to_string(key)}; {usage}", "PROGRAM-ERROR")
            if key.name == "AS":
                if type(value) is not Symbol or value is NIL or value.package == "KEYWORD":
                    raise lisp_error("M005", f"malformed require: :as needs a prefix symbol, got {prin1_to_string(value)}", "PROGRAM-ERROR")
                alias = value.name
            else:
                names = []
                c = value
                while type(c) is Cons:
                    if type(c.car) is not Symbol:
                        raise lisp_error("M005", f"malformed require: :import needs a list of names, got {prin1_to_string(value)}", "PROGRAM-ERROR")
                    names.append(c.car.name)
                    c = c.cdr
                imports = names
        if alias is None:
            alias = Path(spec).stem.upper()
        return spec, alias, imports

    def resolve(self, spec: str) -> tuple[str, str, str, Optional[Path]]:
        """(cache key, display name, source text, path or None for standard modules)."""
        if "\0" in spec or len(spec) > 4096 or any(len(part.encode("utf-8")) > 255 for part in spec.split("/")):
            shown = spec[:60].replace("\0", "\\0") + ("..." if len(spec) > 60 else "")
            raise lisp_error("M005", f'malformed require: "{shown}" is not a usable path: it has a NUL character, a name longer than 255 bytes, or more than 4096 characters', "PROGRAM-ERROR")
        if spec.startswith(STANDARD_PREFIX):
            name = spec[len(STANDARD_PREFIX) :]
            resource = self.stdlib.joinpath(f"{name}.lisp")
            if "/" in name or not name or not resource.is_file():
                known = ", ".join(f'"sexpgpu/{n}"' for n in standard_module_names(self.stdlib)) or "none yet"
                raise lisp_error("M001", f'no standard module "{spec}"; the standard modules are: {known}', "PROGRAM-ERROR")
            return spec, name, resource.read_text(encoding="utf-8"), None
        if os.path.isabs(spec):
            raise lisp_error("M003", f'require "{spec}": absolute paths are not allowed; use a path relative to the requiring file', "PROGRAM-ERROR")
        base = self.current_file[-1].parent if self.current_file else self.root
        path = (base / spec).resolve()
        if path != self.root and self.root not in path.parents:
            raise lisp_error("M003", f'require "{spec}" resolves to {path}, outside the project root {self.root}', "PROGRAM-ERROR")
        try:
            if not path.is_file():
                raise lisp_error("M001", f'require "{spec}": no file {path}', "PROGRAM-ERROR")
            data = path.read_bytes()
        except OSError as exc:
            raise lisp_error("M001", f'require "{spec}": cannot read {path}: {exc.strerror}', "PROGRAM-ERROR") from None
        text = decode_source(data, str(path))
        return str(path), path.stem, text, path

    def load(self, key: str, display: str, text: str, path: Optional[Path]) -> SymbolTable:
        if key in self.loading:
            chain = " -> ".join(_shown(k) for k in self.loading[self.loading.index(key) :] + [key])
            raise lisp_error("M002", f"require cycle: {chain}", "PROGRAM-ERROR")
        table = self.loaded.get(key)
        if table is not None:
            return table
        table = SymbolTable(display, self.interp.base, internals=path is None)
        file_name = _shown(str(path)) if path is not None else standard_file_name(display)
        self.sources.add(file_name, text)
        if path is not None:
            self.files.append(path)
            self.current_file.append(path)
        self.loading.append(key)
        self.digests[key] = text_digest(text)
        try:
            self.load_module(file_name, text, table)
        finally:
            self.loading.pop()
            if path is not None:
                self.current_file.pop()
        publish_exports(self.interp, table)
        self.loaded[key] = table
        return table

    def load_module(self, file_name: str, text: str, table: SymbolTable) -> None:
        """Load a module's TEXT into TABLE: its forms from the image where it holds them (a
        standard module), and, where it is required before any other top-level form of the
        user's files, its recorded expansion (lisp/image.py), made in the first such world
        of the image (a sweep's base compile, watch's last check). What it is recorded under
        is its text and where it is required from: the modules loaded, and being loaded,
        before it, each with its text's digest (a library of the project can change
        between two of watch's checks)."""
        interp = self.interp
        image = interp.image
        key = (f"{file_name}\n{self.loaded_before()}", text) if interp.pristine else None
        leaves = image.leaves(key[0], text, table) if key is not None and image is not None else None
        if leaves is not None:
            interp.load_leaves(leaves, table)
            return
        kept = image.forms(file_name, text, table) if image is not None else None
        if key is not None and interp.recording is not None:
            interp.record_text(text, kept, file_name, table, key)
        elif kept is None:
            interp.load_text(text, file_name, table)
        else:
            interp.load_forms(kept, table)

    def loaded_before(self) -> str:
        def named(keys: Iterable[str]) -> str:
            return " ".join(f"{key}@{self.digests[key]}" for key in keys)

        return f"{AFTER}{named(self.loaded)}{WITHIN}{named(self.loading[:-1])}"

    def import_name(self, current: SymbolTable, module: SymbolTable, name: str, display: str) -> None:
        sym = module.exported.get(name)
        if sym is None:
            hint = did_you_mean(name, module.exported, MODULE_NAME_CUTOFF)
            raise lisp_error("M004", f"module `{display}` exports no `{name.lower()}`, so it cannot be imported{hint}", "PROGRAM-ERROR")
        own = current.own.get(name)
        if own is not None and own is not sym and _defined(self.interp, own):
            raise lisp_error(
                "M004",
                f"cannot import `{name.lower()}` from `{display}`: this file already uses its own `{name.lower()}`; move the require to the top",
                "PROGRAM-ERROR",
            )
        current.own.pop(name, None)
        current.imported[name] = sym


AFTER, WITHIN = "after ", "; within "  # how loaded_before writes what was loaded before a module


def standard_context(key: str) -> bool:
    """Whether the expansion KEY names (load_module's: the module's file, then what was
    loaded before it) is a standard module's, recorded where only standard modules were
    loaded before it: one that does not depend on the user's project (lisp/imagefile.py
    keeps those on disk)."""
    file, _, before = key.partition("\n")
    if not file.startswith(STANDARD_PREFIX) or not before.startswith(AFTER) or WITHIN not in before:
        return False
    loaded = before[len(AFTER) :].replace(WITHIN, " ").split()
    return all(word.startswith(STANDARD_PREFIX) for word in loaded)


def text_digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=12).hexdigest()


def _shown(key: str) -> str:
    if key.startswith(STANDARD_PREFIX):
        return key
    rel = os.path.relpath(key)
    return key if rel.startswith("..") else rel


def _defined(interp: "Interpreter", sym: Symbol) -> bool:
    return any(sym in d for d in (interp.functions, interp.macros, interp.values, interp.structs, interp.setf_functions, interp.setf_expanders))


def publish_exports(interp: "Interpreter", table: SymbolTable) -> None:
    """A module's exports: its own symbols that it defined, except %-prefixed ones."""
    for name, sym in table.own.items():
        if not name.startswith("%") and _defined(interp, sym):
            table.exported[name] = sym
