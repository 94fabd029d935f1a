"""The ranks' NCCL backend through CuPy, on a GPU machine (skipped elsewhere): the unique id,
the communicator, bucketed all-reduce in f32 and bf16 with NCCL's avg and sum. One GPU
holds one rank (NCCL refuses two ranks on one device), so this checks the calls and the
bucket round trip with W=1; W>1 over NCCL needs a machine with several GPUs."""

from __future__ import annotations

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
