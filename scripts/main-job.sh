#!/usr/bin/env bash
# ferry's main job on an embedded default: generate a dataset, export it with `ferry serve`
# on loopback, and copy it with `ferry cp` (progress bar and summary), then verify it.
# Then the fabric benchmark in quick mode, so the machine's limits are on screen too.
#
#   scripts/main-job.sh [SIZE_MIB] [DRIVER]     defaults: 1024, tcp (also ofi+tcp, ofi+shm)
set -euo pipefail
cd "$(dirname "$0")/.."
ferry=./target/release/ferry
size_mib=${1:-1024}
driver=${2:-tcp}

# /dev/shm keeps the disks out of the measurement; fall back to /tmp.
base=/dev/shm
[ -w "$base" ] || base=/tmp
work=$(mktemp -d "$base/ferry-main-job.XXXXXX")
server=
cleanup() {
  if [ -n "$server" ]; then
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "== dataset: one ${size_mib} MiB file and a tree of 200 small files in $work/export"
mkdir -p "$work/export/tree" "$work/copy"
head -c "$((size_mib << 20))" /dev/urandom > "$work/export/big.bin"
for i in $(seq 1 200); do head -c "$((i * 517))" /dev/urandom > "$work/export/tree/f$i"; done

token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
case "$driver" in
  ofi+shm) listen="ofi+shm://ferry-main-job-$$" ;;
  *) listen="$driver://127.0.0.1:0" ;;
esac
"$ferry" serve --root "data=$work/export" --listen "$listen" --token "$token" \
  > "$work/serve.out" 2> "$work/serve.err" &
server=$!
for _ in $(seq 1 100); do
  grep -q '^listening on ' "$work/serve.out" 2>/dev/null && break
  sleep 0.1
done
addr=$(sed -n 's/^listening on //p' "$work/serve.out")
[ -n "$addr" ] || { cat "$work/serve.err" >&2; echo "ferry serve did not start" >&2; exit 1; }
echo "== ferry serve on $addr"

echo "== ferry cp $addr/data/big.bin (download)"
FERRY_TOKEN=$token "$ferry" cp "$addr/data/big.bin" "$work/copy/big.bin"
echo "== ferry cp -r $addr/data/tree (download)"
FERRY_TOKEN=$token "$ferry" cp -r "$addr/data/tree" "$work/copy/"   # lands in copy/tree

echo "== verify"
cmp "$work/export/big.bin" "$work/copy/big.bin"
diff -r "$work/export/tree" "$work/copy/tree"
"$ferry" sum "$work/copy/big.bin"
echo "identical: big.bin and 200 files"

echo "== fabric limits (ferry bench fabric --quick)"
"$ferry" bench fabric --quick
