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
cargo test --workspace --locked
