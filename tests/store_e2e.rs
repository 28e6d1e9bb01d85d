//! End-to-end tests of the conversation store (SPEC 4) through the real HTTP proxy: what a
//! tool-using agent leaves in the store in client and server history modes, auto session
//! matching, tenant isolation and branches. Every behaviour is one async fn taking a
//! [`Backend`], run twice by `on_both_backends!`: on a fresh SQLite file and on a fresh
//! PostgreSQL database (`CTXPROXY_TEST_PG_URL`; skipped when unset unless `CI=true`).
//! More behaviours live in `store_e2e/` (sessions and tenants, replies and failures,
//! retried server-mode requests, concurrency, the admin API).

mod common;

use common::pg::PgTestDb;
use common::*;
use serde_json::{Value, json};

/// The database a test's proxies use.
pub struct Backend {
    /// `None`: each proxy gets its own fresh SQLite file (the harness default).
    pub database_url: Option<String>,
    pg: Option<PgTestDb>,
}

impl Backend {
    pub async fn sqlite() -> Option<Backend> {
        Some(Backend {
            database_url: None,
            pg: None,
        })
    }

    pub async fn postgres() -> Option<Backend> {
        let db = PgTestDb::create().await?;
        Some(Backend {
            database_url: Some(db.url.clone()),
            pg: Some(db),
        })
    }

    pub fn is_postgres(&self) -> bool {
        self.pg.is_some()
    }

    /// The harness defaults on this backend.
    pub fn options(&self) -> ProxyOptions {
        ProxyOptions {
            database_url: self.database_url.clone(),
            ..ProxyOptions::default()
        }
    }
}

/// Runs each listed `async fn(Backend)` of the enclosing module once per backend, as
/// `sqlite::<name>` and `postgres::<name>`.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some(b) = $crate::Backend::sqlite().await {
                        super::$name(b).await;
                    }
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some(b) = $crate::Backend::postgres().await {
                        super::$name(b).await;
                    }
                }
            )*
        }
    };
}

#[path = "store_e2e/admin.rs"]
mod admin;
#[path = "store_e2e/concurrency.rs"]
mod concurrency;
#[path = "store_e2e/odd_strings.rs"]
mod odd_strings;
#[path = "store_e2e/replies.rs"]
mod replies;
#[path = "store_e2e/retries.rs"]
mod retries;
#[path = "store_e2e/server_mode.rs"]
mod server_mode;
#[path = "store_e2e/sessions.rs"]
mod sessions;

/// What a chat call answered.
pub struct Answered {
    pub status: u16,
    pub session: Option<String>,
    pub body: Value,
}

/// POSTs a chat completion to `base` (a `/v1` URL) with bearer `key` and extra headers.
pub async fn chat(base: &str, key: &str, headers: &[(&str, &str)], body: &Value) -> Answered {
    let mut req = client()
        .post(format!("{base}/chat/completions"))
        .bearer_auth(key)
        .json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let session = resp
        .headers()
        .get("x-ctxproxy-session")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = resp.json().await.unwrap_or(Value::Null);
    Answered {
        status,
        session,
        body,
    }
}

/// The assistant message of a (non-streamed) chat answer.
pub fn reply_message(a: &Answered) -> Value {
    assert_eq!(a.status, 200, "{}", a.body);
    a.body["choices"][0]["message"].clone()
}

/// Stored messages without their `seq`, after checking the seqs strictly increase.
pub fn without_seq(stored: &[Value]) -> Vec<Value> {
    let seqs: Vec<i64> = stored.iter().map(|m| m["seq"].as_i64().unwrap()).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "seqs in order: {seqs:?}"
    );
    stored
        .iter()
        .map(|m| {
            let mut m = m.clone();
            m.as_object_mut().unwrap().remove("seq");
            m
        })
        .collect()
}

/// The `messages` arrays the mock received, oldest request first.
pub fn upstream_histories(mock: &ctxproxy::mock_upstream::MockHandle) -> Vec<Vec<Value>> {
    mock.requests()
        .iter()
        .filter(|r| r.path.ends_with("/chat/completions"))
        .map(|r| {
            r.body_json().unwrap()["messages"]
                .as_array()
                .cloned()
                .unwrap()
        })
        .collect()
}

pub fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

fn tool_result(call: &Value, i: usize) -> Value {
    json!({
        "role": "tool",
        "tool_call_id": call["tool_calls"][0]["id"],
        "content": format!("{{\"temp_c\": {i}, \"sky\": \"clear\"}}")
    })
}

fn weather_call(i: usize) -> String {
    format!("call get_weather {{\"city\": \"City {i}\"}}")
}

const TOOLS: &str = r#"[{"type": "function", "function": {"name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]"#;

pub fn request(messages: &[Value]) -> Value {
    json!({
        "model": "gpt-4o-mini",
        "messages": messages,
        "tools": serde_json::from_str::<Value>(TOOLS).unwrap(),
    })
}

async fn ten_tool_turns_in_client_mode_store_every_message_once_in_order(b: Backend) {
    let (proxy, mock) = proxy_and_mock(b.options()).await;
    let base = proxy.base_url();
    let hdr = [("x-session-id", "agent-client")];
    let mut history = vec![json!({"role": "system", "content": "You are a weather agent."})];
    for i in 0..10 {
        history.push(user(&weather_call(i)));
        let call = reply_message(&chat(&base, "sk-a", &hdr, &request(&history)).await);
        assert_eq!(call["tool_calls"][0]["function"]["name"], "get_weather");
        history.push(call.clone());
        history.push(tool_result(&call, i));
        let text = reply_message(&chat(&base, "sk-a", &hdr, &request(&history)).await);
        assert_eq!(
            text["content"],
            format!("ok: {} messages", history.len()),
            "the upstream got the whole history"
        );
        history.push(text);
    }
    assert_eq!(history.len(), 41);
    let upstream = upstream_histories(&mock);
    assert_eq!(upstream.len(), 20);
    assert_eq!(
        upstream[19],
        history[..40],
        "the last request resent everything"
    );
    let stored = proxy.stored_messages("default", "agent-client").await;
    assert_eq!(
        without_seq(&stored),
        history,
        "every message once, in order, replies exactly as produced"
    );
    let (status, detail) = proxy
        .admin_get("/ctxproxy/v1/sessions/default/agent-client")
        .await;
    assert_eq!(status, 200, "{detail}");
    assert_eq!(
        detail["message_count"], 41,
        "no duplicates anywhere: {detail}"
    );
    assert_eq!(detail["branches"].as_array().unwrap().len(), 1, "{detail}");
    proxy.wait_for_records("default", "agent-client", 20).await;
    assert_eq!(
        proxy.request_records("default", "agent-client").await.len(),
        20
    );
}

async fn ten_tool_turns_in_server_mode_send_the_full_history_upstream(b: Backend) {
    let opts = b.options().only_tenant(
        "default",
        "keys: any\nupstream:\n  base_url: {upstream}\nsession:\n  history: server\n",
    );
    let (proxy, mock) = proxy_and_mock(opts).await;
    let base = proxy.base_url();
    let hdr = [("x-session-id", "agent-server")];
    // What the conversation is; the client itself only ever sends the new messages.
    let mut history = vec![json!({"role": "system", "content": "You are a weather agent."})];
    let mut sent_counts = Vec::new();
    for i in 0..10 {
        let mut new = if i == 0 { history.clone() } else { Vec::new() };
        new.push(user(&weather_call(i)));
        history.push(user(&weather_call(i)));
        sent_counts.push(new.len());
        let call = reply_message(&chat(&base, "sk-a", &hdr, &request(&new)).await);
        history.push(call.clone());
        history.push(tool_result(&call, i));
        sent_counts.push(1);
        let text =
            reply_message(&chat(&base, "sk-a", &hdr, &request(&[tool_result(&call, i)])).await);
        history.push(text);
    }
    assert!(
        sent_counts[1..].iter().all(|&n| n == 1),
        "one message a turn"
    );
    let upstream = upstream_histories(&mock);
    assert_eq!(upstream.len(), 20);
    // Request k got everything before its reply: the stored history plus what was new.
    // Request 2i sends user i (history so far: 4i + 2), request 2i + 1 its tool result (4i + 4).
    for (k, got) in upstream.iter().enumerate() {
        assert_eq!(
            got.as_slice(),
            &history[..2 * k + 2],
            "upstream request {k} carried the full history"
        );
    }
    let stored = proxy.stored_messages("default", "agent-server").await;
    assert_eq!(without_seq(&stored), history);
    assert_eq!(stored.len(), 41);
}

/// Numbers go upstream and into the store exactly as the client wrote them, also where they do
/// not fit 64 bits (an id of 30 digits, a decimal of 25 digits): a proxy that rounded them would
/// change what the client said (SPEC 4.2: "exactly as received"). An exponent beyond f64 is
/// valid JSON and goes through (written `1e+400`: the same number) instead of being refused.
async fn numbers_are_kept_exactly_as_written(b: Backend) {
    let (proxy, mock) = proxy_and_mock(b.options()).await;
    let numbers = r#""x_big":123456789012345678901234567890,"x_exact":0.1000000000000000000000001,"x_neg":-0.0"#;
    let cases = [("chat/completions", "messages"), ("responses", "input")];
    for (i, (path, field)) in cases.into_iter().enumerate() {
        let body = format!(
            r#"{{"model":"m","top_big":98765432109876543210987654321,"{field}":[{{"role":"user","content":"hi",{numbers},"x_exp":1e400}}]}}"#
        );
        let resp = client()
            .post(format!("{}/{path}", proxy.base_url()))
            .header("content-type", "application/json")
            .header("x-session-id", format!("numbers-{i}"))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        let raw = String::from_utf8_lossy(&mock.requests()[i].body).into_owned();
        assert!(raw.contains(numbers), "{path}: {raw}");
        assert!(raw.contains("98765432109876543210987654321"), "{raw}");
        assert!(raw.contains(r#""x_exp":1e+400"#), "{raw}");
        let stored = proxy
            .stored_messages("default", &format!("numbers-{i}"))
            .await;
        let stored = serde_json::to_string(&stored[0]).unwrap();
        assert!(stored.contains(numbers), "{path}: {stored}");
    }
}

on_both_backends!(
    numbers_are_kept_exactly_as_written,
    ten_tool_turns_in_client_mode_store_every_message_once_in_order,
    ten_tool_turns_in_server_mode_send_the_full_history_upstream,
);
