"""Data-parallel gradients on the (emulated) CUDA device: the buckets a rank packs, all-reduces
and unpacks where its gradients live (workers/collective.py DeviceBuckets, NCCL's path), with a
stand-in for NCCL that plays W identical ranks. The layout is the host path's, a bucket
round-trips (f32 exactly, bf16 through one rounding, averaged natively or scaled), buckets
start as soon as the backward pass completes them, in the program's order, and a training
loop whose gradients stay on the device trains as one without a collective."""

from __future__ import annotations

import json
import shutil
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Literal

import ml_dtypes
import numpy as np
import pytest

from conftest import REPO
from cuda_host import HostRunner
from sexpgpu.ir.dtypes import DType
from sexpgpu.ir.graph import TensorType
from sexpgpu.runtime.lower.executor import ArrayDevice, DeviceBackend
from workers.collective import AllReduceSpec, DeviceBuckets, RankCollective, RankSpec, plan_buckets

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")

SHAPES = {"grad:a.w": (17, 5), "grad:a.b": (5,), "grad:b.w": (64, 64), "grad:b.b": (3,), "grad:c": (300,)}


class Ranks:
    """NCCL's part, played by W ranks that hold the same gradients: a sum is W times each, an
    average each itself. It records what it reduced, in order."""

    def __init__(self, world: int, averages: bool) -> None:
        self.world, self.averages = world, averages
        self.reduced: list[int] = []

    def allreduce_device(self, buffer: Any, op: Literal["avg", "sum"]) -> None:
        assert op == "sum" or self.averages
        self.reduced.append(int(buffer.size))
        if op == "sum":
            if buffer.dtype == np.uint16:  # bf16 bits: W x, rounded once
                buffer[...] = (buffer.view(ml_dtypes.bfloat16).astype(np.float32) * self.world).astype(ml_dtypes.bfloat16).view(np.uint16)
            else:
                buffer *= np.float32(self.world)

    def side_stream(self) -> Any:
        return nullcontext()

    def join_streams(self) -> None:
        pass

    # the host half of the collective backend (loss, metrics, flags): W identical ranks
    def allreduce_sum(self, buffer: np.ndarray) -> None:
        buffer *= self.world

    def allreduce_avg(self, buffer: np.ndarray) -> bool:
        return False

    def device_reducer(self) -> "Ranks":
        return self


def device() -> DeviceBackend:
    return DeviceBackend(ArrayDevice(np, HostRunner()))


def gradients() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}


@pytest.mark.parametrize("wire", ["f32", "bf16"])
@pytest.mark.parametrize("op,averages", [("avg", True), ("avg", False), ("sum", True)])
def test_the_device_buckets_round_trip_in_the_host_layout(wire: Literal["f32", "bf16"], op: Literal["avg", "sum"], averages: bool) -> None:
    spec = AllReduceSpec(dtype=wire, op=op, bucket_mb=0.002)  # 2 KiB: several buckets
    types = {k: TensorType(dtype=DType.f32, shape=s) for k, s in SHAPES.items()}
    grads = gradients()
    world = 2
    ranks = Ranks(world, averages)
    backend = device()
    buckets = DeviceBuckets(backend, types, spec, ranks, world)
    host = plan_buckets(grads, spec)
    assert [(b.names, b.offsets) for b in buckets.layouts] == [(b.names, b.offsets) for b in host]  # the host path's layout
    assert len(host) >= 3
    # the backward pass completes the gradients in its order; a bucket goes once it is whole
    resident = {k: backend.put(v, types[k]) for k, v in grads.items()}
    last = buckets.layouts[0].names[-1]
    for name in buckets.layouts[0].names:
        buckets.ready(name, resident[name])
        assert len(ranks.reduced) == (1 if name == last else 0)
    out = buckets.finish(resident)
    assert ranks.reduced == [layout.size for layout in buckets.layouts]
    for name, value in grads.items():
        want = value.astype(ml_dtypes.bfloat16).astype(np.float32) if wire == "bf16" else value
        if op == "sum":
            want = (want * world).astype(ml_dtypes.bfloat16).astype(np.float32) if wire == "bf16" else want * np.float32(world)
        elif not averages:  # the sum, scaled by 1/W on the device
            summed = (want * world).astype(ml_dtypes.bfloat16).astype(np.float32) if wire == "bf16" else want * np.float32(world)
            want = summed * np.float32(1.0 / world)
        got = backend.get(out[name], types[name])
        assert got.shape == value.shape and got.dtype == np.float32, name
        np.testing.assert_array_equal(got, want, err_msg=name)
    assert buckets.finish(resident).keys() == grads.keys()  # and again next step


def test_a_rank_whose_gradients_stay_on_the_device_trains_as_a_single_device(tmp_path: Path) -> None:
    """The loop with a collective that reduces resident gradients (one rank here): the train
    program hands each gradient over as soon as it is complete, every bucket is reduced
    during or after the backward pass, and the losses are a single device's."""
    from sexpgpu.compile.pipeline import compile_file
    from sexpgpu.runtime.attempt import RunOptions, train

    experiment = compile_file(REPO / "examples" / "char-transformer.lisp").experiment
    assert experiment is not None
    experiment.run.log_every = 1
    ranks = Ranks(1, averages=True)
    collective = RankCollective(RankSpec(rank=0, world=1, group="device-buckets", backend="nccl", allreduce=AllReduceSpec(bucket_mb=0.05)), ranks)  # type: ignore[arg-type]
    before_finish: list[int] = []  # buckets reduced when the step asks for them: those the backward pass started
    reduce_step = collective.reduce_step

    def counted(out: dict[str, Any]) -> dict[str, Any]:
        before_finish.append(len(ranks.reduced))
        return reduce_step(out)

    collective.reduce_step = counted  # type: ignore[method-assign]
    losses = {}
    for side, extra in (("alone", {}), ("rank", {"ranks": collective})):
        outcome = train(experiment, RunOptions(store=str(tmp_path / side), max_steps=4, signals=False, backend=device(), **extra), say=lambda _: None)
        assert outcome.exit_code == 0
        events = [json.loads(line) for line in (tmp_path / side / outcome.slug / "events.jsonl").read_text().splitlines()]
        losses[side] = [e["loss"] for e in events if e["kind"] == "step"]
    assert collective.device is not None and len(collective.device.layouts) > 3
    per_step = len(collective.device.layouts)
    assert len(ranks.reduced) == 4 * per_step  # every bucket, every step
    assert all(done - step * per_step == per_step for step, done in enumerate(before_finish)), before_finish  # all during the backward pass
    np.testing.assert_allclose(losses["rank"], losses["alone"], rtol=1e-6)
