#!/usr/bin/env bash
# A resumed download against a fresh one (issue 19: a resume must not be slower): `ferry cp`
# of a 2 GiB file over tcp on loopback (--protect clear, the server without its checksum
# cache, as for a file copied the first time), once fresh and once resumed from a part
# interrupted (Ctrl-C) at 1 GiB, to DIR (a disk directory, or /dev/shm/...), with two
# builds alternating, ROUNDS rounds; prints each run and the medians.
#   bench/resume_vs_fresh.sh OLD_FERRY NEW_FERRY DIR [ROUNDS]
# The interrupted part is made once (the first copy, stopped with SIGINT when the part
# holds 1 GiB) and put back before every resumed run, its data with O_DIRECT, so it is
# not in the page cache (as a part that ferry wrote with direct I/O is not).
set -euo pipefail
OLD=$1 NEW=$2 DST=$3 ROUNDS=${4:-3}
B=$(mktemp -d /tmp/ferry-resume-bench.XXXXXX)
export FERRY_STATE_DIR=$B/state FERRY_KNOWN_HOSTS=$B/known_hosts XDG_CONFIG_HOME=$B/config
mkdir -p "$B/src" "$B/save" "$DST"
(umask 077; echo bench-token-0123456789 > "$B/token")
head -c 2G /dev/urandom > "$B/src/big.bin"
part=$DST/.big.bin.ferry-part
trap 'rm -rf "$B" "$DST/big.bin" "$part" "$part.journal"' EXIT

# serve BIN: starts a server on the source, sets ADDR and SPID.
serve() {
  "$1" serve --root d="$B/src" --listen tcp://127.0.0.1:0 --token-file "$B/token" \
    --protection clear,integrity --no-checksum-cache > "$B/serve.out" 2> "$B/serve.log" &
  SPID=$!
  for _ in $(seq 600); do grep -q "listening on" "$B/serve.out" 2>/dev/null && break; sleep 0.1; done
  ADDR=$(sed -n 's/^listening on //p' "$B/serve.out")
}
cp_() {
  FERRY_TOKEN=bench-token-0123456789 "$1" cp --protect clear --json "$ADDR/d/big.bin" "$DST/"
}
secs() { python3 -c 'import json,sys; print(json.load(sys.stdin)["seconds"])'; }

serve "$NEW"
rm -f "$DST/big.bin" "$part" "$part.journal"
FERRY_TOKEN=bench-token-0123456789 "$NEW" cp --protect clear --json "$ADDR/d/big.bin" "$DST/" \
  > /dev/null 2>&1 &
CP=$!
while [ "$(stat -c %s "$part" 2>/dev/null || echo 0)" -lt $((1 << 30)) ]; do sleep 0.005; done
kill -INT $CP; wait $CP || true
cp "$part.journal" "$B/save/journal"; cp "$part" "$B/save/part"
kill $SPID; wait $SPID 2>/dev/null || true

for r in $(seq "$ROUNDS"); do
  for v in old new; do
    bin=$OLD; [ $v = new ] && bin=$NEW
    serve "$bin"
    rm -f "$DST/big.bin" "$part" "$part.journal"
    echo "$v fresh $(cp_ "$bin" | secs)"
    rm -f "$DST/big.bin"; cp "$B/save/journal" "$part.journal"
    dd if="$B/save/part" of="$part" bs=4M oflag=direct status=none 2>/dev/null || cp "$B/save/part" "$part"
    echo "$v resumed $(cp_ "$bin" | secs)"
    kill $SPID; wait $SPID 2>/dev/null || true
  done
done | tee "$B/times"
python3 - "$B/times" <<'PY'
import statistics as st, sys
d = {}
for line in open(sys.argv[1]):
    v, kind, s = line.split()
    d.setdefault((v, kind), []).append(float(s))
for v in ("old", "new"):
    f, r = st.median(d[(v, "fresh")]), st.median(d[(v, "resumed")])
    print(f"{v}: fresh {f:.2f} s, resumed {r:.2f} s (medians of {len(d[(v, 'fresh')])}), resumed/fresh {r / f:.2f}")
PY
