"""Where a run's tensors live and how its programs run: the host (NumPy) or a device.

The training loop holds parameters, optimizer state and gradients as the backend's resident
arrays and asks programs to keep those outputs resident (`run(feeds, keep=...)`); everything
else (loss, metrics, learning rates, the gradient norm) comes back to the host. It converts
to host arrays only where the host needs them: checkpoints, diagnostics, the non-finite
replay, a collective that reduces host buffers. On the host backend all of this is the
identity; on the CUDA device it keeps a step's tensors on the GPU between programs.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol

import numpy as np

from ..ir.graph import Program, TensorType


Ready = Callable[[str, Any], None]  # (output name, its resident value)
Say = Callable[[str], None]


class DeviceError(Exception):
    """The device cannot be used here (exit 4, with the fix)."""


class RunnableProgram(Protocol):
    """An IR program made ready by a backend, to run many times."""

    program: Program  # the IR as `sexpgpu ir` prints it (the non-finite replay names its nodes)
    input_ids: dict[str, int]

    def run(self, feeds: dict[str, Any], keep: frozenset[str] = frozenset(), ready: Optional[Ready] = None) -> dict[str, Any]:
        """The outputs; those named in KEEP resident. READY, if given, is called with each kept
        output once it is complete (on a device, as soon as the step that makes it has been
        launched; on the host, after the run)."""
        ...

    def notice(self) -> Optional[str]:
        """One line on how the program runs here, for the run's output: on a device, which
        ops run on the host and the bytes they copy per run (None on the host)."""
        ...


class Backend(Protocol):
    def program(self, program: Program) -> RunnableProgram:
        """PROGRAM ready to run many times: `run(feeds, keep=...)` returns the outputs named
        in keep as resident arrays (valid until the program runs again), the rest on the host."""
        ...

    def put(self, host: np.ndarray, t: TensorType) -> Any:
        """A resident copy of the host array HOST, of type T."""
        ...

    def get(self, value: Any, t: TensorType) -> np.ndarray:
        """A host copy of the resident VALUE (the NumPy backend's dtype: bf16 through ml_dtypes)."""
        ...

    def add(self, total: Optional[Any], value: Any, t: TensorType) -> Any:
        """TOTAL + VALUE, in place when it can; a copy of VALUE when TOTAL is None."""
        ...

    def scaled(self, total: Any, factor: float, t: TensorType) -> Any:
        """TOTAL * FACTOR, in T's dtype (the factor rounded to it, as NumPy does)."""
        ...


def made(backend: Backend, program: Program, say: Optional[Say]) -> RunnableProgram:
    """BACKEND's PROGRAM, its notice (if any) said through SAY."""
    runnable = backend.program(program)
    line = runnable.notice() if say is not None else None
    if say is not None and line:
        say(line)
    return runnable


class HostBackend:
    """The CPU: programs run by the NumPy interpreter, resident arrays are host arrays."""

    def program(self, program: Program) -> RunnableProgram:
        from .numpy_backend import CompiledProgram

        return CompiledProgram(program)

    def put(self, host: np.ndarray, t: TensorType) -> np.ndarray:
        return host

    def get(self, value: Any, t: TensorType) -> np.ndarray:
        return np.array(value, copy=True)

    def add(self, total: Optional[Any], value: Any, t: TensorType) -> np.ndarray:
        if total is None:
            return np.array(value, copy=True)
        total += value
        return total

    def scaled(self, total: Any, factor: float, t: TensorType) -> np.ndarray:
        return np.asarray(total * total.dtype.type(factor)).astype(total.dtype)
