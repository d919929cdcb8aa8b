#!/usr/bin/env bash
# Start Triton on this repository's model_repository (the README's serve
# command; the container runs it too). Installs what it needs first.
#   scripts/serve.sh [--host ADDR] [--http-port N] [--grpc-port N]
#                    [--metrics-port N] [--model-dir DIR] [--rerank-model-dir DIR]
#                    [--model NAME=DIR ...] [--rerank-model NAME=DIR ...] [--models-file FILE]
#                    [--model-repository DIR] [--gateway-port N] [--no-gateway]
#                    [--otlp-endpoint URL] [--trace-sample-ratio R]
#                    [-- extra tritonserver flags]
# --model-dir is the default embedder (models ensemble, embed, tokenizer, rose_encoder);
# --model / --rerank-model (repeatable) and --models-file (JSON or YAML, with per-model
# settings; also ROSE_MODELS_FILE) serve more embedders and rerankers beside it, each
# under its own name: Triton models NAME, NAME_embed or NAME_score, NAME_tokenizer,
# NAME_encoder; the gateway's `model` field picks them (rose_triton/models_file.py).
# Beside Triton it starts the OpenAI-compatible gateway (python -m gateway) on
# --host:--gateway-port (default 8080) unless --no-gateway. On a --host other
# machines reach, the gateway needs API keys (ROSE_GATEWAY_API_KEYS,
# ROSE_GATEWAY_API_KEY_FILE or ROSE_GATEWAY_KEYS_FILE) or ROSE_GATEWAY_ALLOW_UNAUTHENTICATED=1: without
# either, serve.sh refuses to start (exit 1, naming them).
# Environment: ROSE_MODEL_DIR (model folder; default: the embedded
# all-MiniLM-L6-v2), ROSE_<PARAMETER> (overrides that config.pbtxt parameter,
# e.g. ROSE_MAX_BATCH_TOKENS), ROSE_RERANK_MODEL_DIR (a reranker folder: also
# serve `rerank` and `score`; ROSE_RERANK_<PARAMETER> overrides the reranker's
# parameters), ROSE_MODEL_<NAME>_<PARAMETER> (a parameter of the model served
# as NAME, upper-cased, other characters than A-Z 0-9 as _), ROSE_SKIP_SETUP=1 (use an existing tritonserver on PATH),
# ROSE_ADMIN_KEY or ROSE_ADMIN_KEY_FILE (admin API secret), ROSE_GATEWAY=0
# (same as --no-gateway), OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_SERVICE_NAME /
# OTEL_TRACES_SAMPLER(_ARG) (traces, off by default; --otlp-endpoint, --trace-sample-ratio),
# ROSE_TRITON_TRACE_RATE (Triton's own trace rate then, default 1), ROSE_WATCHDOG=0
# (no watchdog), ROSE_WATCHDOG_INTERVAL (seconds between its probes, default 5),
# ROSE_WATCHDOG_TIMEOUT (seconds a probe waits, default 10), ROSE_WATCHDOG_MAX_TIMEOUTS
# (probes in a row of one model without an answer that restart the server, default 3),
# ROSE_CORE_DUMPS=1 (a crashed process writes a core file; Python tracebacks are always logged),
# ROSE_CPU_BF16=off (dtype=auto serves float32 on every CPU, not bfloat16 where the CPU has AVX512-BF16/AMX),
# ROSE_GATEWAY_DATA_DIR (the Batch API's files and jobs; default under the user's data folder,
# ${XDG_DATA_HOME:-~/.local/share}/rose/gateway; set empty, the Batch API is off).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HOST=127.0.0.1 HTTP_PORT=8000 GRPC_PORT=8001 METRICS_PORT=8002
MODEL_REPOSITORY="$ROOT/model_repository"
GATEWAY="${ROSE_GATEWAY:-1}" GATEWAY_PORT=8080
EXTRA=() NAMED=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --host) HOST="$2"; shift 2 ;;
    --http-port) HTTP_PORT="$2"; shift 2 ;;
    --grpc-port) GRPC_PORT="$2"; shift 2 ;;
    --metrics-port) METRICS_PORT="$2"; shift 2 ;;
    --model-dir) export ROSE_MODEL_DIR="$2"; shift 2 ;;
    --rerank-model-dir) export ROSE_RERANK_MODEL_DIR="$2"; shift 2 ;;
    --model) NAMED+=(--model "$2"); shift 2 ;;
    --rerank-model) NAMED+=(--rerank-model "$2"); shift 2 ;;
    --models-file) export ROSE_MODELS_FILE="$2"; shift 2 ;;
    --model-repository) MODEL_REPOSITORY="$2"; shift 2 ;;
    --gateway-port) GATEWAY_PORT="$2"; shift 2 ;;
    --no-gateway) GATEWAY=0; shift ;;
    --otlp-endpoint) export OTEL_EXPORTER_OTLP_ENDPOINT="$2"; shift 2 ;;
    --trace-sample-ratio) export OTEL_TRACES_SAMPLER=parentbased_traceidratio OTEL_TRACES_SAMPLER_ARG="$2"; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "serve.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

# Admin APIs (model control, shared memory, statistics, trace, logging) answer
# only requests with header `rose-admin-key: <secret>` (gRPC metadata
# `triton-grpc-protocol-rose-admin-key`). Without a configured secret the key
# is random per start and never shown: the admin APIs are refused to everyone.
ADMIN_APIS="model-repository,shared-memory,statistics,trace,logging"
if [[ -n "${ROSE_ADMIN_KEY_FILE:-}" ]]; then
  ADMIN_KEY="$(tr -d '[:space:]' <"$ROSE_ADMIN_KEY_FILE")"
elif [[ -n "${ROSE_ADMIN_KEY:-}" ]]; then
  ADMIN_KEY="$ROSE_ADMIN_KEY"
else
  ADMIN_KEY="$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')"
fi
unset ROSE_ADMIN_KEY ROSE_ADMIN_KEY_FILE
if [[ ! "$ADMIN_KEY" =~ ^[A-Za-z0-9._~-]{16,}$ ]]; then
  echo "serve.sh: the admin key must be 16+ characters of A-Z a-z 0-9 . _ ~ -" >&2; exit 2
fi

if [[ "${ROSE_SKIP_SETUP:-0}" == "1" ]]; then
  TRITONSERVER="$(command -v tritonserver)"
  BACKENDS="${TRITON_BACKEND_DIR:-/opt/tritonserver/backends}"
else
  "$ROOT/scripts/setup.sh"
  VENV="${ROSE_VENV:-$ROOT/.venv}"
  TRITONSERVER="$ROOT/build/pytriton/tritonserver/bin/tritonserver"
  BACKENDS="$ROOT/build/pytriton/tritonserver/backends"
  # The Python stub finds site-packages through python3 on PATH and must load
  # the libpython of the venv's own interpreter (docs/platform.md, "Triton from the PyPI wheel").
  export PATH="$VENV/bin:$PATH"
  LIBDIR="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')"
  export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# A fatal signal (SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL) in the gateway or the watchdog
# prints every thread's Python traceback to the log (the model stubs ignore the environment
# and enable it themselves: rose_triton/faults.py); ROSE_CORE_DUMPS=1 also lets every crashed
# process write a core file (docs/operations.md, "Crashes").
export PYTHONFAULTHANDLER="${PYTHONFAULTHANDLER:-1}"
if [[ "${ROSE_CORE_DUMPS:-0}" == "1" ]]; then ulimit -c unlimited; fi
GATEWAY_ARGS=(--triton "$HOST:$GRPC_PORT" --host "$HOST" --port "$GATEWAY_PORT")
export ROSE_GATEWAY_DATA_DIR="${ROSE_GATEWAY_DATA_DIR-${XDG_DATA_HOME:-${HOME:-.}/.local/share}/rose/gateway}"

# Optional model sets (model_sets/<set>/) and models served by name are served beside the
# base repository in an assembled one (python3 -m rose_triton.repository); without any, the
# base is served as is. With named models the assembled repository lists them in
# served_models.json, which the gateway and the watchdog read.
SETS=()
if [[ -n "${ROSE_RERANK_MODEL_DIR:-}" ]]; then
  if [[ ! -f "$ROSE_RERANK_MODEL_DIR/config.json" ]]; then
    echo "serve.sh: --rerank-model-dir $ROSE_RERANK_MODEL_DIR is not a model folder (no config.json)" >&2; exit 2
  fi
  export ROSE_RERANK_MODEL_DIR="$(cd "$ROSE_RERANK_MODEL_DIR" && pwd)"
  SETS+=("$ROOT/model_sets/rerank")
fi
SERVED_MODELS_ARGS=()
if [[ ${#SETS[@]} -gt 0 || ${#NAMED[@]} -gt 0 || -n "${ROSE_MODELS_FILE:-}" ]]; then
  ASSEMBLED="$(mktemp -d "${TMPDIR:-/tmp}/rose-repository.XXXXXX")"
  trap 'rm -rf "$ASSEMBLED"' EXIT  # links and small files; the exec paths below leave it behind
  python3 -m rose_triton.repository "$ASSEMBLED" "$MODEL_REPOSITORY" "${SETS[@]}" "${NAMED[@]}" >/dev/null || exit 2
  MODEL_REPOSITORY="$ASSEMBLED"
  if [[ -f "$ASSEMBLED/served_models.json" ]]; then
    SERVED_MODELS_ARGS=(--models-file "$ASSEMBLED/served_models.json")
  fi
fi

if [[ "$GATEWAY" == 1 ]]; then  # its settings (keys for an open --host, model names), before anything starts
  python3 -m gateway.config "${GATEWAY_ARGS[@]}" --tokenizer-config "$MODEL_REPOSITORY/tokenizer/config.pbtxt" \
    "${SERVED_MODELS_ARGS[@]}"
fi

echo "[serve] HTTP http://$HOST:$HTTP_PORT  gRPC $HOST:$GRPC_PORT  metrics http://$HOST:$METRICS_PORT/metrics" >&2
[[ -z "${ROSE_RERANK_MODEL_DIR:-}" ]] || echo "[serve] reranker folder: $ROSE_RERANK_MODEL_DIR (models rerank, score)" >&2
[[ "$GATEWAY" == 1 ]] && echo "[serve] OpenAI-compatible API http://$HOST:$GATEWAY_PORT/v1 (gateway)" >&2
echo "[serve] model folder: ${ROSE_MODEL_DIR:-embedded all-MiniLM-L6-v2}; ready when http://$HOST:$HTTP_PORT/v2/health/ready answers 200" >&2
ARGS=(
  --model-repository "$MODEL_REPOSITORY"
  --backend-directory "$BACKENDS"
  --http-address "$HOST" --http-port "$HTTP_PORT"
  --grpc-address "$HOST" --grpc-port "$GRPC_PORT"
  --metrics-address "$HOST" --metrics-port "$METRICS_PORT"
  --model-control-mode none
  --http-restricted-api="$ADMIN_APIS:rose-admin-key=$ADMIN_KEY"
  --grpc-restricted-protocol="$ADMIN_APIS:rose-admin-key=$ADMIN_KEY"
  "${EXTRA[@]}"
)
# Traces (docs/operations.md, "Traces"): on with the standard OTLP variables (or --otlp-endpoint);
# the gateway and the encoder stubs read them, and Triton runs its own OpenTelemetry trace mode.
if [[ "${OTEL_SDK_DISABLED:-}" != "true" && "${OTEL_TRACES_EXPORTER:-otlp}" != "none" &&
      -n "${OTEL_EXPORTER_OTLP_TRACES_ENDPOINT:-${OTEL_EXPORTER_OTLP_ENDPOINT:-}}" ]]; then
  TRACES_URL="${OTEL_EXPORTER_OTLP_TRACES_ENDPOINT:-${OTEL_EXPORTER_OTLP_ENDPOINT%/}/v1/traces}"
  ARGS+=(--trace-config mode=opentelemetry --trace-config "opentelemetry,url=$TRACES_URL"
         --trace-config level=TIMESTAMPS --trace-config "rate=${ROSE_TRITON_TRACE_RATE:-1}")
  echo "[serve] traces to $TRACES_URL" >&2
fi
WATCHDOG=1
if [[ "${ROSE_WATCHDOG:-1}" == "0" ]]; then
  WATCHDOG=0
elif [[ ! -f "$ROOT/scripts/watchdog.py" ]]; then
  echo "[serve] WARNING: $ROOT/scripts/watchdog.py is missing; running without the watchdog" >&2
  WATCHDOG=0
fi
if [[ "$WATCHDOG" == 0 && "$GATEWAY" == 0 ]]; then
  exec "$TRITONSERVER" "${ARGS[@]}"
fi
# Supervised (default): Triton 2.51 never recovers from a dead or hung Python
# model stub, so scripts/watchdog.py stops such a server and every process below
# it (exit 3) and this loop starts a fresh one, as it does for a tritonserver that
# died of a signal (a crash); the gateway keeps running and
# finds the new server by itself. The gateway runs under a loop of its own that
# starts it again if it dies. SIGTERM/SIGINT stop the server and the gateway and
# end both loops.
STOPPING=0 TRITON_PID="" WATCHDOG_PID="" GATEWAY_PID=""
# The gateway stops too (it answers what it holds, then closes its streams:
# Triton waits for open streams before it exits). The watchdog stops first: stubs that end
# while Triton unloads are no fault.
trap 'STOPPING=1; [[ -z "$WATCHDOG_PID" ]] || kill "$WATCHDOG_PID" 2>/dev/null || true
      [[ -z "$GATEWAY_PID" ]] || kill -TERM "$GATEWAY_PID" 2>/dev/null || true
      [[ -z "$TRITON_PID" ]] || kill -TERM "$TRITON_PID" 2>/dev/null || true' TERM INT
finish() {
  [[ -z "$WATCHDOG_PID" ]] || kill "$WATCHDOG_PID" 2>/dev/null || true
  if [[ -n "$GATEWAY_PID" ]]; then kill -TERM "$GATEWAY_PID" 2>/dev/null || true; wait "$GATEWAY_PID" || true; fi
  exit "$1"
}
# The gateway's loop: a gateway that exits is started again after 1 s (doubling up
# to 30 s while it keeps exiting within a minute of its start). SIGTERM to the loop
# stops the gateway (it answers what it holds) and ends the loop: no restart.
supervise_gateway() {
  local child="" delay=1 started status
  trap '[[ -z "$child" ]] || kill -TERM "$child" 2>/dev/null || true; [[ -z "$child" ]] || wait "$child" || true
        exit 0' TERM
  while true; do
    started=$SECONDS
    python3 -m gateway "${GATEWAY_ARGS[@]}" --tokenizer-config "$MODEL_REPOSITORY/tokenizer/config.pbtxt" \
      "${SERVED_MODELS_ARGS[@]}" &
    child=$!
    status=0; wait "$child" || status=$?
    if (( SECONDS - started >= 60 )); then delay=1; fi
    echo "[serve] the gateway exited (status $status); starting it again in ${delay}s" >&2
    sleep "$delay" & child=$!
    wait "$child" || true  # `wait` (not a foreground sleep) lets SIGTERM end the loop at once
    delay=$(( delay * 2 > 30 ? 30 : delay * 2 ))
  done
}
if [[ "$GATEWAY" == 1 ]]; then
  supervise_gateway &
  GATEWAY_PID=$!
fi
CRASH_DELAY=1
while true; do
  STARTED=$SECONDS
  "$TRITONSERVER" "${ARGS[@]}" &
  TRITON_PID=$!
  if [[ "$WATCHDOG" == 1 ]]; then
    python3 "$ROOT/scripts/watchdog.py" --pid "$TRITON_PID" --url "http://$HOST:$HTTP_PORT" \
      --metrics-url "http://$HOST:$METRICS_PORT/metrics" --interval "${ROSE_WATCHDOG_INTERVAL:-5}" \
      --timeout "${ROSE_WATCHDOG_TIMEOUT:-10}" --max-timeouts "${ROSE_WATCHDOG_MAX_TIMEOUTS:-3}" \
      ${ROSE_RERANK_MODEL_DIR:+--probe-rerank} "${SERVED_MODELS_ARGS[@]}" &
    WATCHDOG_PID=$!
  fi
  # Wait once whatever happens: a tritonserver that has already exited (and been reaped by bash)
  # fails `kill -0`, but `wait` still gives its status. Again while it lives: a trapped signal ends
  # a `wait` early.
  status=0; wait "$TRITON_PID" || status=$?
  while kill -0 "$TRITON_PID" 2>/dev/null; do status=0; wait "$TRITON_PID" || status=$?; done
  if [[ "$STOPPING" == 1 || "$WATCHDOG" == 0 ]]; then finish "$status"; fi
  verdict=0
  wait "$WATCHDOG_PID" || verdict=$?
  WATCHDOG_PID=""
  if [[ "$verdict" == 3 && "$STOPPING" == 0 ]]; then
    echo "[serve] a model stub died or hung (see [watchdog] above); starting a fresh tritonserver" >&2
  elif (( status > 128 )) && [[ "$STOPPING" == 0 ]]; then
    # Killed by a signal it did not get from us: a crash (Triton 2.51's Python backend can abort
    # under load, e.g. boost::interprocess::lock_exception) or the OOM killer. Start again, after
    # 1 s doubling up to 30 s while it keeps dying within a minute of its start.
    if (( SECONDS - STARTED >= 60 )); then CRASH_DELAY=1; fi
    echo "[serve] tritonserver died of signal $(( status - 128 )); starting a fresh one in ${CRASH_DELAY}s" >&2
    sleep "$CRASH_DELAY" & wait $! || true
    CRASH_DELAY=$(( CRASH_DELAY * 2 > 30 ? 30 : CRASH_DELAY * 2 ))
  else
    finish "$status"
  fi
done
