"""How long the proxy takes to compress one JSON tool result with many top-level keys (the
fuzz audit's case, session 14). Run by hand against a proxy whose tenant has
`compress_tool_output: {max_tokens: 500}`; it calls only the preview route (no upstream):

    python3 benches/wide_json.py PORT
"""
import http.client
import json
import sys
import time

port = int(sys.argv[1])
for keys in [2_000, 10_000, 200_000]:
    result = json.dumps({"k%d" % i: i for i in range(keys)})
    body = json.dumps({"model": "gpt-4o-mini", "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "search_web", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": result},
        {"role": "user", "content": "next"}]})
    started = time.time()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/ctxproxy/v1/preview/chat/completions", body,
                 {"Authorization": "Bearer x", "Content-Type": "application/json"})
    answer = conn.getresponse()
    report = json.loads(answer.read())["report"]
    took = time.time() - started
    print(f"{keys} keys, {len(body)} bytes: {answer.status} in {took:.3f} s, "
          f"compressed {report['compressed']}")
