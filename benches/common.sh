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
