"""How much a few CPU-heavy requests (a 4 MB JSON tool result each, compressed on the preview
route) hold up small chat completions sent beside them. Run by hand against a proxy whose tenant
has `keys: any` and `compress_tool_output: {max_tokens: 500}`, in front of mock-upstream:

    python3 benches/heavy_beside_small.py PORT [HEAVY_AT_ONCE] [SECONDS]

Prints the small requests' latency percentiles with no heavy request running, then with
HEAVY_AT_ONCE (default 2) heavy requests always in flight.
"""
import http.client
import json
import sys
import threading
import time

port = int(sys.argv[1])
heavy_at_once = int(sys.argv[2]) if len(sys.argv) > 2 else 2
seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 10
HEADERS = {"Authorization": "Bearer x", "Content-Type": "application/json"}

result = json.dumps({"k%d" % i: i for i in range(200_000)})
HEAVY = json.dumps({"model": "gpt-4o-mini", "messages": [
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "search_web", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": result},
    {"role": "user", "content": "next"}]})
SMALL = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})


def post(conn, path, body):
    conn.request("POST", path, body, HEADERS)
    answer = conn.getresponse()
    answer.read()
    assert answer.status == 200, answer.status


def small_latencies(until):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    took = []
    while time.time() < until:
        started = time.perf_counter()
        post(conn, "/v1/chat/completions", SMALL)
        took.append((time.perf_counter() - started) * 1000)
        time.sleep(0.005)
    return sorted(took)


def heavy_loop(stop, done):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    while not stop.is_set():
        post(conn, "/ctxproxy/v1/preview/chat/completions", HEAVY)
        done.append(1)


def show(label, took):
    pick = lambda q: took[min(len(took) - 1, int(q * len(took)))]
    print(f"{label}: {len(took)} small requests, p50 {pick(0.5):.2f} ms, "
          f"p90 {pick(0.9):.2f} ms, p99 {pick(0.99):.2f} ms, max {took[-1]:.2f} ms")


show("alone", small_latencies(time.time() + seconds))
stop, done = threading.Event(), []
threads = [threading.Thread(target=heavy_loop, args=(stop, done)) for _ in range(heavy_at_once)]
for t in threads:
    t.start()
time.sleep(0.5)
show(f"beside {heavy_at_once} heavy", small_latencies(time.time() + seconds))
stop.set()
for t in threads:
    t.join()
print(f"heavy requests answered: {len(done)}")
