#!/usr/bin/env bash
# Command 2 of the README: the whole test suite (format, lints, unit, conformance, CLI tests).
# Installs what is missing first, so it also works alone on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh

echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
# The run's scratch: every test's temporary files (TMPDIR), servers' TLS identities and
# clients' known hosts live in one fresh directory, not the machine's /tmp, /var/lib/ferry
# and ~/.config/ferry (docs/security.md; the CLI tests give each process its own). It is
# removed when the run passes and kept, with its path printed, when it fails.
run_dir="$(mktemp -d -t ferry-tests.XXXXXX)"
finish() {
  local rc=$?
  if [ "$rc" -eq 0 ]; then rm -rf "$run_dir" 2>/dev/null || true
  else echo "ferry: the failed run's temporary files are kept in $run_dir" >&2; fi
}
trap finish EXIT
mkdir -p "$run_dir/tmp"
export TMPDIR="$run_dir/tmp"
export FERRY_STATE_DIR="$run_dir/state" FERRY_KNOWN_HOSTS="$run_dir/known_hosts"
cargo test --workspace --locked
echo "== C API (libferry via pkg-config, every driver)"
bash scripts/test-capi.sh

# Fuzz smoke: every wire decoder for a few seconds (cargo-fuzz needs the nightly toolchain;
# without it this step says so and is skipped — the decoders' proptests above still ran).
secs=${FERRY_FUZZ_SECONDS:-10}
if [ "$secs" -gt 0 ] && rustup run nightly rustc --version >/dev/null 2>&1; then
  command -v cargo-fuzz >/dev/null 2>&1 || cargo install --locked cargo-fuzz >/dev/null 2>&1 \
    || echo "ferry: could not install cargo-fuzz; skipping the fuzz smoke run" >&2
  if command -v cargo-fuzz >/dev/null 2>&1; then
    for target in $(cd fuzz && cargo +nightly fuzz list); do
      echo "== fuzz $target (${secs}s)"
      (cd fuzz && cargo +nightly fuzz run "$target" -- -max_total_time="$secs" 2>&1 | tail -n 1)
    done
  fi
else
  echo "== fuzz smoke skipped (no nightly toolchain, or FERRY_FUZZ_SECONDS=0)"
fi
