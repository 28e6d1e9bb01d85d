#!/usr/bin/env bash
# A/B of one loadgen case between proxy binaries, run one after the other against one
# mock-upstream, each on a fresh SQLite file (2 s of warm-up first). Run by hand, never by CI:
#
#   ARGS="--users 200 --session-header" benches/ab.sh /tmp/bin_old target/release /tmp/bin_old target/release
#   RATE=100 DUR=10 ARGS="--history 200 --users 100 --session-header" benches/ab.sh DIR...
#
# Each DIR holds a `ctxproxy` binary. Knobs: RATE (1000), DUR (8), ARGS (loadgen options),
# OUT (target/ab). Prints ok/errors and p50/p90/p99 to the last byte (and to the first) per run.
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/common.sh
[[ $# -gt 0 ]] || { echo "usage: benches/ab.sh BIN_DIR..." >&2; exit 2; }
LOADGEN=$(loadgen_path)
OUT=$(fresh_bench_dir "${OUT:-target/ab}")
start_mock 127.0.0.1:19860 "$OUT"
PID=
trap 'kill $MOCK_PID $PID 2>/dev/null || true' EXIT
for BIN in "$@"; do
  rm -f "$OUT"/ab.db*
  CTXPROXY_LISTEN=127.0.0.1:18860 CTXPROXY_DATABASE_URL="sqlite://$OUT/ab.db?mode=rwc" \
    CTXPROXY_UPSTREAM_URL=http://127.0.0.1:19860/v1 "$BIN/ctxproxy" serve --config "$OUT/ctxproxy.yaml" \
    >"$OUT/proxy.log" 2>&1 &
  PID=$!
  for _ in $(seq 200); do curl -fs -o /dev/null http://127.0.0.1:18860/readyz && break; sleep 0.05; done
  # shellcheck disable=SC2086
  "$LOADGEN" run http://127.0.0.1:18860/v1 --rate "${RATE:-1000}" --duration 2 ${ARGS:-} >/dev/null
  # shellcheck disable=SC2086
  "$LOADGEN" run http://127.0.0.1:18860/v1 --rate "${RATE:-1000}" --duration "${DUR:-8}" ${ARGS:-} >"$OUT/r.json"
  python3 - "$BIN" "$OUT/r.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[2])); l = d["ttlb_ms"]; f = d.get("ttfb_ms")
line = f"{sys.argv[1]}: {d['ok']} ok, {d['errors']} errors; p50 {l['p50']:.2f} p90 {l['p90']:.2f} p99 {l['p99']:.2f} ms"
if f:
    line += f" (first byte p50 {f['p50']:.2f} p90 {f['p90']:.2f} p99 {f['p99']:.2f} ms)"
print(line)
PY
  kill "$PID"; wait "$PID" 2>/dev/null || true
done
