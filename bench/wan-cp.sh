#!/usr/bin/env bash
# ferry cp across the WAN emulator, against iperf3 -P 1 on the same path: memory to
# memory (the server's mem/zero/SIZE downloaded to null:, and zero:SIZE uploaded to
# mem/null) and a file download (a /dev/shm file to /dev/shm), on tcp and ofi+tcp, with
# whatever flags FLAGS gives (none by default: what a user gets).
#
#   bash bench/wan-cp.sh                       # 50 ms, 1 Gbit/s
#   RTT=50ms RATE=2gbit SIZE=1G FLAGS="-p 4" bash bench/wan-cp.sh
#   FERRY=/path/to/other/ferry bash bench/wan-cp.sh   # another build, for A/B runs
# One line per run: what, Mbit/s of file data (cp --json's wire_bytes / seconds, so the
# connection's set-up is included), and ferry's own path report when -v prints one.
# Needs root, iperf3 and jq.
set -euo pipefail
cd "$(dirname "$0")/.."
RTT=${RTT:-50ms}
RATE=${RATE:-1gbit}
SIZE=${SIZE:-1G}
FLAGS=${FLAGS:-}
SERVE_CONFIG=${SERVE_CONFIG:-}     # a ferry serve config (e.g. ring = 16), or none
DRIVERS=${DRIVERS:-"tcp ofi+tcp"}
WHAT=${WHAT:-"iperf3 down up file"}
FERRY=${FERRY:-target/release/ferry}
WAN=${WAN:-target/release/ferry-wan}
FERRY=$(realpath "$FERRY")
WORK=$(mktemp -d /dev/shm/ferry-wan-cp.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/root" "$WORK/out"
if [[ " $WHAT " == *" file "* ]]; then
    head -c "$(numfmt --from=iec "$SIZE")" /dev/urandom >"$WORK/root/file"
fi
echo "# $RTT $RATE size $SIZE flags '$FLAGS' server config '$SERVE_CONFIG', load $(cut -d' ' -f1-3 /proc/loadavg)"

# on_path A_CMD B_CMD: the emulated path up, A's command (a server) and B's (the client).
on_path() {
    "$WAN" run --rtt "$RTT" --rate "$RATE" --grace 0.2 --a "$1" --b "$2" 2>"$WORK/wan.err"
}

serve() {   # serve DRIVER: the command that serves $WORK/root and mem on A
    local config=
    [ -n "$SERVE_CONFIG" ] && config="--config $(realpath "$SERVE_CONFIG")"
    echo "$FERRY serve $config --anonymous --anonymous-write --mem --root d=$WORK/root --listen $1://\$FERRY_WAN_A:7370 >/dev/null 2>&1"
}

for what in $WHAT; do
    if [ "$what" = iperf3 ]; then
        mbit=$(on_path 'iperf3 -s -1 >/dev/null' \
            'sleep 0.3; iperf3 -c $FERRY_WAN_A -t 10 -R -J' |
            jq '.end.sum_received.bits_per_second / 1e6 | floor')
        echo "iperf3 -P 1 -t 10: $mbit Mbit/s"
        continue
    fi
    for driver in $DRIVERS; do
        case $what in
            down) src="$driver://\$FERRY_WAN_A:7370/mem/zero/$SIZE" dst=null: ;;
            up) src="zero:$SIZE" dst="$driver://\$FERRY_WAN_A:7370/mem/null" ;;
            file) rm -f "$WORK/out/file"; src="$driver://\$FERRY_WAN_A:7370/d/file" dst="$WORK/out/file" ;;
        esac
        out=$(on_path "$(serve "$driver")" \
            "sleep 0.5; $FERRY -v cp --json $FLAGS $src $dst 2>$WORK/cp.err" || true)
        mbit=$(jq -r 'if .ok then (.wire_bytes * 8 / .seconds / 1e6 | floor) else .error end' <<<"$out")
        path=$(grep -o 'path:.*' "$WORK/cp.err" | head -n1 || true)
        echo "$what $driver: $mbit Mbit/s $(jq -c '.path // empty' <<<"$out") $path"
    done
done
