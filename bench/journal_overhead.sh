#!/usr/bin/env bash
# Cost of the resume journal (fdatasync + checkpoint every 16 MiB or 1 s on the receiving
# side): `ferry cp` of 1 GiB down and up over tcp on loopback, disk (/tmp) to disk, with two
# builds alternating in the same run (5 rounds), medians and new/old time ratios.
#   bench/journal_overhead.sh OLD_FERRY NEW_FERRY [DIR]
# e.g. OLD built from 8a60db1 (before resume), NEW from this branch (both --release; a NEW
# from protocol 1.9 on needs --anonymous-write to take uploads from anonymous clients).
set -euo pipefail
OLD=$1 NEW=$2 B=${3:-/tmp/ferry-journal-bench}
rm -rf "$B"; mkdir -p "$B"/{old,new}/{root,local}
head -c 1G /dev/urandom > "$B/src"
for v in old new; do cp "$B/src" "$B/$v/root/f"; cp "$B/src" "$B/$v/local/u"; done
"$OLD" serve --root d="$B/old/root" --listen tcp://127.0.0.1:7401 --anonymous >/dev/null 2>&1 & PO=$!
"$NEW" serve --root d="$B/new/root" --listen tcp://127.0.0.1:7402 --anonymous --anonymous-write >/dev/null 2>&1 & PN=$!
trap 'kill $PO $PN; rm -rf "$B"' EXIT
sleep 0.5
t() { /usr/bin/time -f %e "$@" 2>&1 >/dev/null | tail -n 1; }
for _ in 1 2 3 4 5; do
  echo "down old $(t "$OLD" cp -q tcp://127.0.0.1:7401/d/f "$B/old/local/f")"
  echo "down new $(t "$NEW" cp -q tcp://127.0.0.1:7402/d/f "$B/new/local/f")"
  echo "up old $(t "$OLD" cp -q "$B/old/local/u" tcp://127.0.0.1:7401/d/u)"
  echo "up new $(t "$NEW" cp -q "$B/new/local/u" tcp://127.0.0.1:7402/d/u)"
done | tee "$B/times"
python3 - "$B/times" <<'PY'
import statistics as st, sys
d = {}
for line in open(sys.argv[1]):
    a, b, c = line.split()
    d.setdefault((a, b), []).append(float(c))
for dirn in ("down", "up"):
    o, n = st.median(d[(dirn, "old")]), st.median(d[(dirn, "new")])
    print(f"{dirn}: old {o:.2f} s ({1.073741824 / o:.2f} GB/s), new {n:.2f} s "
          f"({1.073741824 / n:.2f} GB/s), new/old time {n / o:.2f}")
PY
