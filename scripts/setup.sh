#!/usr/bin/env bash
# Command 1 of the README: install everything, build ferry, and run its main job on an
# embedded default (scripts/main-job.sh: serve a generated dataset on loopback, copy it with
# `ferry cp`, verify it, then the quick fabric benchmark).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh
cargo build --release --locked
scripts/main-job.sh
