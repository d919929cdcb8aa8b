#!/usr/bin/env bash
# Start Triton on this repository's model_repository (the README's serve
# command; the container runs it too). Installs what it needs first.
#   scripts/serve.sh [--host ADDR] [--http-port N] [--grpc-port N]
#                    [--metrics-port N] [--model-dir DIR] [-- extra tritonserver flags]
# Environment: ROSE_MODEL_DIR (model folder; default: the embedded
# all-MiniLM-L6-v2), ROSE_<PARAMETER> (overrides that config.pbtxt parameter,
# e.g. ROSE_MAX_BATCH_TOKENS), ROSE_SKIP_SETUP=1 (use an existing tritonserver on PATH).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HOST=127.0.0.1 HTTP_PORT=8000 GRPC_PORT=8001 METRICS_PORT=8002
EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --host) HOST="$2"; shift 2 ;;
    --http-port) HTTP_PORT="$2"; shift 2 ;;
    --grpc-port) GRPC_PORT="$2"; shift 2 ;;
    --metrics-port) METRICS_PORT="$2"; shift 2 ;;
    --model-dir) export ROSE_MODEL_DIR="$2"; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "serve.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

if [[ "${ROSE_SKIP_SETUP:-0}" == "1" ]]; then
  TRITONSERVER="$(command -v tritonserver)"
  BACKENDS="${TRITON_BACKEND_DIR:-/opt/tritonserver/backends}"
else
  "$ROOT/scripts/setup.sh"
  VENV="${ROSE_VENV:-$ROOT/.venv}"
  TRITONSERVER="$ROOT/build/pytriton/tritonserver/bin/tritonserver"
  BACKENDS="$ROOT/build/pytriton/tritonserver/backends"
  # The Python stub finds site-packages through python3 on PATH and must load
  # the libpython of the venv's own interpreter (DESIGN.md fact 1).
  export PATH="$VENV/bin:$PATH"
  LIBDIR="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')"
  export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

echo "[serve] HTTP http://$HOST:$HTTP_PORT  gRPC $HOST:$GRPC_PORT  metrics http://$HOST:$METRICS_PORT/metrics" >&2
echo "[serve] model folder: ${ROSE_MODEL_DIR:-embedded all-MiniLM-L6-v2}; ready when http://$HOST:$HTTP_PORT/v2/health/ready answers 200" >&2
exec "$TRITONSERVER" \
  --model-repository "$ROOT/model_repository" \
  --backend-directory "$BACKENDS" \
  --http-address "$HOST" --http-port "$HTTP_PORT" \
  --grpc-address "$HOST" --grpc-port "$GRPC_PORT" \
  --metrics-address "$HOST" --metrics-port "$METRICS_PORT" \
  --model-control-mode none \
  "${EXTRA[@]}"
