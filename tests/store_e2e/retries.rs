//! A retried request in server history mode: the client (the OpenAI SDKs by default) resends a
//! request that failed with the same body, its new messages only. The turn that got no reply is
//! stored once and sent upstream once; a message equal to one that was answered is a new turn.

use serde_json::{Value, json};

use super::common::*;
use super::{
    Answered, Backend, chat, reply_message, request, upstream_histories, user, without_seq,
};

const SERVER: &str = "x-ctxproxy-history";

/// Headers for a server-mode request on `session`, failing upstream with `status` if given.
fn server<'a>(session: &'a str, status: Option<&'a str>) -> Vec<(&'a str, &'a str)> {
    let mut h = vec![("x-session-id", session), (SERVER, "server")];
    if let Some(s) = status {
        h.push(("x-mock-status", s));
    }
    h
}

fn plain(messages: &[Value]) -> Value {
    json!({"model": "gpt-4o-mini", "messages": messages})
}

/// Sends `messages` in server mode; asserts the answer's status.
async fn send(proxy: &Proxy, session: &str, fail: Option<&str>, messages: &[Value]) -> Answered {
    let a = chat(
        &proxy.base_url(),
        "sk-a",
        &server(session, fail),
        &plain(messages),
    )
    .await;
    let expected: u16 = fail.map_or(200, |s| s.parse().unwrap());
    assert_eq!(a.status, expected, "{}", a.body);
    a
}

/// Role and content of each message, to compare stored messages with what was expected.
fn texts(messages: &[Value]) -> Vec<(String, String)> {
    messages
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or_default().to_string(),
                m["content"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

async fn server_mode_retry_after_429_stores_and_sends_the_turn_once(b: Backend) {
    let (proxy, mock) = proxy_and_mock(b.options()).await;
    let hello = reply_message(&send(&proxy, "s", None, &[user("hello")]).await);
    send(&proxy, "s", Some("429"), &[user("next question")]).await;
    let answer = reply_message(&send(&proxy, "s", None, &[user("next question")]).await);
    assert_eq!(answer["content"], "ok: 3 messages", "the turn went up once");

    let expected = vec![user("hello"), hello, user("next question"), answer];
    let upstream = upstream_histories(&mock);
    assert_eq!(upstream.len(), 3);
    assert_eq!(upstream[1], expected[..3], "the failed request");
    assert_eq!(
        upstream[2],
        expected[..3],
        "its retry: the same conversation"
    );
    let stored = proxy.stored_messages("default", "s").await;
    assert_eq!(without_seq(&stored), expected, "each message stored once");
    let (_, detail) = proxy.admin_get("/ctxproxy/v1/sessions/default/s").await;
    assert_eq!(detail["message_count"], 4, "{detail}");
    assert_eq!(detail["branches"].as_array().unwrap().len(), 1, "{detail}");
}

async fn repeated_question_after_a_reply_is_new_but_its_retry_is_not(b: Backend) {
    let (proxy, mock) = proxy_and_mock(b.options()).await;
    let first = reply_message(&send(&proxy, "again", None, &[user("hello")]).await);
    // The same words once more, after they were answered: a new turn, stored again.
    send(&proxy, "again", Some("500"), &[user("hello")]).await;
    let second = reply_message(&send(&proxy, "again", None, &[user("hello")]).await);
    assert_eq!(second["content"], "ok: 3 messages");
    let stored = proxy.stored_messages("default", "again").await;
    assert_eq!(
        without_seq(&stored),
        [user("hello"), first.clone(), user("hello"), second],
    );
    let upstream = upstream_histories(&mock);
    assert_eq!(upstream[2], [user("hello"), first, user("hello")]);
}

async fn retry_of_the_first_turn_with_its_system_message_is_recognised(b: Backend) {
    let (proxy, mock) = proxy_and_mock(b.options()).await;
    let system = json!({"role": "system", "content": "Be brief."});
    let turn = [system.clone(), user("hello")];
    send(&proxy, "first", Some("503"), &turn).await;
    let answer = reply_message(&send(&proxy, "first", None, &turn).await);
    assert_eq!(answer["content"], "ok: 2 messages");
    // Without its system message it is the same turn too (the stored one is sent).
    send(&proxy, "other", Some("429"), &turn).await;
    let other = reply_message(&send(&proxy, "other", None, &[user("hello")]).await);
    assert_eq!(other["content"], "ok: 2 messages");

    for (session, answer) in [("first", answer), ("other", other)] {
        let stored = proxy.stored_messages("default", session).await;
        assert_eq!(
            without_seq(&stored),
            [system.clone(), user("hello"), answer],
            "{session}"
        );
    }
    let upstream = upstream_histories(&mock);
    assert!(
        upstream.iter().all(|h| h[..] == turn[..]),
        "every request sent the turn once: {upstream:?}"
    );
}

async fn retry_of_tool_results_after_a_tool_call_is_recognised(b: Backend) {
    let (proxy, mock) = proxy_and_mock(b.options()).await;
    let ask = user(r#"call get_weather {"city": "Oslo"}"#);
    let call = reply_message(
        &chat(
            &proxy.base_url(),
            "sk-a",
            &server("tools", None),
            &request(std::slice::from_ref(&ask)),
        )
        .await,
    );
    let call_id = call["tool_calls"][0]["id"].clone();
    assert!(call_id.is_string(), "{call}");
    let result = json!({"role": "tool", "tool_call_id": call_id, "content": "{\"temp_c\": 4}"});
    for fail in [Some("429"), None] {
        let a = chat(
            &proxy.base_url(),
            "sk-a",
            &server("tools", fail),
            &request(std::slice::from_ref(&result)),
        )
        .await;
        assert_eq!(
            a.status,
            if fail.is_some() { 429 } else { 200 },
            "{}",
            a.body
        );
    }
    let stored = without_seq(&proxy.stored_messages("default", "tools").await);
    assert_eq!(stored.len(), 4, "{stored:?}");
    assert_eq!(stored[..3], [ask.clone(), call.clone(), result.clone()]);
    assert_eq!(stored[3]["content"], "ok: 3 messages");
    let upstream = upstream_histories(&mock);
    assert_eq!(
        upstream[2],
        [ask, call, result],
        "the tool result went once"
    );
}

async fn two_retries_in_a_row_leave_one_turn_and_records_on_its_head(b: Backend) {
    let (proxy, mock) = proxy_and_mock(b.options()).await;
    let hello = reply_message(&send(&proxy, "twice", None, &[user("hello")]).await);
    send(&proxy, "twice", Some("429"), &[user("next question")]).await;
    send(&proxy, "twice", Some("502"), &[user("next question")]).await;
    let answer = reply_message(&send(&proxy, "twice", None, &[user("next question")]).await);
    assert_eq!(answer["content"], "ok: 3 messages");

    let expected = vec![user("hello"), hello, user("next question"), answer];
    let upstream = upstream_histories(&mock);
    assert_eq!(upstream.len(), 4);
    for h in &upstream[1..] {
        assert_eq!(h[..], expected[..3]);
    }
    let store = proxy.store().await;
    let branch = store.head_branch("default", "twice").await.unwrap();
    let bodies: Vec<Value> = branch.iter().map(|m| m.body.clone()).collect();
    assert_eq!(bodies, expected);
    assert_eq!(
        branch[3].parent,
        Some(branch[2].id),
        "the reply answers the turn"
    );

    // Each failure is recorded ending on the stored turn, the success on its reply.
    proxy.wait_for_records("default", "twice", 4).await;
    let records = store.list_requests("default", "twice").await.unwrap();
    let heads: Vec<_> = records.iter().map(|r| (r.status, r.head)).collect();
    assert_eq!(
        heads,
        [
            (200, Some(branch[1].id)),
            (429, Some(branch[2].id)),
            (502, Some(branch[2].id)),
            (200, Some(branch[3].id)),
        ]
    );
}

async fn preview_of_a_retry_shows_the_turn_once(b: Backend) {
    let (proxy, _mock) = proxy_and_mock(b.options()).await;
    let hello = reply_message(&send(&proxy, "peek", None, &[user("hello")]).await);
    send(&proxy, "peek", Some("429"), &[user("next question")]).await;
    let resp = client()
        .post(proxy.url("/ctxproxy/v1/preview/chat/completions"))
        .bearer_auth("sk-a")
        .header("x-session-id", "peek")
        .header(SERVER, "server")
        .json(&plain(&[user("next question")]))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(
        texts(v["messages"].as_array().unwrap()),
        texts(&[user("hello"), hello, user("next question")])
    );
    let stored = proxy.stored_messages("default", "peek").await;
    assert_eq!(stored.len(), 3, "a preview stores nothing");
}

async fn responses_retry_in_server_mode_is_recognised(b: Backend) {
    let (proxy, mock) = proxy_and_mock(b.options()).await;
    let item = |text: &str| json!({"role": "user", "content": text});
    let post = |text: &'static str, fail: Option<&'static str>| {
        let mut req = client()
            .post(format!("{}/responses", proxy.base_url()))
            .bearer_auth("sk-a")
            .header("x-session-id", "items")
            .header(SERVER, "server")
            .json(&json!({"model": "gpt-4o-mini", "input": [item(text)]}));
        if let Some(s) = fail {
            req = req.header("x-mock-status", s);
        }
        async move { req.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(post("hello", None).await, 200);
    assert_eq!(post("next question", Some("429")).await, 429);
    assert_eq!(post("next question", None).await, 200);

    let inputs: Vec<usize> = mock
        .requests()
        .iter()
        .map(|r| r.body_json().unwrap()["input"].as_array().unwrap().len())
        .collect();
    assert_eq!(inputs, [1, 3, 3], "the retry sent the turn once");
    let stored = without_seq(&proxy.stored_messages("default", "items").await);
    assert_eq!(stored.len(), 4, "{stored:?}");
    assert_eq!(stored[2], item("next question"));
    assert_eq!(stored[3]["role"], "assistant");
}

on_both_backends!(
    server_mode_retry_after_429_stores_and_sends_the_turn_once,
    repeated_question_after_a_reply_is_new_but_its_retry_is_not,
    retry_of_the_first_turn_with_its_system_message_is_recognised,
    retry_of_tool_results_after_a_tool_call_is_recognised,
    two_retries_in_a_row_leave_one_turn_and_records_on_its_head,
    preview_of_a_retry_shows_the_turn_once,
    responses_retry_in_server_mode_is_recognised,
);
