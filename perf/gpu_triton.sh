#!/usr/bin/env bash
# Triton from the carried wheels (.whl/, perf/gpu_wheels.sh), then the harness's `gpu-triton` profile
# (perf/gpu_triton.py): scripts/serve.sh serving on the GPU machine, which has no tritonserver.
#   perf/gpu_triton.sh [harness options: --out DIR, --dry-run, ...]
# PYTHON selects the interpreter (default python3): the model stubs use the python3 on PATH, so it
# must be the same one.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
SITE="${ROSE_WHEEL_SITE:-$(mktemp -d -t rose-site.XXXXXX)}"
shopt -s nullglob
wheels=("$ROOT"/.whl/*.whl)
if [[ ${#wheels[@]} == 0 ]]; then
  echo "gpu_triton.sh: no wheels in $ROOT/.whl (run perf/gpu_wheels.sh here, name .whl in the call's carry)" >&2
  exit 3
fi
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "${wheels[@]}" || exit 3
pyver="$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
TRITON="$SITE/pytriton/tritonserver"
# The wheel's layout keeps the binaries' RPATH ($ORIGIN/../../../nvidia_pytriton.libs) resolving.
cp "$TRITON/python_backend_stubs/$pyver/triton_python_backend_stub" "$TRITON/backends/python/" || exit 3
chmod +x "$TRITON/bin/tritonserver" "$TRITON/backends/python/triton_python_backend_stub"
LIBDIR="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')"
if ! ls "$LIBDIR"/libpython"$pyver"*.so* >/dev/null 2>&1 && ! ldconfig -p | grep -q "libpython$pyver"; then
  echo "gpu_triton.sh: no libpython$pyver shared library (in $LIBDIR or ldconfig's cache): the Python stub needs it" >&2
  exit 3
fi
# serve.sh with ROSE_SKIP_SETUP=1 serves the tritonserver on PATH; the stubs take python3 from PATH.
export ROSE_SKIP_SETUP=1 TRITON_BACKEND_DIR="$TRITON/backends"
export PATH="$TRITON/bin:$(dirname "$(command -v "$PYTHON")"):$PATH"
export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
cd "$ROOT" && "$PYTHON" -m perf run --profile gpu-triton --quiet-wait 0 "$@"
