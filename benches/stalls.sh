#!/usr/bin/env bash
# Rare long stalls under sustained load, A/B between proxy binaries. A stall of a few hundred
# ms shows in one 10 s run in several, so each binary gets ROUNDS fresh processes (fresh SQLite
# file) of RUNS back-to-back runs, interleaved with the other binaries. Per run it prints the
# latency to the last byte and the proxy's file syscalls counted by `perf stat` tracepoints
# (files opened, unlinked, pwrite calls, fsyncs), then per binary how many runs had a request
# over 100 ms. Run by hand, never by CI:
#
#   benches/stalls.sh /tmp/bin_old target/release
#   ROUNDS=3 ARGS= benches/stalls.sh DIR...        # small requests instead of streams
#   PRELOAD=50 RATE=200 ARGS="--history 200 --users 100" benches/stalls.sh DIR...
#
# Each DIR holds `ctxproxy`. Knobs: ROUNDS (5), RUNS (4), RATE (1000), DUR (10), ARGS
# (loadgen options, default --stream), PRELOAD (0: seconds of small requests at 2,000/s sent
# first, unmeasured, so that the runs meet a database of that many turns), OUT
# (target/stalls). Needs perf.
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/common.sh
[[ $# -gt 0 ]] || { echo "usage: benches/stalls.sh BIN_DIR..." >&2; exit 2; }
LOADGEN=$(loadgen_path)
OUT=$(fresh_bench_dir "${OUT:-target/stalls}")
start_mock 127.0.0.1:19870 "$OUT"
PID=
trap 'kill $MOCK_PID $PID 2>/dev/null || true' EXIT
EVENTS=syscalls:sys_enter_openat,syscalls:sys_enter_unlink,syscalls:sys_enter_pwrite64,syscalls:sys_enter_fsync
for round in $(seq "${ROUNDS:-5}"); do
  for BIN in "$@"; do
    rm -f "$OUT"/stalls.db*
    CTXPROXY_LISTEN=127.0.0.1:18870 CTXPROXY_DATABASE_URL="sqlite://$OUT/stalls.db?mode=rwc" \
      CTXPROXY_UPSTREAM_URL=http://127.0.0.1:19870/v1 CTXPROXY_LOG=warn \
      "$BIN/ctxproxy" serve --config "$OUT/ctxproxy.yaml" >"$OUT/proxy.log" 2>&1 &
    PID=$!
    for _ in $(seq 200); do curl -fs -o /dev/null http://127.0.0.1:18870/readyz && break; sleep 0.05; done
    if [[ ${PRELOAD:-0} -gt 0 ]]; then
      "$LOADGEN" run http://127.0.0.1:18870/v1 --rate 2000 --duration "$PRELOAD" >/dev/null
    fi
    for run in $(seq "${RUNS:-4}"); do
      perf stat -e "$EVENTS" -p "$PID" -o "$OUT/perf.txt" &
      PERF_PID=$!
      # shellcheck disable=SC2086
      "$LOADGEN" run http://127.0.0.1:18870/v1 --rate "${RATE:-1000}" --duration "${DUR:-10}" \
        ${ARGS---stream} >"$OUT/r.json"
      kill -INT "$PERF_PID"
      wait "$PERF_PID" || true
      python3 - "$BIN" "$round" "$run" "$OUT/r.json" "$OUT/perf.txt" <<'PY' | tee -a "$OUT/runs.txt"
import json, sys
bin_, rnd, run, result, perf = sys.argv[1:]
d = json.load(open(result)); l = d["ttlb_ms"]
counts = {}
for line in open(perf):
    f = line.split()
    if len(f) >= 2 and f[1].startswith("syscalls:sys_enter_"):
        counts[f[1].removeprefix("syscalls:sys_enter_")] = int(f[0].replace(",", ""))
per = lambda k: counts.get(k, 0) * 10_000 / max(d["ok"] + d["errors"], 1)
print(f"{bin_}\tround {rnd} run {run}\t{d['errors']} errors\tp50 {l['p50']:.2f} p99 {l['p99']:.2f} "
      f"max {l['max']:.2f} ms\tper 10k requests: openat {per('openat'):.0f} unlink "
      f"{per('unlink'):.0f} pwrite64 {per('pwrite64'):.0f} fsync {per('fsync'):.0f}")
PY
    done
    kill "$PID"
    wait "$PID" 2>/dev/null || true
    PID=
  done
done
python3 - "$OUT/runs.txt" <<'PY'
import re, sys
runs = {}
for line in open(sys.argv[1]):
    b = line.split("\t")[0]
    m = float(re.search(r"max ([\d.]+) ms", line).group(1))
    runs.setdefault(b, []).append(m)
for b, maxes in runs.items():
    print(f"{b}: {sum(m > 100 for m in maxes)} of {len(maxes)} runs with a request over 100 ms "
          f"(worst {max(maxes):.0f} ms)")
PY
