//! End-to-end: message identity (SPEC 4.2) tells apart replies that differ only in what the
//! plain message fields do not show (a refusal, a reasoning item's encrypted content), so a
//! regenerated turn is a branch of its own instead of being taken for the first reply, and it
//! recognises a reply resent with its tool-call arguments re-serialised, so that turn goes on
//! the same branch.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::*;
use serde_json::{Value, json};

/// An upstream whose n-th answer (from 1) differs from every other one: a chat reply that is a
/// refusal `refusal n`, a Responses reply with reasoning `rs_n` (encrypted content `enc-n`)
/// before the same answer text each time. It records the bodies it received.
struct Varying {
    base_url: String,
    received: Arc<Mutex<Vec<Value>>>,
}

async fn varying_upstream() -> Varying {
    use axum::Json;
    use axum::routing::post;
    let count = Arc::new(AtomicUsize::new(0));
    let received = Arc::new(Mutex::new(Vec::new()));
    let answer = {
        let (count, received) = (count.clone(), received.clone());
        move |body: Value| {
            received.lock().unwrap().push(body);
            count.fetch_add(1, Ordering::SeqCst) + 1
        }
    };
    let chat_answer = answer.clone();
    let app = axum::Router::new()
        .route(
            "/v1/chat/completions",
            post(move |Json(body): Json<Value>| async move {
                let n = chat_answer(body);
                Json(json!({
                    "id": format!("chatcmpl-{n}"), "object": "chat.completion", "created": 0,
                    "model": "m",
                    "choices": [{"index": 0, "finish_reason": "stop", "message":
                        {"role": "assistant", "content": null, "refusal": format!("refusal {n}")}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }))
            }),
        )
        .route(
            "/v1/responses",
            post(move |Json(body): Json<Value>| async move {
                let n = answer(body);
                Json(json!({
                    "id": format!("resp_{n}"), "object": "response", "created_at": 0,
                    "status": "completed", "model": "m",
                    "output": [
                        {"type": "reasoning", "id": format!("rs_{n}"), "summary": [],
                            "encrypted_content": format!("enc-{n}")},
                        {"type": "message", "id": format!("msg_{n}"), "role": "assistant",
                            "status": "completed",
                            "content": [{"type": "output_text", "text": "same answer",
                                "annotations": []}]},
                    ],
                    "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
                }))
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Varying {
        base_url: format!("http://{addr}/v1"),
        received,
    }
}

/// POSTs `body` to `path` under the proxy's `/v1` on `session`; returns the JSON answer.
async fn post(proxy: &Proxy, path: &str, session: &str, body: &Value) -> Value {
    let resp = client()
        .post(format!("{}/{path}", proxy.base_url()))
        .header("x-session-id", session)
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{path}");
    resp.json().await.unwrap()
}

/// The session's branches, each as its stored messages (without `seq`), head last.
async fn stored_branches(proxy: &Proxy, session: &str) -> Vec<Vec<Value>> {
    let (status, detail) = proxy
        .admin_get(&format!("/ctxproxy/v1/sessions/default/{session}"))
        .await;
    assert_eq!(status, 200, "{detail}");
    let mut out = Vec::new();
    let mut list = detail["branches"].as_array().unwrap().clone();
    list.sort_by_key(|b| b["head"] == true);
    for branch in list {
        let id = branch["id"].as_str().unwrap();
        let (status, messages) = proxy
            .admin_get(&format!(
                "/ctxproxy/v1/sessions/default/{session}/messages?branch={id}"
            ))
            .await;
        assert_eq!(status, 200, "{messages}");
        let messages = messages
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let mut m = m.clone();
                m.as_object_mut().unwrap().shift_remove("seq");
                m
            })
            .collect();
        out.push(messages);
    }
    out
}

/// A chat turn regenerated with the same prompt gets another refusal: both replies are kept,
/// each on its own branch, the second the head.
#[tokio::test]
async fn regenerated_refusals_are_two_branches() {
    let upstream = varying_upstream().await;
    let proxy = Proxy::start(ProxyOptions::default(), &upstream.base_url).await;
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "q"}]});
    for _ in 0..2 {
        post(&proxy, "chat/completions", "refusals", &body).await;
    }
    let branches = stored_branches(&proxy, "refusals").await;
    let refusals: Vec<&Value> = branches.iter().map(|b| &b[1]["refusal"]).collect();
    assert_eq!(refusals, ["refusal 1", "refusal 2"], "{branches:?}");
    for branch in &branches {
        assert_eq!(branch.len(), 2, "{branches:?}");
        assert_eq!(branch[0], json!({"role": "user", "content": "q"}));
    }
}

/// A Responses turn regenerated with the same prompt gets the same text after another
/// reasoning item: both replies are kept on their own branches, and the next turn in server
/// history mode goes upstream with the reasoning (and encrypted content) of the head's reply.
#[tokio::test]
async fn regenerated_reasoning_is_two_branches_and_the_head_is_sent_on() {
    let upstream = varying_upstream().await;
    let proxy = Proxy::start(ProxyOptions::default(), &upstream.base_url).await;
    let body = json!({"model": "m", "input": [{"role": "user", "content": "q"}]});
    for _ in 0..2 {
        post(&proxy, "responses", "reasoning", &body).await;
    }
    let branches = stored_branches(&proxy, "reasoning").await;
    let encrypted: Vec<&Value> = branches
        .iter()
        .map(|b| &b[1]["encrypted_content"])
        .collect();
    assert_eq!(encrypted, ["enc-1", "enc-2"], "{branches:?}");
    for branch in &branches {
        assert_eq!(branch.len(), 3, "{branches:?}");
        assert_eq!(branch[2]["content"][0]["text"], "same answer");
    }

    let resp = client()
        .post(format!("{}/responses", proxy.base_url()))
        .header("x-session-id", "reasoning")
        .header("x-ctxproxy-history", "server")
        .json(&json!({"model": "m", "input": [{"role": "user", "content": "next"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let sent = upstream.received.lock().unwrap()[2].clone();
    let input = sent["input"].as_array().unwrap();
    assert_eq!(input.len(), 4, "{sent}");
    assert_eq!(input[1]["id"], "rs_2", "{sent}");
    assert_eq!(input[1]["encrypted_content"], "enc-2", "{sent}");
}

/// A client (LangChain, anything that `json.dumps` the arguments) resends the assistant's tool
/// call with `{"a": 1}` where the upstream wrote `{"a":1}`: the turn continues the stored
/// branch, on chat and on responses.
#[tokio::test]
async fn re_serialised_tool_arguments_continue_the_branch() {
    let (proxy, _mock) = proxy_and_mock(ProxyOptions::default()).await;
    let user = json!({"role": "user", "content": r#"call f {"a":1}"#});

    let reply = post(
        &proxy,
        "chat/completions",
        "args-chat",
        &json!({"model": "m", "messages": [user]}),
    )
    .await;
    let mut assistant = reply["choices"][0]["message"].clone();
    let call = &mut assistant["tool_calls"][0];
    assert_eq!(call["function"]["arguments"], r#"{"a":1}"#);
    call["function"]["arguments"] = json!(r#"{"a": 1}"#);
    let call_id = call["id"].clone();
    let result = json!({"role": "tool", "tool_call_id": call_id, "content": "done"});
    post(
        &proxy,
        "chat/completions",
        "args-chat",
        &json!({"model": "m", "messages": [user, assistant, result]}),
    )
    .await;
    let branches = stored_branches(&proxy, "args-chat").await;
    assert_eq!(branches.len(), 1, "{branches:?}");
    assert_eq!(branches[0].len(), 4, "{branches:?}");

    let reply = post(
        &proxy,
        "responses",
        "args-responses",
        &json!({"model": "m", "input": [user]}),
    )
    .await;
    let mut call = reply["output"][0].clone();
    assert_eq!(call["arguments"], r#"{"a":1}"#);
    call["arguments"] = json!(r#"{"a": 1}"#);
    let output = json!({"type": "function_call_output", "call_id": call["call_id"],
        "output": "done"});
    post(
        &proxy,
        "responses",
        "args-responses",
        &json!({"model": "m", "input": [user, call, output]}),
    )
    .await;
    let branches = stored_branches(&proxy, "args-responses").await;
    assert_eq!(branches.len(), 1, "{branches:?}");
    assert_eq!(branches[0].len(), 4, "{branches:?}");
}

/// A framework that names its agents (LangGraph's `create_react_agent(..., name=...)`) resends
/// each reply with that `name` and without the fields it does not model: the turn still finds
/// its session by auto matching (no session header) and stays on one branch.
#[tokio::test]
async fn a_reply_resent_with_its_agent_s_name_continues_the_session() {
    let (proxy, _mock) = proxy_and_mock(ProxyOptions::default()).await;
    let user = json!({"role": "user", "content": r#"call get_weather {"city":"Tokyo"}"#});
    let first = client()
        .post(format!("{}/chat/completions", proxy.base_url()))
        .json(&json!({"model": "m", "messages": [user]}))
        .send()
        .await
        .unwrap();
    let session = first.headers()["x-ctxproxy-session"]
        .to_str()
        .unwrap()
        .to_string();
    let reply: Value = first.json().await.unwrap();
    let stored = &reply["choices"][0]["message"];
    let resent = json!({"role": "assistant", "content": null, "name": "weather_agent",
        "tool_calls": stored["tool_calls"]});
    let result = json!({"role": "tool", "tool_call_id": stored["tool_calls"][0]["id"],
        "content": "sunny"});
    let second = client()
        .post(format!("{}/chat/completions", proxy.base_url()))
        .json(&json!({"model": "m", "messages": [user, resent, result]}))
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), 200);
    assert_eq!(second.headers()["x-ctxproxy-session"], session.as_str());
    let branches = stored_branches(&proxy, &session).await;
    assert_eq!(branches.len(), 1, "{branches:?}");
    assert_eq!(branches[0].len(), 4, "{branches:?}");
}
