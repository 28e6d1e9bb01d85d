//! What the store keeps of replies and unusual messages, and what happens when it is gone:
//! a streamed reply with parallel tool calls is stored as the whole answer is, a client that
//! hangs up mid-stream still gets its reply stored, unknown fields survive the round trip, and
//! a store that is down refuses requests with 503 before the upstream is called.

use std::time::Duration;

use serde_json::{Value, json};

use super::common::*;
use super::{Backend, chat, reply_message, request, user, without_seq};

const PARALLEL: &str =
    r#"call get_weather {"city": "Paris"}; call get_time {"tz": "Europe/Paris"}"#;

/// Polls (bounded) until the session's head branch holds `n` messages.
async fn wait_for_messages(proxy: &Proxy, session: &str, n: usize) -> Vec<Value> {
    for _ in 0..200 {
        let (status, v) = proxy
            .admin_get(&format!("/ctxproxy/v1/sessions/default/{session}/messages"))
            .await;
        if status == 200 && v.as_array().is_some_and(|a| a.len() >= n) {
            return v.as_array().cloned().unwrap_or_default();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("session {session} never held {n} messages");
}

async fn streamed_parallel_tool_calls_are_stored_like_the_whole_answer(b: Backend) {
    // Two mocks, so both answers get the same call ids (`call_1`, `call_2`).
    let (streamed, _mock_s) = proxy_and_mock(b.options()).await;
    let (whole, _mock_w) = proxy_and_mock(b.options()).await;
    let mut body = request(&[user(PARALLEL)]);

    // Distinct session ids: on PostgreSQL both proxies share one database.
    let answer = chat(
        &whole.base_url(),
        "sk-a",
        &[("x-session-id", "par-whole")],
        &body,
    )
    .await;
    let answered = reply_message(&answer);
    assert_eq!(answered["tool_calls"].as_array().unwrap().len(), 2);

    body["stream"] = json!(true);
    let resp = client()
        .post(format!("{}/chat/completions", streamed.base_url()))
        .header("x-session-id", "par-stream")
        .bearer_auth("sk-a")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let sse = resp.text().await.unwrap();
    assert!(sse.contains("\"index\":1"), "the stream carried two calls");

    streamed.wait_for_records("default", "par-stream", 1).await;
    let s = without_seq(&streamed.stored_messages("default", "par-stream").await);
    let w = without_seq(&whole.stored_messages("default", "par-whole").await);
    assert_eq!(
        w[1], answered,
        "the whole answer is stored exactly as produced"
    );
    // OpenAI's whole message carries `annotations: []`, which no chunk of a stream does; the
    // rebuilt reply is otherwise the same value: role, null content and refusal, both calls in
    // order with their ids, types, names and complete argument text.
    let mut expected = answered.clone();
    expected.as_object_mut().unwrap().remove("annotations");
    assert_eq!(s[1], expected);
    assert_eq!(s[0], w[0]);

    // Same conversation, same tree: both sessions end on the same message id.
    assert_eq!(
        head_id(&streamed, "par-stream").await,
        head_id(&whole, "par-whole").await
    );
}

/// The id of a session's first listed branch.
async fn head_id(proxy: &Proxy, session: &str) -> Value {
    let (status, d) = proxy
        .admin_get(&format!("/ctxproxy/v1/sessions/default/{session}"))
        .await;
    assert_eq!(status, 200, "{d}");
    d["branches"][0]["id"].clone()
}

async fn reply_is_stored_after_the_client_hangs_up_mid_stream(b: Backend) {
    let (proxy, mock) = proxy_and_mock(b.options()).await;
    let mut body = request(&[user("tell me slowly")]);
    body["stream"] = json!(true);
    let mut resp = client()
        .post(format!("{}/chat/completions", proxy.base_url()))
        .header("x-session-id", "gone")
        .header("x-mock-chunk-delay-ms", "150")
        .bearer_auth("sk-a")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let first = resp.chunk().await.unwrap().expect("a first chunk");
    assert!(!first.is_empty());
    drop(resp);

    let stored = wait_for_messages(&proxy, "gone", 2).await;
    proxy.wait_for_records("default", "gone", 1).await;
    assert_eq!(mock.requests().len(), 1);
    assert_eq!(
        without_seq(&stored),
        vec![
            user("tell me slowly"),
            json!({"role": "assistant", "content": "ok: 1 messages", "refusal": null}),
        ],
        "the full reply, not just what the client read"
    );
    let records = proxy.request_records("default", "gone").await;
    assert_eq!(records[0]["status"], 200);

    // The lease was released: the session takes another turn.
    let mut next = without_seq(&stored);
    next.push(user("again"));
    let again = chat(
        &proxy.base_url(),
        "sk-a",
        &[("x-session-id", "gone")],
        &request(&next),
    )
    .await;
    assert_eq!(reply_message(&again)["content"], "ok: 3 messages");
}

/// Messages with fields no OpenAI client sends today: extras at every level, provider fields,
/// content parts, unicode and awkward numbers.
fn unusual_history() -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "Be terse. ☕", "x_meta": {"v": 2, "tags": ["a", "b"]}, "name": null, "tool_call_id": null}),
        json!({
            "role": "user",
            "content": [
                {"type": "text", "text": "Résumé of 東京 — \u{1F5FC} \"quoted\" \\ back"},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}}
            ],
            "name": "zoë",
            "annotations": [{"type": "url_citation", "url_citation": {"start_index": 0, "end_index": 5, "url": "https://example.com", "title": "Ex"}}]
        }),
        json!({
            "role": "assistant",
            "content": "Tokyo.",
            "reasoning_content": "The user asks about 東京; answer briefly…",
            "refusal": null,
            "audio": null,
            "provider_specific": {"nested": {"deep": [1, 2.5, -0.001, 12345678901234567_i64, true, null, {"k": "v"}]}},
            "tool_calls": [{
                "id": "call_x", "type": "function",
                "function": {"name": "lookup", "arguments": "{\"q\": \"東京\"}"},
                "x_call_extra": {"cached": true}
            }]
        }),
        json!({"role": "tool", "tool_call_id": "call_x", "content": "{\"ok\":true}", "x_latency_ms": 12.75}),
        json!({"role": "user", "content": "And Osaka? 🍜", "metadata": {"client": {"ver": "1.0.0-β"}}}),
    ]
}

async fn unknown_fields_survive_into_the_store_and_back_out(b: Backend) {
    let (proxy, mock) = proxy_and_mock(b.options()).await;
    let history = unusual_history();
    let hdr = [("x-session-id", "odd")];
    let answer = chat(&proxy.base_url(), "sk-a", &hdr, &request(&history)).await;
    let reply = reply_message(&answer);
    assert_eq!(
        mock.requests()[0].body_json().unwrap()["messages"],
        Value::Array(history.clone()),
        "forwarded unchanged"
    );

    let mut expected = history.clone();
    expected.push(reply);
    let stored = proxy.stored_messages("default", "odd").await;
    assert_eq!(without_seq(&stored), expected, "stored value for value");

    // Resent as the next turn, nothing is stored twice and nothing changes.
    expected.push(user("thanks"));
    let again = chat(&proxy.base_url(), "sk-a", &hdr, &request(&expected)).await;
    expected.push(reply_message(&again));
    let stored = proxy.stored_messages("default", "odd").await;
    assert_eq!(without_seq(&stored), expected);
}

/// Makes the test's store unusable under the running proxy. PostgreSQL: the database is
/// dropped `WITH (FORCE)`, which ends the proxy's connections. SQLite: an open connection keeps
/// a deleted or overwritten file usable, so the proxy's pool is closed instead (every later
/// query fails as a lost database would).
async fn take_the_store_down(b: &Backend, proxy: &Proxy) {
    match &b.database_url {
        Some(url) if b.is_postgres() => {
            use sqlx::Connection;
            let name = url
                .rsplit('/')
                .next()
                .and_then(|s| s.split('?').next())
                .unwrap()
                .to_string();
            let admin = super::common::pg::admin_url().unwrap();
            let mut conn = sqlx::PgConnection::connect(&admin).await.unwrap();
            let sql = format!("DROP DATABASE \"{name}\" WITH (FORCE)");
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&mut conn)
                .await
                .unwrap();
            let _ = conn.close().await;
        }
        _ => proxy.state.store.close().await,
    }
}

async fn store_down_is_503_store_unavailable_and_the_upstream_is_not_called(b: Backend) {
    let (proxy, mock) = proxy_and_mock(b.options()).await;
    let hdr = [("x-session-id", "down")];
    let ok = chat(&proxy.base_url(), "sk-a", &hdr, &request(&[user("hi")])).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    take_the_store_down(&b, &proxy).await;
    mock.clear_requests();
    let errors_before = proxy.store_errors_total().await;

    for (session, body) in [
        (
            "down",
            request(&[user("hi"), reply_message(&ok), user("still there?")]),
        ),
        ("fresh", request(&[user("new conversation")])),
    ] {
        let refused = chat(
            &proxy.base_url(),
            "sk-a",
            &[("x-session-id", session)],
            &body,
        )
        .await;
        assert_eq!(refused.status, 503, "{}", refused.body);
        let err = assert_openai_error(&refused.body);
        assert_eq!(err["type"], "server_error", "{}", refused.body);
        assert_eq!(err["code"], "store_unavailable", "{}", refused.body);
        assert_eq!(
            refused.session.as_deref(),
            Some(session),
            "the session named"
        );
    }
    // Without a session id, the refusal names none: the id the proxy would have generated
    // names nothing stored.
    let refused = chat(&proxy.base_url(), "sk-a", &[], &request(&[user("new")])).await;
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert_eq!(refused.session, None, "{}", refused.body);
    assert!(mock.requests().is_empty(), "the upstream was never called");
    assert!(
        proxy.store_errors_total().await >= errors_before + 2.0,
        "each refusal counts in ctxproxy_store_errors_total"
    );

    let ready = client().get(proxy.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    let health = client().get(proxy.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200, "the process still serves");
}

/// Requests still waiting on the upstream when shutdown's grace period ends are ended, not
/// dropped: a stream gets an error event (SPEC 3), a whole answer a 503, both are recorded with
/// that status, and their sessions are free at once (a dropped request kept its lease, which
/// blocked the session for 30 s after a restart).
async fn requests_still_running_when_the_grace_period_ends_are_ended_and_recorded(b: Backend) {
    let opts = ProxyOptions {
        shutdown_grace_s: 1,
        ..b.options()
    };
    let (proxy, mock) = proxy_and_mock(opts).await;
    let state = proxy.state.clone();
    let http = client();
    let mut body = request(&[user("a long answer")]);
    body["stream"] = json!(true);
    let mut streamed = http
        .post(format!("{}/chat/completions", proxy.base_url()))
        .header("x-session-id", "held-stream")
        .header("x-mock-hold-ms", "60000")
        .bearer_auth("sk-a")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(streamed.status(), 200);
    let mut text = String::from_utf8_lossy(&streamed.chunk().await.unwrap().unwrap()).into_owned();
    let whole = tokio::spawn(
        http.post(format!("{}/chat/completions", proxy.base_url()))
            .header("x-session-id", "held-whole")
            .header("x-mock-delay-ms", "60000")
            .bearer_auth("sk-a")
            .json(&request(&[user("a slow answer")]))
            .send(),
    );
    while !mock
        .requests()
        .iter()
        .any(|r| r.header("x-session-id") == Some("held-whole"))
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let shutdown = tokio::spawn(proxy.shutdown());
    while let Some(chunk) = streamed.chunk().await.unwrap() {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let events = sse_data(&text);
    let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "shutting_down", "{text}");
    let whole = whole.await.unwrap().unwrap();
    assert_eq!(whole.status(), 503);
    let err: Value = whole.json().await.unwrap();
    assert_eq!(assert_openai_error(&err)["code"], "shutting_down");
    shutdown.await.unwrap();

    for session in ["held-stream", "held-whole"] {
        let records = state.store.list_requests("default", session).await.unwrap();
        assert_eq!(records.len(), 1, "{session}");
        assert_eq!(records[0].status, 503, "{session}");
        let stored = state.store.head_branch("default", session).await.unwrap();
        assert_eq!(stored.len(), 1, "{session}: only the question");
        state
            .store
            .lock_session("default", session, Duration::from_secs(30), Duration::ZERO)
            .await
            .unwrap_or_else(|e| panic!("{session} is still held: {e}"));
    }
}

on_both_backends!(
    streamed_parallel_tool_calls_are_stored_like_the_whole_answer,
    reply_is_stored_after_the_client_hangs_up_mid_stream,
    unknown_fields_survive_into_the_store_and_back_out,
    store_down_is_503_store_unavailable_and_the_upstream_is_not_called,
    requests_still_running_when_the_grace_period_ends_are_ended_and_recorded,
);
