#!/usr/bin/env bash
# Install perf_analyzer (PyPI perf-analyzer, a manylinux_2_38 wheel) under perf/.peers/perf-analyzer
# and write a launcher `perf/.peers/perf-analyzer/perf_analyzer` that works on Debian 12 and 13.
# Debian 13 (glibc >= 2.38): the binary runs as is. Debian 12 (glibc 2.36): libc6, libstdc++6 and
# libgcc-s1 are fetched from the trixie suite of the machine's OWN configured Debian mirror with a
# private apt state (nothing on the system changes) and the binary runs under their loader
# (docs/platform.md, "perf_analyzer on Debian 12"). No mirror host is written anywhere: it is read from the apt configuration.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEST="${PERF_ANALYZER_HOME:-$ROOT/perf/.peers/perf-analyzer}"
VERSION=2.60.0
log() { echo "[perf_analyzer setup] $*" >&2; }

if [[ -x "$DEST/perf_analyzer" ]] && "$DEST/perf_analyzer" --version >/dev/null 2>&1; then
  log "ready: $DEST/perf_analyzer"; exit 0
fi
mkdir -p "$DEST/wheel"
PY="${ROSE_VENV:-$ROOT/.venv}/bin/python"; [[ -x "$PY" ]] || PY=python3
if [[ ! -x "$DEST/wheel/perf_analyzer/bin/perf_analyzer" ]]; then
  log "downloading perf-analyzer==$VERSION"
  "$PY" -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_38_x86_64 \
    --python-version 3.11 "perf-analyzer==$VERSION" -d "$DEST/dl"
  "$PY" -m zipfile -e "$DEST"/dl/perf_analyzer-*.whl "$DEST/wheel"
  chmod +x "$DEST/wheel/perf_analyzer/bin/perf_analyzer"
fi
BIN="$DEST/wheel/perf_analyzer/bin/perf_analyzer"

glibc="$(getconf GNU_LIBC_VERSION | awk '{print $2}')"
if printf '%s\n2.38\n' "$glibc" | sort -V -C 2>/dev/null && [[ "$glibc" != "2.38" ]]; then
  # glibc < 2.38: newer runtime libraries from Debian 13, private to this folder.
  RT="$DEST/runtime"
  if [[ ! -e "$RT/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" ]]; then
    APT="$DEST/apt"
    mkdir -p "$APT/state/lists/partial" "$APT/cache/archives/partial" "$APT/debs"
    # The machine's own Debian mirror: first deb URI from deb822 sources or the one-line format.
    mirror="$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -1 || true)"
    [[ -n "$mirror" ]] || mirror="$(grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
      | awk '{for (i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' | grep -v security | head -1 || true)"
    [[ -n "$mirror" ]] || { log "no Debian mirror found in /etc/apt; cannot fetch glibc >= 2.38"; exit 1; }
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    echo "deb [signed-by=$keyring] $mirror trixie main" > "$APT/sources.list"
    opts=(-o "Dir::State=$APT/state" -o "Dir::Cache=$APT/cache" -o "Dir::Etc::SourceList=$APT/sources.list"
          -o "Dir::Etc::SourceParts=/dev/null" -o "APT::Architecture=amd64" -o "Debug::NoLocking=1")
    log "fetching libc6 libstdc++6 libgcc-s1 from the trixie suite of the configured mirror"
    apt-get "${opts[@]}" update -qq
    (cd "$APT/debs" && apt-get "${opts[@]}" download libc6 libstdc++6 libgcc-s1 >/dev/null)
    mkdir -p "$RT"
    for deb in "$APT"/debs/*.deb; do dpkg -x "$deb" "$RT"; done
  fi
  LIBS="$RT/usr/lib/x86_64-linux-gnu"
  cat > "$DEST/perf_analyzer" <<LAUNCH
#!/usr/bin/env bash
exec "$LIBS/ld-linux-x86-64.so.2" --library-path "$LIBS:/lib/x86_64-linux-gnu" "$BIN" "\$@"
LAUNCH
else
  printf '#!/usr/bin/env bash\nexec "%s" "$@"\n' "$BIN" > "$DEST/perf_analyzer"
fi
chmod +x "$DEST/perf_analyzer"
"$DEST/perf_analyzer" --version >/dev/null 2>&1 || "$DEST/perf_analyzer" --help >/dev/null 2>&1 \
  || { log "perf_analyzer does not start"; exit 1; }
log "ready: $DEST/perf_analyzer"
