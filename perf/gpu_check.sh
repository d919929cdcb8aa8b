#!/usr/bin/env bash
# One prepared GPU session (one device call, about 8 minutes with every stage; docs/benchmarks.md has the command):
#  1. GPU tests (pytest -m gpu): graph replay == eager (Qwen3 and all-MiniLM shapes), a failed capture
#     restores the stream, a runner on cuda:N, a device-side assert ends the process (exit 70),
#     varlen/FlashInfer == SDPA on strided GQA q/k/v, bf16 within cosine 0.999 of fp32;
#  2. the harness's gpu-served profile (perf/gpu.py): build_endpoint as the Triton model does it
#     (bf16, graphs, max_batch_tokens=auto, self-check), an output check against the float32 model, the
#     seed's scenarios 1-3 through the Endpoint against transformers on padded batches, graph counters;
#  3. the gpu-budget profile (perf/gpu_budget.py): max_batch_tokens auto vs fixed budgets, bulk load
#     alone and beside one interactive client;
#  4. the gpu-triton profile through perf/gpu_triton.sh (Triton from the wheels carried in .whl/, made by
#     perf/gpu_wheels.sh): scripts/serve.sh on the GPU, tritonclient against transformers, latency.
# Random-weight Qwen3-Embedding-0.6B-shaped model throughout (no downloads on that machine).
#   perf/gpu_check.sh [--dry-run] [--out DIR] [--stages tests,served,budget,triton]
# Results: DIR (default perf/results/<gpu>-<cores>c/): gpu-served and gpu-budget .json/.md (in the README's table:
# `python -m perf readme-table --write`), gpu_tests.log/.xml, summary.txt.
# --dry-run: CPU only, tiny model, small sizes (CI); writes to a temporary folder unless --out.
# FlashInfer is not installed by this script: give it its own call (docs/benchmarks.md).
# PYTHON selects the interpreter (default python3).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
DRY_RUN=0
OUT_DIR=""
STAGES="tests,served,budget,triton"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY_RUN=1; shift ;;
    --out) OUT_DIR="$2"; shift 2 ;;
    --stages) STAGES="$2"; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# PYTHONFAULTHANDLER: a step past its hard timeout gets SIGABRT (timeout -s ABRT) and prints every thread's stack.
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
export GIT_COMMIT="${GIT_COMMIT:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || true)}"
cd "$ROOT"
if [[ -z "$OUT_DIR" ]]; then
  if [[ "$DRY_RUN" == 1 ]]; then
    OUT_DIR="$(mktemp -d -t gpu_check_dry.XXXXXX)"  # a dry run never writes into perf/results/
  else
    OUT_DIR="$ROOT/perf/results/$("$PYTHON" -c 'from perf import machine; print(machine.slug(machine.describe()))')"
  fi
fi
mkdir -p "$OUT_DIR"
log() { echo "[gpu_check] $*" | tee -a "$OUT_DIR/summary.txt" >&2; }
log "results in $OUT_DIR"
# A harness profile follows; its own checks decide the exit status. No quiet wait or plots here.
PROFILE=("$PYTHON" -m perf run --out "$OUT_DIR" --quiet-wait 0 --profile)

if [[ "$DRY_RUN" == 1 ]]; then
  log "dry run on CPU: torch $("$PYTHON" -c 'from importlib.metadata import version; print(version("torch"))')"
  "${PROFILE[@]}" gpu-served --dry-run 2>&1 | tee -a "$OUT_DIR/summary.txt"
  served=${PIPESTATUS[0]}
  "${PROFILE[@]}" gpu-budget --dry-run 2>&1 | tee -a "$OUT_DIR/summary.txt"
  budget=${PIPESTATUS[0]}
  log "dry run exit status: served $served, budget $budget"
  [[ $served == 0 && $budget == 0 ]]
  exit
fi

"$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || { log "no CUDA device"; exit 2; }
log "$("$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())')"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee -a "$OUT_DIR/summary.txt"

stage() { [[ ",$STAGES," == *",$1,"* ]]; }
tests_status=0 served_status=0 budget_status=0 triton_status=0
if ! stage tests; then
  log "GPU tests not asked for (--stages $STAGES)"
elif "$PYTHON" -c 'import pytest' 2>/dev/null; then
  log "GPU tests (pytest -m gpu)"
  timeout -s ABRT -k 10 120 "$PYTHON" -m pytest -m gpu -p no:cacheprovider -o addopts="--import-mode=importlib" -rA -q \
    tests/unit/attention/test_attention.py tests/unit/runner/test_cuda_graphs.py tests/unit/device/test_lazy_tensor.py tests/unit/models/test_models_qwen3.py \
    tests/unit/service/test_service_fatal.py tests/unit/runner/test_batched_equals_alone.py tests/unit/models/test_retrieval_gpu.py \
    >"$OUT_DIR/gpu_tests.log" 2>&1
  tests_status=$?
  tail -n 25 "$OUT_DIR/gpu_tests.log" >&2
  log "GPU tests exit status $tests_status"
else
  log "pytest is not installed: GPU tests skipped"
  tests_status=3
fi

if stage served; then
  log "served path (Endpoint + BatchingService + CUDA engine with graphs): profile gpu-served"
  timeout -s ABRT -k 10 300 "${PROFILE[@]}" gpu-served 2>&1 | grep -v "Writing model shards" | tee -a "$OUT_DIR/summary.txt"
  served_status=${PIPESTATUS[0]}
  log "served exit status $served_status"
fi

if stage budget; then
  log "token budgets (auto vs fixed; bulk alone and beside a query): profile gpu-budget"
  timeout -s ABRT -k 10 260 "${PROFILE[@]}" gpu-budget 2>&1 | grep -v "Writing model shards" | tee -a "$OUT_DIR/summary.txt"
  budget_status=${PIPESTATUS[0]}
  log "budget exit status $budget_status"
fi
if stage triton; then
  log "the model repository under tritonserver (wheels from .whl/): profile gpu-triton"
  PYTHON="$PYTHON" timeout -s ABRT -k 10 240 "$ROOT/perf/gpu_triton.sh" --out "$OUT_DIR" 2>&1 \
    | grep -v "Writing model shards" | tee -a "$OUT_DIR/summary.txt"
  triton_status=${PIPESTATUS[0]}
  log "triton exit status $triton_status"
fi
[[ $tests_status == 0 && $served_status == 0 && $budget_status == 0 && $triton_status == 0 ]]
