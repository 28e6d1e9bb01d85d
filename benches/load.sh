#!/usr/bin/env bash
# Load benchmark: ctxproxy versus going direct to mock-upstream, in the same run, at fixed
# request rates (open loop). Run by hand (never by CI):
#
#   benches/load.sh                      # everything, SQLite and PostgreSQL (~15 min)
#   STORES=sqlite QUICK=1 benches/load.sh
#
# Knobs (environment): STORES ("sqlite postgres"), RATE (1000, requests/s for the latency cases),
# HIST_RATE (200, requests/s for the 200-message history cases), DUR (20, seconds per case),
# REPS (2, direct/proxy pairs per case, interleaved), SOAK_RATE (2000) and SOAK_DUR (60) for the
# error soak, STEPS ("1000 2000 3000 4000 5000", rates tried for the highest rate held),
# STREAMS (1000, concurrent open streams for the RSS figure); STEPS="", SOAK_DUR=0 or STREAMS=0
# skip those parts. QUICK=1 (short runs, one rep),
# PG_ADMIN (postgres://postgres@127.0.0.1/postgres), BIN (target/release: where ctxproxy and
# mock-upstream are; NO_BUILD=1 skips `cargo build`), OUT (target/load/<date>), LOG (info, the default filter).
#
# Needs: oha (`cargo install oha --locked`), python3 (for the summary), psql for PostgreSQL.
# Every result is one JSON line in $OUT/results.jsonl; the summary table goes to $OUT/summary.md.
set -euo pipefail

cd "$(dirname "$0")/.."
source benches/common.sh
ROOT=$(pwd)
STORES=${STORES:-"sqlite postgres"}
RATE=${RATE:-1000}
HIST_RATE=${HIST_RATE:-200}
DUR=${DUR:-20}
REPS=${REPS:-2}
SOAK_RATE=${SOAK_RATE:-2000}
SOAK_DUR=${SOAK_DUR:-60}
STEPS=${STEPS-"1000 2000 3000 4000 5000"}
STREAMS=${STREAMS:-1000}
PG_ADMIN=${PG_ADMIN:-postgres://postgres@127.0.0.1/postgres}
PG_DB=ctxproxy_bench
LOG=${LOG:-info}
if [[ -n "${QUICK:-}" ]]; then
  DUR=5; REPS=1; SOAK_DUR=10; STEPS="1000 2000 4000"
fi
OUT=${OUT:-target/load/$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
RESULTS=$OUT/results.jsonl
: >"$RESULTS"

MOCK_ADDR=127.0.0.1:19000
PROXY_ADDR=127.0.0.1:18080
DIRECT=http://$MOCK_ADDR/v1
PROXIED=http://$PROXY_ADDR/v1
PIDS=()

cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT INT TERM

log() { printf '[load %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

wait_http() { # URL
  local i
  for i in $(seq 1 200); do
    if curl -fsS -o /dev/null "$1" 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  log "nothing answers at $1"; return 1
}

BIN=${BIN:-$ROOT/target/release}
log "building release binaries and the load generator"
[[ -n "${NO_BUILD:-}" ]] || cargo build --release --bins -q
cargo bench --bench loadgen --no-run -q 2>/dev/null
LOADGEN=$(loadgen_path)
command -v oha >/dev/null || { log "oha missing: cargo install oha --locked"; exit 1; }

# A config with only the pass-through tenant (the example tenant is left out).
bench_config "$OUT"

"$BIN/mock-upstream" --listen "$MOCK_ADDR" --no-record >"$OUT/mock.log" 2>&1 &
PIDS+=($!)
wait_http "$DIRECT/models"

PROXY_PID=
start_proxy() { # STORE
  local url
  case $1 in
    # Not next to the config file: the config watcher must not see the database change.
    sqlite) rm -rf "$OUT/data"; url="sqlite://$OUT/data/bench.db?mode=rwc" ;;
    postgres)
      psql -q "$PG_ADMIN" -c "DROP DATABASE IF EXISTS $PG_DB WITH (FORCE)" >/dev/null
      psql -q "$PG_ADMIN" -c "CREATE DATABASE $PG_DB" >/dev/null
      url="${PG_ADMIN%/*}/$PG_DB" ;;
  esac
  CTXPROXY_LISTEN=$PROXY_ADDR CTXPROXY_DATABASE_URL=$url CTXPROXY_UPSTREAM_URL=$DIRECT \
    CTXPROXY_LOG=$LOG "$BIN/ctxproxy" serve --config "$OUT/ctxproxy.yaml" \
    >>"$OUT/proxy-$1.log" 2>&1 &
  PROXY_PID=$!
  PIDS+=("$PROXY_PID")
  wait_http "http://$PROXY_ADDR/readyz"
}
stop_proxy() {
  kill "$PROXY_PID" 2>/dev/null || true
  wait "$PROXY_PID" 2>/dev/null || true
}
rss_kb() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"; }

record() { # STORE CASE TARGET JSON
  python3 -c 'import json,sys; d=json.loads(sys.argv[4]); d.update(store=sys.argv[1], case=sys.argv[2], target=sys.argv[3]); print(json.dumps(d))' \
    "$1" "$2" "$3" "$4" >>"$RESULTS"
}

# oha at a fixed rate, latency corrected for coordinated omission; prints a loadgen-shaped line.
# Requests still in flight when the time is up are not errors (oha calls them "aborted due to
# deadline"); they are counted in in_flight_at_end.
oha_run() { # URL RATE SECONDS BODYFILE
  local conc=$(( $2 / 10 > 64 ? $2 / 10 : 64 ))
  oha --no-tui --output-format json -q "$2" -z "${3}s" -c "$conc" --latency-correction \
    -m POST -H 'content-type: application/json' -H 'authorization: Bearer sk-bench' \
    -D "$4" "$1/chat/completions" 2>/dev/null |
    python3 -c 'import json,sys
d=json.load(sys.stdin); s=d["summary"]; p=d["latencyPercentiles"]; codes=d.get("statusCodeDistribution",{})
ed=d.get("errorDistribution",{}); cut=ed.pop("aborted due to deadline",0)
ok=sum(v for k,v in codes.items() if k.startswith("2")); err=sum(v for k,v in codes.items() if not k.startswith("2"))+sum(ed.values())
ms=lambda x: None if x is None else x*1000
print(json.dumps({"rate": float(sys.argv[1]), "sent": ok+err, "ok": ok, "errors": err,
  "error_pct": 100.0*err/max(ok+err,1), "in_flight_at_end": cut, "achieved_rps": s.get("requestsPerSec"),
  "ttlb_ms": {"p50": ms(p.get("p50")), "p90": ms(p.get("p90")), "p99": ms(p.get("p99")), "max": ms(s.get("slowest"))}}))' "$2"
}

SMALL=$OUT/small.json
echo '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}' >"$SMALL"

pair() { # STORE CASE COMMAND...: @URL@ in COMMAND becomes the base URL; direct then proxy, REPS times
  local store=$1 case=$2; shift 2
  local r t out
  for r in $(seq 1 "$REPS"); do
    for t in direct proxy; do
      local base=$DIRECT; [[ $t == proxy ]] && base=$PROXIED
      out=$("${@//@URL@/$base}")
      record "$store" "$case" "$t" "$out"
      # Let a proxy that fell behind finish its backlog before the next measurement.
      sleep 5
      log "$store $case $t: $(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print("errors", d["errors"], "ttfb", d.get("ttfb_ms"), "ttlb", d["ttlb_ms"])' "$out")"
    done
  done
}

for store in $STORES; do
  log "== store: $store"
  start_proxy "$store"
  record "$store" rss_idle proxy "{\"rss_kb\": $(rss_kb "$PROXY_PID" VmRSS)}"
  # Warm both paths (connections, token tables, SQLite pages) before measuring.
  "$LOADGEN" run "$DIRECT" --rate 200 --duration 2 >/dev/null
  "$LOADGEN" run "$PROXIED" --rate 200 --duration 2 >/dev/null

  pair "$store" small_oha oha_run @URL@ "$RATE" "$DUR" "$SMALL"
  pair "$store" small "$LOADGEN" run @URL@ --rate "$RATE" --duration "$DUR"
  pair "$store" small_session_header "$LOADGEN" run @URL@ --rate "$RATE" --duration "$DUR" --users 200 --session-header
  pair "$store" stream "$LOADGEN" run @URL@ --rate "$RATE" --duration "$DUR" --stream
  pair "$store" history200 "$LOADGEN" run @URL@ --rate "$HIST_RATE" --duration "$DUR" --history 200 --users 100
  pair "$store" history200_session_header "$LOADGEN" run @URL@ --rate "$HIST_RATE" --duration "$DUR" --history 200 --users 100 --session-header
  pair "$store" history200_new "$LOADGEN" run @URL@ --rate "$HIST_RATE" --duration "$DUR" --history 200

  # Highest rate held: < 0.1 % errors and p99 under 100 ms (not queueing), small requests.
  for rate in $STEPS; do
    out=$(oha_run "$PROXIED" "$rate" 10 "$SMALL")
    record "$store" "step_$rate" proxy "$out"
    log "$store step $rate: $out"
  done
  if (( SOAK_DUR > 0 )); then
    out=$(oha_run "$PROXIED" "$SOAK_RATE" "$SOAK_DUR" "$SMALL")
    record "$store" soak proxy "$out"
    log "$store soak $SOAK_RATE/s for ${SOAK_DUR}s: $out"
  fi
  record "$store" rss_peak_load proxy "{\"rss_kb\": $(rss_kb "$PROXY_PID" VmHWM)}"
  stop_proxy

  # Peak RSS with $STREAMS concurrent open streams, on a fresh process.
  (( STREAMS > 0 )) || continue
  start_proxy "$store"
  out=$("$LOADGEN" hold "$PROXIED" "$STREAMS" 3000)
  record "$store" streams_open proxy "$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d["rss_kb"]=int(sys.argv[2]); print(json.dumps(d))' "$out" "$(rss_kb "$PROXY_PID" VmHWM)")"
  log "$store $STREAMS open streams: $out, VmHWM $(rss_kb "$PROXY_PID" VmHWM) kB"
  stop_proxy
done

python3 - "$RESULTS" >"$OUT/summary.md" <<'EOF'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")
print("| store | case | rate/s | direct p50/p90/p99 (ms) | proxy p50/p90/p99 (ms) | added p50/p90/p99 (ms) | proxy errors |")
print("|---|---|---|---|---|---|---|")
seen = []
for r in rows:
    k = (r["store"], r["case"])
    if r["target"] == "direct" and k not in seen:
        seen.append(k)
for store, case in seen:
    for metric in ("ttfb_ms", "ttlb_ms"):
        d = [r for r in rows if (r["store"], r["case"], r["target"]) == (store, case, "direct")]
        p = [r for r in rows if (r["store"], r["case"], r["target"]) == (store, case, "proxy")]
        if not d[0].get(metric) or (metric == "ttfb_ms" and "stream" not in case):
            continue
        dq = [med([x[metric][q] for x in d]) for q in ("p50", "p90", "p99")]
        pq = [med([x[metric][q] for x in p]) for q in ("p50", "p90", "p99")]
        add = [b - a for a, b in zip(dq, pq)]
        errs = sum(x["errors"] for x in p)
        sent = sum(x["sent"] for x in p)
        name = case + (" (first byte)" if metric == "ttfb_ms" else (" (last byte)" if "stream" in case else ""))
        f = lambda xs: " / ".join(f"{x:.2f}" for x in xs)
        print(f"| {store} | {name} | {d[0]['rate']:.0f} | {f(dq)} | {f(pq)} | {f(add)} | {errs}/{sent} |")
print()
print("| store | figure | value |")
print("|---|---|---|")
for r in rows:
    if r["case"].startswith("step_") or r["case"] == "soak":
        print(f"| {r['store']} | {r['case']} {r['rate']:.0f}/s | errors {r['errors']}/{r['sent']} ({r['error_pct']:.3f} %), p99 {r['ttlb_ms']['p99']:.2f} ms, achieved {r.get('achieved_rps') or 0:.0f}/s |")
    if "rss_kb" in r:
        extra = f" ({r['completed']}/{r['streams']} streams completed)" if "streams" in r else ""
        print(f"| {r['store']} | {r['case']} | {r['rss_kb']/1024:.1f} MB{extra} |")
EOF
cat "$OUT/summary.md"
log "results in $OUT"
