#!/usr/bin/env bash
# Links libferry-mpiio.so, the MPI-IO interposer, in DIR from DIR/libferry_mpiio.a (the
# crate ferry-mpiio, built by cargo into DIR) and c/mpiio/ferry-mpiio.c, with mpicc.
#   bash c/mpiio/link.sh target/release      (what `make build-mpiio` runs)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:?usage: link.sh DIR (holding libferry_mpiio.a)}
command -v mpicc >/dev/null || { echo "link.sh: mpicc not found (apt-get install libopenmpi-dev)" >&2; exit 1; }
# -Bsymbolic: the interposer's own calls stay inside it; the Rust archive needs only libc's
# pieces (libfabric is loaded with dlopen on first use).
mpicc -shared -fPIC -O2 -Wall -Wextra -Werror -I"$here/../../crates/ferry-mpiio/include" \
  -o "$dir/libferry-mpiio.so" "$here/ferry-mpiio.c" "$dir/libferry_mpiio.a" \
  -Wl,--version-script="$here/exports.map" -Wl,-soname,libferry-mpiio.so -Wl,--gc-sections \
  -lpthread -ldl -lm -lgcc_s
