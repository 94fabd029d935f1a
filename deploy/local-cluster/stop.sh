#!/usr/bin/env bash
# Stop what start.sh started, by the pids it recorded: another Ray on this machine (a
# colleague's, a test's) is left alone.
set -uo pipefail
state="${SEXPGPU_LOCAL_CLUSTER:-$HOME/.sexpgpu-local-cluster}"
for name in ray s3; do
    file="$state/$name.pid"
    [ -f "$file" ] || continue
    pid="$(cat "$file")"
    if kill -TERM "$pid" 2>/dev/null; then
        for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$file"
done
echo "local cluster stopped"
