#!/usr/bin/env bash
# How much of the proxy's added latency is the HTTP hop itself, and how much the managed path
# (store, pipeline, record): oha at RATE/s against mock-upstream directly and through ctxproxy,
# for GET /v1/models (forwarded untouched) and a small chat completion (managed), with the
# store on a file and in memory; prints p50/p90/p99 and the proxy's CPU per request.
# Run by hand, never by CI:
#
#   benches/floor.sh                 # 1,000/s, 8 s per run
#   RATE=500 DUR=5 benches/floor.sh
#   BIN=/tmp/base benches/floor.sh   # binaries from elsewhere (no build), e.g. to compare commits
#   STORES=file CASES=chat benches/floor.sh
#
# Needs oha (cargo install oha --locked) and release builds (built here).
set -euo pipefail

cd "$(dirname "$0")/.."
source benches/common.sh
RATE=${RATE:-1000}
DUR=${DUR:-8}
OUT=${OUT:-target/floor}
rm -rf "$OUT"
mkdir -p "$OUT/tenants" "$OUT/data"
OUT=$(cd "$OUT" && pwd)
MOCK=127.0.0.1:19100
PROXY=127.0.0.1:18180
BIN=${BIN:-}
if [[ -z $BIN ]]; then
  cargo build --release --bins -q
  BIN=target/release
fi
STORES=${STORES:-"file memory"}
CASES=${CASES:-"models chat"}
bench_config "$OUT"
echo '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}' >"$OUT/small.json"

"$BIN/mock-upstream" --listen "$MOCK" --no-record >"$OUT/mock.log" 2>&1 &
MOCK_PID=$!
PID=
trap 'kill $MOCK_PID $PID 2>/dev/null || true' EXIT

load() { # URL [oha options...]: prints "p50 p90 p99" in ms
  local url=$1
  shift
  oha --no-tui --output-format json -q "$RATE" -z "${DUR}s" -c 100 --latency-correction "$@" "$url" \
    2>/dev/null | python3 -c 'import json,sys
d=json.load(sys.stdin); p=d["latencyPercentiles"]
n=sum(d["statusCodeDistribution"].values()); ok=d["statusCodeDistribution"].get("200", 0)
print(" / ".join(f"{p[k]*1000:.2f}" for k in ("p50","p90","p99")), f"({ok} of {n} answered 200)")'
}
chat=(-m POST -H 'content-type: application/json' -D "$OUT/small.json")

for kind in $STORES; do
  if [[ $kind == file ]]; then store="sqlite://$OUT/data/floor.db?mode=rwc"; else store="sqlite::memory:"; fi
  CTXPROXY_LISTEN=$PROXY CTXPROXY_DATABASE_URL="$store" CTXPROXY_UPSTREAM_URL="http://$MOCK/v1" \
    CTXPROXY_LOG=warn "$BIN/ctxproxy" serve --config "$OUT/ctxproxy.yaml" >"$OUT/proxy.log" 2>&1 &
  PID=$!
  for _ in $(seq 200); do curl -fs -o /dev/null "http://$PROXY/readyz" && break; sleep 0.05; done
  echo "store: $store"
  for case in $CASES; do
    if [[ $case == models ]]; then opts=(); path=/v1/models; else opts=("${chat[@]}"); path=/v1/chat/completions; fi
    echo "  $case direct   p50/p90/p99 ms: $(load "http://$MOCK$path" "${opts[@]}")"
    before=$(awk '{print $14+$15}' /proc/$PID/stat)
    echo "  $case proxied  p50/p90/p99 ms: $(load "http://$PROXY$path" "${opts[@]}")"
    after=$(awk '{print $14+$15}' /proc/$PID/stat)
    echo "  $case proxy CPU: $(( (after - before) * 10 * 1000 / (RATE * DUR) )) us/request"
  done
  kill $PID
  wait $PID 2>/dev/null || true
done
