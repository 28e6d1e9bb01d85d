"""The official openai Python SDK against ctxproxy (in front of mock-upstream).

Run by tests/python_sdk.rs with CTXPROXY_BASE_URL pointing at a running proxy.
"""
import os

import pytest
from openai import OpenAI

BASE_URL = os.environ["CTXPROXY_BASE_URL"]


@pytest.fixture
def client():
    return OpenAI(base_url=BASE_URL, api_key="sk-test", max_retries=0)


def test_chat_completion(client):
    r = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}]
    )
    assert r.choices[0].message.content == "ok: 1 messages"
    assert r.usage.prompt_tokens > 0


def test_chat_completion_stream(client):
    stream = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "ok: 2 messages"


def test_chat_tool_call(client):
    r = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": 'call get_weather {"city": "Tokyo"}'}],
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    )
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert call.function.arguments == '{"city": "Tokyo"}'


def test_responses_create(client):
    r = client.responses.create(model="gpt-4o-mini", input="hello")
    assert r.output_text == "ok: 1 messages"


def test_responses_stream(client):
    with client.responses.stream(model="gpt-4o-mini", input="hello") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == "ok: 1 messages"
    assert final.output_text == "ok: 1 messages"


def test_models_list(client):
    models = client.models.list()
    assert len(models.data) > 0
