"""Which emitter writes a step's kernels for a device, as JAX's `register_lowering(...,
platform=)` registers a primitive's lowering per platform.

A device's emitter module registers each emitter at its definition,
`@register_emitter(FusedGroup, platform="cpu")`, and the device asks `emitter_for(step,
"cpu", default)`: the emitter registered for the step's type or, failing that, for the
nearest of its base classes (a subclass the device has nothing of its own for is written as
its base is), else DEFAULT. The table is filled once, when the emitter modules are imported,
and read only after.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])

# (step type, platform) -> emitter: filled when the emitter modules are imported (runtime/cpu/hostc.py)
EMITTERS: dict[tuple[type, str], Callable[..., Any]] = {}


def register_emitter(*step_types: type, platform: str) -> Callable[[F], F]:
    """A decorator: the emitter writes the kernels of STEP_TYPES for PLATFORM."""

    def add(emitter: F) -> F:
        for step_type in step_types:
            key = (step_type, platform)
            if key in EMITTERS:
                raise ValueError(f"an emitter for {step_type.__name__} on {platform} is registered twice")
            EMITTERS[key] = emitter
        return emitter

    return add


def emitter_for(step: object, platform: str, default: F) -> F:
    """The emitter PLATFORM registered for STEP's type or its nearest base, else DEFAULT."""
    for step_type in type(step).__mro__:
        emitter = EMITTERS.get((step_type, platform))
        if emitter is not None:
            return cast(F, emitter)
    return default
