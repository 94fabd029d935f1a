"""Every Lisp builtin is added one way: `@builtin("name")` on a module-level function
(sexpgpu/lisp/registry.py). No class of `op_*` methods found by a name-mangled getattr, no
`install(reg)` closures: "find usages" of a builtin's Python function finds its registration."""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import pkgutil
from functools import partial
from pathlib import Path
from typing import Any, Optional

import sexpgpu.lisp
from sexpgpu.lisp.evaluator import Interpreter
from sexpgpu.lisp.objects import Builtin
from sexpgpu.lisp.registry import arity, builtin, registered, spec_of

LISP = Path(sexpgpu.lisp.__file__).parent


def _functions(tree: ast.AST) -> list[ast.FunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]


def test_no_op_methods_and_no_install_closures_in_lisp() -> None:
    found = []
    for path in sorted(LISP.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in _functions(tree):
            if fn.name.startswith("op_") or fn.name == "install":
                found.append(f"{path.name}:{fn.lineno} def {fn.name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
                text = ast.unparse(node)
                if "op_" in text:
                    found.append(f"{path.name}:{node.lineno} {text}")
    assert found == []


def test_every_builtin_of_a_fresh_world_comes_from_a_registration() -> None:
    interp = Interpreter()
    unregistered = []
    for fn in interp.functions.values():
        if type(fn) is not Builtin:
            continue
        target = fn.fn.func if isinstance(fn.fn, partial) else fn.fn
        spec = spec_of(target)
        if spec is None or fn.name not in spec.names:
            unregistered.append(fn.name)
    assert unregistered == []


def test_every_module_that_registers_builtins_is_installed() -> None:
    interp = Interpreter()
    installed = {fn.name for fn in interp.functions.values() if type(fn) is Builtin}
    missing = []
    for info in pkgutil.iter_modules([str(LISP)]):
        module = importlib.import_module(f"sexpgpu.lisp.{info.name}")
        for _, spec in registered(module):
            missing += [f"{info.name}: {name}" for name in spec.names if name not in installed]
    assert missing == []


def test_a_name_registered_twice_is_refused() -> None:
    import types

    from sexpgpu.lisp.registry import install_modules

    first, second = types.ModuleType("first_builtins"), types.ModuleType("second_builtins")

    def one() -> int:
        return 1

    def two() -> int:
        return 2

    one.__module__, two.__module__ = first.__name__, second.__name__
    first.one, second.two = builtin("car")(one), builtin("car")(two)  # type: ignore[attr-defined]
    try:
        install_modules(Interpreter(), (first, second))
    except ValueError as exc:
        assert "car is registered twice" in str(exc)
    else:
        raise AssertionError("a second car was installed")


def test_the_arity_comes_from_the_signature_past_the_context() -> None:
    @builtin("f", context=object)
    def f(lib: object, a: int, b: int = 0, *rest: int) -> int:
        return a

    @builtin("g")
    def g(a: int, b: int = 0) -> int:
        return a

    assert (spec_of(f).required, spec_of(f).maximum) == (1, None)  # type: ignore[union-attr]
    assert (spec_of(g).required, spec_of(g).maximum) == (1, 2)  # type: ignore[union-attr]


def _signature_arity(fn: Any, skip: int) -> tuple[int, Optional[int]]:
    params = list(inspect.signature(fn).parameters.values())[skip:]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    variadic = any(p.kind == p.VAR_POSITIONAL for p in params)
    return sum(1 for p in positional if p.default is p.empty), None if variadic else len(positional)


def test_the_arity_read_off_the_code_object_is_the_signatures() -> None:
    """arity reads plain functions' code objects (inspect.signature for 500 builtins is a
    noticeable part of a fresh check): it says what the signature says, for every builtin
    and for the shapes a builtin may have (positional-only, keyword-only, a wrapper)."""

    def shapes(a: int, /, b: int, c: int = 0, *rest: int, d: int = 0, **kw: int) -> None: ...

    def keyword_only(a: int, *, b: int) -> None: ...

    @functools.wraps(keyword_only)
    def wrapper(*args: Any, **kwargs: Any) -> None: ...

    odd = [(shapes, 0), (shapes, 1), (shapes, 3), (keyword_only, 0), (keyword_only, 1), (wrapper, 0), (partial(shapes, 1), 0)]
    for fn, skip in odd:
        assert arity(fn, skip) == _signature_arity(fn, skip), (fn, skip)
    modules = [importlib.import_module(f"sexpgpu.lisp.{m.name}") for m in pkgutil.iter_modules([str(LISP)]) if m.name.startswith("builtins")]
    checked = 0
    for module in modules:
        for fn, spec in registered(module):
            skip = 1 if spec.context is not None else 0
            assert (spec.required, spec.maximum) == _signature_arity(fn, skip), fn.__qualname__
            checked += 1
    assert checked > 400


def test_the_x_if_and_x_if_not_families_come_from_one_helper() -> None:
    interp = Interpreter()
    families = ["count", "find", "position", "remove", "delete", "substitute", "nsubstitute", "member", "assoc", "rassoc"]
    makers = {}
    for base in families:
        for name in (base, f"{base}-if", f"{base}-if-not"):
            fn = interp.functions[interp.sym(name)]
            assert type(fn) is Builtin and isinstance(fn.fn, partial)
            makers[name] = fn.fn.func.__qualname__.split(".")[0]
    assert set(makers.values()) == {"test_family", "substitution_family"}


def test_first_to_tenth_come_from_one_helper() -> None:
    """As the cxr and bit families do: one factory, not ten copies of one function."""
    interp = Interpreter()
    names = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth"]
    makers = set()
    for name in names:
        fn = interp.functions[interp.sym(name)]
        assert type(fn) is Builtin and isinstance(fn.fn, partial)
        makers.add(fn.fn.func.__qualname__.split(".")[0])
    assert makers == {"_nth_accessor"}
