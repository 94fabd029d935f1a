#!/usr/bin/env bash
# The wheels bench/gpu_check.sh installs on a GPU machine that cannot reach PyPI (it has
# torch, cupy and ml-dtypes already): sexpgpu's own dependencies and pytest, for the Python
# versions such a machine may have. Run here, then carry .gpu-wheels with the device call.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu-wheels
mkdir -p "$out"
reqs=(pydantic==2.13.4 pydantic-core fsspec==2026.9.0 safetensors==0.8.0 typing-extensions annotated-types typing-inspection
      pytest==9.0.3 iniconfig pluggy packaging pygments)
for py in 3.10 3.11 3.12 3.13; do
    pip download -q --only-binary=:all: --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        --python-version "$py" --implementation cp --dest "$out" "${reqs[@]}"
done
du -sh "$out"
