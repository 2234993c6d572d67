#!/usr/bin/env bash
# Command 1 of the README: install everything, build ferry, and run its main job on an
# embedded default (for now: the fabric benchmark over loopback, quick mode).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh
cargo build --release --locked
./target/release/ferry bench fabric --quick
