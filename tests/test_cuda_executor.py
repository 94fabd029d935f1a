"""Whole programs on the CUDA executor without a GPU: the executor runs every example's
programs with NumPy as the array module and the generated kernels compiled for the host, and
its outputs equal the NumPy backend's (f32 within reduction order, bf16 within bf16)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO
from cuda_host import HostRunner
from sexpgpu.ir.dtypes import DType
from sexpgpu.runtime.cuda.executor import ArrayDevice, LoweredProgram
from sexpgpu.runtime.numpy_backend import CompiledProgram
from test_cuda_codegen import example_programs, feeds_for

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")


def test_every_example_program_on_the_emulated_device_equals_the_numpy_backend() -> None:
    rng = np.random.default_rng(11)
    checked = 0
    for stem, name, program in example_programs():
        feeds_by_id = feeds_for(program, rng)
        feeds = {i.name: feeds_by_id[i.id] for i in program.inputs}
        want = CompiledProgram(program).run_copy(feeds)
        got = LoweredProgram(program, ArrayDevice(np, HostRunner())).run(feeds)
        types = program.types()
        for key, w in want.items():
            g = got[key]
            t = types[program.outputs[key]]
            assert g.shape == np.asarray(w).shape, (stem, name, key)
            if t.dtype in (DType.i32, DType.i64, DType.bool):
                np.testing.assert_array_equal(g, w, err_msg=f"{stem} {name} {key}")
                continue
            g64, w64 = np.asarray(g, dtype=np.float64), np.asarray(w, dtype=np.float64)
            scale = max(1e-3, float(np.max(np.abs(w64)))) if w64.size else 1.0
            tol = 2.0**-6 if t.dtype == DType.bf16 else 2e-4
            np.testing.assert_allclose(g64, w64, rtol=tol, atol=tol * scale, err_msg=f"{stem} {name} {key}")
        checked += 1
    assert checked >= 15, checked


def losses_of(folder: Path) -> list[float]:
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    return [e["loss"] for e in events if e["kind"] == "step"]


@pytest.mark.parametrize("example,steps", [("quickstart", 40), ("char-transformer", 8), ("cnn", 8)])
def test_examples_train_on_the_emulated_device_like_on_the_cpu(example: str, steps: int, tmp_path: Path) -> None:
    """The one training loop with the CUDA executor (host-compiled kernels) in place of the
    NumPy backend: the same loss at every step, within f32 reduction order."""
    from sexpgpu.compile.pipeline import compile_file
    from sexpgpu.runtime.loop import RunOptions, train

    experiment = compile_file(REPO / "examples" / f"{example}.lisp").experiment
    assert experiment is not None
    experiment.run.log_every = 1
    device = ArrayDevice(np, HostRunner())
    cpu = train(experiment, RunOptions(store=str(tmp_path / "cpu"), max_steps=steps, signals=False), say=lambda _: None)
    emulated = train(experiment, RunOptions(store=str(tmp_path / "cuda"), max_steps=steps, signals=False,
                                            programs=lambda program: LoweredProgram(program, device)), say=lambda _: None)
    assert cpu.exit_code == emulated.exit_code == 0
    a, b = losses_of(tmp_path / "cpu" / cpu.slug), losses_of(tmp_path / "cuda" / emulated.slug)
    assert len(a) == len(b) == steps
    np.testing.assert_allclose(b, a, rtol=1e-4)
