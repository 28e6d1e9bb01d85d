//! End-to-end: rolling summaries (SPEC 5 step 5, 5.2) through a real proxy and the mock
//! upstream, whose script answers the summariser's requests. Jobs run after the answer, so the
//! tests wait (bounded) for them instead of sleeping fixed times.

mod common;

use std::time::{Duration, Instant};

use common::*;
use ctxproxy::conversation::Message;
use ctxproxy::mock_upstream::{MockHandle, RecordedRequest, ScriptEntry};
use ctxproxy::summarize::request::MARKER;
use ctxproxy::tokens::{Encoding, TokenCounter};
use serde_json::{Value, json};

const SESSION: &str = "sum-1";
const BUDGET: u64 = 2500;
const PREFIX: &str = "Summary of the earlier conversation:\n";

fn tenant(blocking: bool) -> String {
    format!(
        "keys: any\nupstream:\n  base_url: {{upstream}}\npolicy:\n  summary: {{ model: summariser-1, \
         trigger_tokens: 2000, target_tokens: 1200, min_messages: 10, blocking: {blocking} }}\n  \
         token_budget: {{ max_tokens: {BUDGET} }}\n"
    )
}

fn opts(blocking: bool) -> ProxyOptions {
    ProxyOptions::default().only_tenant("default", &tenant(blocking))
}

/// A user message of about 100 tokens, recognisable by its number.
fn user(n: usize) -> Value {
    json!({"role": "user", "content": format!("q{n:03} {}", "lorem ipsum dolor ".repeat(22))})
}

fn system() -> Value {
    json!({"role": "system", "content": "You are a test assistant."})
}

fn script(mock: &MockHandle, status: u16, content: &str) {
    mock.set_script(vec![ScriptEntry {
        matches: MARKER.into(),
        status,
        content: content.into(),
    }]);
}

fn is_summary_request(r: &RecordedRequest) -> bool {
    String::from_utf8_lossy(&r.body).contains(MARKER)
}

/// The summariser's input: the user message of a summary request.
fn summary_input(r: &RecordedRequest) -> String {
    r.body_json().unwrap()["messages"][1]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Sends one chat turn; returns the reply message and the tokens the proxy says it sent.
async fn turn(proxy: &Proxy, session: &str, history: &[Value]) -> (Value, u64) {
    let resp = client()
        .post(format!("{}/chat/completions", proxy.base_url()))
        .bearer_auth("sk-client")
        .header("x-session-id", session)
        .json(&json!({"model": "test-model", "messages": history}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "a user request never fails");
    let out: u64 = resp.headers()["x-ctxproxy-tokens-out"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let v: Value = resp.json().await.unwrap();
    (v["choices"][0]["message"].clone(), out)
}

/// Waits (at most 10 s) until no summary job runs in `proxy`.
async fn settle(proxy: &Proxy) {
    // The reply is written after the answer went out, and its summary job starts after that.
    proxy.state.pending.settle_all().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while proxy.state.summaries.running() > 0 {
        assert!(Instant::now() < deadline, "summary job still running");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A counter's value from the proxy's `/metrics` (0 when absent). The registry is per test
/// process, so other tests' jobs may add to it: assert lower bounds only.
async fn counter(proxy: &Proxy, series: &str) -> f64 {
    let text = proxy.metrics_text().await;
    text.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Tokens of a request the mock received, counted independently of the proxy's report.
fn sent_tokens(r: &RecordedRequest) -> u64 {
    let msgs: Vec<Message> =
        serde_json::from_value(r.body_json().unwrap()["messages"].clone()).unwrap();
    TokenCounter::new().request(Encoding::Approximate, &msgs, None, None)
}

#[tokio::test]
async fn sixty_turns_roll_summaries_forward_and_stay_in_budget() {
    let (proxy, mock) = proxy_and_mock(opts(false)).await;
    let store = proxy.state.store.clone();
    script(&mock, 200, "SUMMARY-1 facts");
    let mut history = vec![system()];
    for n in 1..=60 {
        history.push(user(n));
        let (reply, out) = turn(&proxy, SESSION, &history).await;
        assert!(out <= BUDGET, "turn {n} sent {out} tokens");
        history.push(reply);
        settle(&proxy).await;
        // Each summary gets its own text, so the rolling input can be checked.
        let made = store
            .list_summaries("default", SESSION)
            .await
            .unwrap()
            .len();
        script(&mock, 200, &format!("SUMMARY-{} facts", made + 1));
    }

    let summaries = store.list_summaries("default", SESSION).await.unwrap();
    assert!(summaries.len() >= 2, "{} summaries", summaries.len());
    let seen = mock.requests();
    let asked: Vec<&RecordedRequest> = seen.iter().filter(|r| is_summary_request(r)).collect();
    assert_eq!(
        asked.len(),
        summaries.len(),
        "one summariser call per summary"
    );
    for (k, s) in summaries.iter().enumerate() {
        assert_eq!(s.text, format!("SUMMARY-{} facts", k + 1));
        assert_eq!(s.model.as_deref(), Some("summariser-1"));
        assert!(s.token_count > 0);
    }
    let body = asked[0].body_json().unwrap();
    assert_eq!(body["model"], "summariser-1");
    assert_eq!(asked[0].header("authorization"), Some("Bearer sk-client"));
    // Its answer is read, so it is asked for uncompressed.
    assert_eq!(asked[0].header("accept-encoding"), Some("identity"));

    // The second summary rolls the first forward: its input is the first summary plus only the
    // messages after what the first covers.
    let stored = store.head_branch("default", SESSION).await.unwrap();
    assert_eq!(stored.len(), 121, "every message is kept in the store");
    let input = summary_input(asked[1]);
    assert!(
        input.contains("Previous summary:\nSUMMARY-1 facts"),
        "{input}"
    );
    for m in stored.iter().filter(|m| m.body["role"] == "user") {
        let tag = &m.body["content"].as_str().unwrap()[..4];
        let expected = m.seq > summaries[0].covers_until && m.seq <= summaries[1].covers_until;
        assert_eq!(input.contains(tag), expected, "{tag} at seq {}", m.seq);
    }

    // Requests after a summary carry the newest one right after the system message; the
    // messages it covers are gone from them; nothing ever exceeds the budget.
    let mut made = 0;
    for r in &seen {
        if is_summary_request(r) {
            made += 1;
            continue;
        }
        assert!(sent_tokens(r) <= BUDGET);
        let msgs = r.body_json().unwrap()["messages"].clone();
        assert_eq!(msgs[0], system());
        if made == 0 {
            assert_ne!(msgs[1]["role"], "system");
            continue;
        }
        let text = format!("{PREFIX}SUMMARY-{made} facts");
        assert_eq!(msgs[1], json!({"role": "system", "content": text}));
        let covered = summaries[made - 1].covers_until;
        let sent = serde_json::to_string(&msgs).unwrap();
        for m in stored.iter().filter(|m| m.seq <= covered) {
            if m.body["role"] == "user" {
                let tag = &m.body["content"].as_str().unwrap()[..4];
                assert!(!sent.contains(tag), "{tag} is covered but was sent");
            }
        }
    }

    // The admin session route shows the newest summary of the head branch.
    let (status, detail) = proxy
        .admin_get(&format!("/ctxproxy/v1/sessions/default/{SESSION}"))
        .await;
    assert_eq!(status, 200, "{detail}");
    let newest = summaries.last().unwrap();
    assert_eq!(detail["summary"]["text"], newest.text);
    assert_eq!(detail["summary"]["covers_until"], newest.covers_until);

    // Every request record reports whether a summary was used and up to which seq.
    let records = store.list_requests("default", SESSION).await.unwrap();
    assert_eq!(records.len(), 60);
    let first = &records[0].report.as_ref().unwrap()["summary"];
    assert_eq!(first, &json!({"used": false, "covers_until": null}));
    let last = &records[59].report.as_ref().unwrap()["summary"];
    assert_eq!(last["used"], true);
    assert_eq!(
        last["covers_until"],
        json!(summaries.last().unwrap().covers_until)
    );
}

/// Sends chat turns (user messages 1, 2, ...) until the proxy has asked for a summary; returns
/// the conversation so far (replies included) and the number of the last user message.
async fn turns_until_summarised(proxy: &Proxy, mock: &MockHandle) -> (Vec<Value>, usize) {
    let mut history = vec![system()];
    let mut n = 0;
    while mock.requests().iter().all(|r| !is_summary_request(r)) {
        n += 1;
        assert!(n <= 40, "the trigger was never crossed");
        history.push(user(n));
        let (reply, _) = turn(proxy, SESSION, &history).await;
        history.push(reply);
    }
    (history, n)
}

#[tokio::test]
async fn blocking_summary_is_applied_to_the_request_that_crosses_the_trigger() {
    let (proxy, mock) = proxy_and_mock(opts(true)).await;
    script(&mock, 200, "BLOCKING facts");
    turns_until_summarised(&proxy, &mock).await;
    let seen = mock.requests();
    let last = seen.last().unwrap();
    assert!(
        is_summary_request(&seen[seen.len() - 2]),
        "summarised first"
    );
    let msgs = last.body_json().unwrap()["messages"].clone();
    assert_eq!(msgs[1]["content"], format!("{PREFIX}BLOCKING facts"));
    assert_eq!(proxy.state.summaries.running(), 0);
}

#[tokio::test]
async fn preview_with_a_session_uses_its_stored_summary_as_the_real_call_does() {
    let (proxy, mock) = proxy_and_mock(opts(true)).await;
    script(&mock, 200, "PREVIEW facts");
    let (mut history, n) = turns_until_summarised(&proxy, &mock).await;
    settle(&proxy).await;
    // The next turn's message is not stored yet: the preview must still find the summary.
    history.push(user(n + 1));
    let preview: Value = client()
        .post(proxy.url("/ctxproxy/v1/preview/chat/completions"))
        .bearer_auth("sk-client")
        .header("x-session-id", SESSION)
        .json(&json!({"model": "test-model", "messages": history}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(preview["report"]["summary"]["used"], true, "{preview}");
    assert!(preview["report"]["summary"]["covers_until"].is_u64());
    assert_eq!(
        preview["messages"][1]["content"],
        format!("{PREFIX}PREVIEW facts")
    );
    let sent_before = mock.requests().len();
    turn(&proxy, SESSION, &history).await;
    let real = mock.requests()[sent_before..]
        .iter()
        .rfind(|r| !is_summary_request(r))
        .unwrap()
        .body_json()
        .unwrap();
    assert_eq!(
        preview["messages"], real["messages"],
        "the dry run is the real call"
    );
}

/// Sends one Responses turn (user message `n`, chained to `previous`); returns the response
/// id and the session.
async fn respond(proxy: &Proxy, previous: Option<&str>, n: usize) -> (String, String) {
    let mut body = json!({
        "model": "test-model",
        "instructions": "You are a test assistant.",
        "input": [{"role": "user", "content": user(n)["content"]}],
    });
    if let Some(id) = previous {
        body["previous_response_id"] = json!(id);
    }
    let resp = client()
        .post(format!("{}/responses", proxy.base_url()))
        .bearer_auth("sk-client")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "a user request never fails");
    let session = resp.headers()["x-ctxproxy-session"]
        .to_str()
        .unwrap()
        .to_string();
    let v: Value = resp.json().await.unwrap();
    (v["id"].as_str().unwrap().to_string(), session)
}

/// The `/v1/responses` requests the mock received, oldest first.
fn responses_requests(mock: &MockHandle) -> Vec<Value> {
    mock.requests()
        .iter()
        .filter(|r| r.path.ends_with("/responses"))
        .map(|r| r.body_json().unwrap())
        .collect()
}

/// A Responses conversation chained by `previous_response_id` gets rolling summaries like a
/// chat one (SPEC 5 step 5 applies to both APIs): the summary goes first among the input items,
/// the covered items are no longer sent, `instructions` stays, and the request record says so.
#[tokio::test]
async fn responses_conversations_are_summarised_too() {
    let (proxy, mock) = proxy_and_mock(opts(false)).await;
    script(&mock, 200, "RESPONSES facts");
    let mut previous: Option<String> = None;
    let mut session = String::new();
    let mut n = 0;
    while mock.requests().iter().all(|r| !is_summary_request(r)) {
        n += 1;
        assert!(n <= 40, "the trigger was never crossed");
        let (id, s) = respond(&proxy, previous.as_deref(), n).await;
        previous = Some(id);
        session = s;
    }
    settle(&proxy).await;
    let summary_request = mock
        .requests()
        .into_iter()
        .find(is_summary_request)
        .unwrap();
    let input = summary_input(&summary_request);
    assert!(input.contains("q001"), "the oldest turn is summarised");
    assert!(
        !input.contains("You are a test assistant."),
        "instructions are not summarised"
    );

    n += 1;
    respond(&proxy, previous.as_deref(), n).await;
    let sent = responses_requests(&mock).pop().unwrap();
    assert_eq!(sent["instructions"], "You are a test assistant.");
    let items = sent["input"].as_array().unwrap();
    assert_eq!(
        items[0],
        json!({"role": "system", "content": format!("{PREFIX}RESPONSES facts")})
    );
    let text = sent["input"].to_string();
    assert!(!text.contains("q001"), "covered items are not sent again");
    assert!(
        text.contains(&format!("q{n:03}")),
        "the current turn is sent"
    );

    let records = proxy.request_records("default", &session).await;
    let report = &records.last().unwrap()["report"];
    assert_eq!(report["summary"]["used"], true, "{report}");
    assert!(report["summary"]["covers_until"].is_u64(), "{report}");
    assert!(
        report["removed"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["reason"] == "summary"),
        "{report}"
    );
}

#[tokio::test]
async fn blocking_summary_applies_to_a_responses_request_too() {
    let (proxy, mock) = proxy_and_mock(opts(true)).await;
    script(&mock, 200, "BLOCKING facts");
    let mut previous: Option<String> = None;
    let mut n = 0;
    while mock.requests().iter().all(|r| !is_summary_request(r)) {
        n += 1;
        assert!(n <= 40, "the trigger was never crossed");
        previous = Some(respond(&proxy, previous.as_deref(), n).await.0);
    }
    let seen = mock.requests();
    assert!(
        is_summary_request(&seen[seen.len() - 2]),
        "summarised before forwarding"
    );
    let sent = responses_requests(&mock).pop().unwrap();
    assert_eq!(
        sent["input"][0]["content"],
        format!("{PREFIX}BLOCKING facts")
    );
}

#[tokio::test]
async fn failed_summary_never_fails_the_request_and_is_retried_later() {
    let (proxy, mock) = proxy_and_mock(opts(false)).await;
    let store = proxy.state.store.clone();
    script(&mock, 500, "summariser down");
    let mut history = vec![system()];
    let mut n = 0;
    let asked = |mock: &MockHandle| {
        mock.requests()
            .iter()
            .filter(|r| is_summary_request(r))
            .count()
    };
    while asked(&mock) == 0 {
        n += 1;
        assert!(n <= 40, "the trigger was never crossed");
        history.push(user(n));
        let (reply, _) = turn(&proxy, SESSION, &history).await;
        history.push(reply);
        settle(&proxy).await;
    }
    assert!(
        store
            .list_summaries("default", SESSION)
            .await
            .unwrap()
            .is_empty()
    );

    // The summariser recovers; the very next turn tries again (a first failure waits for
    // nothing) and succeeds.
    script(&mock, 200, "RECOVERED facts");
    n += 1;
    history.push(user(n));
    turn(&proxy, SESSION, &history).await;
    settle(&proxy).await;
    let made = store.list_summaries("default", SESSION).await.unwrap();
    assert_eq!(made.len(), 1, "the next turn's retry made the summary");
    assert_eq!(made[0].text, "RECOVERED facts");
    assert_eq!(asked(&mock), 2, "retried once, on the next turn");
    assert!(counter(&proxy, "ctxproxy_summaries_total{outcome=\"error\"}").await >= 1.0);
}

/// The audit's case: a summariser that ignores its length and answers with more than the
/// history it was to stand in for. Such a summary would make every later request longer (over
/// a small model's window, a 400 for a request that fits without it): it is a failed summary,
/// not kept nor applied, and the request that asked for it goes out without it.
#[tokio::test]
async fn a_summary_longer_than_what_it_replaces_is_not_kept() {
    let (proxy, mock) = proxy_and_mock(opts(true)).await;
    let long = "endless ".repeat(8000);
    script(&mock, 200, &long);
    turns_until_summarised(&proxy, &mock).await;
    let seen = mock.requests();
    let last = seen.last().unwrap();
    assert!(!is_summary_request(last));
    let msgs = last.body_json().unwrap()["messages"].clone();
    assert!(
        msgs.as_array()
            .unwrap()
            .iter()
            .all(|m| !m["content"].as_str().unwrap_or("").starts_with(PREFIX)),
        "no summary sent"
    );
    assert!(sent_tokens(last) <= BUDGET);
    let store = proxy.state.store.clone();
    assert!(
        store
            .list_summaries("default", SESSION)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(counter(&proxy, "ctxproxy_summaries_total{outcome=\"error\"}").await >= 1.0);
}

/// A session deleted (admin DELETE) while its summary is being made: the summary has nowhere
/// to go, which is what was asked for. Counted as skipped, not as a failed summary.
#[tokio::test]
async fn a_summary_of_a_session_deleted_meanwhile_is_skipped_not_failed() {
    // Every answer, the summariser's too, takes a while: time to delete the session.
    let mock = ctxproxy::mock_upstream::spawn(Duration::from_millis(500)).await;
    let proxy = Proxy::start(opts(false), &mock.base_url()).await;
    script(&mock, 200, "facts");
    let history = long_conversation(30);
    turn(&proxy, "deleted-meanwhile", &history).await;
    proxy.state.pending.settle_all().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !mock.requests().iter().any(is_summary_request) {
        assert!(Instant::now() < deadline, "no summary was asked for");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        proxy
            .state
            .store
            .delete_session("default", "deleted-meanwhile")
            .await
            .unwrap()
    );
    // At once, a new conversation under the same id: the old one's summary is not its own.
    turn(&proxy, "deleted-meanwhile", &[system(), user(1)]).await;
    settle(&proxy).await;
    assert!(
        proxy
            .state
            .store
            .list_summaries("default", "deleted-meanwhile")
            .await
            .unwrap()
            .is_empty(),
        "the deleted conversation's summary was not kept"
    );
    assert_eq!(
        counter(&proxy, "ctxproxy_summaries_total{outcome=\"error\"}").await,
        0.0
    );
    assert_eq!(
        counter(&proxy, "ctxproxy_summaries_total{outcome=\"skipped\"}").await,
        1.0
    );
}

/// A blocking summary is a call to the upstream: the time it holds the request is not counted
/// as the proxy's overhead (request time less upstream time), as the forwarded call is not.
#[tokio::test]
async fn a_blocking_summary_is_not_counted_as_overhead() {
    // Every answer, the summariser's included, takes at least 300 ms.
    let mock = ctxproxy::mock_upstream::spawn(Duration::from_millis(300)).await;
    let proxy = Proxy::start(opts(true), &mock.base_url()).await;
    script(&mock, 200, "facts");
    turn(&proxy, "blocking-overhead", &long_conversation(30)).await;
    assert!(
        mock.requests().iter().any(is_summary_request),
        "the summary was made"
    );
    let total = counter(
        &proxy,
        "ctxproxy_request_duration_seconds_sum{endpoint=\"chat.completions\"}",
    )
    .await;
    let upstream = counter(&proxy, "ctxproxy_upstream_duration_seconds_sum").await;
    let overhead = counter(
        &proxy,
        "ctxproxy_overhead_seconds_sum{endpoint=\"chat.completions\"}",
    )
    .await;
    // overhead = total - upstream - summary, and the summary took 300 ms at least.
    assert!(
        overhead <= total - upstream - 0.3 + 1e-6,
        "overhead {overhead}, total {total}, upstream {upstream}"
    );
}

/// A conversation of `turns` fabricated turns plus a new question: over the trigger at once.
fn long_conversation(turns: usize) -> Vec<Value> {
    let mut history = vec![system()];
    for n in 1..=turns {
        history.push(user(n));
        history.push(json!({"role": "assistant", "content": format!("answer {n}")}));
    }
    history.push(user(turns + 1));
    history
}

#[tokio::test]
async fn two_processes_on_one_postgres_make_one_summary() {
    let Some(db) = common::pg::PgTestDb::create().await else {
        return;
    };
    // A's upstream is slow, B's fast: B's job starts while A's still holds the summary lease.
    let slow = ctxproxy::mock_upstream::spawn(Duration::from_millis(1500)).await;
    let fast = ctxproxy::mock_upstream::spawn(Duration::ZERO).await;
    script(&slow, 200, "SHARED facts");
    script(&fast, 200, "SHARED facts");
    let shared = || ProxyOptions {
        database_url: Some(db.url.clone()),
        ..opts(false)
    };
    let a = Proxy::start(shared(), &slow.base_url()).await;
    let b = Proxy::start(shared(), &fast.base_url()).await;

    let history = long_conversation(20);
    let first = turn(&a, SESSION, &history);
    let second = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        turn(&b, SESSION, &history).await
    };
    let _ = tokio::join!(first, second);
    settle(&a).await;
    settle(&b).await;

    let asked = slow
        .requests()
        .iter()
        .filter(|r| is_summary_request(r))
        .count()
        + fast
            .requests()
            .iter()
            .filter(|r| is_summary_request(r))
            .count();
    assert_eq!(asked, 1, "one summary job for the session, not two");
    // The other process did plan a job too; the lease (or the re-check under it) stopped it.
    assert!(counter(&b, "ctxproxy_summaries_total{outcome=\"skipped\"}").await >= 1.0);
    let summaries = a
        .state
        .store
        .list_summaries("default", SESSION)
        .await
        .unwrap();
    assert_eq!(summaries.len(), 1);

    // The other process uses the shared summary on the next turn.
    let mut next = history.clone();
    next.push(json!({"role": "assistant", "content": "ok"}));
    next.push(user(99));
    turn(&b, SESSION, &next).await;
    let last = fast.requests().last().unwrap().body_json().unwrap();
    assert_eq!(
        last["messages"][1]["content"],
        format!("{PREFIX}SHARED facts")
    );
    a.shutdown().await;
    b.shutdown().await;
}

/// A tenant whose history steps remove calls before the summary: `tool_filter` excludes
/// `secret_tool`, and the (default) viewer role may not use `get_account_balance`.
fn scrubbing_tenant() -> String {
    "keys: any\nupstream:\n  base_url: {upstream}\ntools:\n  roles:\n    viewer: [search_web, \
     secret_tool]\n  default_role: viewer\n  scrub_history: true\npolicy:\n  tool_filter: { \
     exclude: [secret_tool] }\n  summary: { model: summariser-1, trigger_tokens: 200, \
     target_tokens: 60, min_messages: 2 }\n"
        .to_string()
}

/// Tools offered by the requests of the scrubbing tests, chat shape.
fn offered_tools() -> Value {
    let tool = |name: &str| json!({"type": "function", "function": {"name": name, "parameters": {"type": "object"}}});
    json!([
        tool("search_web"),
        tool("secret_tool"),
        tool("get_account_balance")
    ])
}

/// Words that must never reach the summariser from the scrubbing tests' history.
const HIDDEN: [&str; 4] = [
    "secret_tool",
    "SECRET-PAYLOAD-XYZ",
    "get_account_balance",
    "BALANCE-4242",
];

/// A history with three history calls, two of which steps 1–3 remove (the first by tool_filter,
/// the second by tool access), then two turns and a new question; chat messages.
fn scrubbed_history() -> Vec<Value> {
    let call = |id: &str, name: &str, args: &str| {
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
            "function": {"name": name, "arguments": args}}]})
    };
    let result =
        |id: &str, text: &str| json!({"role": "tool", "tool_call_id": id, "content": text});
    vec![
        system(),
        user(1),
        call("c1", "secret_tool", r#"{"q": "x"}"#),
        result("c1", "SECRET-PAYLOAD-XYZ"),
        call("c2", "get_account_balance", r#"{"account": "ACC-001"}"#),
        result("c2", "BALANCE-4242"),
        call("c3", "search_web", r#"{"query": "weather"}"#),
        result("c3", "SEARCH-RESULT-OK"),
        json!({"role": "assistant", "content": "answer 1"}),
        user(2),
        json!({"role": "assistant", "content": "answer 2"}),
        user(3),
    ]
}

/// The same history as Responses input items (with `instructions` for the system message).
fn scrubbed_items() -> Vec<Value> {
    scrubbed_history()[1..]
        .iter()
        .flat_map(|m| match m["role"].as_str() {
            Some("tool") => vec![json!({"type": "function_call_output",
                "call_id": m["tool_call_id"], "output": m["content"]})],
            Some("assistant") if m.get("tool_calls").is_some() => m["tool_calls"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| {
                    json!({"type": "function_call", "call_id": c["id"],
                        "name": c["function"]["name"], "arguments": c["function"]["arguments"]})
                })
                .collect(),
            _ => vec![m.clone()],
        })
        .collect()
}

/// The one summariser request `mock` received, after the jobs settled.
async fn the_summary_request(proxy: &Proxy, mock: &MockHandle) -> String {
    settle(proxy).await;
    let asked: Vec<RecordedRequest> = mock
        .requests()
        .into_iter()
        .filter(is_summary_request)
        .collect();
    assert_eq!(asked.len(), 1, "one summary was due");
    summary_input(&asked[0])
}

/// The reasons the last request record of the session reports removals for.
async fn removal_reasons(proxy: &Proxy, session: &str) -> Vec<String> {
    let records = proxy.request_records("default", session).await;
    let report = &records.last().unwrap()["report"];
    report["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["reason"].as_str().unwrap().to_string())
        .collect()
}

/// The summariser's input (returned) holds none of the calls tool access and tool_filter
/// removed, and the allowed search result; the request record names both removals.
async fn assert_summariser_saw_only_what_was_kept(proxy: &Proxy, mock: &MockHandle) -> String {
    let input = the_summary_request(proxy, mock).await;
    for hidden in HIDDEN {
        assert!(
            !input.contains(hidden),
            "{hidden} reached the summariser: {input}"
        );
    }
    assert!(input.contains("SEARCH-RESULT-OK"), "{input}");
    let reasons = removal_reasons(proxy, SESSION).await;
    assert!(reasons.iter().any(|r| r == "tool_filter"), "{reasons:?}");
    assert!(reasons.iter().any(|r| r == "tool_access"), "{reasons:?}");
    input
}

/// SPEC 5 runs tool access, tool_filter and the tool-call window before the summary: what they
/// removed must not reach the summariser (it would come back on every later turn, and to a
/// role that may not see it).
#[tokio::test]
async fn the_summariser_never_reads_calls_removed_before_the_summary_step() {
    let opts = ProxyOptions::default().only_tenant("default", &scrubbing_tenant());
    let (proxy, mock) = proxy_and_mock(opts).await;
    script(&mock, 200, "SCRUBBED facts");
    let resp = client()
        .post(format!("{}/chat/completions", proxy.base_url()))
        .header("x-session-id", SESSION)
        .json(&json!({"model": "test-model", "messages": scrubbed_history(), "tools": offered_tools()}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let input = assert_summariser_saw_only_what_was_kept(&proxy, &mock).await;
    assert!(input.contains("q001"), "{input}");
}

#[tokio::test]
async fn the_summariser_never_reads_items_removed_before_the_summary_step() {
    let opts = ProxyOptions::default().only_tenant("default", &scrubbing_tenant());
    let (proxy, mock) = proxy_and_mock(opts).await;
    script(&mock, 200, "SCRUBBED facts");
    let tools: Vec<Value> = ["search_web", "secret_tool", "get_account_balance"]
        .iter()
        .map(|name| json!({"type": "function", "name": name}))
        .collect();
    let resp = client()
        .post(format!("{}/responses", proxy.base_url()))
        .header("x-session-id", SESSION)
        .json(
            &json!({"model": "test-model", "instructions": "You are a test assistant.",
            "input": scrubbed_items(), "tools": tools}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_summariser_saw_only_what_was_kept(&proxy, &mock).await;
}

/// The trigger is measured on the history as compress_tool_output leaves it: a long tool
/// result shortened far below the trigger does not make a summary due.
#[tokio::test]
async fn the_trigger_counts_tool_results_as_compressed() {
    let tenant = "keys: any\nupstream:\n  base_url: {upstream}\npolicy:\n  compress_tool_output: \
                  { max_tokens: 20 }\n  summary: { model: summariser-1, trigger_tokens: 200, \
                  target_tokens: 100, min_messages: 1, blocking: true }\n";
    let (proxy, mock) =
        proxy_and_mock(ProxyOptions::default().only_tenant("default", tenant)).await;
    script(&mock, 200, "NEVER facts");
    let history = json!([
        {"role": "user", "content": "look it up"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "x".repeat(3000)},
        {"role": "assistant", "content": "found it"},
        {"role": "user", "content": "thanks"},
        {"role": "assistant", "content": "welcome"},
        {"role": "user", "content": "and now?"},
    ]);
    let resp = client()
        .post(format!("{}/chat/completions", proxy.base_url()))
        .header("x-session-id", SESSION)
        .json(&json!({"model": "test-model", "messages": history}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let out: u64 = resp.headers()["x-ctxproxy-tokens-out"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(out < 200, "the whole request is under the trigger: {out}");
    settle(&proxy).await;
    assert!(
        mock.requests().iter().all(|r| !is_summary_request(r)),
        "no summary is due"
    );
    let records = proxy.request_records("default", SESSION).await;
    let report = &records.last().unwrap()["report"];
    assert_eq!(report["summary"]["used"], false, "{report}");
    assert_eq!(
        report["compressed"].as_array().unwrap().len(),
        1,
        "{report}"
    );
}

/// The tenant and models of the over-the-window tests: a 300-token model, summaries on.
fn tiny_window(database_url: Option<String>) -> ProxyOptions {
    let tenant = "keys: any\nupstream:\n  base_url: {upstream}\npolicy:\n  summary: { model: \
                  summariser-1, trigger_tokens: 100, target_tokens: 60, min_messages: 2 }\n";
    ProxyOptions {
        server_extra: "models:\n  \"tiny*\": { context_window: 300, encoding: approximate }\n"
            .into(),
        database_url,
        ..ProxyOptions::default().only_tenant("default", tenant)
    }
}

/// A short user message (about 30 tokens), recognisable by its number.
fn short_user(n: usize) -> Value {
    json!({"role": "user", "content": format!("q{n:03} {}", "lorem ipsum dolor ".repeat(6))})
}

/// Sends `body` to `path`; the status.
async fn post_status(proxy: &Proxy, path: &str, body: &Value) -> u16 {
    client()
        .post(format!("{}{path}", proxy.base_url()))
        .header("x-session-id", SESSION)
        .json(body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// SPEC 5.2: the request that crosses the trigger starts a job, also when it is itself refused
/// as over the model's window; the next try then fits with the summary.
async fn over_the_window_starts_a_summary(database_url: Option<String>, responses: bool) {
    let (proxy, mock) = proxy_and_mock(tiny_window(database_url)).await;
    script(&mock, 200, "WINDOW facts");
    let mut history = vec![system()];
    for n in 1..=8 {
        history.push(short_user(n));
        history.push(json!({"role": "assistant", "content": format!("answer {n}")}));
    }
    history.push(short_user(9));
    let (path, body) = if responses {
        let input = history[1..].to_vec();
        let body = json!({"model": "tiny-1", "instructions": "You are a test assistant.",
            "input": input});
        ("/responses", body)
    } else {
        let body = json!({"model": "tiny-1", "messages": history});
        ("/chat/completions", body)
    };
    assert_eq!(
        post_status(&proxy, path, &body).await,
        400,
        "over the window"
    );
    settle(&proxy).await;
    let asked = || {
        mock.requests()
            .iter()
            .filter(|r| is_summary_request(r))
            .count()
    };
    assert_eq!(asked(), 1, "the refused request started the summary job");
    assert_eq!(
        post_status(&proxy, path, &body).await,
        200,
        "the next try fits with the summary"
    );
    let records = proxy.request_records("default", SESSION).await;
    let report = &records.last().unwrap()["report"];
    assert_eq!(report["summary"]["used"], true, "{report}");
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_chat_request_over_the_window_still_starts_its_summary() {
    over_the_window_starts_a_summary(None, false).await;
}

#[tokio::test]
async fn a_responses_request_over_the_window_still_starts_its_summary() {
    over_the_window_starts_a_summary(None, true).await;
}

#[tokio::test]
async fn a_request_over_the_window_still_starts_its_summary_on_postgres() {
    let Some(db) = common::pg::PgTestDb::create().await else {
        return;
    };
    over_the_window_starts_a_summary(Some(db.url.clone()), false).await;
}

/// Two roles on one session, `scrub_history` on, blocking summaries.
fn two_roles_tenant() -> String {
    "keys: any\nupstream:\n  base_url: {upstream}\ntools:\n  roles:\n    admin: [\"*\"]\n    \
     viewer: [search_web]\n  default_role: viewer\n  role_from_header: true\n  scrub_history: \
     true\npolicy:\n  summary: { model: summariser-1, trigger_tokens: 200, target_tokens: 60, \
     min_messages: 2, blocking: true }\n"
        .to_string()
}

/// One chat turn on `SESSION` as `role`; the reply and the report of its request record.
async fn turn_as(proxy: &Proxy, role: &str, messages: &[Value]) -> (Value, Value) {
    let resp = client()
        .post(format!("{}/chat/completions", proxy.base_url()))
        .header("x-session-id", SESSION)
        .header("x-ctxproxy-role", role)
        .json(&json!({"model": "test-model", "messages": messages, "tools": offered_tools()}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{role}");
    let v: Value = resp.json().await.unwrap();
    settle(proxy).await;
    let records = proxy.request_records("default", SESSION).await;
    let report = records.last().unwrap()["report"].clone();
    (v["choices"][0]["message"].clone(), report)
}

/// SPEC 6: with `scrub_history`, a role never gets the results of a tool it may not use. A
/// summary made on an admin's request read them, so it is not given to a viewer on the same
/// session (whose history has those calls scrubbed): the viewer gets a summary made from what
/// it sees instead, which later viewer turns keep using.
#[tokio::test]
async fn a_summary_that_read_a_tool_a_role_may_not_use_is_not_given_to_that_role() {
    let opts = ProxyOptions::default().only_tenant("default", &two_roles_tenant());
    let (proxy, mock) = proxy_and_mock(opts).await;
    script(&mock, 200, "ADMIN-SUMMARY");
    let mut messages = scrubbed_history();
    let (reply, report) = turn_as(&proxy, "admin", &messages).await;
    assert_eq!(report["summary"]["used"], true, "{report}");
    let summaries: Vec<RecordedRequest> = mock
        .requests()
        .into_iter()
        .filter(is_summary_request)
        .collect();
    assert!(summary_input(&summaries[0]).contains("BALANCE-4242"));

    script(&mock, 200, "VIEWER-SUMMARY");
    for n in 4..6 {
        messages.push(reply.clone());
        messages.push(user(n));
        let seen = mock.requests().len();
        let (_, report) = turn_as(&proxy, "viewer", &messages).await;
        assert_eq!(report["summary"]["used"], true, "{report}");
        let asked = mock.requests()[seen..].to_vec();
        for r in asked.iter().filter(|r| is_summary_request(r)) {
            let input = summary_input(r);
            for hidden in HIDDEN {
                assert!(!input.contains(hidden), "{hidden} reached the summariser");
            }
        }
        let sent = asked.iter().find(|r| !is_summary_request(r)).unwrap();
        let sent = String::from_utf8_lossy(&sent.body).to_string();
        assert!(!sent.contains("ADMIN-SUMMARY"), "turn {n}: {sent}");
        assert!(sent.contains("VIEWER-SUMMARY"), "turn {n}: {sent}");
        for hidden in HIDDEN {
            assert!(!sent.contains(hidden), "turn {n}: {hidden} went upstream");
        }
    }
    // The viewer's summary was made once, then reused.
    let made = mock
        .requests()
        .into_iter()
        .filter(is_summary_request)
        .count();
    assert_eq!(made, 2);
}

/// In a `keys: any` tenant the summariser call is made with the triggering request's credential
/// as that request sent it upstream, also when it is Azure's `api-key` header rather than a
/// bearer token, and with the client's query (Azure's `api-version`), as the request went.
#[tokio::test]
async fn a_summariser_call_carries_the_client_s_credential_and_query_as_its_request_did() {
    let (proxy, mock) = proxy_and_mock(opts(true)).await;
    script(&mock, 200, "AZURE facts");
    let mut history = vec![system()];
    for n in 1..=40 {
        history.push(user(n));
        let resp = client()
            .post(format!(
                "{}/chat/completions?api-version=2024-10-21",
                proxy.base_url()
            ))
            .header("api-key", "AZUREKEY123")
            .header("x-session-id", SESSION)
            .json(&json!({"model": "test-model", "messages": history}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let v: Value = resp.json().await.unwrap();
        history.push(v["choices"][0]["message"].clone());
        if mock.requests().iter().any(is_summary_request) {
            break;
        }
    }
    let seen = mock.requests();
    let asked = seen
        .iter()
        .find(|r| is_summary_request(r))
        .expect("a summary");
    let request = seen.iter().find(|r| !is_summary_request(r)).unwrap();
    for r in [asked, request] {
        assert_eq!(r.headers["api-key"], "AZUREKEY123");
        assert_eq!(r.query.as_deref(), Some("api-version=2024-10-21"));
    }
}

/// Roles taking turns on one session: when the newest summary is one a viewer may not see, the
/// viewer gets the best one it may see and rolls that forward, rather than going without a
/// summary and summarising its whole history again on every turn.
#[tokio::test]
async fn a_role_rolls_its_own_summary_forward_while_another_role_s_is_newer() {
    let opts = ProxyOptions::default().only_tenant("default", &two_roles_tenant());
    let (proxy, mock) = proxy_and_mock(opts).await;
    let mut messages = scrubbed_history();
    let call = |id: &str, name: &str| {
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
            "function": {"name": name, "arguments": "{}"}}]})
    };
    let mut viewer_inputs = Vec::new();
    for (turn, role) in [
        "admin", "viewer", "admin", "viewer", "admin", "viewer", "viewer",
    ]
    .into_iter()
    .enumerate()
    {
        script(
            &mock,
            200,
            &format!("{}-SUMMARY-{turn}", role.to_uppercase()),
        );
        let seen = mock.requests().len();
        let (reply, report) = turn_as(&proxy, role, &messages).await;
        assert_eq!(report["summary"]["used"], true, "turn {turn}: {report}");
        if role == "viewer" {
            let asked = mock.requests()[seen..].to_vec();
            let sent = asked.iter().find(|r| !is_summary_request(r)).unwrap();
            let sent = String::from_utf8_lossy(&sent.body).to_string();
            assert!(!sent.contains("ADMIN-SUMMARY"), "turn {turn}: {sent}");
            for hidden in HIDDEN {
                assert!(
                    !sent.contains(hidden),
                    "turn {turn}: {hidden} went upstream"
                );
            }
            viewer_inputs.extend(
                asked
                    .iter()
                    .filter(|r| is_summary_request(r))
                    .map(summary_input),
            );
        }
        // Each turn adds an admin-only call and its secret result, and a new question.
        let id = format!("s{turn}");
        messages.push(reply);
        messages.push(user(10 + turn));
        messages.push(call(&id, "get_account_balance"));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": "BALANCE-4242"}));
        messages.push(json!({"role": "assistant", "content": format!("noted {turn}")}));
        messages.push(user(20 + turn));
    }
    // The viewer summarised from nothing once; every later viewer summary rolled its own
    // previous one forward.
    assert!(!viewer_inputs.is_empty());
    let from_nothing = viewer_inputs
        .iter()
        .filter(|i| i.contains("Previous summary: none."))
        .count();
    assert_eq!(from_nothing, 1, "{viewer_inputs:#?}");
    for input in &viewer_inputs {
        for hidden in HIDDEN {
            assert!(!input.contains(hidden), "{hidden} reached the summariser");
        }
    }
}

/// The summary audit's cases (SPEC 5.2): a message larger than the summariser can read (a
/// pasted document, a plain-text tool result) is shortened in its transcript, as step 4 shortens
/// text, rather than stopping the session's summaries. Before, the plan was cut to what fitted
/// whole, which left only the question before the document: a summary of it replaced nothing,
/// was not kept, and every later turn tried the same. A pasted document first in the history was
/// sent to the summariser whole, past its context window.
#[tokio::test]
async fn a_message_too_large_for_the_summariser_is_shortened_not_a_dead_end() {
    summarise_around_large_messages("").await;
}

/// The re-check's case: a tenant whose `compress_tool_output` limit is larger than what the
/// summariser may read of one message. Tool results and call arguments are held to the lower
/// of the two, or a result the pipeline left at 2,000 tokens stopped the summaries again, and
/// plain-text arguments overflowed the summariser's window.
#[tokio::test]
async fn a_large_compression_limit_does_not_let_one_result_fill_the_summary_input() {
    summarise_around_large_messages("  compress_tool_output: { max_tokens: 2000 }\n").await;
}

async fn summarise_around_large_messages(policy: &str) {
    let tenant = format!(
        "keys: any\nupstream:\n  base_url: {{upstream}}\npolicy:\n  summary: {{ model: summ-tiny, \
         trigger_tokens: 2000, target_tokens: 1000, min_messages: 6, blocking: true }}\n{policy}"
    );
    let opts = ProxyOptions {
        server_extra:
            "models:\n  \"summ-tiny*\": { context_window: 3000, encoding: approximate }\n".into(),
        ..ProxyOptions::default().only_tenant("default", &tenant)
    };
    let (proxy, mock) = proxy_and_mock(opts).await;
    script(&mock, 200, "DOC facts");
    let document = "lorem ipsum dolor sit amet ".repeat(540); // ~3,600 tokens
    let mut history = vec![
        system(),
        json!({"role": "user", "content": format!("read this: {document}")}),
        json!({"role": "assistant", "content": "read"}),
        json!({"role": "user", "content": "get the doc"}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "fetch_doc", "arguments": "{}"}}]}),
        json!({"role": "tool", "tool_call_id": "c1", "content": document}),
        json!({"role": "user", "content": "save it"}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c2", "type": "function", "function": {"name": "save", "arguments": document}}]}),
        json!({"role": "tool", "tool_call_id": "c2", "content": "saved"}),
    ];
    for n in 0..6 {
        history.push(json!({"role": "user", "content": format!("short question {n}")}));
        history.push(json!({"role": "assistant", "content": format!("short answer {n}")}));
    }
    history.push(json!({"role": "user", "content": "now"}));
    // Each turn's summary rolls in what fits; within a few turns every large message is read,
    // in part, with step 4's marker, and no transcript goes past the summariser's reach (half
    // its window).
    let mut read = String::new();
    let mut last_out = 0;
    for n in 0..4 {
        let (reply, tokens_out) = turn(&proxy, "too-large", &history).await;
        let sent = mock.requests().last().unwrap().body_json().unwrap();
        assert!(
            sent["messages"][1]["content"]
                .as_str()
                .is_some_and(|c| c.starts_with(PREFIX)),
            "turn {n}: the summary was kept and used"
        );
        last_out = tokens_out;
        history.push(reply);
        history.push(json!({"role": "user", "content": format!("and then {n}")}));
        if read.contains("[assistant calls save (c2)]") {
            break;
        }
        for r in mock.requests().iter().filter(|r| is_summary_request(r)) {
            let input = summary_input(r);
            assert!(
                input.len() / 4 <= 1500,
                "{} tokens: {input}",
                input.len() / 4
            );
            read.push_str(&input);
        }
    }
    assert!(last_out < 1500, "the documents are still sent: {last_out}");
    assert!(read.contains("[user] get the doc"), "{read}");
    for label in [
        "[user] read this: ",
        "[tool result (c1)] ",
        "[assistant calls save (c2)] ",
    ] {
        let at = read
            .find(label)
            .unwrap_or_else(|| panic!("{label} never read: {read}"));
        let message = read[at..].lines().take(3).collect::<String>();
        assert!(
            message.contains("tokens omitted]"),
            "{label} not shortened: {message}"
        );
    }
}

/// The final re-check's case (SPEC 5.2): a summary model that writes far more than it is asked
/// for. Its long summary is kept (it still stands in for more), but the next summariser call
/// reads it shortened, within the transcript's half of the window, rather than past the
/// model's window on every later call.
#[tokio::test]
async fn a_long_previous_summary_is_read_shortened_by_the_next_one() {
    let tenant = "keys: any\nupstream:\n  base_url: {upstream}\npolicy:\n  summary: { model: summ-tiny, \
                  trigger_tokens: 2000, target_tokens: 1000, min_messages: 6, blocking: true }\n";
    let opts = ProxyOptions {
        server_extra:
            "models:\n  \"summ-tiny*\": { context_window: 3000, encoding: approximate }\n".into(),
        ..ProxyOptions::default().only_tenant("default", tenant)
    };
    let (proxy, mock) = proxy_and_mock(opts).await;
    script(&mock, 200, &"verbose fact ".repeat(800)); // ~2,600 tokens
    let document = "lorem ipsum dolor sit amet ".repeat(540); // ~3,600 tokens
    let mut history = vec![system()];
    for n in 0..12 {
        history.push(json!({"role": "user", "content": format!("doc {n}: {document}")}));
        let (reply, _) = turn(&proxy, "verbose", &history).await;
        history.push(reply);
        let made = mock
            .requests()
            .into_iter()
            .filter(is_summary_request)
            .count();
        if made >= 3 {
            break;
        }
    }
    let inputs: Vec<String> = mock
        .requests()
        .iter()
        .filter(|r| is_summary_request(r))
        .map(summary_input)
        .collect();
    assert!(inputs.len() >= 2, "{} summaries", inputs.len());
    for input in &inputs {
        assert!(
            input.len() / 4 <= 1500,
            "{} tokens: {input}",
            input.len() / 4
        );
    }
    let previous = inputs[1].split("New messages:").next().unwrap();
    assert!(previous.contains("verbose fact"), "{previous}");
    assert!(previous.contains("tokens omitted]"), "{previous}");
}
