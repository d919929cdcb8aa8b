#!/usr/bin/env bash
# The README's test command: set up (venv, Triton) and run the whole suite.
# Extra arguments go to pytest (e.g. scripts/test.sh -k scheduler).
# Without a test path the suite runs as three pytest processes at once: tests/unit
# (CPU-bound, no server), the server tests that share the session's servers, and
# those marked own_server (they start servers of their own; tests/conftest.py
# ROSE_TEST_SHARD); the server tests mostly wait on servers and sockets. Options go
# to all three. The reports follow one another; the exit status is non-zero if any
# failed. With a test path (scripts/test.sh tests/unit/service) it is one plain
# pytest run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh" --test
cd "$ROOT"
PYTEST=("${ROSE_VENV:-$ROOT/.venv}/bin/python" -m pytest)
for arg in "$@"; do
  if [[ "$arg" == tests* && -e "${arg%%::*}" ]]; then
    exec "${PYTEST[@]}" "$@"
  fi
done

# The three runs and their servers oversubscribe the cores: OpenMP threads sleep when idle
# instead of spinning (the default), which would burn the cores the other runs wait for.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
logs="$(mktemp -d -t rose-tests.XXXXXX)"
trap 'rm -rf "$logs"' EXIT
# One intra-op thread for the unit tests: the servers of the other runs need the cores.
OMP_NUM_THREADS=1 "${PYTEST[@]}" tests/unit "$@" >"$logs/unit" 2>&1 &
unit_pid=$!
ROSE_TEST_SHARD=own_server "${PYTEST[@]}" tests/e2e tests/deploy "$@" >"$logs/own_server" 2>&1 &
own_pid=$!
set +e
ROSE_TEST_SHARD=shared "${PYTEST[@]}" tests/e2e tests/deploy "$@"
shared_status=$?
wait "$own_pid"
own_status=$?
wait "$unit_pid"
unit_status=$?
set -e
for run in own_server unit; do
  echo
  echo "================================ $run ================================"
  cat "$logs/$run"
done
echo "shared-server tests exit status $shared_status; own_server tests $own_status; tests/unit $unit_status"
[[ $shared_status == 0 && $own_status == 0 && $unit_status == 0 ]]
