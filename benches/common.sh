# Shared by the load scripts in benches/ (sourced from the repository's root, never run).

# The path of the `loadgen` bench binary, built if needed.
loadgen_path() {
  cargo bench --bench loadgen --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]=="loadgen" and m.get("executable"): print(m["executable"])'
}

# bench_config DIR: DIR/ctxproxy.yaml, the shipped server config with only the shipped
# pass-through tenant (copied to DIR/tenants; the example tenant is left out).
bench_config() {
  mkdir -p "$1/tenants"
  cp config/tenants/default.yaml "$1/tenants/"
  sed "s#^tenants_dir:.*#tenants_dir: $1/tenants#" config/ctxproxy.yaml >"$1/ctxproxy.yaml"
}

# fresh_bench_dir DIR: DIR emptied and holding the bench config (see bench_config); prints its
# absolute path.
fresh_bench_dir() {
  rm -rf "$1"
  mkdir -p "$1"
  local dir
  dir=$(cd "$1" && pwd)
  bench_config "$dir"
  echo "$dir"
}

# start_mock ADDR DIR: mock-upstream (release, built if needed) on ADDR in the background,
# logging to DIR/mock.log; its pid in MOCK_PID.
start_mock() {
  cargo build --release --bin mock-upstream -q
  target/release/mock-upstream --listen "$1" --no-record >"$2/mock.log" 2>&1 &
  MOCK_PID=$!
}
