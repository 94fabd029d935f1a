"""The device a run trains on, `--device cpu|numpy|cuda|cuda:N|auto`: resolved once per run (by
sexpgpu.session), then handed to the loop as a backend.

- `cpu` (the default): the compiled CPU device (runtime/cpu/): the lowering's programs (runtime/lower/)
  with their kernels emitted as C and compiled by the system C compiler. Where no C compiler
  works, the NumPy backend, with one line saying so; the run then records `numpy`.
- `numpy`: the NumPy backend, the reference (runtime/numpy_backend.py).
- `cuda`, `cuda:N`: the CUDA device (runtime/cuda/, through CuPy); `auto`: `cuda` when a CUDA
  device opens here, else `cpu`.

A CPU or NumPy run never loads CuPy.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Optional, Union

from .backend import Backend, DeviceError, HostBackend

DEVICE_FORMS = "cpu, numpy, cuda, cuda:N or auto"
_SPEC = re.compile(r"^(cpu|numpy|auto|cuda(:\d+)?)$")
Say = Callable[[str], None]


def is_device_spec(spec: str) -> bool:
    return _SPEC.match(spec) is not None


def open_device(spec: str, say: Optional[Say] = None) -> tuple[str, Backend]:
    """SPEC resolved and its backend, opened once: `auto` is `cuda` when a CUDA device opens
    here, else `cpu`; `cpu` is `numpy` where no C compiler works (SAY is told why, in one
    line). DeviceError says why another SPEC cannot run here."""
    if spec == "auto":
        try:
            return "cuda", open_backend("cuda")
        except DeviceError:
            spec = "cpu"
    if spec == "cpu":
        from .cpu.toolchain import NoCompiler

        try:
            return "cpu", open_backend("cpu")
        except (NoCompiler, RuntimeError) as exc:
            if say is not None:
                say(f"cpu: {exc}: running on the NumPy backend (--device numpy); install a C compiler (cc) for the compiled CPU device")
            return "numpy", HostBackend()
    return spec, open_backend(spec)


def open_backend(spec: str) -> Backend:
    """The backend of a resolved SPEC (`cpu`, `numpy`, `cuda`, `cuda:N`), or DeviceError saying
    why this machine cannot run it (`cpu`: NoCompiler, when no C compiler works)."""
    if spec == "numpy":
        return HostBackend()
    if spec == "cpu":
        from .cpu.device import CpuBackend, CpuRuntime
        from .cpu.toolchain import open_toolchain

        return CpuBackend(CpuRuntime(open_toolchain()))
    if not is_device_spec(spec) or spec == "auto":
        raise DeviceError(f"--device {spec}: use {DEVICE_FORMS}")
    from .cuda.device import cuda_device
    from .lower.executor import DeviceBackend

    return DeviceBackend(cuda_device(spec))


def is_host(spec: str) -> bool:
    """Whether a resolved SPEC computes on this machine's CPU (its memory is the host's)."""
    return spec in ("cpu", "numpy")


def describe(spec: str) -> Union[str, dict[str, Any]]:
    """What run.json records for a resolved SPEC: `cpu` and `numpy` stay words; a GPU is an
    object (index, name, memory, compute capability, CUDA and CuPy versions)."""
    if is_host(spec):
        return spec
    from .cuda.device import describe as describe_gpu

    return describe_gpu(spec)


def free_device_memory() -> int:
    from .cuda.device import free_device_memory as free

    return free()
