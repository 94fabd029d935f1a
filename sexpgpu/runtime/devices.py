"""The device a run trains on, `--device cpu|cuda|cuda:N|auto`: resolved once per run (by
sexpgpu.session), then handed to the loop as a backend. A CPU run never loads the CUDA
lowering."""

from __future__ import annotations

import re
from typing import Any, Union

from .backend import Backend, DeviceError, HostBackend

DEVICE_FORMS = "cpu, cuda, cuda:N or auto"
_SPEC = re.compile(r"^(cpu|auto|cuda(:\d+)?)$")


def is_device_spec(spec: str) -> bool:
    return _SPEC.match(spec) is not None


def open_device(spec: str) -> tuple[str, Backend]:
    """SPEC resolved and its backend, opened once: `auto` is `cuda` when a CUDA device opens
    here, else `cpu`. DeviceError says why another SPEC cannot run here."""
    if spec == "auto":
        try:
            return "cuda", open_backend("cuda")
        except DeviceError:
            return "cpu", HostBackend()
    return spec, open_backend(spec)


def open_backend(spec: str) -> Backend:
    """The backend of a resolved SPEC (`cpu`, `cuda`, `cuda:N`), or DeviceError saying why
    this machine cannot run it."""
    if spec == "cpu":
        return HostBackend()
    if not is_device_spec(spec) or spec == "auto":
        raise DeviceError(f"--device {spec}: use {DEVICE_FORMS}")
    from .cuda.device import cuda_device
    from .cuda.executor import DeviceBackend

    return DeviceBackend(cuda_device(spec))


def describe(spec: str) -> Union[str, dict[str, Any]]:
    """What run.json records for a resolved SPEC: `cpu` stays a word; a GPU is an object
    (index, name, memory, compute capability, CUDA and CuPy versions)."""
    if spec == "cpu":
        return spec
    from .cuda.device import describe as describe_gpu

    return describe_gpu(spec)


def free_device_memory() -> int:
    from .cuda.device import free_device_memory as free

    return free()
