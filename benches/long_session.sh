#!/usr/bin/env bash
# How long a long session takes to read back: for each N, one client-mode request stores an
# N-message conversation under a session header, then the admin messages route reads the head
# branch (the path load that server-history turns and previews also do). Run by hand, never by
# CI:
#
#   benches/long_session.sh                                   # SQLite, N = 1000 2000 4000
#   DB=postgres://postgres@127.0.0.1:5432/DBNAME benches/long_session.sh
#
# Knobs: NS ("1000 2000 4000"), DB (a fresh SQLite file in OUT by default), BIN (target/release;
# no build when set), OUT (target/long_session).
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/common.sh
if [[ -z ${BIN:-} ]]; then cargo build --release --bins -q; BIN=target/release; fi
OUT=${OUT:-target/long_session}
rm -rf "$OUT"
mkdir -p "$OUT/tenants"
OUT=$(cd "$OUT" && pwd)
bench_config "$OUT"
"$BIN/mock-upstream" --listen 127.0.0.1:19870 --no-record >"$OUT/mock.log" 2>&1 &
MOCK_PID=$!
CTXPROXY_ADMIN_TOKEN=bench CTXPROXY_LISTEN=127.0.0.1:18870 \
  CTXPROXY_DATABASE_URL="${DB:-sqlite://$OUT/long.db?mode=rwc}" \
  CTXPROXY_UPSTREAM_URL=http://127.0.0.1:19870/v1 "$BIN/ctxproxy" serve --config "$OUT/ctxproxy.yaml" \
  >"$OUT/proxy.log" 2>&1 &
PID=$!
trap 'kill $MOCK_PID $PID 2>/dev/null || true' EXIT
for _ in $(seq 200); do curl -fs -o /dev/null http://127.0.0.1:18870/readyz && break; sleep 0.05; done
python3 - ${NS:-1000 2000 4000} <<'PY'
import http.client, json, sys, time
def call(method, path, body=None, headers={}):
    c = http.client.HTTPConnection("127.0.0.1", 18870, timeout=600)
    c.request(method, path, body=json.dumps(body) if body else None,
              headers={"content-type": "application/json", **headers})
    r = c.getresponse(); data = r.read(); c.close()
    return r.status, data
for n in map(int, sys.argv[1:]):
    session = f"long-{n}-{time.time_ns()}"
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i} " + "y" * 10}
            for i in range(n - 1)] + [{"role": "user", "content": "end"}]
    status, _ = call("POST", "/v1/chat/completions", {"model": "gpt-4.1", "messages": msgs},
                     {"x-session-id": session})
    assert status == 200, status
    time.sleep(0.1)
    t = time.perf_counter()
    status, data = call("GET", f"/ctxproxy/v1/sessions/default/{session}/messages",
                        headers={"authorization": "Bearer bench"})
    took = time.perf_counter() - t
    assert status == 200, status
    print(f"N = {n}: {len(json.loads(data))} messages read back in {took:.3f} s")
PY
