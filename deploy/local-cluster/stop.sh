#!/usr/bin/env bash
# Stop what start.sh started.
set -uo pipefail
state="${SEXPGPU_LOCAL_CLUSTER:-$HOME/.sexpgpu-local-cluster}"
ray stop >/dev/null 2>&1 || true
if [ -f "$state/s3.pid" ]; then
    kill "$(cat "$state/s3.pid")" 2>/dev/null || true
    rm -f "$state/s3.pid"
fi
echo "local cluster stopped"
