#!/usr/bin/env bash
# Idempotent set-up: project virtualenv from the pinned lock files, and a
# runnable Triton server (2.51, from the nvidia-pytriton wheel) under build/.
# Usage: scripts/setup.sh [--test]   (--test also installs the test tools)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ROSE_VENV:-$ROOT/.venv}"
PYTHON="${ROSE_PYTHON:-python3}"
LOCKS=("$ROOT/requirements.lock")
NODEPS_LOCKS=()  # installed with --no-deps: exactly the packages they list (their declared trees are unused)
[[ "${1:-}" == "--test" ]] && LOCKS+=("$ROOT/requirements-test.lock") && NODEPS_LOCKS+=("$ROOT/requirements-test-nodeps.lock")

log() { echo "[setup] $*" >&2; }

CACHE="${ROSE_SETUP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rose}"
# The locks' wheels, kept per user: the package index's answers are not cacheable here (pip
# downloaded ~540 MB at every set-up). A lock that asks for a wheel the folder lacks fetches it
# (pip download, with what pip adds itself, such as setuptools for torch).
WHEELS="$CACHE/wheels"
want="$(cat "${LOCKS[@]}" "${NODEPS_LOCKS[@]}" | sha256sum | cut -d' ' -f1)"

install_locks() {  # install_locks VENV: the locks into that virtualenv, from $WHEELS
  local args=() lock
  for lock in "${LOCKS[@]}"; do args+=(-r "$lock"); done
  # --no-compile: pip compiles file by file (an install of these locks took 88 s with it and 37 s
  # without on 2 cores); a template's bytecode is written in one parallel pass instead (below).
  local install=("$1/bin/python" -m pip install -q --no-compile --no-index --find-links "$WHEELS" "${args[@]}")
  if ! "${install[@]}" >/dev/null 2>&1; then  # pip resolves before it installs: nothing half-done
    log "fetching the locked wheels into $WHEELS"
    mkdir -p "$WHEELS"
    "$1/bin/python" -m pip download -q -d "$WHEELS" "${args[@]}" 2> >(grep -v "^WARNING: Location" >&2)
    "${install[@]}" || { echo "[setup] installing from $WHEELS failed; removing that folder starts it afresh" >&2; exit 1; }
  fi
  for lock in "${NODEPS_LOCKS[@]}"; do
    local nodeps=("$1/bin/python" -m pip install -q --no-compile --no-deps --no-index --find-links "$WHEELS" -r "$lock")
    if ! "${nodeps[@]}" >/dev/null 2>&1; then
      "$1/bin/python" -m pip download -q --no-deps -d "$WHEELS" -r "$lock" 2> >(grep -v "^WARNING: Location" >&2)
      "${nodeps[@]}"
    fi
  done
}

if [[ ! -x "$VENV/bin/python" ]]; then
  shared="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("Py_ENABLE_SHARED") or 0)')"
  if [[ "$shared" != "1" ]]; then
    echo "[setup] $PYTHON is not a shared-library build; Triton's Python stub needs libpython. Set ROSE_PYTHON to a shared build (e.g. /usr/bin/python3.11)." >&2
    exit 1
  fi
  # A fresh virtualenv is a copy of an installed one kept per user for these locks and this
  # Python, with its files hard-linked: this disk costs ~0.8 ms of kernel time per file written,
  # and an install writes ~40,000 (60-90 s on 2 cores against ~5 s for the links). Nothing
  # edits installed files in place (pip and bytecode writes replace files), so the copies stay
  # apart; the template is built once, in a temporary folder renamed when complete.
  key="$("$PYTHON" -c 'import sys; print(sys.executable, sys.version)' | sha256sum | cut -c1-12)-${want:0:12}"
  template="$CACHE/venvs/$key"
  mkdir -p "$CACHE/venvs"
  exec 9>"$CACHE/venvs/.lock" && flock 9  # one build of a template at a time
  if [[ ! -f "$template/.rose-complete" ]]; then
    log "installing pinned packages (${LOCKS[*]##*/}) into $template"
    rm -rf "$CACHE/venvs"/.building.*  # what an interrupted build left (none runs: the lock is ours)
    building="$(mktemp -d "$CACHE/venvs/.building.XXXXXX")"
    "$PYTHON" -m venv "$building/venv"
    "$building/venv/bin/python" -m pip install -q --upgrade pip 2> >(grep -v "^WARNING: Location" >&2)
    install_locks "$building/venv"
    # Bytecode for every module, once: where PYTHONDONTWRITEBYTECODE is set (as on CI here) no
    # process writes it, and each would compile what it imports (`import torch`: 7.0 s of CPU
    # instead of 2.8; every model stub pays it). A file that does not compile is left as it is.
    "$building/venv/bin/python" -m compileall -q -j 0 "$building/venv/lib" >/dev/null 2>&1 || true
    rm -rf "$template"
    mv "$building/venv" "$template" && rmdir "$building"
    # a virtualenv names its own folder in its scripts: they are rewritten for each copy
    grep -lIr --exclude-dir=__pycache__ "$building/venv" "$template/bin" "$template/pyvenv.cfg" 2>/dev/null \
      | xargs -r sed -i "s|$building/venv|$template|g"
    touch "$template/.rose-complete"
    # the three newest templates stay (copies keep their files: they are links, not references)
    ls -1dt "$CACHE/venvs"/*/ | tail -n +4 | xargs -r rm -rf
  fi
  flock -u 9
  log "creating virtualenv $VENV (linked from $template)"
  mkdir -p "$(dirname "$VENV")"
  cp -al "$template" "$VENV" 2>/dev/null || { rm -rf "$VENV"; cp -a "$template" "$VENV"; }  # links need one file system
  rm -f "$VENV/.rose-complete"
  grep -lIr --exclude-dir=__pycache__ "$template" "$VENV/bin" "$VENV/pyvenv.cfg" 2>/dev/null \
    | xargs -r sed -i "s|$template|$VENV|g"  # sed writes new files: the template keeps its own
  echo "$want" >"$VENV/.rose-installed.new" && mv "$VENV/.rose-installed.new" "$VENV/.rose-installed"
fi

stamp="$VENV/.rose-installed"
if [[ ! -f "$stamp" ]] || ! grep -qx "$want" "$stamp"; then
  log "installing pinned packages (${LOCKS[*]##*/})"
  install_locks "$VENV"
  echo "$want" >>"$stamp"
fi

# This checkout's own modules likewise (each model stub imports them); compileall skips what is
# current. The globs leave out dot folders (.venv, perf/.peers: the peers' virtualenvs).
sources=()
for dir in "$ROOT"/*/ "$ROOT"/perf/*/; do
  case "$dir" in "$ROOT/build/" | "$ROOT/perf/") ;; *) sources+=("$dir") ;; esac
done
"$VENV/bin/python" -m compileall -q -j 0 "${sources[@]}" "$ROOT"/perf/*.py >/dev/null 2>&1 || true

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
