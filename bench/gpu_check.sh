#!/usr/bin/env bash
# Everything that needs a GPU, in one call on a lent GPU machine (the device tool), within
# its minutes:
#   bash bench/gpu_wheels.sh                       # here, once: the wheels the machine lacks and the precompiled kernels
#   run(command="bash bench/gpu_check.sh", carry=[".gpu-wheels"], timeout_s=540)
# It installs sexpgpu without touching the machine's torch/cupy/ml-dtypes, unpacks the
# kernels precompiled for sm_90 (.gpu-wheels/cubins.tar.gz, built by bench/gpu_ready.py
# without a GPU) into the kernel cache the CUDA device reads, so that its minutes go to
# running rather than to NVRTC; then, cheapest first so that a cut-off run still reports what
# it reached: the small benchmark (the char transformer against PyTorch eager and
# torch.compile), the CUDA tests (every op of the op tables through NVRTC and cuBLAS against
# NumPy, every reduction strategy, cuBLAS with transpose flags, fused attention against the
# unfused path, every example program against NumPy, the examples' losses and the whole loop
# against the CPU's, the NCCL backend from host and from device buffers, and W=2 against W=1
# on this one GPU, which NCCL may refuse: the test then skips with NCCL's message, printed by
# -rs), then the GPT-2-sized benchmark. No test stops the others (no -x). Each part's output
# goes to $OUT (machine.txt, bench-small.txt, tests.txt, bench-gpt2.txt) as it runs; each
# benchmark prints a row as soon as it is measured.
#
# The timeouts (100 + 270 + 130 s after the install, within the 540 s call) are not measured on
# a GPU yet: NVRTC alone was about 85 s of the tests and 87 s of the GPT-2 benchmark without
# the precompiled kernels (docs/devices.md "Before the first GPU run"), which they now skip.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/sexpgpu-gpu-check}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export SEXPGPU_CACHE="${SEXPGPU_CACHE:-/tmp/sexpgpu-gpu-cache}"
started=$SECONDS
# what explains a failure, first: the GPU, the driver, CUDA, NVRTC and the C compiler
{
    python -V
    nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv || true
    nvidia-smi || true
    python -c "import cupy, torch, ml_dtypes; print('cupy', cupy.__version__, 'torch', torch.__version__, 'ml_dtypes', ml_dtypes.__version__)"
    python -c "import cupy; cupy.show_config()"
    (cc --version || gcc --version || echo "no C compiler: the CPU comparisons run on --device numpy") 2>&1 | head -1
} 2>&1 | tee "$out/machine.txt"
# -- install (tests/gpu_machine.py runs these lines as they are, on a simulated machine) --
if [ -d .gpu-wheels ]; then
    pip install -q --no-index --find-links .gpu-wheels setuptools wheel pydantic fsspec safetensors threadpoolctl pytest pytest-xdist execnet 2>&1 | tail -3
fi
pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -3 || pip install -q --no-deps -e . 2>&1 | tail -3
if [ -f .gpu-wheels/cubins.tar.gz ]; then
    mkdir -p "$SEXPGPU_CACHE" && tar -xzf .gpu-wheels/cubins.tar.gz -C "$SEXPGPU_CACHE"
fi
# -- end install --
echo "precompiled kernels: $(find "$SEXPGPU_CACHE/cubins" -name '*.cubin' -not -path '*/units/*' 2>/dev/null | wc -l) in $SEXPGPU_CACHE/cubins" | tee -a "$out/machine.txt"
echo "installed after $((SECONDS - started)) s" | tee -a "$out/machine.txt"
timeout 100 python bench/gpu_vs_torch.py --steps 20 --only char-transformer 2>&1 | tee "$out/bench-small.txt" | tail -8
echo "small benchmark done after $((SECONDS - started)) s" | tee -a "$out/machine.txt"
timeout 270 python -m pytest -q -p no:cacheprovider -n 4 --dist loadgroup -rs --durations=10 tests/test_cuda_device.py tests/test_nccl.py 2>&1 | tee "$out/tests.txt" | tail -30
echo "tests done after $((SECONDS - started)) s" | tee -a "$out/machine.txt"
timeout 130 python bench/gpu_vs_torch.py --steps 10 --only gpt2 2>&1 | tee "$out/bench-gpt2.txt" | tail -8
echo "all done after $((SECONDS - started)) s" | tee -a "$out/machine.txt"
