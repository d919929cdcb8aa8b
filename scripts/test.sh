#!/usr/bin/env bash
# The README's test command: set up (venv, Triton) and run the whole suite.
# Extra arguments go to pytest (e.g. scripts/test.sh -k scheduler).
# Without a test path the suite runs as two pytest processes at once: tests/unit
# (CPU-bound, no server) beside tests/e2e + tests/deploy (mostly waiting on
# servers and sockets); options go to both. The unit run's report follows the
# other's; the exit status is non-zero if either failed. With a test path
# (scripts/test.sh tests/unit/service) it is one plain pytest run.
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

unit_log="$(mktemp -t rose-unit-tests.XXXXXX)"
trap 'rm -f "$unit_log"' EXIT
# One intra-op thread for the unit tests: the servers of the other run need the other core.
OMP_NUM_THREADS=1 "${PYTEST[@]}" tests/unit "$@" >"$unit_log" 2>&1 &
unit_pid=$!
set +e
"${PYTEST[@]}" tests/e2e tests/deploy "$@"
servers_status=$?
wait "$unit_pid"
unit_status=$?
set -e
echo
echo "================================ tests/unit ================================"
cat "$unit_log"
echo "tests/e2e + tests/deploy exit status $servers_status; tests/unit exit status $unit_status"
[[ $servers_status == 0 && $unit_status == 0 ]]
