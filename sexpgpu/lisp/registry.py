"""The one way to add a builtin: `@builtin("name")` on a module-level function.

A plain function is called with the Lisp arguments. A function registered with a context
class (`@builtin("mapcar", context=Lists)`) is called with that class's instance for the
interpreter first (one instance per interpreter and class), then the Lisp arguments; the
context holds what the builtins of one chapter share (charging the budget, calling function
arguments). The arity is read from the signature once, when the module is imported.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from functools import partial
from types import CodeType, FunctionType, ModuleType
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar

from .objects import Builtin

if TYPE_CHECKING:
    from .evaluator import Interpreter

F = TypeVar("F", bound=Callable[..., Any])
MARK = "__lisp_builtin__"


@dataclass(frozen=True)
class BuiltinSpec:
    """What `@builtin` recorded on a function: its Lisp names, its context class, its arity."""

    names: tuple[str, ...]
    context: Optional[type]
    required: int
    maximum: Optional[int]  # None: any number (&rest)


def builtin(*names: str, context: Optional[type] = None) -> Callable[[F], F]:
    """Register the decorated module-level function as the Lisp builtin(s) NAMES."""
    if not names:
        raise ValueError("@builtin needs at least one Lisp name")

    def mark(fn: F) -> F:
        earlier = spec_of(fn)
        if earlier is not None:  # one function under more names (char and schar)
            if earlier.context is not context:
                raise ValueError(f"{fn.__name__} is registered with two contexts")
            setattr(fn, MARK, BuiltinSpec(earlier.names + names, context, earlier.required, earlier.maximum))
            return fn
        required, maximum = arity(fn, 1 if context is not None else 0)
        setattr(fn, MARK, BuiltinSpec(names, context, required, maximum))
        return fn

    return mark


def arity(fn: Callable[..., Any], skip: int = 0) -> tuple[int, Optional[int]]:
    """The required and the most positional arguments of FN (None: &rest), past the first SKIP."""
    code = getattr(fn, "__code__", None)
    if type(fn) is FunctionType and isinstance(code, CodeType) and skip <= code.co_argcount and not hasattr(fn, "__wrapped__") and not hasattr(fn, "__signature__"):
        # what inspect.signature would say, read off the code object: the signatures of the
        # ~500 builtins cost a fresh `check` 10-20 ms
        most = code.co_argcount - skip
        required = max(0, code.co_argcount - len(fn.__defaults__ or ()) - skip)
        return required, None if code.co_flags & inspect.CO_VARARGS else most
    params = list(inspect.signature(fn).parameters.values())[skip:]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(1 for p in positional if p.default is p.empty)
    variadic = any(p.kind == p.VAR_POSITIONAL for p in params)
    return required, None if variadic else len(positional)


def spec_of(fn: Any) -> Optional[BuiltinSpec]:
    spec = getattr(fn, MARK, None)
    return spec if isinstance(spec, BuiltinSpec) else None


def registered(module: ModuleType) -> list[tuple[Callable[..., Any], BuiltinSpec]]:
    """The builtins a module registers, in the order they are defined: its decorated
    functions, not those it imports from another module that registers them."""
    out: list[tuple[Callable[..., Any], BuiltinSpec]] = []
    seen: set[int] = set()
    for value in vars(module).values():
        spec = spec_of(value)
        if spec is not None and id(value) not in seen and _registers(module, value):
            seen.add(id(value))
            out.append((value, spec))
    return out


def _registers(module: ModuleType, fn: Any) -> bool:
    """Whether MODULE is where FN is registered: FN was defined there, or made there by a
    factory of another module (and so is no name of that module)."""
    home = getattr(fn, "__module__", None)
    if home == module.__name__:
        return True
    defining = sys.modules.get(home or "")
    return defining is None or not any(value is fn for value in vars(defining).values())


def install_modules(interp: "Interpreter", modules: tuple[ModuleType, ...]) -> None:
    """Make every builtin the MODULES register a function of INTERP. A name registered twice
    is a mistake, caught here rather than left to the order of the modules."""
    contexts: dict[type, Any] = {}
    installed: dict[str, str] = {}
    for module in modules:
        for fn, spec in registered(module):
            target: Callable[..., Any] = fn
            if spec.context is not None:
                context = contexts.get(spec.context)
                if context is None:
                    context = contexts[spec.context] = spec.context(interp)
                target = partial(fn, context)
            for name in spec.names:
                if name in installed:
                    raise ValueError(f"the builtin {name} is registered twice: in {installed[name]} and {module.__name__}")
                installed[name] = module.__name__
                interp.functions[interp.sym(name)] = Builtin(name.lower(), target, spec.required, spec.maximum)
