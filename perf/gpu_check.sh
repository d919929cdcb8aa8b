#!/usr/bin/env bash
# One prepared GPU session (one device call, under 8 minutes; docs/benchmarks.md has the command):
#  1. GPU tests (pytest -m gpu): graph replay == eager, a failed capture restores the stream,
#     varlen/FlashInfer == SDPA on strided GQA q/k/v, bf16 within cosine 0.999 of fp32;
#  2. the served path (perf/gpu_served.py): build_encoder as the Triton model does it (bf16,
#     graphs, max_batch_tokens=auto, self-check), threads submitting concurrent mixed-length
#     requests checked row by row against fp32 eager, the seed's scenarios 1-3 through the
#     Encoder, graph counters;
#  3. the seed's low-latency scenario engine-only (perf/gpu_latency.py): eager vs graphs vs HF.
# Random-weight Qwen3-Embedding-0.6B-shaped model throughout (no downloads on that machine).
#   perf/gpu_check.sh [--dry-run] [--out DIR]
# Results: DIR (default perf/results/<date>-<gpu>/): gpu_served.json/.md (the harness's format,
# for `python -m perf readme`), latency.json, gpu_tests.log/.xml, summary.txt.
# --dry-run: CPU only, tiny model, small sizes (CI); writes to a temporary folder unless --out.
# FlashInfer is not installed by this script: give it its own call (docs/benchmarks.md).
# PYTHON selects the interpreter (default python3).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
DRY_RUN=0
OUT_DIR=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY_RUN=1; shift ;;
    --out) OUT_DIR="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
if [[ -z "$OUT_DIR" ]]; then
  if [[ "$DRY_RUN" == 1 ]]; then
    OUT_DIR="$(mktemp -d -t gpu_check_dry.XXXXXX)"  # a dry run never writes into perf/results/
  else
    slug="$("$PYTHON" -c 'import re, torch; print(re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name().lower()).strip("-"))' 2>/dev/null || echo gpu)"
    OUT_DIR="$ROOT/perf/results/$(date -u +%Y-%m-%d)-$slug"
  fi
fi
mkdir -p "$OUT_DIR"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export GIT_COMMIT="${GIT_COMMIT:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || true)}"
cd "$ROOT"
log() { echo "[gpu_check] $*" | tee -a "$OUT_DIR/summary.txt" >&2; }
log "results in $OUT_DIR"

if [[ "$DRY_RUN" == 1 ]]; then
  log "dry run on CPU: $("$PYTHON" -c 'import torch; print("torch", torch.__version__)')"
  "$PYTHON" -m perf.gpu_served --dry-run --out "$OUT_DIR" 2>&1 | tee -a "$OUT_DIR/summary.txt"
  served=${PIPESTATUS[0]}
  "$PYTHON" -m perf.gpu_latency --dry-run --out "$OUT_DIR" 2>&1 | tee -a "$OUT_DIR/summary.txt"
  latency=${PIPESTATUS[0]}
  log "dry run exit statuses: served $served, latency $latency"
  [[ $served == 0 && $latency == 0 ]]
  exit $?
fi

"$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || { log "no CUDA device"; exit 2; }
log "$("$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())')"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee -a "$OUT_DIR/summary.txt"

tests_status=0
if "$PYTHON" -c 'import pytest' 2>/dev/null; then
  log "GPU tests (pytest -m gpu)"
  timeout 120 "$PYTHON" -m pytest -m gpu -p no:cacheprovider -o addopts="" -rA -q \
    --junitxml "$OUT_DIR/gpu_tests.xml" \
    tests/unit/attention/test_attention.py tests/unit/runner/test_cuda_graphs.py tests/unit/device/test_lazy_tensor.py tests/unit/models/test_models_qwen3.py \
    >"$OUT_DIR/gpu_tests.log" 2>&1
  tests_status=$?
  tail -n 25 "$OUT_DIR/gpu_tests.log" >&2
  log "GPU tests exit status $tests_status"
else
  log "pytest is not installed: GPU tests skipped"
  tests_status=3
fi

log "served path (Encoder + EncoderService + CUDA engine with graphs)"
timeout 200 "$PYTHON" -m perf.gpu_served --out "$OUT_DIR" 2>&1 | grep -v "Writing model shards" | tee -a "$OUT_DIR/summary.txt"
served_status=${PIPESTATUS[0]}
log "served exit status $served_status"

log "low-latency scenario, engine only (eager vs graphs vs HF transformers)"
timeout 90 "$PYTHON" -m perf.gpu_latency --out "$OUT_DIR" --iters 100 2>&1 | grep -v "Writing model shards" | tee -a "$OUT_DIR/summary.txt"
latency_status=${PIPESTATUS[0]}
log "latency exit status $latency_status"
[[ $tests_status == 0 && $served_status == 0 && $latency_status == 0 ]]
