#!/usr/bin/env bash
# One prepared GPU session (one H200 call, under 8 minutes): the GPU tests (graph
# replay == eager, FlashInfer/varlen == SDPA, bf16 within cosine 0.999 of fp32,
# CUDA LazyTensor), then the seed's low-latency scenario (batch 1, 128/512/4096
# tokens, sequential, p50/p90/p99/max) on a random-weight Qwen3-Embedding-0.6B-
# shaped model: ROSE eager vs ROSE graphs vs HF transformers.
#   perf/gpu_check.sh [--dry-run] [--out DIR]
# --dry-run: CPU only; tiny model, one step per scenario (CI runs this).
# Results: DIR (default $OUT, else perf/results/gpu-<UTC time>): gpu_tests.log,
# gpu_tests.xml, latency.json, summary.txt. Wheels in .whl/ (pytest, flashinfer)
# are installed offline first when present. PYTHON selects the interpreter.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
DRY_RUN=0
OUT_DIR="${OUT:-$ROOT/perf/results/gpu-$(date -u +%Y%m%dT%H%M%SZ)}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY_RUN=1; shift ;;
    --out) OUT_DIR="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT_DIR"
export PYTHONPATH="$ROOT:$ROOT/tests${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
cd "$ROOT"
log() { echo "[gpu_check] $*" | tee -a "$OUT_DIR/summary.txt" >&2; }

if [[ "$DRY_RUN" == 1 ]]; then
  log "dry run on CPU: $("$PYTHON" -c 'import torch; print("torch", torch.__version__)')"
  "$PYTHON" perf/gpu_latency.py --dry-run --out "$OUT_DIR"
  status=$?
  log "dry run exit status $status"
  exit $status
fi

"$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || { log "no CUDA device"; exit 2; }
log "$("$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())')"
if compgen -G "$ROOT/.whl/*.whl" >/dev/null; then
  log "installing carried wheels: $(cd "$ROOT/.whl" && ls -- *.whl | tr '\n' ' ')"
  "$PYTHON" -m pip install -q --no-index --find-links "$ROOT/.whl" "$ROOT"/.whl/*.whl 2>&1 | tail -3 | tee -a "$OUT_DIR/summary.txt"
fi

tests_status=0
if "$PYTHON" -c 'import pytest' 2>/dev/null; then
  log "GPU tests (pytest -m gpu)"
  timeout 200 "$PYTHON" -m pytest -m gpu -p no:cacheprovider -o addopts="" -rA \
    --junitxml "$OUT_DIR/gpu_tests.xml" \
    tests/test_attention.py tests/test_cuda_graphs.py tests/test_lazy_tensor.py tests/test_models_qwen3.py \
    >"$OUT_DIR/gpu_tests.log" 2>&1
  tests_status=$?
  tail -n 25 "$OUT_DIR/gpu_tests.log" >&2
  log "GPU tests exit status $tests_status"
else
  log "pytest is not installed and no wheel was carried in .whl/: GPU tests skipped (latency checks still run)"
  tests_status=3
fi

log "low-latency scenario (random weights, Qwen3-Embedding-0.6B shape)"
timeout 270 "$PYTHON" perf/gpu_latency.py --out "$OUT_DIR" 2>&1 | grep -v "Writing model shards" | tee -a "$OUT_DIR/summary.txt"
latency_status=${PIPESTATUS[0]}
log "latency exit status $latency_status"
[[ $tests_status == 0 && $latency_status == 0 ]]
