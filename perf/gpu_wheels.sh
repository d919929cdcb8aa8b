#!/usr/bin/env bash
# The wheels the GPU machine lacks for perf/gpu_check.sh's `triton` stage, into .whl/ (git-ignored; name it
# in the device call's `carry`): Triton 2.51 from nvidia-pytriton, tritonclient and python-rapidjson, at
# requirements.lock's versions, for that machine's Python (3.12; PYVER=3.11 fetches this machine's, to
# try the stage here). About 57 MB: with the tree, under a call's 64 MiB.
#   perf/gpu_wheels.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYVER="${PYVER:-3.12}"
PYTHON="${PYTHON:-python3}"
pin() { grep -i "^$1==" "$ROOT/requirements.lock" | head -n 1; }
rm -rf "$ROOT/.whl"
mkdir -p "$ROOT/.whl"
platforms=()
for n in 17 27 28 31 34 35 39; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  "${platforms[@]}" --platform manylinux2014_x86_64 -d "$ROOT/.whl" \
  "$(pin nvidia-pytriton)" "$(pin tritonclient)" "$(pin python-rapidjson)"
ls -l "$ROOT/.whl"
du -sh "$ROOT/.whl"
