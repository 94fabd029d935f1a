#!/usr/bin/env bash
# Everything that needs a GPU, in one call on a lent GPU machine (the device tool), within
# its minutes:
#   bash bench/gpu_wheels.sh                       # here, once: the wheels the machine lacks
#   run(command="bash bench/gpu_check.sh", carry=[".gpu-wheels"], timeout_s=540)
# It installs sexpgpu without touching the machine's torch/cupy/ml-dtypes, runs the CUDA
# tests (every op and every example program against NumPy, the examples' losses against the
# CPU's, the NCCL backend), then the benchmark against PyTorch eager and torch.compile.
# Results (pytest's log, the benchmark table) go to $OUT when it is set.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/sexpgpu-gpu-check}"
mkdir -p "$out"
export OPENBLAS_NUM_THREADS=1 PYTHONUNBUFFERED=1
{
    python -V
    nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv || true
    python -c "import cupy, torch, ml_dtypes; print('cupy', cupy.__version__, 'torch', torch.__version__, 'ml_dtypes', ml_dtypes.__version__)"
} 2>&1 | tee "$out/machine.txt"
if [ -d .gpu-wheels ]; then
    pip install -q --no-index --find-links .gpu-wheels pydantic fsspec safetensors pytest 2>&1 | tail -3
fi
pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -3 || pip install -q --no-deps -e . 2>&1 | tail -3
timeout 300 python -m pytest -q -x -p no:cacheprovider tests/test_cuda_device.py tests/test_nccl.py tests/test_cuda_codegen.py 2>&1 | tee "$out/tests.txt" | tail -25
timeout 200 python bench/gpu_vs_torch.py --steps 10 2>&1 | tee "$out/bench.txt" | tail -20
