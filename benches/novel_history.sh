#!/usr/bin/env bash
# New 200-message conversations with novel text, one at a time (closed loop), through the proxy
# (SQLite file) and, with DIRECT=1, straight to the mock: the cost of a conversation the proxy
# has never seen (every message tokenised and stored). Run by hand, never by CI:
#
#   benches/novel_history.sh            # 100 requests through the proxy
#   DIRECT=1 benches/novel_history.sh   # the same straight to mock-upstream
#
# Knobs: N (100), SEED (1), BIN (target/release; no build when set), OUT (target/novel),
# DB (the proxy's database URL; default a fresh SQLite file in OUT).
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/common.sh
N=${N:-100}
OUT=${OUT:-target/novel}
if [[ -z ${BIN:-} ]]; then cargo build --release --bins -q; BIN=target/release; fi
rm -rf "$OUT"
mkdir -p "$OUT/tenants"
OUT=$(cd "$OUT" && pwd)
bench_config "$OUT"
"$BIN/mock-upstream" --listen 127.0.0.1:19400 --no-record >"$OUT/mock.log" 2>&1 &
MOCK_PID=$!
CTXPROXY_LISTEN=127.0.0.1:18480 CTXPROXY_DATABASE_URL="${DB:-sqlite://$OUT/novel.db?mode=rwc}" \
  CTXPROXY_UPSTREAM_URL=http://127.0.0.1:19400/v1 "$BIN/ctxproxy" serve --config "$OUT/ctxproxy.yaml" \
  >"$OUT/proxy.log" 2>&1 &
PID=$!
trap 'kill $MOCK_PID $PID 2>/dev/null || true' EXIT
for _ in $(seq 200); do curl -fs -o /dev/null http://127.0.0.1:18480/readyz && break; sleep 0.05; done
if [[ -n ${DIRECT:-} ]]; then port=19400; else port=18480; fi
python3 benches/novel_history.py "$port" "$N" "${SEED:-1}"
