#!/usr/bin/env bash
# The README's test command: set up (venv, Triton) and run the whole suite.
# Extra arguments go to pytest (e.g. scripts/test.sh -k scheduler).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh" --test
cd "$ROOT"
exec "${ROSE_VENV:-$ROOT/.venv}/bin/python" -m pytest "$@"
