#!/usr/bin/env bash
# Idempotent set-up: project virtualenv from the pinned lock files, and a
# runnable Triton server (2.51, from the nvidia-pytriton wheel) under build/.
# Usage: scripts/setup.sh [--test]   (--test also installs the test tools)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ROSE_VENV:-$ROOT/.venv}"
PYTHON="${ROSE_PYTHON:-python3}"
LOCKS=("$ROOT/requirements.lock")
[[ "${1:-}" == "--test" ]] && LOCKS+=("$ROOT/requirements-test.lock")

log() { echo "[setup] $*" >&2; }

if [[ ! -x "$VENV/bin/python" ]]; then
  shared="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("Py_ENABLE_SHARED") or 0)')"
  if [[ "$shared" != "1" ]]; then
    echo "[setup] $PYTHON is not a shared-library build; Triton's Python stub needs libpython. Set ROSE_PYTHON to a shared build (e.g. /usr/bin/python3.11)." >&2
    exit 1
  fi
  log "creating virtualenv $VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi

stamp="$VENV/.rose-installed"
want="$(cat "${LOCKS[@]}" | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$stamp" ]] || ! grep -qx "$want" "$stamp"; then
  log "installing pinned packages (${LOCKS[*]##*/})"
  args=()
  for lock in "${LOCKS[@]}"; do args+=(-r "$lock"); done
  # --no-compile: bytecode is written on first import instead, for the modules actually used
  # (an install of these locks takes 88 s with it and 37 s without on 2 cores).
  "$VENV/bin/python" -m pip install -q --no-compile "${args[@]}" 2> >(grep -v "^WARNING: Location" >&2)
  echo "$want" >>"$stamp"
fi

# Layout mirrors site-packages so the binaries' RPATH ($ORIGIN/../../../nvidia_pytriton.libs) resolves.
TRITON_HOME="$ROOT/build/pytriton/tritonserver"
pyver="$("$VENV/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
if [[ ! -x "$TRITON_HOME/backends/python/triton_python_backend_stub" ]]; then
  log "preparing Triton server in $TRITON_HOME"
  site="$("$VENV/bin/python" -c 'import pytriton, os; print(os.path.dirname(os.path.dirname(pytriton.__file__)))')"
  rm -rf "$ROOT/build/pytriton" "$ROOT/build/nvidia_pytriton.libs"
  mkdir -p "$ROOT/build/pytriton"
  cp -r "$site/pytriton/tritonserver" "$TRITON_HOME"
  cp -r "$site/nvidia_pytriton.libs" "$ROOT/build/nvidia_pytriton.libs"
  cp "$TRITON_HOME/python_backend_stubs/$pyver/triton_python_backend_stub" "$TRITON_HOME/backends/python/"
  chmod +x "$TRITON_HOME/bin/tritonserver" "$TRITON_HOME/backends/python/triton_python_backend_stub"
fi
