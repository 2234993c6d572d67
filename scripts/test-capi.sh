#!/usr/bin/env bash
# The C API's tests: stage `make install` into a temporary prefix, build the programs in
# tests/c with nothing but `pkg-config --cflags --libs ferry` (-Wall -Wextra -Werror), and
# run each one as a server and a client process on every driver. Every process runs under
# a timeout, so nothing hangs; the temporary prefix is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

# FERRY_CAPI_PROGRAMS="a b" runs only those programs.
read -ra PROGRAMS <<<"${FERRY_CAPI_PROGRAMS:-pingpong blast api peerkill connect latency}"
# Programs whose server kills its client with SIGKILL (exit 137 under timeout).
KILLED_CLIENTS=" peerkill "
DRIVERS=(tcp ofi+tcp ofi+shm)
LIMIT=${FERRY_CAPI_TIMEOUT:-60}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ferry-capi.XXXXXX")
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

echo "== make install-lib PREFIX=$tmp/prefix"
if ! make --no-print-directory install-lib PREFIX="$tmp/prefix" >"$tmp/install.log" 2>&1; then
  cat "$tmp/install.log"
  exit 1
fi
lib="$tmp/prefix/lib"
for f in "$lib"/libferry.so "$lib"/libferry.so.0 "$tmp/prefix/include/ferry/exs.h" \
  "$lib/pkgconfig/ferry.pc"; do
  [ -e "$f" ] || { echo "missing after install: $f"; exit 1; }
done
# Every call of the header has its man 3 page.
for fn in $(sed -n 's/^[a-z_]* \**\(exs_[a-z_]*\)(.*/\1/p' crates/ferry-capi/include/ferry/exs.h); do
  [ -s "$tmp/prefix/share/man/man3/$fn.3" ] || { echo "missing after install: man3/$fn.3"; exit 1; }
done
[ "$(readlink "$lib/libferry.so")" = libferry.so.0 ] || { echo "libferry.so is not a link to libferry.so.0"; exit 1; }
grep -q 'SONAME.*\[libferry.so.0\]' <(readelf -d "$lib/libferry.so.0") \
  || { echo "libferry.so.0 has no SONAME libferry.so.0"; exit 1; }

export PKG_CONFIG_PATH="$lib/pkgconfig"
echo "== pkg-config: ferry $(pkg-config --modversion ferry): $(pkg-config --cflags --libs ferry)"
libdir=$(pkg-config --variable=libdir ferry)
for p in "${PROGRAMS[@]}"; do
  # shellcheck disable=SC2046 # pkg-config's output is meant to be word-split
  cc -std=c99 -Wall -Wextra -Werror -O2 -o "$tmp/$p" "tests/c/$p.c" \
    $(pkg-config --cflags --libs ferry) -Wl,-rpath,"$libdir"
done
# Also valid C++ (the header's extern "C" guards), if a C++ compiler is there.
if command -v c++ >/dev/null 2>&1; then
  # shellcheck disable=SC2046
  echo '#include <ferry/exs.h>
int main() { return exs_init(EXS_VERSION); }' | c++ -Wall -Wextra -Werror -x c++ - \
    -o "$tmp/cxx" $(pkg-config --cflags --libs ferry) -Wl,-rpath,"$libdir"
fi
# Not `ldd | grep -q`: under pipefail, grep -q quitting early fails the pipeline (SIGPIPE).
grep -q "$libdir/libferry.so.0" <(ldd "$tmp/${PROGRAMS[0]}") \
  || { echo "the test programs do not load the staged libferry.so.0"; ldd "$tmp/${PROGRAMS[0]}"; exit 1; }

# run_pair PROGRAM DRIVER: the server publishes its address in a file, the client uses it.
run_pair() {
  local prog=$1 driver=$2 url addr log
  case $driver in
    ofi+shm) url="ofi+shm://ferry-capi-$$-$prog" ;;
    *) url="$driver://127.0.0.1:0" ;;
  esac
  addr="$tmp/$prog-${driver/+/-}.addr"
  log="$tmp/$prog-${driver/+/-}"
  local start=$SECONDS
  timeout "$LIMIT" "$tmp/$prog" server "$url" "$addr" >"$log.server" 2>&1 &
  server_pid=$!
  for _ in $(seq 200); do
    [ -s "$addr" ] && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  local crc=0 src=0
  if [ -s "$addr" ]; then
    timeout "$LIMIT" "$tmp/$prog" client "$(cat "$addr")" >"$log.client" 2>&1 || crc=$?
  else
    echo "server published no address" >"$log.client"
    crc=1
  fi
  wait "$server_pid" || src=$?
  server_pid=
  if [[ $KILLED_CLIENTS == *" $prog "* ]]; then
    if [ "$crc" -eq 137 ]; then crc=0; else crc="$crc (expected 137: killed)"; fi
  fi
  if [ "$crc" = 0 ] && [ "$src" -eq 0 ]; then
    printf 'ok    %-9s %-8s (%ss)\n' "$prog" "$driver" $((SECONDS - start))
    return 0
  fi
  printf 'FAIL  %-9s %-8s (server exit %s, client exit %s; 124 = timed out)\n' \
    "$prog" "$driver" "$src" "$crc"
  sed 's/^/    server| /' "$log.server"
  sed 's/^/    client| /' "$log.client"
  return 1
}

echo "== C tests (server and client processes) on ${DRIVERS[*]}"
failed=0
for p in "${PROGRAMS[@]}"; do
  for d in "${DRIVERS[@]}"; do
    run_pair "$p" "$d" || failed=$((failed + 1))
  done
done
if [ "$failed" -gt 0 ]; then
  echo "== $failed C test run(s) failed"
  exit 1
fi
echo "== all C tests passed"
