#!/usr/bin/env bash
# Parallel streams (ferry cp -p N) on loopback: memory to memory (zero:SIZE -> mem/null)
# with -p 1, 2, 4 on tcp and ofi+shm, and a /dev/shm file download with -p 1 and -p 4;
# runs alternate so drifting load hits every variant alike. Optional A/B of -p 1 against
# another build: BASE=/path/to/old/ferry.
#
#   bash bench/streams.sh [REPS] [MEM_SIZE]      (defaults: 3, 4G)
# Prints one line per run and the medians (GB/s, from cp --json's wire_bytes/seconds).
set -euo pipefail
REPS=${1:-3}
SIZE=${2:-4G}
NEW=${NEW:-$(dirname "$0")/../target/release/ferry}
BASE=${BASE:-}
WORK=$(mktemp -d /dev/shm/ferry-bench-streams.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK" /dev/shm/ferry-bench-streams-shm-*
}
trap cleanup EXIT
mkdir -p "$WORK/root" "$WORK/out"
head -c $((1 << 30)) /dev/urandom > "$WORK/root/file1g"
echo "load: $(cat /proc/loadavg)"

# serve BIN DRIVER -> sets ADDR
serve() {
    local bin=$1 driver=$2 listen
    case $driver in
        ofi+shm) listen="ofi+shm://ferry-bench-streams-shm-$RANDOM$RANDOM" ;;
        *) listen="$driver://127.0.0.1:0" ;;
    esac
    local out="$WORK/serve.$RANDOM$RANDOM"
    "$bin" serve --anonymous --anonymous-write --mem --root "d=$WORK/root" --listen "$listen" >"$out" 2>/dev/null &
    PIDS+=("$!")
    local line=""
    for _ in $(seq 100); do
        line=$(head -n1 "$out")
        [ -n "$line" ] && break
        sleep 0.1
    done
    ADDR="${line#listening on }"
}

gbps() { python3 -c 'import json,sys; v=json.loads(sys.stdin.read()); print("%.3f" % (v["wire_bytes"]/v["seconds"]/1e9))'; }
median() { python3 -c 'import sys,statistics; print("%.3f" % statistics.median(map(float, sys.argv[1:])))' "$@"; }

declare -A R
run() { # key bin args...
    local key=$1 bin=$2; shift 2
    local g
    g=$("$bin" cp --json "$@" | gbps)
    R[$key]="${R[$key]:-} $g"
    echo "$key $g"
}

for driver in tcp ofi+shm; do
    serve "$NEW" "$driver"
    a_new=$ADDR
    a_base=""
    if [ -n "$BASE" ]; then
        serve "$BASE" "$driver"
        a_base=$ADDR
    fi
    for ((i = 0; i < REPS; i++)); do
        for p in 1 2 4; do
            run "mem/$driver/p$p" "$NEW" -p "$p" "zero:$SIZE" "$a_new/mem/null"
        done
        if [ -n "$BASE" ]; then
            run "mem/$driver/base-p1" "$BASE" "zero:$SIZE" "$a_base/mem/null"
        fi
        for p in 1 4; do
            run "shm-file/$driver/p$p" "$NEW" -p "$p" "$a_new/d/file1g" "$WORK/out/f"
            rm -f "$WORK/out/f"
        done
        if [ -n "$BASE" ]; then
            run "shm-file/$driver/base-p1" "$BASE" "$a_base/d/file1g" "$WORK/out/f"
            rm -f "$WORK/out/f"
        fi
    done
done
echo "== medians of $REPS (GB/s); load now: $(cat /proc/loadavg)"
for k in $(printf '%s\n' "${!R[@]}" | sort); do
    # shellcheck disable=SC2086
    echo "$k $(median ${R[$k]})   [${R[$k]# }]"
done
