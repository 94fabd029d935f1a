"""Whole programs on the CUDA executor without a GPU: the executor runs every example's
programs with NumPy as the array module and the generated kernels compiled for the host, and
its outputs equal the NumPy backend's (f32 within reduction order, bf16 within bf16)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from conftest import REPO
from cuda_host import HostRunner
from sexpgpu.ir.dtypes import DType
from sexpgpu.runtime.lower.executor import ArrayDevice, DeviceBackend, LoweredProgram
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
    from sexpgpu.runtime.attempt import RunOptions, train

    experiment = compile_file(REPO / "examples" / f"{example}.lisp").experiment
    assert experiment is not None
    experiment.run.log_every = 1
    device = ArrayDevice(np, HostRunner())
    cpu = train(experiment, RunOptions(store=str(tmp_path / "cpu"), max_steps=steps, signals=False), say=lambda _: None)
    emulated = train(experiment, RunOptions(store=str(tmp_path / "cuda"), max_steps=steps, signals=False,
                                            backend=DeviceBackend(device)), say=lambda _: None)
    assert cpu.exit_code == emulated.exit_code == 0
    a, b = losses_of(tmp_path / "cpu" / cpu.slug), losses_of(tmp_path / "cuda" / emulated.slug)
    assert len(a) == len(b) == steps
    np.testing.assert_allclose(b, a, rtol=1e-4)


WHOLE_LOOP = """
(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)
(defloader train :source (synthetic :spirals :n 512 :classes 3 :seed 0)
  :fields ((x :f32 (2)) (y :i32 ())) :batch 16)
(defloader val :source (synthetic :spirals :n 100 :classes 3 :seed 7)
  :fields ((x :f32 (2)) (y :i32 ())) :batch 32)
(defpart net (nn:mlp 2 32 3))
(defobjective (batch)
  (let ((logits (net (field batch x))))
    (metric acc (nn:accuracy logits (field batch y)))
    (nn:cross-entropy logits (field batch y))))
(defevaluate (batch)
  (metric loss (nn:cross-entropy (net (field batch x)) (field batch y))))
(defeval val :loader val :every 4 :overlap t)
(defgroups (all "**" (optim:adamw :lr 0.01 :weight-decay 0.1)))
(defrun :steps 12 :seed 3 :microbatches 2 :precision :bf16 :log-every 1
  :checkpoint (:every 3 :keep 5) :diagnostics (:every 2 :select ("**")))
"""


def test_the_whole_loop_keeps_its_tensors_on_the_emulated_device(tmp_path: Path) -> None:
    """Parameters, optimizer state and gradients resident on the device between programs,
    with microbatches, bf16, diagnostics, evaluation, checkpoints and a resume: the same
    events and checkpoints as the CPU's, within f32 reduction order."""
    check_whole_loop(tmp_path, DeviceBackend(ArrayDevice(np, HostRunner())))


def check_whole_loop(tmp_path: Path, backend: Any) -> None:
    """WHOLE_LOOP on BACKEND (stopped at step 6, resumed to 12) against the CPU."""
    from sexpgpu.compile.pipeline import compile_file
    from sexpgpu.runtime.checkpoint import load_checkpoint
    from sexpgpu.runtime.attempt import RunOptions, train
    from sexpgpu.runtime.trainer import Trainer
    from sexpgpu.runtime.store import Store

    (tmp_path / ".git").mkdir()
    path = tmp_path / "loop.lisp"
    path.write_text(WHOLE_LOOP)
    result = compile_file(path)
    experiment = result.experiment
    assert experiment is not None, [d.headline() for d in result.diagnostics]
    trainer = Trainer(experiment, None, backend)
    host = Trainer(experiment).params
    assert all(trainer.params[p] is not host[p] for p in host)  # resident copies, not the host's arrays

    cpu = train(experiment, RunOptions(store=str(tmp_path / "cpu"), signals=False), say=lambda _: None)
    first = train(experiment, RunOptions(store=str(tmp_path / "cuda"), max_steps=6, signals=False, backend=backend), say=lambda _: None)
    resumed = train(experiment, RunOptions(store=str(tmp_path / "cuda"), signals=False, backend=backend), say=lambda _: None)
    assert cpu.exit_code == first.exit_code == resumed.exit_code == 0
    events = {side: [json.loads(line) for line in (tmp_path / side / cpu.slug / "events.jsonl").read_text().splitlines()] for side in ("cpu", "cuda")}
    assert any(e["kind"] == "resume" and e["from_step"] == 6 for e in events["cuda"])
    ratios = [v for e in events["cpu"] if e["kind"] == "diagnostic" for k, v in e["values"].items() if k.startswith("update-ratio/")]
    assert ratios and min(ratios) > 0  # "before" is a copy, not the updated parameters themselves
    for kind, field in (("step", "loss"), ("step", "grad_norm"), ("eval", "metrics"), ("diagnostic", "values")):
        # by step (the stopped attempt also evaluated at its end, step 6)
        want = {e["step"]: e[field] for e in events["cpu"] if e["kind"] == kind and e.get(field) is not None}
        got = {e["step"]: e[field] for e in events["cuda"] if e["kind"] == kind and e.get(field) is not None}
        assert set(want) <= set(got) and want, (kind, field)
        for step, w in want.items():
            g = got[step]
            if isinstance(w, dict):
                assert w.keys() == g.keys()
                np.testing.assert_allclose([g[k] for k in w], [w[k] for k in w], rtol=2e-3, atol=1e-6, err_msg=field)
            else:
                np.testing.assert_allclose(g, w, rtol=2e-3, err_msg=field)
    for step in ("step-000006", "step-000012"):
        want_params, want_states, _ = load_checkpoint(Store.open(str(tmp_path / "cpu")), cpu.slug, step)
        got_params, got_states, _ = load_checkpoint(Store.open(str(tmp_path / "cuda")), cpu.slug, step)
        for want, got in ((want_params, got_params), (want_states, got_states)):
            assert want.keys() == got.keys()
            for key in want:
                assert got[key].dtype == want[key].dtype, key
                np.testing.assert_allclose(got[key], want[key], rtol=1e-2, atol=1e-4, err_msg=f"{step} {key}")


MATMUL_SHAPES = [((5, 3), (3, 4)), ((2, 6, 5, 3), (3, 4)), ((4, 5, 3), (4, 3, 7)), ((2, 3, 5, 3), (2, 3, 3, 2)), ((3, 5, 3), (1, 3, 2)),
                 ((2, 1, 5, 3), (4, 3, 2)), ((5, 3), (2, 3, 4)), ((1, 1), (1, 1))]


@pytest.mark.parametrize("a_shape,b_shape", MATMUL_SHAPES)
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("dtype", [DType.f32, DType.bf16])
def test_the_cublas_calls_of_a_matmul_compute_it_by_cublas_contract(a_shape: tuple[int, ...], b_shape: tuple[int, ...], trans_a: bool, trans_b: bool,
                                                                       dtype: DType) -> None:
    """The row-major product (broadcast batches included) through cuBLAS's column-major calls,
    transposed operands passed as they are stored (the transpose flag), checked against what
    cuBLAS's documentation says each call computes; bf16 accumulates in f32, rounded once."""
    from cuda_host import cublas_gemm
    from sexpgpu.ir.builder import broadcast_shapes
    from sexpgpu.runtime.lower.blas import matmul_calls

    rng = np.random.default_rng(5)
    a, b = rng.standard_normal(a_shape).astype(np.float32), rng.standard_normal(b_shape).astype(np.float32)
    if dtype == DType.bf16:
        a, b = a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16)
    want = np.matmul(a.astype(np.float32), b.astype(np.float32))
    stored_a = np.ascontiguousarray(a.swapaxes(-1, -2)) if trans_a else a
    stored_b = np.ascontiguousarray(b.swapaxes(-1, -2)) if trans_b else b
    out_shape = broadcast_shapes(a_shape[:-2], b_shape[:-2], "matmul") + (a_shape[-2], b_shape[-1])
    calls = matmul_calls(stored_a.shape, stored_b.shape, out_shape, trans_a, trans_b, dtype)
    storage = np.uint16 if dtype == DType.bf16 else np.float32
    out = np.full(out_shape, 7, dtype=storage)
    for call in calls:
        cublas_gemm(call, np.ascontiguousarray(stored_b).view(storage), np.ascontiguousarray(stored_a).view(storage), out)
    got = out.view(ml_dtypes.bfloat16).astype(np.float32) if dtype == DType.bf16 else out
    tol = 2.0**-8 if dtype == DType.bf16 else 1e-6  # bf16: the f32 product rounded once
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    assert len(calls) == (2 if (a_shape, b_shape) == ((2, 1, 5, 3), (4, 3, 2)) else 1), calls  # one call unless no stride describes the batch


def test_frozen_parameters_stay_put_on_the_cpu_and_the_emulated_device(tmp_path: Path) -> None:
    """A :frozen group's parameters are resident too (the update program does not read them)
    and never change; the others train the same on both backends."""
    from sexpgpu.compile.pipeline import compile_file
    from sexpgpu.runtime.backend import HostBackend
    from sexpgpu.runtime.trainer import Trainer

    (tmp_path / ".git").mkdir()
    path = tmp_path / "frozen.lisp"
    path.write_text(WHOLE_LOOP.replace('(defgroups (all "**" (optim:adamw :lr 0.01 :weight-decay 0.1)))',
                                       '(defgroups (frozen "net.layers.0.*" :frozen) (all "**" (optim:adamw :lr 0.01 :weight-decay 0.1)))'))
    result = compile_file(path)
    experiment = result.experiment
    assert experiment is not None, [d.headline() for d in result.diagnostics]
    losses = {}
    for name, backend in (("cpu", HostBackend()), ("device", DeviceBackend(ArrayDevice(np, HostRunner())))):
        trainer = Trainer(experiment, None, backend)
        start = trainer.host_params()
        losses[name] = [trainer.train_step().loss for _ in range(4)]
        end = trainer.host_params()
        assert all(np.array_equal(start[p], end[p]) for p in start if p.startswith("net.layers.0.")), name
        assert not np.array_equal(start["net.layers.1.w"], end["net.layers.1.w"]), name
    np.testing.assert_allclose(losses["device"], losses["cpu"], rtol=2e-3)


def test_a_device_run_says_for_each_program_which_ops_run_on_the_host(tmp_path: Path) -> None:
    """`run --device cuda` prints one line per program it loads, from the runtime's side
    (the attempt's say): every op on the device, or the ops on the host with the bytes they
    copy per run (here random-normal noise on the inputs)."""
    from sexpgpu.compile.pipeline import compile_file
    from sexpgpu.runtime.attempt import RunOptions, train

    (tmp_path / ".git").mkdir()
    path = tmp_path / "noisy.lisp"
    path.write_text(WHOLE_LOOP.replace("(net (field batch x))))\n    (metric acc", "(net (+ (field batch x) (* 0.01 (random-normal '(16 2)))))))\n    (metric acc")
                    .replace(":microbatches 2 :precision :bf16", ":precision :f32"))
    experiment = compile_file(path).experiment
    assert experiment is not None
    said: list[str] = []
    outcome = train(experiment, RunOptions(store=str(tmp_path / "runs"), max_steps=2, signals=False, backend=DeviceBackend(ArrayDevice(np, HostRunner()))),
                    say=said.append)
    assert outcome.exit_code == 0
    notices = [line for line in said if line.startswith("cuda: ")]
    assert "cuda: update: every op runs on the device" in notices and "cuda: eval:val: every op runs on the device" in notices, notices
    (train_line,) = [line for line in notices if line.startswith("cuda: train: ")]
    assert train_line.endswith(f"1 op on the host (%{train_line.split('%')[1].split()[0]} random_normal): {8 + 16 * 2 * 4:,} bytes copied per run"), train_line


@pytest.mark.parametrize("dtype", [DType.f32, DType.bf16])
def test_microbatch_sums_and_scalings_stay_on_the_device_and_equal_the_host(dtype: DType) -> None:
    """DeviceBackend.add and .scaled (the microbatches' gradient sums) are generated kernels,
    bf16 as its bits: the host backend's values exactly."""
    import ml_dtypes

    from sexpgpu.ir.graph import TensorType
    from sexpgpu.runtime.backend import HostBackend

    t = TensorType(dtype=dtype, shape=(3, 7))
    rng = np.random.default_rng(3)
    host_dtype = ml_dtypes.bfloat16 if dtype == DType.bf16 else np.float32
    a, b = (rng.standard_normal((3, 7)).astype(host_dtype) for _ in range(2))
    device, host = DeviceBackend(ArrayDevice(np, HostRunner())), HostBackend()
    total = device.add(None, device.put(a, t), t)
    total = device.add(total, device.put(b, t), t)
    want = host.add(host.add(None, a.copy(), t), b, t)
    np.testing.assert_array_equal(device.get(total, t), want)
    np.testing.assert_array_equal(device.get(device.scaled(total, 1 / 3, t), t), host.scaled(want, 1 / 3, t))
