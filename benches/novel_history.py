"""Sends N new 200-message agent conversations one after another, each with text nobody sent
before (so every message is tokenised and stored fresh), and prints the latency of each
request's answer (mean, p50, p90; the first 5 are warm-up and not counted).

Usage: python3 benches/novel_history.py PORT N [SEED]   (run by benches/novel_history.sh)
"""

import http.client
import json
import random
import string
import sys
import time

port, n = int(sys.argv[1]), int(sys.argv[2])
rnd = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 1)


def words(k):
    return " ".join(
        "".join(rnd.choices(string.ascii_lowercase, k=rnd.randint(3, 9))) for _ in range(k)
    )


def conversation():
    msgs = [{"role": "system", "content": "agent " + words(5)}]
    for r in range(50):
        call = {"id": f"c{r}", "type": "function",
                "function": {"name": "q", "arguments": json.dumps({"x": words(3)})}}
        msgs.append({"role": "user", "content": words(20)})
        msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        msgs.append({"role": "tool", "tool_call_id": f"c{r}",
                     "content": json.dumps({"rows": [words(8) for _ in range(5)]})})
        msgs.append({"role": "assistant", "content": words(15)})
    msgs[-1] = {"role": "user", "content": "sum up"}
    return json.dumps({"model": "gpt-4o-mini", "messages": msgs})


conn = http.client.HTTPConnection("127.0.0.1", port)
latencies, tokens = [], None
for _ in range(n):
    body = conversation()
    started = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    resp = conn.getresponse()
    resp.read()
    if resp.status != 200:
        sys.exit(f"answer {resp.status}")
    latencies.append((time.perf_counter() - started) * 1000)
    tokens = resp.getheader("x-ctxproxy-tokens-in")
latencies = sorted(latencies[5:])
print(f"{len(latencies)} requests: mean {sum(latencies) / len(latencies):.2f} / "
      f"p50 {latencies[len(latencies) // 2]:.2f} / p90 {latencies[int(len(latencies) * 0.9)]:.2f} ms"
      f" (tokens in per request: {tokens})")
