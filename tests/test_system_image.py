"""The system image (sexpgpu/lisp/image.py): the prelude's and the contract macros' forms,
read once by a caller that builds many worlds. A world built from it reads neither text,
means the same by every form as a world that reads them, and shares no symbol, cons or
vector with any other world built from the same image."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any, Callable

import pytest

from sexpgpu.cli import check, sweeps
from sexpgpu.compile import pipeline
from sexpgpu.compile.compiler import Compiler, contract_text
from sexpgpu.compile.pipeline import check_every_selection, system_image
from sexpgpu.ir.experiment import Selection
from sexpgpu.lisp.evaluator import Interpreter, Limits, prelude_text, run_with_big_stack
from sexpgpu.lisp.diagnostics import SourceMap
from sexpgpu.lisp.image import SYSTEM_FILE, SystemImage, expanded_file
from sexpgpu.lisp.modules import standard_module_texts
from sexpgpu.lisp.objects import BitVector
from sexpgpu.lisp.printer import prin1_to_string
from sexpgpu.lisp.program import Program, new_program
from sexpgpu.lisp.reader import Reader
from sexpgpu.lisp.types import Cons, Symbol, SymbolTable

from sweep_files import width_grid

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def world(image: SystemImage | None) -> Program:
    """A world as a compile builds it: the prelude, then the compiler's contract macros."""

    def build() -> Program:
        program = new_program(None, image=image)
        Compiler(program.interp, Selection(), Path.cwd())
        return program

    return run_with_big_stack(build)


def last_value(program: Program, text: str) -> str:
    results = run_with_big_stack(lambda: program.eval_text(text))
    assert results[-1].error is None, results[-1].error
    return str(results[-1].value)


TEXTS = [(SYSTEM_FILE, prelude_text()), (SYSTEM_FILE, contract_text()), *standard_module_texts()]


@pytest.fixture(autouse=True)
def cold_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test starts where no image is kept on disk (lisp/imagefile.py): what its worlds
    read and record does not depend on the tests before it."""
    root = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("SEXPGPU_CACHE", str(root))
    return root


def test_every_system_text_is_imaged() -> None:
    image = system_image()
    assert set(image.texts) == set(TEXTS) and len(TEXTS) >= 4
    assert len(image.texts[SYSTEM_FILE, prelude_text()]) > 100


@pytest.fixture
def read(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The file names of the texts worlds read from now on (Interpreter.load_text)."""
    files: list[str] = []
    load_text = Interpreter.load_text

    def reading(interp: Interpreter, text: str, file: str, table: SymbolTable) -> Any:
        files.append(file)
        return load_text(interp, text, file, table)

    monkeypatch.setattr(Interpreter, "load_text", reading)
    return files


def test_a_world_from_the_image_reads_no_system_text(read: list[str]) -> None:
    """A world from the image reads only the user's text: not the prelude, not the contract
    macros, not a standard module it requires; and it is whole: the prelude's macros (loop),
    the contract macros and the module work."""
    program = world(system_image())
    code = '(require "sexpgpu/nn" :as nn) (defun twice (x) (* 2 x)) (list (loop for i from 1 to 3 collect (twice i)) (fboundp (quote nn:mlp)) (not (macro-function (quote defrun))))'
    assert last_value(program, code) == "((2 4 6) t nil)"
    assert read == []
    world(None)
    assert read.count(SYSTEM_FILE) == 2


def same_form(read: Any, made: Any, pairs: dict[int, Symbol]) -> None:
    """READ (from the reader) and MADE (from the image) are the same tree: the same atoms,
    every cons at the same position, each base symbol the same object, the others alike
    (named alike, in the same package), one to one."""
    if type(read) is Symbol:
        assert type(made) is Symbol and (made.name, made.package) == (read.name, read.package)
        assert made is read or read.package != "", read.name
        assert pairs.setdefault(id(read), made) is made
        return
    assert type(made) is type(read)
    if type(read) is Cons:
        assert made.loc == read.loc
        same_form(read.car, made.car, pairs)
        same_form(read.cdr, made.cdr, pairs)
    elif type(read) is list or type(read) is BitVector:
        assert len(made) == len(read)
        for a, b in zip(read, made):
            same_form(a, b, pairs)
    else:
        assert made == read


@pytest.mark.parametrize("file,text", TEXTS, ids=[f"{file}-{i}" for i, (file, _) in enumerate(TEXTS)])
def test_the_image_gives_what_the_reader_reads(file: str, text: str) -> None:
    """In a world's tables (its base for the prelude's texts, a fresh module table over its
    base for a module's), the image's forms are the reader's."""
    base = world(None).interp.base

    def table() -> SymbolTable:
        return base if file == SYSTEM_FILE else SymbolTable(file, base, internals=True)

    read = Reader(text, file, table()).read_all()
    made = system_image().forms(file, text, table())
    assert made is not None
    made_forms = list(made)
    assert [r.loc for r in made_forms] == [r.loc for r in read]
    pairs: dict[int, Symbol] = {}
    for a, b in zip(read, made_forms):
        same_form(a.form, b.form, pairs)
    assert len({id(s) for s in pairs.values()}) == len(pairs)  # no two symbols became one


def conses(x: Any, found: set[int]) -> set[int]:
    while type(x) is Cons and id(x) not in found:
        found.add(id(x))
        conses(x.car, found)
        x = x.cdr
    return found


def all_conses(forms: list[Any]) -> set[int]:
    found: set[int] = set()
    for form in forms:
        conses(form, found)
    return found


def test_two_worlds_from_one_image_share_no_symbol_and_no_cons() -> None:
    image = system_image()
    text = prelude_text()
    first, second = world(image), world(image)
    assert first.interp.sym("CAR") is not second.interp.sym("CAR")
    assert first.interp.kw("TEST") is not second.interp.kw("TEST")
    forms_a = [r.form for r in image.forms(SYSTEM_FILE, text, SymbolTable("")) or []]
    forms_b = [r.form for r in image.forms(SYSTEM_FILE, text, SymbolTable("")) or []]
    cells_a, cells_b = all_conses(forms_a), all_conses(forms_b)
    assert len(cells_a) > 1000 and not cells_a & cells_b


def test_what_one_world_does_to_its_symbols_never_reaches_the_next() -> None:
    """Property lists and values set on the base's symbols (the prelude's and the builtins'),
    and names defined, in one world are not in a world built later from the same image."""
    image = system_image()
    first = world(image)
    setting = "(setf (get 'car 'colour) 'red) (setf (get 'defun 'colour) 'blue) (setf (symbol-value 'loop-count) 3) (defparameter *seen* 1)"
    last_value(first, setting)
    asking = "(list (get 'car 'colour) (get 'defun 'colour) (boundp 'loop-count) (boundp '*seen*))"
    assert last_value(first, asking) == "(red blue t t)"
    assert last_value(world(image), asking) == "(nil nil nil nil)"


def test_a_text_the_world_must_read_itself_is_not_imaged() -> None:
    """#+/#- ask the world's *features*, `prefix:name` the modules required so far; a #2A
    array is not copied: such texts are left out, and a world reads them as before."""
    texts = ["#+sexpgpu (defun f () 1)", "(defparameter *a* #2A((1 2) (3 4)))", "(defun h () nn:mlp)", "(defun g () '(1 #(2 #*01) #:u))"]
    kept = SystemImage.read([("lib.lisp", text) for text in texts])
    assert list(kept.texts) == [("lib.lisp", texts[-1])]


def test_a_check_takes_one_image_for_all_its_worlds(monkeypatch: pytest.MonkeyPatch) -> None:
    """check_every_selection takes the system image once for all the worlds of a file with
    sweeps, and once for the one world of a file without."""
    made: list[SystemImage] = []
    real = pipeline.system_image

    def counted(expand: bool = True, forms: bool = True) -> SystemImage:
        made.append(real(expand, forms))
        return made[-1]

    monkeypatch.setattr(pipeline, "system_image", counted)
    checked = check_every_selection(EXAMPLES / "search.lisp")
    assert checked.compiled > 2 and len(made) == 1
    check_every_selection(EXAMPLES / "quickstart.lisp")
    assert len(made) == 2


def test_watch_reads_the_system_texts_once_for_all_its_checks(read: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """watch's checks of a file without sweeps (one world each) read only the file."""
    parser = argparse.ArgumentParser()
    check.register(parser.add_subparsers())
    args = parser.parse_args(["watch", "--json", "--max-checks", "1", str(EXAMPLES / "quickstart.lisp")])
    assert run_with_big_stack(lambda: args.run(args)) == 0
    assert '"ok": true' in capsys.readouterr().out
    assert SYSTEM_FILE not in read and not any(f.startswith("sexpgpu/lib/") for f in read)


def test_variants_reads_the_system_texts_once_for_every_world(read: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """`variants` of a sweep file, where no image is kept on disk yet: the image reads the
    system texts once, and no world reads the prelude or the contract macros, not even the
    first (it expands the image's forms)."""
    parser = argparse.ArgumentParser()
    sweeps.register(parser.add_subparsers())
    args = parser.parse_args(["variants", "--json", str(EXAMPLES / "sweep.lisp")])
    assert run_with_big_stack(lambda: args.run(args)) == 0
    assert '"sweeps"' in capsys.readouterr().out
    assert read.count(SYSTEM_FILE) == 0 and read.count("examples/sweep.lisp") >= 2


def described(interp: Interpreter) -> dict[str, Any]:
    """What a world holds after loading its system texts, by name and printed value."""

    def printed(x: Any) -> str:
        return prin1_to_string(x, interp.print_other)

    held: dict[str, Any] = {}
    for name in ("functions", "macros", "setf_functions", "setf_expanders", "structs", "symbol_macros"):
        held[name] = sorted((printed(k), type(v).__name__) for k, v in getattr(interp, name).items())
    held["values"] = sorted((printed(k), printed(v)) for k, v in interp.values.items())
    held["plists"] = sorted((printed(k), printed(v)) for k, v in interp.plists.items())
    held["documentation"] = sorted((printed(k[0]), k[1], v) for k, v in interp.documentation.items())
    held["specials"] = sorted(printed(k) for k in interp.specials)
    held["constants"] = sorted(printed(k) for k in interp.constants)
    held["conditions"] = sorted(interp.condition_types)
    held["counters"] = interp.counters()
    held["base"] = (sorted(interp.base.own), sorted(interp.base.exported), sorted(interp.base.keywords))
    return held


def test_a_world_from_the_expansions_holds_what_a_world_that_expands_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The prelude's and the contract macros' recorded expansions: a world that evaluates
    them calls no macro's expander while it is built, and ends with the same functions,
    macros, values, documentation, symbols and gensym counters as a world that expands the
    forms itself."""
    image = system_image()
    assert set(image.expanded) == {(SYSTEM_FILE, prelude_text()), (SYSTEM_FILE, contract_text())}
    expanded: list[Any] = []
    call_macro = Interpreter.call_macro

    def calling(interp: Interpreter, *args: Any) -> Any:
        expanded.append(args[0])
        return call_macro(interp, *args)

    monkeypatch.setattr(Interpreter, "call_macro", calling)
    expanding = world(SystemImage(image.texts))
    assert len(expanded) > 100
    expanded.clear()
    replaying = world(image)
    assert expanded == []
    assert described(replaying.interp) == described(expanding.interp)
    code = "(defmacro twice (x) `(* 2 ,x)) (defun f (x) \"doc\" (twice x)) (list (f 4) (documentation 'f 'function) (symbol-name (gensym)))"
    answer = last_value(replaying, code)
    assert answer == last_value(expanding, code) and answer.startswith('(8 "doc" "G')


def test_a_system_texts_leaves_keep_its_gensyms_and_an_object_no_template_holds_is_not_recorded() -> None:
    """A text whose expansion makes gensyms is replayed with them named as they were, and
    *gensym-counter* where it was; a text whose expansion holds a function object is left for
    each world to expand."""
    texts = ["(defmacro %two () `(progn (defparameter *a* ',(gensym)) (defparameter *b* (gensym \"B\")))) (%two)",
             "(defmacro %fn () `(defparameter *f* ',(function car))) (%fn)"]

    def build(image: SystemImage, recording: dict[Any, Any] | None) -> Interpreter:
        interp = Interpreter(None, image, recording)
        for text in texts:
            interp.load_system_text(text)
        return interp

    recorded: dict[Any, Any] = {}
    image = system_image()
    first = run_with_big_stack(lambda: build(image, recorded))
    assert list(recorded) == [(SYSTEM_FILE, texts[0])]
    second = run_with_big_stack(lambda: build(image.with_expansions(recorded), None))
    asking = "(list *a* *b* *gensym-counter* (eq (symbol-package *a*) nil) (funcall *f* '(1 2)))"
    answers = [last_value(Program(i, i.base, None, SourceMap(), None), asking) for i in (first, second)]  # type: ignore[arg-type]
    assert answers[0] == answers[1]
    made = re.fullmatch(r"\(#:g(\d+) #:b(\d+) (\d+) t 1\)", answers[0])
    assert made is not None and int(made[1]) + 1 == int(made[2]) == int(made[3]) - 1


def test_a_sweeps_check_records_the_expansions_in_its_base_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """check_every_selection builds no world of its own to record the expansions: the base
    compile's world records them, and every later world of the check evaluates them."""
    worlds: list[Interpreter] = []
    leaves: list[Interpreter] = []
    init, load_leaves = Interpreter.__init__, Interpreter.load_leaves

    def building(interp: Interpreter, *args: Any) -> None:
        worlds.append(interp)
        init(interp, *args)

    def replaying(interp: Interpreter, *args: Any) -> None:
        leaves.append(interp)
        load_leaves(interp, *args)
        if len(args) > 1:  # a standard module's leaves, into its table
            modules.append((interp, args[1].package))

    modules: list[tuple[Interpreter, str]] = []
    compiles: list[Path] = []
    compile_file = pipeline.compile_file

    def compiling(path: Path, *args: Any, **kwargs: Any) -> Any:
        compiles.append(path)
        return compile_file(path, *args, **kwargs)

    monkeypatch.setattr(Interpreter, "__init__", building)
    monkeypatch.setattr(Interpreter, "load_leaves", replaying)
    monkeypatch.setattr(pipeline, "compile_file", compiling)
    check_every_selection(EXAMPLES / "search.lisp")
    assert len(compiles) > 2 and len(worlds) == len(compiles)  # one world per compile, none more
    assert worlds[0].recording is not None and worlds[0] not in leaves
    # the prelude, the contract macros, and the two modules search.lisp requires before any other form
    assert all(w.recording is None and leaves.count(w) == 4 for w in worlds[1:])
    assert all([p for i, p in modules if i is w] == ["nn", "optim"] for w in worlds[1:])


def loading_modules(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[str]]:
    """(the standard modules loaded from recorded leaves, those expanded by their world), one
    entry per world and module."""
    replayed: list[str] = []
    expanded: list[str] = []
    load_leaves, load_forms, record_text = Interpreter.load_leaves, Interpreter.load_forms, Interpreter.record_text

    def replaying(interp: Interpreter, leaves: Any, table: SymbolTable | None = None) -> None:
        if table is not None:
            replayed.append(table.package)
        load_leaves(interp, leaves, table)

    def reading(interp: Interpreter, forms: Any, table: SymbolTable) -> Any:
        if table.internals:
            expanded.append(table.package)
        return load_forms(interp, forms, table)

    def recording(interp: Interpreter, text: str, kept: Any, *args: Any) -> None:
        if args:  # a standard module's: its file, table and key given
            expanded.append(args[1].package)
        with monkeypatch.context() as inner:
            inner.setattr(Interpreter, "load_forms", load_forms)
            record_text(interp, text, kept, *args)

    monkeypatch.setattr(Interpreter, "load_leaves", replaying)
    monkeypatch.setattr(Interpreter, "load_forms", reading)
    monkeypatch.setattr(Interpreter, "record_text", recording)
    return replayed, expanded


def grid(before: str = "") -> str:
    """A 2 widths x 3 lrs sweep over the quickstart's model, BEFORE put before its second require."""
    return width_grid(2, 3).replace('(require "sexpgpu/optim"', before + '(require "sexpgpu/optim"', 1)


def test_a_module_required_first_is_replayed_and_one_required_later_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep's check: a standard module the file requires before any other form is expanded
    once (the base compile records it) and replayed by every later world, and by the worlds of
    a later check (the disk keeps what the first recorded); one required after
    another form is expanded by every world, since what that form did may change what the
    module's macros make. Either way the check's diagnostics are those of a check that
    expands every module in every world."""
    first, later = tmp_path / "first.lisp", tmp_path / "later.lisp"
    first.write_text(grid())
    later.write_text(grid("(progn)\n"))
    replayed, expanded = loading_modules(monkeypatch)
    checked = check_every_selection(first)
    assert expanded == ["nn", "optim"] and replayed.count("nn") == replayed.count("optim") >= 2
    assert checked.diagnostics == []
    replayed.clear()
    expanded.clear()
    checked = check_every_selection(later)  # nn as the first check recorded it (the disk keeps it)
    assert set(replayed) == {"nn"} and "nn" not in expanded and expanded.count("optim") == replayed.count("nn") >= 3
    assert checked.diagnostics == []


def expanded_then_replayed(path: Path) -> tuple[dict[Any, Any], str, int]:
    """PATH's world built twice: once recording the modules' expansions, once replaying them.
    Asserts that the two end alike (the file's last value, the functions, macros, values,
    counters and module symbols); returns the recording, the last value, the modules loaded."""
    image = system_image()
    recorded: dict[Any, Any] = {}

    def build(image: SystemImage, recording: dict[Any, Any] | None) -> tuple[Program, Any]:
        program = new_program(path, image=image, recording=recording)
        Compiler(program.interp, Selection(), Path.cwd())
        return program, run_with_big_stack(lambda: program.eval_text(path.read_text()))[-1]

    expanding, expanded_value = run_with_big_stack(lambda: build(image, recorded))
    replaying, replayed_value = run_with_big_stack(lambda: build(image.with_expansions(recorded), None))
    assert expanded_value.error is None and str(replayed_value.value) == str(expanded_value.value)
    assert described(replaying.interp) == described(expanding.interp)
    tables = [{k: sorted(t.own) for k, t in p.loader.loaded.items()} for p in (expanding, replaying)]  # type: ignore[union-attr]
    assert tables[0] == tables[1]
    return recorded, str(expanded_value.value), len(tables[0])


def test_a_world_from_a_modules_expansion_holds_what_a_world_that_expands_it_holds(tmp_path: Path) -> None:
    """A file's world built with the standard modules' recorded expansions ends as one whose
    modules are expanded: the same functions, macros, values, counters and module symbols."""
    path = tmp_path / "nets.lisp"
    path.write_text(grid() + "(list (symbol-name (gensym)) *gensym-counter*)\n")
    recorded, _, modules = expanded_then_replayed(path)
    assert len(recorded) == 2 and modules == 2  # the two modules (the image holds the prelude's and the contract macros')


LIBRARY = '''(require "sexpgpu/nn" :as nn)
(defmacro twice (x) `(* 2 ,x))
(defun width () (twice WIDTH))
(defparameter *maker* 'nn:mlp)
'''


def watched_project(tmp_path: Path, width: int) -> Path:
    """The quickstart, its hidden width from a library of the project that requires nn."""
    main = tmp_path / "main.lisp"
    text = (EXAMPLES / "quickstart.lisp").read_text()
    text = text.replace('(require "sexpgpu/optim" :as optim)', '(require "sexpgpu/optim" :as optim)\n(require "./lib.lisp" :as lib)', 1)
    main.write_text(text.replace("(nn:mlp 2 64 3)", "(nn:mlp 2 (lib:width) 3)", 1))
    (tmp_path / "lib.lisp").write_text(LIBRARY.replace("WIDTH", str(width)))
    return main


Watched = tuple[list[Any], str, list[str], list[str]]


def watch_checks(main: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Callable[[], Watched], Callable[[], tuple[list[Any], str]], Callable[[], SystemImage]]:
    """(one of watch's checks of MAIN, as run_watch makes them: its diagnostics, the file's IR
    hash, the modules it replayed and those it expanded; a fresh check's diagnostics and IR
    hash; the image the checks keep)."""
    image = system_image()
    replayed, expanded = loading_modules(monkeypatch)

    def checked() -> Watched:
        nonlocal image
        replayed.clear()
        expanded.clear()
        recorded: dict[Any, Any] = {}
        diagnostics, _, files = run_with_big_stack(lambda: check.check_once(main, Limits(), image=image, recording=recorded))
        loads = (list(replayed), list(expanded))
        image = image.with_expansions(recorded, superseding=True)
        assert main.parent / "lib.lisp" in files
        result = run_with_big_stack(lambda: pipeline.compile_file(main, image=image))
        assert result.experiment is not None
        return diagnostics, result.experiment.ir_hash, *loads

    def fresh() -> tuple[list[Any], str]:
        diagnostics, _, _ = run_with_big_stack(lambda: check.check_once(main, Limits()))
        result = run_with_big_stack(lambda: pipeline.compile_file(main))
        assert result.experiment is not None
        return diagnostics, result.experiment.ir_hash

    return checked, fresh, lambda: image


def test_watch_replays_the_libraries_a_save_left_alone_and_expands_one_that_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """watch's checks: the first expands the modules the file requires first, the next
    replays them, one after a library's save expands that library again; each check's
    diagnostics and IR are those of a fresh check, and the image holds one expansion of
    each file."""
    main = watched_project(tmp_path, 32)
    checked, fresh, image = watch_checks(main, monkeypatch)
    diagnostics, ir, replays, expands = checked()
    assert sorted(expands) == ["lib", "nn", "optim"] and replays == []
    assert (diagnostics, ir) == fresh() and diagnostics == []
    again = checked()
    assert sorted(again[2]) == ["lib", "nn", "optim"] and again[3] == []
    assert again[:2] == (diagnostics, ir)
    (tmp_path / "lib.lisp").write_text(LIBRARY.replace("WIDTH", "48"))
    saved = checked()
    assert saved[3] == ["lib"] and sorted(saved[2]) == ["nn", "optim"]  # loaded before the library: unchanged
    assert saved[:2] == fresh() and saved[1] != ir
    modules = [expanded_file(key) for key in image().expanded if key[0] != SYSTEM_FILE]
    assert len(modules) == len(set(modules)) == 3  # the library's text before the save is gone


def test_a_save_of_a_library_expands_again_every_module_loaded_after_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second library, loaded after the first and expanding the first's macro, is expanded
    again when only the first is saved: its expansion depends on the macro it found."""
    main = watched_project(tmp_path, 32)
    main.write_text(main.read_text().replace('(require "./lib.lisp" :as lib)', '(require "./lib.lisp" :as lib)\n(require "./wide.lisp" :as wide)', 1)
                    .replace("(lib:width)", "(wide:width)", 1))
    (tmp_path / "wide.lisp").write_text('(require "./lib.lisp" :as lib)\n(defun width () (lib:twice 16))\n')
    checked, fresh, _ = watch_checks(main, monkeypatch)
    first = checked()
    assert sorted(first[3]) == ["lib", "nn", "optim", "wide"] and first[0] == []
    assert sorted(checked()[2]) == ["lib", "nn", "optim", "wide"]
    (tmp_path / "lib.lisp").write_text(LIBRARY.replace("WIDTH", "32").replace("(* 2 ,x)", "(* 3 ,x)"))
    saved = checked()
    assert sorted(saved[3]) == ["lib", "wide"] and sorted(saved[2]) == ["nn", "optim"]
    assert saved[:2] == fresh() and saved[1] != first[1]


def test_a_world_replaying_a_library_holds_what_a_world_that_expands_it_holds(tmp_path: Path) -> None:
    """A library of the project that names another module's symbols (`nn:mlp`) is recorded,
    and a world that replays it ends as one that expands it."""
    main = watched_project(tmp_path, 32)
    main.write_text(main.read_text() + "\n(list (lib:width) lib:*maker* (symbol-name (gensym)))\n")
    recorded, value, modules = expanded_then_replayed(main)
    assert any(expanded_file(key).endswith("lib.lisp") for key in recorded)
    assert value.startswith("(64 nn:mlp") and modules == 3
