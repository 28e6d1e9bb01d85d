#!/usr/bin/env bash
# Where a proxied request's cost goes: starts mock-upstream and ctxproxy (release builds, SQLite
# unless DB_URL says otherwise), sends small chat completions with oha at RATE/s for DUR seconds
# (open loop, latency-corrected), and prints the proxy's CPU per request, context switches per
# request, CPU and bytes written per thread, and the mean of each store operation from /metrics.
# Run by hand, never by CI:
#
#   benches/profile.sh                  # 1,000/s for 10 s
#   RATE=500 PERF=1 benches/profile.sh  # also `perf record -g` the proxy; report printed
#   CASE=history benches/profile.sh     # loadgen's 200-message history case (100 users) instead
#   CASE=history_new benches/profile.sh # the same 200 messages as a new session every time
#
# Knobs: RATE (1000; 100 for the history cases), DUR (10), CASE (small | history | history_new),
# DB_URL, PERF, LOG (info), BIN (target/release), OUT (target/profile). Needs oha; PERF=1 needs
# perf.
set -euo pipefail

cd "$(dirname "$0")/.."
source benches/common.sh
CASE=${CASE:-small}
if [[ $CASE == history* ]]; then RATE=${RATE:-100}; else RATE=${RATE:-1000}; fi
DUR=${DUR:-10}
BIN=${BIN:-target/release}
OUT=${OUT:-target/profile}
rm -rf "$OUT"
mkdir -p "$OUT/tenants"
OUT=$(cd "$OUT" && pwd)
MOCK=127.0.0.1:19100
PROXY=127.0.0.1:18180

cargo build --release --bins -q
LOADGEN=$(loadgen_path)
bench_config "$OUT"
echo '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}' >"$OUT/small.json"

"$BIN/mock-upstream" --listen "$MOCK" --no-record >"$OUT/mock.log" 2>&1 &
MOCK_PID=$!
CTXPROXY_LISTEN=$PROXY CTXPROXY_DATABASE_URL="${DB_URL:-sqlite://$OUT/data/profile.db?mode=rwc}" \
  CTXPROXY_UPSTREAM_URL="http://$MOCK/v1" CTXPROXY_LOG="${LOG:-info}" \
  "$BIN/ctxproxy" serve --config "$OUT/ctxproxy.yaml" >"$OUT/proxy.log" 2>&1 &
PID=$!
trap 'kill $PID $MOCK_PID 2>/dev/null || true' EXIT
for _ in $(seq 200); do curl -fs -o /dev/null "http://$PROXY/readyz" && break; sleep 0.05; done
"$LOADGEN" run "http://$PROXY/v1" --rate 200 --duration 2 >/dev/null # warm up

# Per thread: id-name, bytes written, write calls, CPU ticks.
threads() {
  for t in /proc/"$PID"/task/*; do
    echo "$(basename "$t")-$(tr ' ' _ <"$t/comm") $(awk '/^wchar/ {print $2}' "$t/io") \
      $(awk '/^syscw/ {print $2}' "$t/io") $(awk '{print $14+$15}' "$t/stat")"
  done | sort
}
switches() { cat /proc/"$PID"/task/*/status | awk '/ctxt_switches/ {s += $2} END {print s}'; }

threads >"$OUT/threads.0"
S0=$(switches)
if [[ -n "${PERF:-}" ]]; then
  perf record -F 999 -g -p "$PID" -o "$OUT/perf.data" -- sleep "$DUR" >/dev/null 2>&1 &
  PERF_PID=$!
fi
if [[ $CASE == history ]]; then
  "$LOADGEN" run "http://$PROXY/v1" --rate "$RATE" --duration "$DUR" --history 200 --users 100 >"$OUT/load.json"
elif [[ $CASE == history_new ]]; then
  "$LOADGEN" run "http://$PROXY/v1" --rate "$RATE" --duration "$DUR" --history 200 >"$OUT/load.json"
else
  oha --no-tui --output-format json -q "$RATE" -z "${DUR}s" -c 100 --latency-correction -m POST \
    -H 'content-type: application/json' -D "$OUT/small.json" "http://$PROXY/v1/chat/completions" \
    2>/dev/null >"$OUT/load.json"
fi
[[ -n "${PERF:-}" ]] && wait "$PERF_PID"
threads >"$OUT/threads.1"
S1=$(switches)
curl -s "http://$PROXY/metrics" >"$OUT/metrics.txt"

python3 - "$OUT" "$CASE" "$S0" "$S1" <<'EOF'
import json, re, sys
out, case, s0, s1 = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
d = json.load(open(f"{out}/load.json"))
if case.startswith("history"):
    n, lat = d["ok"] + d["errors"], d["ttlb_ms"]
    p50, p90, p99 = lat["p50"], lat["p90"], lat["p99"]
else:
    n, p = sum(d["statusCodeDistribution"].values()), d["latencyPercentiles"]
    p50, p90, p99 = (p[k] * 1000 for k in ("p50", "p90", "p99"))
print(f"{case}: {n} requests; latency p50 {p50:.2f} / p90 {p90:.2f} / p99 {p99:.2f} ms")
def load(name):
    rows = {}
    for line in open(f"{out}/{name}"):
        k, w, c, t = line.split()
        rows[k] = (int(w), int(c), int(t))
    return rows
a, b = load("threads.0"), load("threads.1")
total = 0
for k in sorted(b):
    w0, c0, t0 = a.get(k, (0, 0, 0))
    w, c, t = b[k]
    cpu = (t - t0) * 10.0 / n  # clock ticks of 10 ms
    total += cpu
    if cpu > 0 or w > w0:
        print(f"  {k:32s} cpu {cpu:.3f} ms/req  written {(w - w0) / n:9.0f} B/req  writes {(c - c0) / n:5.1f}/req")
print(f"proxy CPU {total:.3f} ms/request; context switches {(s1 - s0) / n:.1f}/request")
m = open(f"{out}/metrics.txt").read()
for op in sorted(set(re.findall(r'ctxproxy_store_duration_seconds_count\{op="([^"]+)"\}', m))):
    total_s = float(re.search(rf'ctxproxy_store_duration_seconds_sum\{{op="{op}"\}} (\S+)', m).group(1))
    count = float(re.search(rf'ctxproxy_store_duration_seconds_count\{{op="{op}"\}} (\S+)', m).group(1))
    if count == 0:
        continue
    print(f"  store {op}: mean {total_s / count * 1000:.3f} ms over {count:.0f}")
for name in ("ctxproxy_overhead_seconds",):
    s = re.search(rf'{name}_sum\{{[^}}]*\}} (\S+)', m)
    c = re.search(rf'{name}_count\{{[^}}]*\}} (\S+)', m)
    if s and c and float(c.group(1)) > 0:
        print(f"  overhead (request minus upstream): mean {float(s.group(1)) / float(c.group(1)) * 1000:.3f} ms")
EOF
if [[ -n "${PERF:-}" ]]; then
  perf report -i "$OUT/perf.data" --no-children --sort sym -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -30
fi
