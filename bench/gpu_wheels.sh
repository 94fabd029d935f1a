#!/usr/bin/env bash
# The wheels bench/gpu_check.sh installs on a GPU machine that cannot reach PyPI (it has
# torch, cupy and ml-dtypes already): sexpgpu's own dependencies, pytest and pytest-xdist,
# and setuptools and wheel (the editable install builds without isolation), for the Python
# versions such a machine may have (sexpgpu needs 3.11 or later); and the kernels precompiled for sm_90
# (.gpu-wheels/cubins.tar.gz, by bench/gpu_ready.py: NVRTC and ptxas, no GPU, with the Python
# that has the test extra, `$PYTHON` or `python`). Run here, then carry .gpu-wheels with the
# device call; the device tool carries at most 64 MiB, which the last line checks.
# GPU_WHEELS_OUT (the folder), GPU_WHEELS_PYTHONS (the versions) and GPU_WHEELS_KERNELS=0
# (no kernels) are for tests/gpu_machine.py, which simulates the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${GPU_WHEELS_OUT:-.gpu-wheels}"
mkdir -p "$out"
reqs=(pydantic==2.13.4 pydantic-core fsspec==2026.9.0 safetensors==0.8.0 typing-extensions annotated-types typing-inspection
      threadpoolctl==3.8.0 pytest==9.0.3 iniconfig pluggy packaging pygments pytest-xdist==3.8.0 execnet==2.1.2 setuptools wheel)
for py in ${GPU_WHEELS_PYTHONS:-3.11 3.12 3.13}; do
    pip download -q --only-binary=:all: --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        --python-version "$py" --implementation cp --dest "$out" "${reqs[@]}"
done
if [ "${GPU_WHEELS_KERNELS:-1}" != 0 ]; then
    "${PYTHON:-python}" bench/gpu_ready.py --no-install --pack "$out/cubins.tar.gz" | tail -1
fi
du -sh "$out"
size=$(du -sb "$out" | cut -f1)
[ "$size" -le $((64 * 1024 * 1024)) ] || { echo "gpu_wheels: $out is $size bytes, over the 64 MiB the device tool carries" >&2; exit 1; }
