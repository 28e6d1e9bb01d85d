#!/usr/bin/env bash
# Instructions per managed request of the whole proxy process (every thread: tokio workers,
# SQLite writer, checkpointer), counted by callgrind: repeatable whatever else the machine is
# doing, unlike its latency. Starts mock-upstream and ctxproxy (SQLite, a fresh file) under
# `valgrind --tool=callgrind`, warms up, zeroes the counters, sends the case closed loop on one
# connection, dumps, and prints the total divided by the requests. Run by hand, never by CI:
#
#   benches/request_instructions.sh BIN_DIR CASE [OUT]
#
# BIN_DIR holds `ctxproxy` and `mock-upstream` (release builds); CASE is one of
#   small     1,000 chat completions `{"role":"user","content":"hi"}` (oha), each a new session
#   stream    the same with `"stream": true`
#   history   160 requests of loadgen's 200-message agent history, 20 users (8 turns each)
# OUT is the callgrind file (default target/callgrind/CASE.out); read it with
# `callgrind_annotate --inclusive=yes OUT.1`. Needs valgrind, oha, and the loadgen bench built
# (`cargo bench --bench loadgen --no-run`).
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/common.sh
BIN=$1
CASE=$2
mkdir -p target/callgrind
OUT=${3:-target/callgrind/$CASE.out}
LOADGEN=$(loadgen_path)
DIR=$(mktemp -d)
MOCK=127.0.0.1:19300
PROXY=127.0.0.1:18300
bench_config "$DIR"
echo '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}' >"$DIR/small.json"
echo '{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}' >"$DIR/stream.json"

"$BIN/mock-upstream" --listen "$MOCK" --no-record >"$DIR/mock.log" 2>&1 &
MOCK_PID=$!
CTXPROXY_LISTEN=$PROXY CTXPROXY_DATABASE_URL="sqlite://$DIR/bench.db?mode=rwc" \
  CTXPROXY_UPSTREAM_URL=http://$MOCK/v1 CTXPROXY_LOG=info \
  valgrind --tool=callgrind --callgrind-out-file="$OUT" --dump-instr=no \
  "$BIN/ctxproxy" serve --config "$DIR/ctxproxy.yaml" >"$DIR/proxy.log" 2>&1 &
PROXY_PID=$!
trap 'kill $PROXY_PID $MOCK_PID 2>/dev/null || true' EXIT
for _ in $(seq 1 200); do curl -fs -o /dev/null "http://$PROXY/readyz" && break; sleep 0.5; done
curl -fs -o /dev/null "http://$PROXY/readyz" || { cat "$DIR/proxy.log" >&2; exit 1; }
rm -f "$OUT".*

send() { # N
  case $CASE in
    small | stream)
      oha --no-tui -n "$1" -c 1 -m POST -H 'content-type: application/json' \
        -D "$DIR/$CASE.json" "http://$PROXY/v1/chat/completions" | grep 'Success rate' ;;
    history)
      "$LOADGEN" run "http://$PROXY/v1" --rate 4 --duration $(($1 / 4)) --history 200 --users 20 |
        python3 -c 'import json,sys; d=json.load(sys.stdin); print("ok", d["ok"], "errors", d["errors"])' ;;
    *) echo "unknown case $CASE" >&2; exit 2 ;;
  esac
}
case $CASE in history) WARM=40 N=160 ;; *) WARM=200 N=1000 ;; esac
send $WARM >/dev/null
callgrind_control -z "$PROXY_PID" >/dev/null 2>&1
send $N
callgrind_control -d "$PROXY_PID" >/dev/null 2>&1
sleep 1
echo "$CASE: $(($(grep -m1 '^summary' "$OUT.1" | cut -d' ' -f2) / N)) instructions per request"
