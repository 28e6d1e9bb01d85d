//! End-to-end tests of the conversation store (SPEC 4) through the real HTTP proxy: what a
//! tool-using agent leaves in the store in client and server history modes, auto session
//! matching, tenant isolation and branches. Every behaviour is one async fn taking a
//! [`Backend`], run twice by `on_both_backends!`: on a fresh SQLite file and on a fresh
//! PostgreSQL database (`CTXPROXY_TEST_PG_URL`; skipped when unset unless `CI=true`).
//! More behaviours live in `store_e2e/` (replies, failures, concurrency).

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

#[path = "store_e2e/concurrency.rs"]
mod concurrency;
#[path = "store_e2e/replies.rs"]
mod replies;

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

fn user(text: &str) -> Value {
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

fn request(messages: &[Value]) -> Value {
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

async fn auto_mode_separates_conversations_and_finds_a_continued_one(b: Backend) {
    let (proxy, _mock) = proxy_and_mock(b.options()).await;
    let base = proxy.base_url();
    let trip = vec![user("Plan a trip to Kyoto")];
    let poem = vec![user("Write a poem about rain")];
    let first = chat(&base, "sk-a", &[], &request(&trip)).await;
    let other = chat(&base, "sk-a", &[], &request(&poem)).await;
    let (s_trip, s_poem) = (
        first.session.clone().unwrap(),
        other.session.clone().unwrap(),
    );
    assert_ne!(s_trip, s_poem, "two conversations, two sessions");

    let mut continued = trip.clone();
    continued.push(reply_message(&first));
    continued.push(user("And where should I stay?"));
    let again = chat(&base, "sk-a", &[], &request(&continued)).await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(
        again.session.as_deref(),
        Some(s_trip.as_str()),
        "found without a header"
    );
    continued.push(reply_message(&again));
    let stored = proxy.stored_messages("default", &s_trip).await;
    assert_eq!(without_seq(&stored), continued);
    let stored = proxy.stored_messages("default", &s_poem).await;
    assert_eq!(stored.len(), 2, "the other conversation is untouched");
}

const ACME_KEY: &str = "sk-proxy-acme-store-e2e";
const ACME_UPSTREAM_ENV: &str = "CTXPROXY_STORE_E2E_ACME_KEY";

fn two_tenants(b: &Backend) -> ProxyOptions {
    use sha2::Digest;
    let hash = hex::encode(sha2::Sha256::digest(ACME_KEY.as_bytes()));
    // SAFETY: set before the proxy starts, to the same value by every test that reads it.
    unsafe { std::env::set_var(ACME_UPSTREAM_ENV, "sk-upstream-acme") };
    b.options()
        .only_tenant("open", "keys: any\nupstream:\n  base_url: {upstream}\n")
        .tenant(
            "acme",
            &format!(
                "keys:\n  - sha256: {hash}\nupstream:\n  base_url: {{upstream}}\n  api_key_env: {ACME_UPSTREAM_ENV}\n"
            ),
        )
}

async fn tenants_sharing_a_session_id_never_see_each_other(b: Backend) {
    let (proxy, mock) = proxy_and_mock(two_tenants(&b)).await;
    let base = proxy.base_url();
    let server = [("x-session-id", "shared"), ("x-ctxproxy-history", "server")];
    let open1 = chat(
        &base,
        "sk-anyone",
        &server,
        &request(&[user("open secret")]),
    )
    .await;
    let acme1 = chat(&base, ACME_KEY, &server, &request(&[user("acme secret")])).await;
    assert_eq!(open1.session.as_deref(), Some("shared"));
    assert_eq!(acme1.session.as_deref(), Some("shared"));
    mock.clear_requests();
    let acme2 = chat(&base, ACME_KEY, &server, &request(&[user("acme again")])).await;
    let open2 = chat(&base, "sk-anyone", &server, &request(&[user("open again")])).await;

    let upstream = upstream_histories(&mock);
    let texts = |h: &Vec<Value>| -> Vec<String> {
        h.iter()
            .map(|m| m["content"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    assert_eq!(
        texts(&upstream[0]),
        ["acme secret", "ok: 1 messages", "acme again"],
        "acme's server-mode history is acme's only"
    );
    assert_eq!(
        texts(&upstream[1]),
        ["open secret", "ok: 1 messages", "open again"]
    );
    let requests = mock.requests();
    assert_eq!(
        requests[0].header("authorization"),
        Some("Bearer sk-upstream-acme")
    );
    assert_eq!(
        requests[1].header("authorization"),
        Some("Bearer sk-anyone")
    );

    let acme = proxy.stored_messages("acme", "shared").await;
    let open = proxy.stored_messages("open", "shared").await;
    let mut expect_acme = vec![user("acme secret"), reply_message(&acme1)];
    expect_acme.extend([user("acme again"), reply_message(&acme2)]);
    let mut expect_open = vec![user("open secret"), reply_message(&open1)];
    expect_open.extend([user("open again"), reply_message(&open2)]);
    assert_eq!(without_seq(&acme), expect_acme);
    assert_eq!(without_seq(&open), expect_open);
    let (status, _) = proxy.admin_get("/ctxproxy/v1/sessions/acme/nope").await;
    assert_eq!(status, 404);
}

async fn edited_turn_makes_a_branch_and_both_stay_retrievable(b: Backend) {
    let (proxy, _mock) = proxy_and_mock(b.options()).await;
    let base = proxy.base_url();
    let hdr = [("x-session-id", "branchy")];
    let mut convo = vec![user("Name a colour")];
    let a1 = reply_message(&chat(&base, "sk-a", &hdr, &request(&convo)).await);
    convo.extend([a1, user("Name a fruit")]);
    let a2 = reply_message(&chat(&base, "sk-a", &hdr, &request(&convo)).await);
    let mut original = convo.clone();
    original.push(a2);

    let mut edited = convo[..2].to_vec();
    edited.push(user("Name a vegetable instead"));
    let a2b = reply_message(&chat(&base, "sk-a", &hdr, &request(&edited)).await);
    edited.push(a2b);

    let (status, detail) = proxy
        .admin_get("/ctxproxy/v1/sessions/default/branchy")
        .await;
    assert_eq!(status, 200, "{detail}");
    assert_eq!(detail["message_count"], 6, "nothing deleted: {detail}");
    let branches = detail["branches"].as_array().unwrap().clone();
    assert_eq!(branches.len(), 2, "{detail}");
    let heads: Vec<&Value> = branches.iter().filter(|b| b["head"] == true).collect();
    assert_eq!(heads.len(), 1, "{detail}");
    for branch in &branches {
        assert_eq!(branch["messages"], 4, "{detail}");
        let id = branch["id"].as_str().unwrap();
        let (status, msgs) = proxy
            .admin_get(&format!(
                "/ctxproxy/v1/sessions/default/branchy/messages?branch={id}"
            ))
            .await;
        assert_eq!(status, 200, "{msgs}");
        let msgs = without_seq(msgs.as_array().unwrap());
        let expected = if branch["head"] == true {
            &edited
        } else {
            &original
        };
        assert_eq!(&msgs, expected);
    }
    let head = proxy.stored_messages("default", "branchy").await;
    assert_eq!(
        without_seq(&head),
        edited,
        "the branch last written is the head"
    );
}

on_both_backends!(
    ten_tool_turns_in_client_mode_store_every_message_once_in_order,
    ten_tool_turns_in_server_mode_send_the_full_history_upstream,
    auto_mode_separates_conversations_and_finds_a_continued_one,
    tenants_sharing_a_session_id_never_see_each_other,
    edited_turn_makes_a_branch_and_both_stay_retrievable,
);
