#!/usr/bin/env bash
# Try the whole cluster path on one machine: a Ray head on 127.0.0.1 and a loopback S3
# server (moto's, from the test extra). stop.sh stops exactly these processes, by the pids
# recorded here, and nothing else of Ray on the machine.
#
# The S3 server keeps its buckets in memory: stop.sh drops every run stored in it.
#
#   export ...  (the variables README.md gives), then:
#   bash deploy/local-cluster/start.sh
#   sexpgpu sweep examples/sweep.lisp --sweep lr --ray --devices 2
#   bash deploy/local-cluster/stop.sh
set -euo pipefail
state="${SEXPGPU_LOCAL_CLUSTER:-$HOME/.sexpgpu-local-cluster}"
mkdir -p "$state"
s3_port="${S3_PORT:-9000}"
ray_port="${RAY_PORT:-6379}"

wait_for_port() {
    for _ in $(seq 300); do
        python - "$1" <<'PY' && return 0
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=0.2).close()
except OSError:
    sys.exit(1)
PY
        sleep 0.2
    done
    echo "nothing answers on 127.0.0.1:$1 (see $state/*.log)" >&2
    return 1
}

export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE=disabled
# --block: this ray process owns the head's processes and stops them all when it is stopped
nohup ray start --head --block --node-ip-address=127.0.0.1 --port="$ray_port" --include-dashboard=false >"$state/ray.log" 2>&1 &
echo $! >"$state/ray.pid"
wait_for_port "$ray_port"

nohup python -m moto.server -H 127.0.0.1 -p "$s3_port" >"$state/s3.log" 2>&1 &
echo $! >"$state/s3.pid"
wait_for_port "$s3_port"

AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-local}" AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-local}" AWS_REGION="${AWS_REGION:-us-east-1}" \
    AWS_ENDPOINT_URL="http://127.0.0.1:$s3_port" python -c "import boto3; boto3.client('s3').create_bucket(Bucket='sexpgpu')"

cat <<EOT
local cluster up: Ray on 127.0.0.1:$ray_port, S3 on 127.0.0.1:$s3_port (in memory: stop.sh drops its buckets).
If your shell does not have them yet:
  export AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local AWS_REGION=us-east-1
  export AWS_ENDPOINT_URL=http://127.0.0.1:$s3_port SEXPGPU_RAY_ADDRESS=127.0.0.1:$ray_port
  export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE=disabled   # keep Ray clients on 127.0.0.1
  export SEXPGPU_STORE=s3://sexpgpu/runs
  sexpgpu sweep examples/sweep.lisp --sweep lr --ray --devices 2
EOT
