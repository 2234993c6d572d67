#!/usr/bin/env bash
# Throughput of one TCP stream across the WAN emulator against the round-trip time:
# iperf3 -t 3 from namespace B to namespace A at each RTT, with no bottleneck and with a
# 1 Gbit/s one, with the emulator's raised TCP buffer ceilings and with the host's own.
# Writes bench/results/wan-emulator.csv (needs root, iperf3 and jq).
#
#   crates/ferry-wan/scripts/throughput-vs-delay.sh
#   DELAYS="0 50" RATES="none 2000" crates/ferry-wan/scripts/throughput-vs-delay.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
WAN=${WAN:-target/release/ferry-wan}
OUT=${OUT:-bench/results/wan-emulator.csv}
DELAYS=${DELAYS:-"0 10 30 80"}
RATES=${RATES:-"none 1000"}       # Mbit/s, or none
SECONDS_PER_RUN=${SECONDS_PER_RUN:-3}

[ -x "$WAN" ] || cargo build --release -p ferry-wan
for tool in iperf3 jq; do
    command -v $tool >/dev/null || { echo "needs $tool (apt-get install $tool)" >&2; exit 1; }
done

mkdir -p "$(dirname "$OUT")"
tmp="$OUT.tmp"
echo "rtt_ms,rate_mbit,tcp_buffers,congestion_control,throughput_mbit,retransmits" >"$tmp"
for rtt in $DELAYS; do
    for rate in $RATES; do
        for buffers in raised host; do
            args=(--rtt "${rtt}ms")
            [ "$rate" != none ] && args+=(--rate "${rate}mbit")
            [ "$buffers" = host ] && args+=(--host-buffers)
            json=$("$WAN" run "${args[@]}" --a 'iperf3 -s -1 >/dev/null' \
                --b "sleep 0.3; iperf3 -c \$FERRY_WAN_A -t $SECONDS_PER_RUN -J" 2>/dev/null)
            mbit=$(jq '.end.sum_received.bits_per_second / 1e6 | floor' <<<"$json")
            retr=$(jq '.end.sum_sent.retransmits' <<<"$json")
            cc=$(jq -r '.end.sender_tcp_congestion' <<<"$json")
            [ "$rate" = none ] && rate_col= || rate_col=$rate
            echo "$rtt,$rate_col,$buffers,$cc,$mbit,$retr" | tee -a "$tmp"
        done
    done
done
mv "$tmp" "$OUT"
echo "wrote $OUT" >&2
