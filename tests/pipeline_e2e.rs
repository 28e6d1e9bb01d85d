//! End-to-end: the context pipeline through the proxy (SPEC 5): a long agent conversation whose
//! every upstream request is valid by the repair invariant while the store keeps everything,
//! and the preview routes (a dry run: rewritten conversation and report, nothing stored).

mod common;

use std::collections::HashSet;

use common::*;
use serde_json::{Value, json};

/// SPEC 5 step 7: every `tool` message answers an id of the nearest preceding assistant message
/// with tool calls, with only tool messages between; every such id is answered exactly once; no
/// assistant message has neither content nor tool calls.
fn assert_valid(messages: &[Value]) {
    let mut open: Vec<String> = Vec::new();
    let mut answered: HashSet<String> = HashSet::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m["role"].as_str().unwrap();
        if role == "tool" {
            let id = m["tool_call_id"].as_str().unwrap().to_string();
            assert!(
                open.contains(&id),
                "message {i}: tool result {id} answers no open call"
            );
            assert!(
                answered.insert(id.clone()),
                "message {i}: {id} answered twice"
            );
            continue;
        }
        assert!(
            open.iter().all(|id| answered.contains(id)),
            "message {i}: calls {open:?} left unanswered"
        );
        open.clear();
        answered.clear();
        if role == "assistant" {
            let calls = m["tool_calls"].as_array().map(Vec::len).unwrap_or(0);
            let text = m["content"].as_str().is_some_and(|s| !s.is_empty());
            assert!(calls > 0 || text, "message {i}: empty assistant message");
            for c in m["tool_calls"].as_array().into_iter().flatten() {
                open.push(c["id"].as_str().unwrap().to_string());
            }
        }
    }
    assert!(
        open.iter().all(|id| answered.contains(id)),
        "calls left unanswered at the end"
    );
}

const AGENT_TENANT: &str = "keys: any\nupstream:\n  base_url: {upstream}\npolicy:\n  tool_call_window:\n    max: 3\n  compress_tool_output:\n    max_tokens: 40\n  token_budget:\n    max_tokens: 4000\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_turn_agent_conversation_stays_valid_upstream_and_complete_in_the_store() {
    let opts = ProxyOptions::default().only_tenant("default", AGENT_TENANT);
    let (proxy, mock) = proxy_and_mock(opts).await;
    let http = client();
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
    let mut messages = vec![json!({"role": "system", "content": "You are a weather agent."})];
    let mut session = None;
    for turn in 0..200 {
        messages.push(json!({"role": "user", "content": format!("call get_weather {{\"city\": \"city-{turn}\"}}")}));
        for step in 0..2 {
            let resp = http
                .post(format!("{}/chat/completions", proxy.base_url()))
                .json(&json!({"model": "gpt-4o-mini", "messages": messages, "tools": tools}))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200, "turn {turn} step {step}");
            let sid = resp.headers()["x-ctxproxy-session"]
                .to_str()
                .unwrap()
                .to_string();
            assert_eq!(
                session.get_or_insert(sid.clone()),
                &sid,
                "one session throughout"
            );
            let v: Value = resp.json().await.unwrap();
            let reply = v["choices"][0]["message"].clone();
            messages.push(reply.clone());
            if let Some(call) = reply["tool_calls"].get(0) {
                let output = json!({"city": format!("city-{turn}"), "forecast": vec!["sunny with a light breeze"; 30]});
                messages.push(json!({"role": "tool", "tool_call_id": call["id"], "content": output.to_string()}));
            }
        }
    }
    let seen = mock.requests();
    assert_eq!(seen.len(), 400);
    for (i, r) in seen.iter().enumerate() {
        let body = r.body_json().unwrap();
        let sent = body["messages"].as_array().unwrap();
        assert_valid(sent);
        assert_eq!(
            sent[0]["role"], "system",
            "request {i} keeps the system message"
        );
        let history_calls = sent
            .iter()
            .take(sent.iter().rposition(|m| m["role"] == "user").unwrap())
            .filter(|m| m["role"] == "tool")
            .count();
        assert!(
            history_calls <= 3,
            "request {i}: {history_calls} history tool calls"
        );
    }
    let stored = proxy
        .stored_messages("default", session.as_deref().unwrap())
        .await;
    assert_eq!(stored.len(), messages.len(), "every message stored once");
    for (s, m) in stored.iter().zip(&messages) {
        assert_eq!(s["role"], m["role"]);
        assert_eq!(s["content"], m["content"]);
    }
}

#[tokio::test]
async fn preview_returns_the_rewrite_and_stores_nothing() {
    let opts = ProxyOptions::default().only_tenant("default", AGENT_TENANT);
    let (proxy, mock) = proxy_and_mock(opts).await;
    let mut messages = vec![json!({"role": "system", "content": "s"})];
    for i in 0..5 {
        let id = format!("c{i}");
        messages.push(json!({"role": "user", "content": format!("q{i}")}));
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "f", "arguments": "{}"}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": "r"}));
        messages.push(json!({"role": "assistant", "content": "ok"}));
    }
    messages.push(json!({"role": "user", "content": "now"}));
    let resp = client()
        .post(proxy.url("/ctxproxy/v1/preview/chat/completions"))
        .json(&json!({"model": "gpt-4o", "messages": messages}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    let out = v["messages"].as_array().unwrap();
    assert_valid(out);
    assert_eq!(out.iter().filter(|m| m["role"] == "tool").count(), 3);
    let report = &v["report"];
    assert!(report["tokens_in"].as_u64().unwrap() > report["tokens_out"].as_u64().unwrap());
    let removed = report["removed"].as_array().unwrap();
    assert_eq!(removed.len(), 4, "two calls and their results: {report}");
    assert!(removed.iter().all(|r| r["reason"] == "tool_call_window"));
    assert_eq!(removed[0]["index"], 2);
    assert!(mock.requests().is_empty(), "no upstream call");
    let (_, list) = proxy.admin_get("/ctxproxy/v1/sessions").await;
    assert!(
        list["data"].as_array().unwrap().is_empty(),
        "nothing stored: {list}"
    );
}

#[tokio::test]
async fn preview_with_a_session_uses_its_stored_history() {
    let tenant = "keys: any\nupstream:\n  base_url: {upstream}\nsession:\n  history: server\n";
    let opts = ProxyOptions::default().only_tenant("default", tenant);
    let (proxy, mock) = proxy_and_mock(opts).await;
    let http = client();
    for q in ["first", "second"] {
        let resp = http
            .post(format!("{}/chat/completions", proxy.base_url()))
            .header("x-session-id", "s1")
            .json(&json!({"model": "m", "messages": [{"role": "user", "content": q}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    let v: Value = http
        .post(proxy.url("/ctxproxy/v1/preview/chat/completions"))
        .header("x-session-id", "s1")
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "third"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let contents: Vec<&str> = v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        contents,
        [
            "first",
            "ok: 1 messages",
            "second",
            "ok: 3 messages",
            "third"
        ]
    );
    assert_eq!(mock.requests().len(), 2, "the preview called no upstream");
    assert_eq!(
        proxy.stored_messages("default", "s1").await.len(),
        4,
        "and stored nothing"
    );
}

#[tokio::test]
async fn a_conversation_too_large_for_the_model_is_400_and_not_forwarded() {
    let opts = ProxyOptions {
        server_extra: "models:\n  \"tiny-*\": { context_window: 50, encoding: o200k_base }\n"
            .into(),
        ..Default::default()
    };
    let (proxy, mock) = proxy_and_mock(opts).await;
    let resp = client()
        .post(format!("{}/chat/completions", proxy.base_url()))
        .json(&json!({"model": "tiny-1", "messages": [{"role": "user", "content": "word ".repeat(200)}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    // The message is stored under a new session by now: the answer names it, as any other.
    let session = resp
        .headers()
        .get("x-ctxproxy-session")
        .expect("a refused request still names its session")
        .to_str()
        .unwrap()
        .to_string();
    // How long it was, as an answered request says (the audit's case).
    let tokens = |name: &str| -> u64 { resp.headers()[name].to_str().unwrap().parse().unwrap() };
    let (tokens_in, tokens_out) = (
        tokens("x-ctxproxy-tokens-in"),
        tokens("x-ctxproxy-tokens-out"),
    );
    assert!(
        tokens_out > 50 && tokens_in >= tokens_out,
        "{tokens_in} {tokens_out}"
    );
    let v: Value = resp.json().await.unwrap();
    let err = assert_openai_error(&v);
    assert_eq!(err["code"], "context_length_exceeded");
    assert_eq!(err["param"], "messages");
    assert_eq!(proxy.stored_messages("default", &session).await.len(), 1);
    let records = proxy.request_records("default", &session).await;
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["status"], 400);
    // SPEC 5.3: every request record stores the report, a refused one's too.
    assert_eq!(records[0]["tokens_in"], tokens_in);
    assert_eq!(records[0]["tokens_out"], tokens_out);
    assert_eq!(
        records[0]["report"]["tokens_out"], tokens_out,
        "{records:?}"
    );

    // The Responses API names its own field.
    let resp = client()
        .post(format!("{}/responses", proxy.base_url()))
        .json(&json!({"model": "tiny-1", "input": "word ".repeat(200)}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    let err = assert_openai_error(&v);
    assert_eq!(err["code"], "context_length_exceeded");
    assert_eq!(err["param"], "input");
    assert!(mock.requests().is_empty());

    // Refused, but nothing is lost: the message is stored (the store writes while the pipeline
    // runs) and the session's lease is free again for the next request.
    let big = json!({"role": "user", "content": "word ".repeat(200)});
    let resp = client()
        .post(format!("{}/chat/completions", proxy.base_url()))
        .header("x-session-id", "too-big")
        .json(&json!({"model": "tiny-1", "messages": [big]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let stored = proxy.stored_messages("default", "too-big").await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0]["content"], big["content"]);
    let resp = client()
        .post(format!("{}/chat/completions", proxy.base_url()))
        .header("x-session-id", "too-big")
        .header("x-ctxproxy-history", "server")
        .json(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "short"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(mock.requests().len(), 1);
}

#[tokio::test]
async fn token_headers_report_before_and_after_rewriting() {
    let opts = ProxyOptions::default().only_tenant("default", AGENT_TENANT);
    let (proxy, _mock) = proxy_and_mock(opts).await;
    let mut messages = vec![json!({"role": "system", "content": "s"})];
    for i in 0..6 {
        let id = format!("c{i}");
        messages.push(json!({"role": "user", "content": format!("q{i}")}));
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "f", "arguments": "{}"}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": "some longer tool output ".repeat(20)}));
    }
    messages.push(json!({"role": "user", "content": "now"}));
    let resp = client()
        .post(format!("{}/chat/completions", proxy.base_url()))
        .json(&json!({"model": "gpt-4o", "messages": messages}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let tin: u64 = resp.headers()["x-ctxproxy-tokens-in"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let tout: u64 = resp.headers()["x-ctxproxy-tokens-out"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(tin > tout, "{tin} > {tout}");
    let session = resp.headers()["x-ctxproxy-session"]
        .to_str()
        .unwrap()
        .to_string();
    let records = proxy.request_records("default", &session).await;
    assert_eq!(records[0]["tokens_in"], tin);
    assert_eq!(records[0]["report"]["tokens_out"], tout);
    assert!(
        !records[0]["report"]["compressed"]
            .as_array()
            .unwrap()
            .is_empty()
    );
}

/// SPEC 5.1 of a chat request as sent: the messages' formula plus 3.
fn formula(encoding: ctxproxy::tokens::Encoding, messages: &[Value]) -> u64 {
    let messages: Vec<ctxproxy::conversation::Message> = messages
        .iter()
        .map(|m| serde_json::from_value(m.clone()).unwrap())
        .collect();
    messages
        .iter()
        .map(|m| ctxproxy::tokens::message_tokens(encoding, m))
        .sum::<u64>()
        + 3
}

fn header_u64(resp: &reqwest::Response, name: &str) -> u64 {
    resp.headers()[name].to_str().unwrap().parse().unwrap()
}

/// A message's id treats re-spelled JSON arguments as the same call (so a client that
/// re-serialises them continues its conversation), but they are sent as spelled: a count cached
/// for one spelling, in one session, must not stand for another in the next, or the request goes
/// upstream over its budget.
#[tokio::test]
async fn re_spelled_arguments_are_counted_as_sent_and_the_budget_holds() {
    let tenant = "keys: any\nupstream:\n  base_url: {upstream}\npolicy:\n  token_budget:\n    max_tokens: 300\n";
    let opts = ProxyOptions::default().only_tenant("default", tenant);
    let (proxy, mock) = proxy_and_mock(opts).await;
    let mut args = serde_json::Map::new();
    for k in 0..12 {
        args.insert(format!("field_{k}"), json!([k, k + 1, k + 2, k + 3]));
    }
    let args = Value::Object(args);
    let compact = args.to_string();
    let mut pretty = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"        ");
    let mut ser = serde_json::Serializer::with_formatter(&mut pretty, formatter);
    serde::Serialize::serialize(&args, &mut ser).unwrap();
    let pretty = String::from_utf8(pretty).unwrap();
    let conversation = |arguments: &str| {
        json!([
            {"role": "user", "content": "fill in the form"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "f", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "done"},
            {"role": "user", "content": "thanks, what next?"},
        ])
    };
    let encoding = ctxproxy::tokens::Encoding::O200kBase;
    let mut sent_in = Vec::new();
    for (session, arguments) in [("s1", &compact), ("s2", &pretty)] {
        let messages = conversation(arguments);
        let resp = client()
            .post(format!("{}/chat/completions", proxy.base_url()))
            .header("x-session-id", session)
            .json(&json!({"model": "gpt-4o", "messages": messages}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let want = formula(encoding, messages.as_array().unwrap());
        assert_eq!(header_u64(&resp, "x-ctxproxy-tokens-in"), want, "{session}");
        let out = header_u64(&resp, "x-ctxproxy-tokens-out");
        let body = mock.requests().last().unwrap().body_json().unwrap();
        let upstream = body["messages"].as_array().unwrap().clone();
        assert_eq!(formula(encoding, &upstream), out, "{session}");
        assert!(
            out <= 300,
            "{session}: {out} tokens sent over a budget of 300"
        );
        sent_in.push((want, upstream.len()));
    }
    // The compact spelling fits whole; the pretty one does not, so its history goes.
    assert!(sent_in[0].0 <= 300 && sent_in[1].0 > 300, "{sent_in:?}");
    assert_eq!(sent_in[0].1, 4);
    assert_eq!(sent_in[1].1, 1);
}

/// A request over `ctxproxy::cpu::HEAVY_BYTES` is parsed and rewritten with its worker handed
/// off (on the server's multi-thread runtime): the same work, so the same result, whichever way
/// it runs. A huge JSON tool result goes upstream compressed, is stored whole, and the second
/// turn continues the same session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_of_megabytes_is_rewritten_and_stored_whole() {
    let opts = ProxyOptions::default().only_tenant("default", AGENT_TENANT);
    let (proxy, mock) = proxy_and_mock(opts).await;
    let wide: serde_json::Map<String, Value> = (0..40_000)
        .map(|i| (format!("key{i}"), json!(format!("value number {i}"))))
        .collect();
    let result = Value::Object(wide).to_string();
    assert!(result.len() > 4 * ctxproxy::cpu::HEAVY_BYTES);
    let mut messages = vec![
        json!({"role": "user", "content": "dump the table"}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "dump", "arguments": "{}"}}]}),
        json!({"role": "tool", "tool_call_id": "c1", "content": result}),
        json!({"role": "user", "content": "summarise it"}),
    ];
    let mut session = None;
    for turn in 0..2 {
        let resp = client()
            .post(format!("{}/chat/completions", proxy.base_url()))
            .json(&json!({"model": "gpt-4o", "messages": messages}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "turn {turn}");
        let sid = resp.headers()["x-ctxproxy-session"]
            .to_str()
            .unwrap()
            .to_string();
        assert_eq!(session.get_or_insert(sid.clone()), &sid, "one session");
        let reply: Value = resp.json().await.unwrap();
        messages.push(reply["choices"][0]["message"].clone());
        messages.push(json!({"role": "user", "content": "and now?"}));
    }
    for (i, r) in mock.requests().iter().enumerate() {
        let sent = r.body_json().unwrap();
        let sent = sent["messages"].as_array().unwrap();
        assert_valid(sent);
        let tool = sent.iter().find(|m| m["role"] == "tool").unwrap();
        let content = tool["content"].as_str().unwrap();
        assert!(
            content.len() < 2_000,
            "request {i}: {} bytes",
            content.len()
        );
        serde_json::from_str::<Value>(content).expect("compressed JSON is still JSON");
    }
    messages.truncate(messages.len() - 1);
    let stored = proxy
        .stored_messages("default", session.as_deref().unwrap())
        .await;
    assert_eq!(stored.len(), messages.len(), "every message stored once");
    assert_eq!(stored[2]["content"], messages[2]["content"], "stored whole");
}

/// A conversation of nothing but what pair repair must drop (a tool result without its call; a
/// Responses output or reasoning that leads nothing) would go upstream empty, which the
/// provider refuses: a 400 naming the conversation, not forwarded, its turn stored, on the real
/// route and the preview alike.
#[tokio::test]
async fn a_conversation_repair_empties_is_a_400_not_an_empty_request() {
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    let cases = [
        (
            "/chat/completions",
            json!({"model": "gpt-4o", "messages": [{"role": "tool", "tool_call_id": "x", "content": "o"}]}),
            "messages",
        ),
        (
            "/responses",
            json!({"model": "gpt-4o", "input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]}),
            "input",
        ),
        (
            "/responses",
            json!({"model": "gpt-4o", "input": [{"type": "reasoning", "id": "rs_1", "summary": []}]}),
            "input",
        ),
    ];
    for (i, (path, body, param)) in cases.iter().enumerate() {
        let session = format!("empty-{i}");
        for url in [
            format!("{}{path}", proxy.base_url()),
            proxy.url(&format!("/ctxproxy/v1/preview{path}")),
        ] {
            let resp = client()
                .post(&url)
                .header("x-session-id", &session)
                .json(body)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 400, "{url}");
            let v: Value = resp.json().await.unwrap();
            assert_eq!(assert_openai_error(&v)["param"], *param, "{url}: {v}");
        }
        let stored = proxy.stored_messages("default", &session).await;
        assert_eq!(stored.len(), 1, "the turn is stored: {stored:?}");
    }
    assert!(mock.requests().is_empty(), "nothing forwarded");
    // Nothing was sent, so nothing was rewritten or repaired for the metrics.
    let metrics = proxy.metrics_text().await;
    for line in metrics.lines().filter(|l| {
        l.starts_with("ctxproxy_repairs_total{") || l.starts_with("ctxproxy_rewrites_total{")
    }) {
        assert!(
            line.ends_with(" 0"),
            "counted for a refused request: {line}"
        );
    }
}
