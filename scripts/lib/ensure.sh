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

ensure_mariadb() {
  if find_mariadbd >/dev/null && command -v mariadb-install-db >/dev/null 2>&1; then return 0; fi
  apt_install mariadb-server mariadb-client || true
  find_mariadbd >/dev/null && command -v mariadb-install-db >/dev/null 2>&1 || die \
    "mariadbd and mariadb-install-db are missing and could not be installed.
       Install them with: sudo apt-get install -y mariadb-server mariadb-client
       (or point BLOODRAVEN_MARIADBD at a mariadbd binary)."
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
