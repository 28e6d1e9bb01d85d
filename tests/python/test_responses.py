"""The official openai Python SDK: a managed Responses conversation through ctxproxy.

Run by tests/responses_python.rs with CTXPROXY_BASE_URL (the proxy), CTXPROXY_MOCK_URL (the
mock upstream, for its request recorder) and CTXPROXY_SESSIONS_OUT (a file this test appends
one JSON line per conversation to, so the Rust side can check the store).
"""
import json
import os
import urllib.request

import pytest
from openai import OpenAI

BASE_URL = os.environ["CTXPROXY_BASE_URL"]
MOCK_URL = os.environ["CTXPROXY_MOCK_URL"]
SESSIONS_OUT = os.environ["CTXPROXY_SESSIONS_OUT"]

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]


@pytest.fixture
def client():
    # The recorder is shared by the tests of one run; each test starts from an empty log.
    urllib.request.urlopen(urllib.request.Request(f"{MOCK_URL}/_mock/requests", method="DELETE"))
    return OpenAI(base_url=BASE_URL, api_key="sk-test", max_retries=0)


def upstream_bodies():
    with urllib.request.urlopen(f"{MOCK_URL}/_mock/requests") as resp:
        requests = json.load(resp)
    return [r["body"] for r in requests if r["path"] == "/v1/responses"]


def create(client, stream, **kwargs):
    """One turn; returns (session header, final response)."""
    if stream:
        raw = client.responses.with_raw_response.create(stream=True, **kwargs)
        events = list(raw.parse())
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        final = next(e.response for e in events if e.type == "response.completed")
        assert deltas == final.output_text
        return raw.headers["x-ctxproxy-session"], final
    raw = client.responses.with_raw_response.create(**kwargs)
    return raw.headers["x-ctxproxy-session"], raw.parse()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_three_turns_with_previous_response_id(client, stream):
    s1, r1 = create(
        client,
        stream,
        model="gpt-4o-mini",
        input='call get_weather {"city": "Tokyo"}',
        tools=TOOLS,
    )
    call = r1.output[0]
    assert call.type == "function_call"
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Tokyo"}

    s2, r2 = create(
        client,
        stream,
        model="gpt-4o-mini",
        previous_response_id=r1.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"temp": 21}'}],
        tools=TOOLS,
    )
    # The mock counts the items it received: the proxy sent the whole conversation.
    assert r2.output_text == "ok: 3 messages"

    s3, r3 = create(
        client, stream, model="gpt-4o-mini", previous_response_id=r2.id, input="thanks"
    )
    assert r3.output_text == "ok: 5 messages"
    assert s1 == s2 == s3

    bodies = upstream_bodies()
    assert len(bodies) == 3
    for body in bodies:
        assert "previous_response_id" not in body
    assert [len(b["input"]) for b in bodies] == [1, 3, 5]
    last = bodies[2]["input"]
    assert [i.get("type", "message") for i in last] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
        "message",
    ]
    assert last[1]["call_id"] == call.call_id
    assert last[2] == {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp": 21}'}
    assert last[4] == {"role": "user", "content": "thanks"}
    assert bodies[1]["tools"][0]["name"] == "get_weather"

    with open(SESSIONS_OUT, "a") as out:
        out.write(json.dumps({"session": s3, "call_id": call.call_id, "reply": r3.id}) + "\n")
