"""The ranks' NCCL backend through CuPy, on a GPU machine (skipped elsewhere): the unique id,
the communicator, bucketed all-reduce in f32 and bf16 with NCCL's avg and sum, from host
buffers and from the CUDA device's resident gradients (reduced where they are). W=2 against
W=1 on one GPU runs when NCCL lets two ranks share the device; NCCL refuses that by default,
and the test then skips with NCCL's own message (W>1 then needs a machine with several
GPUs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
pytest.importorskip("ml_dtypes")


def gpu_count() -> int:
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no driver, no device
        return 0


def nccl_available() -> bool:
    try:
        from cupy.cuda import nccl

        return bool(getattr(nccl, "available", True))
    except Exception:  # CuPy built without its NCCL module
        return False


pytestmark = [pytest.mark.skipif(gpu_count() == 0, reason="no CUDA device"), pytest.mark.skipif(not nccl_available(), reason="CuPy has no NCCL")]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("op", ["avg", "sum"])
def test_one_rank_nccl_all_reduce_round_trips_the_gradients(dtype: str, op: str) -> None:
    from workers.collective import AllReduceSpec, NcclBackend, RankCollective, RankSpec, nccl_unique_id

    spec = RankSpec(rank=0, world=1, group="nccl-test", backend="nccl", nccl_id=nccl_unique_id(),
                    allreduce=AllReduceSpec(dtype=dtype, op=op, bucket_mb=0.001), rendezvous_timeout_s=30)
    collective = RankCollective(spec, NcclBackend(spec))
    rng = np.random.default_rng(0)
    out = {"loss": np.float32(1.5), "metric:acc": np.float32(0.25)}
    for i, shape in enumerate([(17, 5), (300,), (64, 64)]):
        out[f"grad:p{i}"] = rng.standard_normal(shape).astype(np.float32)
    reduced = collective.reduce_step(out)
    tol = 0.0 if dtype == "f32" else 2.0**-8
    for key, value in out.items():
        np.testing.assert_allclose(reduced[key], value, rtol=tol, atol=0)
    assert collective.agree(True) is True


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("op", ["avg", "sum"])
def test_one_rank_nccl_reduces_the_device_buckets_where_they_are(dtype: str, op: str) -> None:
    """With the CUDA device the gradients stay on the GPU: packed by a generated kernel,
    all-reduced in place on the communication stream, unpacked (bf16) or viewed (f32)."""
    from sexpgpu.ir.dtypes import DType
    from sexpgpu.ir.graph import TensorType
    from sexpgpu.runtime.devices import open_backend
    from workers.collective import AllReduceSpec, NcclBackend, RankCollective, RankSpec, nccl_unique_id

    backend = open_backend("cuda")
    spec = RankSpec(rank=0, world=1, group="nccl-device", backend="nccl", nccl_id=nccl_unique_id(),
                    allreduce=AllReduceSpec(dtype=dtype, op=op, bucket_mb=0.001), rendezvous_timeout_s=30)
    collective = RankCollective(spec, NcclBackend(spec))
    rng = np.random.default_rng(0)
    host = {f"grad:p{i}": rng.standard_normal(shape).astype(np.float32) for i, shape in enumerate([(17, 5), (300,), (64, 64)])}
    types = {k: TensorType(dtype=DType.f32, shape=v.shape) for k, v in host.items()}
    assert collective.reduces_resident(backend, types)
    resident = {k: backend.put(v, types[k]) for k, v in host.items()}
    for name in reversed(sorted(resident)):
        collective.gradient_ready(name, resident[name])
    reduced = collective.reduce_step({"loss": np.float32(1.5), **resident})
    tol = 0.0 if dtype == "f32" else 2.0**-8
    for key, value in host.items():
        assert isinstance(reduced[key], cupy.ndarray), key  # it never went to the host
        np.testing.assert_allclose(backend.get(reduced[key], types[key]), value, rtol=tol, atol=0, err_msg=key)
    assert float(reduced["loss"]) == 1.5


TWO_RANKS = r"""
import json, sys
import numpy as np
rank, uid, store, path, steps = int(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
from pathlib import Path
from workers.collective import AllReduceSpec, NcclBackend, RankCollective, RankSpec
spec = RankSpec(rank=rank, world=2, group="two-on-one", backend="nccl", nccl_id=uid, allreduce=AllReduceSpec(bucket_mb=1.0), rendezvous_timeout_s=30)
try:
    nccl = NcclBackend(spec)
except Exception as exc:  # NCCL's answer to two ranks on one GPU
    print(json.dumps({"refused": f"{type(exc).__name__}: {exc}"}))
    sys.exit(0)
from sexpgpu.compile.pipeline import compile_file
from sexpgpu.runtime.attempt import RunOptions, train
from sexpgpu.runtime.devices import open_backend
experiment = compile_file(Path(path), world=2).experiment
experiment.run.log_every = 1
outcome = train(experiment, RunOptions(store=store, device="cuda", backend=open_backend("cuda"), max_steps=steps, ranks=RankCollective(spec, nccl), signals=False),
                say=lambda _: None)
print(json.dumps({"code": int(outcome.exit_code), "slug": outcome.slug}))
"""


def test_two_nccl_ranks_on_one_gpu_train_as_one_device(tmp_path: Path) -> None:
    """W=2 against W=1 on one GPU, when NCCL lets two ranks share it (it refuses by default:
    then this says so, as a skip with NCCL's message)."""
    import json
    import os
    import subprocess
    import sys

    from conftest import REPO
    from sexpgpu.compile.pipeline import compile_file
    from sexpgpu.runtime.attempt import RunOptions, train
    from sexpgpu.runtime.devices import open_backend
    from workers.collective import nccl_unique_id

    script = tmp_path / "rank.py"
    script.write_text(TWO_RANKS)
    path, steps = REPO / "examples" / "char-transformer.lisp", 20
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OPENBLAS_NUM_THREADS": "1"}
    uid = json.dumps(nccl_unique_id())
    ranks = [subprocess.Popen([sys.executable, str(script), str(r), uid, str(tmp_path / "two"), str(path), str(steps)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=REPO) for r in (0, 1)]
    results = []
    for rank in ranks:
        out, err = rank.communicate(timeout=150)
        assert rank.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    refused = [r["refused"] for r in results if "refused" in r]
    if refused:
        pytest.skip(f"NCCL refuses two ranks on one GPU here, so W=2 against W=1 needs two GPUs: {refused[0]}")
    assert all(r["code"] == 0 for r in results), results
    experiment = compile_file(path).experiment
    assert experiment is not None
    experiment.run.log_every = 1
    alone = train(experiment, RunOptions(store=str(tmp_path / "one"), device="cuda", backend=open_backend("cuda"), max_steps=steps, signals=False),
                  say=lambda _: None)
    assert alone.exit_code == 0

    def losses(store: Path, slug: str) -> list[float]:
        events = [json.loads(line) for line in (store / slug / "events.jsonl").read_text().splitlines()]
        return [e["loss"] for e in events if e["kind"] == "step"]

    np.testing.assert_allclose(losses(tmp_path / "two", results[0]["slug"]), losses(tmp_path / "one", alone.slug), rtol=1e-3)
