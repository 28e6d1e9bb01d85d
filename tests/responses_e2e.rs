//! End-to-end: `/v1/responses` fully managed (SPEC 7) between a real HTTP client and the mock
//! upstream: the tool-call window over a long agent conversation (full input resent, or
//! `previous_response_id`), unknown items and fields kept on the way up and into the store, and
//! `previous_response_id` resolved by the proxy or, when unknown, forwarded.

mod common;
mod items_support;

use common::*;
use items_support::*;
use serde_json::{Value, json};

const WINDOWED: &str =
    "keys: any\nupstream:\n  base_url: {upstream}\npolicy:\n  tool_call_window: {max: 3}\n";

/// Posts a Responses request; returns the body and the session the proxy stored it under.
async fn respond(proxy: &Proxy, body: &Value) -> (Value, String) {
    let resp = client()
        .post(format!("{}/responses", proxy.base_url()))
        .bearer_auth("sk-test")
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    for h in ["x-ctxproxy-tokens-in", "x-ctxproxy-tokens-out"] {
        assert!(resp.headers().contains_key(h), "{h} missing");
    }
    let session = resp.headers()["x-ctxproxy-session"]
        .to_str()
        .unwrap()
        .to_string();
    (resp.json().await.unwrap(), session)
}

fn output(resp: &Value) -> Vec<Value> {
    resp["output"].as_array().unwrap().clone()
}

/// The stored head branch of a session of tenant `default`, as wire items.
async fn stored(proxy: &Proxy, session: &str) -> Vec<Value> {
    let branch = proxy
        .store()
        .await
        .head_branch("default", session)
        .await
        .unwrap();
    branch.into_iter().map(|m| m.body).collect()
}

/// Position of the last user message item: the current turn starts there.
fn current_turn_start(items: &[Value]) -> usize {
    items.iter().rposition(|i| i["role"] == "user").unwrap()
}

/// Drives a 30-call agent: each call is asked for by a user message, answered with a
/// `function_call_output`, and acknowledged by the model. With `chained`, the client sends only
/// the new items and `previous_response_id`; otherwise it resends the whole input.
async fn windowed_agent(chained: bool) {
    let (proxy, mock) =
        proxy_and_mock(ProxyOptions::default().only_tenant("default", WINDOWED)).await;
    let tools = json!([{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]);
    let mut full: Vec<Value> = Vec::new();
    let mut calls: Vec<String> = Vec::new();
    let mut previous: Option<String> = None;
    let mut session: Option<String> = None;
    for k in 0..30 {
        for step in 0..2 {
            let new = if step == 0 {
                vec![json!({"role": "user", "content": format!("call lookup {{\"n\": {k}}}")})]
            } else {
                vec![
                    json!({"type": "function_call_output", "call_id": calls[k], "output": format!("result {k}"), "x_trace": k}),
                ]
            };
            full.extend(new.iter().cloned());
            let mut body = json!({"model": "gpt-4o-mini", "tools": tools, "store": false});
            match (&previous, chained) {
                (Some(id), true) => {
                    body["input"] = Value::Array(new);
                    body["previous_response_id"] = json!(id);
                }
                _ => body["input"] = Value::Array(full.clone()),
            }
            let (resp, sid) = respond(&proxy, &body).await;
            assert_eq!(
                session.get_or_insert(sid.clone()),
                &sid,
                "one session throughout"
            );
            let out = output(&resp);
            if step == 0 {
                assert_eq!(out[0]["type"], "function_call", "{resp}");
                calls.push(out[0]["call_id"].as_str().unwrap().to_string());
            } else {
                assert_eq!(out[0]["type"], "message", "{resp}");
            }
            full.extend(out);
            previous = resp["id"].as_str().map(str::to_string);
        }
    }

    let requests = mock.requests();
    assert_eq!(requests.len(), 60);
    for (n, r) in requests.iter().enumerate() {
        let body = r.body_json().unwrap();
        assert!(body.get("previous_response_id").is_none(), "request {n}");
        assert_eq!(body["store"], false);
        let input = body["input"].as_array().unwrap();
        check_items(input).unwrap_or_else(|e| panic!("request {n}: {e}"));
        let (k, step) = (n / 2, n % 2);
        let start = current_turn_start(input);
        let history_calls = call_ids(&input[..start]);
        assert_eq!(history_calls, calls[k.saturating_sub(3)..k], "request {n}");
        let current_calls = call_ids(&input[start..]);
        assert_eq!(current_calls, calls[k..k + step], "request {n}");
        // The client's own fields on results survive the rewrite.
        for item in input.iter().filter(|i| i["type"] == "function_call_output") {
            assert!(item.get("x_trace").is_some(), "{item}");
        }
    }

    // Nothing the window dropped is lost: the store has the whole conversation.
    let kept = stored(&proxy, session.as_deref().unwrap()).await;
    assert_eq!(kept.len(), full.len());
    assert_eq!(call_ids(&kept), calls);
    check_items(&kept).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_keeps_last_three_calls_when_client_resends_input() {
    windowed_agent(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_keeps_last_three_calls_with_previous_response_id() {
    windowed_agent(true).await;
}

#[tokio::test]
async fn unknown_items_and_fields_reach_upstream_and_store_verbatim() {
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    let f = fixture("mixed_items.json");
    let items = f["input"].as_array().unwrap().clone();
    let body = json!({
        "model": "gpt-4o-mini",
        "instructions": f["instructions"],
        "input": items,
        "include": ["reasoning.encrypted_content"],
        "reasoning": {"effort": "low", "x_new": 1},
        "some_future_field": {"nested": [1, "two"]},
    });
    let (resp, session) = respond(&proxy, &body).await;
    assert_eq!(
        resp["output"][0]["content"][0]["text"],
        format!("ok: {} messages", items.len())
    );
    let sent = mock.requests()[0].body_json().unwrap();
    assert_eq!(sent, body, "the request went up unchanged");

    let reply = output(&resp);
    let mut expected = items.clone();
    expected.extend(reply.iter().cloned());
    assert_eq!(stored(&proxy, &session).await, expected);

    // The stored items come back verbatim when the proxy rebuilds the input.
    let next = json!({"role": "user", "content": "more", "x_client": "kept"});
    let (_, again) = respond(
        &proxy,
        &json!({"model": "gpt-4o-mini", "previous_response_id": resp["id"], "input": [next]}),
    )
    .await;
    assert_eq!(again, session);
    expected.push(next);
    let sent = mock.requests()[1].body_json().unwrap();
    assert_eq!(sent["input"], Value::Array(expected.clone()));
    assert!(
        sent.get("instructions").is_none(),
        "instructions are not carried over"
    );
    assert_eq!(stored(&proxy, &session).await.len(), expected.len() + 1);
}

#[tokio::test]
async fn previous_response_id_is_resolved_into_full_input() {
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    let (first, session) = respond(&proxy, &json!({"model": "m", "input": "hello"})).await;
    let (second, again) = respond(
        &proxy,
        &json!({"model": "m", "input": "again", "previous_response_id": first["id"], "stream": false}),
    )
    .await;
    assert_eq!(again, session);
    assert_eq!(second["output"][0]["content"][0]["text"], "ok: 3 messages");
    let sent = mock.requests()[1].body_json().unwrap();
    assert!(sent.get("previous_response_id").is_none());
    assert_eq!(types(sent["input"].as_array().unwrap()), ["message"; 3]);
    assert_eq!(sent["input"][1], output(&first)[0]);

    // Streamed, with the session also named by the header: still resolved.
    let resp = client()
        .post(format!("{}/responses", proxy.base_url()))
        .header("x-session-id", &session)
        .json(&json!({"model": "m", "input": "third", "stream": true, "previous_response_id": second["id"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["x-ctxproxy-session"], session.as_str());
    let text = resp.text().await.unwrap();
    assert!(text.contains("ok: 5 messages"), "{text}");
    let sent = mock.requests()[2].body_json().unwrap();
    assert!(sent.get("previous_response_id").is_none());
    assert_eq!(sent["input"].as_array().unwrap().len(), 5);
    // The stream ends only once its reply is stored, so a client can continue at once.
    assert_eq!(stored(&proxy, &session).await.len(), 6);
}

/// New input items under a `previous_response_id` follow the previous response, instructions
/// (`developer`, `system`) too: sent where they come and stored, so later turns keep them, as
/// OpenAI's own chain does.
#[tokio::test]
async fn instructions_in_a_continuation_are_stored_where_they_come() {
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    let (first, session) = respond(&proxy, &json!({"model": "m", "input": "hello"})).await;
    let terse = json!({"role": "developer", "content": "be terse"});
    let second_q = json!({"role": "user", "content": "second"});
    let (second, _) = respond(
        &proxy,
        &json!({"model": "m", "input": [terse, second_q], "previous_response_id": first["id"]}),
    )
    .await;
    let sent = mock.requests()[1].body_json().unwrap();
    let roles: Vec<&str> = sent["input"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["role"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(roles, ["user", "assistant", "developer", "user"]);
    let (_, again) = respond(
        &proxy,
        &json!({"model": "m", "input": "third", "previous_response_id": second["id"]}),
    )
    .await;
    assert_eq!(again, session);
    let kept = stored(&proxy, &session).await;
    assert_eq!(kept[2], terse, "{kept:?}");
    let sent = mock.requests()[2].body_json().unwrap();
    assert_eq!(sent["input"][2], terse, "a later turn still has it");
}

#[tokio::test]
async fn unknown_previous_response_id_is_forwarded_and_stored_in_a_new_session() {
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    let (_, known) = respond(&proxy, &json!({"model": "m", "input": "hello"})).await;
    let input =
        json!([{"type": "function_call_output", "call_id": "call_upstream_only", "output": "42"}]);
    let (resp, session) = respond(
        &proxy,
        &json!({"model": "m", "input": input, "previous_response_id": "resp_not_ours"}),
    )
    .await;
    assert_ne!(session, known);
    assert_eq!(resp["previous_response_id"], "resp_not_ours");
    let sent = mock.requests()[1].body_json().unwrap();
    assert_eq!(sent["previous_response_id"], "resp_not_ours");
    // The upstream knows the call this output answers: the items go as received, unrepaired.
    assert_eq!(sent["input"], input);
    let kept = stored(&proxy, &session).await;
    assert_eq!(kept[0], input[0]);
    assert_eq!(kept.len(), 2, "the output and the reply");
}

/// The audit's case (SPEC 7): a chain the proxy stores, begun from a response only the upstream
/// holds, keeps that root. Each continuation sends the root as `previous_response_id` with every
/// stored item after it, as stored (a rewrite would be blind: repair would drop the output of a
/// call only the upstream knows); the preview shows what the real call sends.
async fn chain_from_an_upstream_response_keeps_its_root(opts: ProxyOptions) {
    let (proxy, mock) = proxy_and_mock(opts).await;
    let root = "resp_unknown_zz";
    let x =
        json!({"type": "function_call_output", "call_id": "call_upstream_only", "output": "42"});
    let (first, session) = respond(
        &proxy,
        &json!({"model": "gpt-4o", "input": [x], "previous_response_id": root}),
    )
    .await;
    let sent = mock.requests()[0].body_json().unwrap();
    assert_eq!(sent["previous_response_id"], root);

    let y = json!({"role": "user", "content": "y"});
    let (second, again) = respond(
        &proxy,
        &json!({"model": "gpt-4o", "input": [y], "previous_response_id": first["id"]}),
    )
    .await;
    assert_eq!(again, session, "the session of the known response");
    let sent = mock.requests()[1].body_json().unwrap();
    assert_eq!(sent["previous_response_id"], root, "{sent}");
    let mut expected = vec![x];
    expected.extend(output(&first));
    expected.push(y);
    assert_eq!(sent["input"], Value::Array(expected.clone()));

    // Streamed, a turn further: the reply of a rooted request is rooted too.
    let z = json!({"role": "user", "content": "z"});
    let resp = client()
        .post(format!("{}/responses", proxy.base_url()))
        .bearer_auth("sk-test")
        .json(&json!({"model": "gpt-4o", "input": [z], "stream": true, "previous_response_id": second["id"]}))
        .send()
        .await
        .unwrap();
    let text = resp.text().await.unwrap();
    let sent = mock.requests()[2].body_json().unwrap();
    assert_eq!(sent["previous_response_id"], root);
    expected.extend(output(&second));
    expected.push(z);
    assert_eq!(sent["input"], Value::Array(expected.clone()));
    let completed = sse_data(&text)
        .into_iter()
        .filter_map(|d| serde_json::from_str::<Value>(&d).ok())
        .find(|e| e["type"] == "response.completed")
        .expect("a completed event");
    let third = &completed["response"];

    // Everything is stored, on one branch of the one session.
    expected.extend(output(third));
    assert_eq!(stored(&proxy, &session).await, expected);
    let (_, detail) = proxy
        .admin_get(&format!("/ctxproxy/v1/sessions/default/{session}"))
        .await;
    assert_eq!(detail["branches"].as_array().unwrap().len(), 1, "{detail}");

    // The preview agrees with the real call.
    let next = json!({"model": "gpt-4o", "input": "w", "previous_response_id": third["id"]});
    let (status, previewed) = preview(&proxy, "sk-test", &next).await;
    assert_eq!(status, 200, "{previewed}");
    respond(&proxy, &next).await;
    let sent = mock.requests()[3].body_json().unwrap();
    assert_eq!(sent["previous_response_id"], root);
    assert_eq!(previewed["input"], sent["input"]);
    assert_eq!(sent["input"].as_array().unwrap().len(), expected.len() + 1);
}

#[tokio::test]
async fn chain_from_an_upstream_response_keeps_its_root_on_sqlite() {
    chain_from_an_upstream_response_keeps_its_root(ProxyOptions::default()).await;
}

#[tokio::test]
async fn chain_from_an_upstream_response_keeps_its_root_on_postgres() {
    let Some(db) = common::pg::PgTestDb::create().await else {
        return;
    };
    let opts = ProxyOptions {
        database_url: Some(db.url.clone()),
        ..ProxyOptions::default()
    };
    chain_from_an_upstream_response_keeps_its_root(opts).await;
}

/// A response of another session than the one the header names is not resolved: its id goes
/// upstream as it came, with the items as received, and the preview shows the same.
#[tokio::test]
async fn previous_response_of_another_session_is_forwarded_and_previewed_alike() {
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    let (first, _) = respond(&proxy, &json!({"model": "m", "input": "hello"})).await;
    let (_, other) = respond(&proxy, &json!({"model": "m", "input": "elsewhere"})).await;
    let input =
        json!([{"type": "function_call_output", "call_id": "call_upstream_only", "output": "42"}]);
    let body = json!({"model": "m", "input": input, "previous_response_id": first["id"]});
    let resp = client()
        .post(proxy.url("/ctxproxy/v1/preview/responses"))
        .header("x-session-id", &other)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let previewed: Value = resp.json().await.unwrap();
    let resp = client()
        .post(format!("{}/responses", proxy.base_url()))
        .header("x-session-id", &other)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["x-ctxproxy-session"], other.as_str());
    let sent = mock.requests()[2].body_json().unwrap();
    assert_eq!(sent["previous_response_id"], first["id"]);
    assert_eq!(sent["input"], input);
    assert_eq!(previewed["input"], sent["input"]);
}

/// The audit's case: in a `keys: any` tenant each client brings its own provider key, and a
/// response id belongs to the key that made it, as it does at the provider. Another key's
/// `previous_response_id` is unknown to the proxy: forwarded as it came, in a session of its
/// own (previewed alike), and the first client's session is left as it was. The key that made
/// it continues it.
#[tokio::test]
async fn a_response_id_is_continued_only_with_the_key_that_made_it() {
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    let url = format!("{}/responses", proxy.base_url());
    let post = |key: &str, body: &Value| client().post(&url).bearer_auth(key).json(body).send();
    let resp = post(
        "sk-alice",
        &json!({"model": "m", "input": "my PIN is 4321"}),
    )
    .await
    .unwrap();
    let alice = resp.headers()["x-ctxproxy-session"]
        .to_str()
        .unwrap()
        .to_string();
    let first: Value = resp.json().await.unwrap();
    let input = json!([{"role": "user", "content": "what did I say?"}]);
    let body = json!({"model": "m", "input": input, "previous_response_id": first["id"]});

    let (status, previewed) = preview(&proxy, "sk-bob", &body).await;
    assert_eq!(status, 200);
    assert_eq!(previewed["input"], input, "{previewed}");

    let resp = post("sk-bob", &body).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_ne!(resp.headers()["x-ctxproxy-session"], alice.as_str());
    let sent = mock.requests()[1].body_json().unwrap();
    assert_eq!(sent["previous_response_id"], first["id"], "{sent}");
    assert_eq!(sent["input"], input, "nothing of alice's: {sent}");
    assert_eq!(
        stored(&proxy, &alice).await.len(),
        2,
        "alice's session untouched"
    );

    let resp = post("sk-alice", &body).await.unwrap();
    assert_eq!(resp.headers()["x-ctxproxy-session"], alice.as_str());
    let sent = mock.requests()[2].body_json().unwrap();
    assert!(sent.get("previous_response_id").is_none(), "{sent}");
    assert_eq!(sent["input"].as_array().unwrap().len(), 3, "{sent}");
}

/// The re-audit's case: a client's key is its credential however presented (an Azure client's
/// `api-key` header, another Authorization scheme), and a client without one is a client too:
/// none of them continues another's response by its id.
#[tokio::test]
async fn a_response_id_is_kept_from_clients_with_other_credentials() {
    type Credential = &'static [(&'static str, &'static str)];
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    let url = format!("{}/responses", proxy.base_url());
    // Sends `body` with `credential`; returns the body the mock received.
    let send = |credential: Credential, body: Value| {
        let req = credential
            .iter()
            .fold(client().post(&url).json(&body), |req, (k, v)| {
                req.header(*k, *v)
            });
        let mock = &mock;
        async move {
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status(), 200);
            let answer: Value = resp.json().await.unwrap();
            (answer, mock.requests().last().unwrap().body_json().unwrap())
        }
    };
    let cases: [(Credential, Credential); 4] = [
        (&[("api-key", "azure-one")], &[("api-key", "azure-two")]),
        (
            &[("authorization", "Token one")],
            &[("authorization", "Token two")],
        ),
        (&[], &[("authorization", "Bearer sk-other")]),
        (&[("authorization", "Bearer sk-one")], &[]),
    ];
    for (made_by, asked_by) in cases {
        let (first, _) = send(made_by, json!({"model": "m", "input": "secret"})).await;
        let next = json!({"model": "m", "input": "next", "previous_response_id": first["id"]});
        let (_, sent) = send(asked_by, next.clone()).await;
        assert_eq!(
            sent["previous_response_id"], first["id"],
            "{made_by:?} {asked_by:?}: {sent}"
        );
        // The same credential continues it.
        let (_, sent) = send(made_by, next).await;
        assert!(
            sent.get("previous_response_id").is_none(),
            "{made_by:?}: {sent}"
        );
    }
}

#[tokio::test]
async fn tool_access_reads_responses_tools_and_items() {
    let tenant = "keys: any\nupstream:\n  base_url: {upstream}\ntools:\n  roles:\n    viewer: [lookup]\n  default_role: viewer\n  scrub_history: true\n";
    let (proxy, mock) =
        proxy_and_mock(ProxyOptions::default().only_tenant("default", tenant)).await;
    let tools = json!([
        {"type": "function", "name": "lookup", "parameters": {"type": "object"}},
        {"type": "function", "name": "delete_all", "parameters": {"type": "object"}}
    ]);
    let forbidden_call = json!([
        {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "c1", "name": "delete_all", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "done"}
    ]);
    // A call to a forbidden tool in the current turn is refused before anything is sent.
    let resp = client()
        .post(format!("{}/responses", proxy.base_url()))
        .json(&json!({"model": "m", "input": forbidden_call, "tools": tools}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(assert_openai_error(&body)["code"], "tool_not_allowed");
    assert!(mock.requests().is_empty());

    // In the history it is scrubbed; the tools offered are cut to the role's.
    let mut input = forbidden_call.as_array().unwrap().clone();
    input.push(json!({"role": "user", "content": "next"}));
    respond(
        &proxy,
        &json!({"model": "m", "input": input, "tools": tools}),
    )
    .await;
    let sent = mock.requests()[0].body_json().unwrap();
    assert_eq!(sent["tools"], json!([tools[0]]));
    let sent_input = sent["input"].as_array().unwrap();
    check_items(sent_input).unwrap();
    assert!(call_ids(sent_input).is_empty(), "{sent}");
    assert_eq!(sent_input.len(), 2);
}

/// A client that started with a string `input` and then resends the conversation as typed
/// `message` items continues the same session on the same branch (SPEC 4.2, 7).
#[tokio::test]
async fn resent_history_with_typed_message_items_continues_the_session() {
    let (proxy, _mock) = proxy_and_mock(ProxyOptions::default()).await;
    let (first, session) = respond(
        &proxy,
        &json!({"model": "gpt-4o-mini", "input": "hello there"}),
    )
    .await;
    let mut input = vec![json!({"type": "message", "role": "user", "content": "hello there"})];
    input.extend(output(&first));
    input.push(json!({"type": "message", "role": "user", "content": "and then?"}));
    let (_, again) = respond(&proxy, &json!({"model": "gpt-4o-mini", "input": input})).await;
    assert_eq!(again, session, "auto matching found the session");
    let items = stored(&proxy, &session).await;
    assert_eq!(
        items.len(),
        4,
        "one branch, nothing stored twice: {items:?}"
    );
    let (status, detail) = proxy
        .admin_get(&format!("/ctxproxy/v1/sessions/default/{session}"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(detail["branches"].as_array().unwrap().len(), 1, "{detail}");
}

/// Posts `body` to the Responses preview as tenant `default`; returns status and JSON body.
async fn preview(proxy: &Proxy, key: &str, body: &Value) -> (u16, Value) {
    let resp = client()
        .post(proxy.url("/ctxproxy/v1/preview/responses"))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

/// The audit's cases (SPEC 5.3, 7): the preview report names every item not sent, once, by
/// its index in `input`, with its own role; a dropped reasoning item and each dropped call
/// separately.
#[tokio::test]
async fn preview_report_names_every_dropped_item_by_its_input_index() {
    let cases = [
        (
            "tool_call_window: {max: 1, unit: call}",
            json!([
                {"index": 2, "role": "assistant", "reason": "tool_call_window"},
                {"index": 3, "role": "assistant", "reason": "tool_call_window"},
                {"index": 4, "role": "assistant", "reason": "tool_call_window"},
                {"index": 5, "role": "tool", "reason": "tool_call_window"},
                {"index": 6, "role": "tool", "reason": "tool_call_window"},
            ]),
        ),
        (
            "tool_filter: {include: [search]}",
            json!([
                {"index": 7, "role": "assistant", "reason": "tool_filter"},
                {"index": 8, "role": "assistant", "reason": "tool_filter"},
                {"index": 9, "role": "tool", "reason": "tool_filter"},
            ]),
        ),
    ];
    let items = fixture("parallel_turns.json")["input"].clone();
    for (policy, expected) in cases {
        let tenant =
            format!("keys: any\nupstream:\n  base_url: {{upstream}}\npolicy:\n  {policy}\n");
        let (proxy, mock) =
            proxy_and_mock(ProxyOptions::default().only_tenant("default", &tenant)).await;
        let (status, body) =
            preview(&proxy, "sk-test", &json!({"model": "m", "input": items})).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["report"]["removed"], expected, "{policy}");
        let sent = body["input"].as_array().unwrap();
        check_items(sent).unwrap();
        let unsent = items
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| !sent.contains(i))
            .count();
        assert_eq!(unsent, expected.as_array().unwrap().len(), "{policy}");
        assert!(mock.requests().is_empty());
    }
}

#[tokio::test]
async fn preview_repair_names_the_unanswered_call_item() {
    let (proxy, _mock) = proxy_and_mock(ProxyOptions::default()).await;
    let items = fixture("unanswered_in_turn.json")["input"].clone();
    let (status, body) = preview(&proxy, "sk-test", &json!({"model": "m", "input": items})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["report"]["repaired"],
        json!([{"index": 4, "kind": "unanswered_call"}])
    );
    assert_eq!(body["report"]["removed"], json!([]));
    assert_eq!(call_ids(body["input"].as_array().unwrap()), ["c1"]);
}

/// A forbidden call in the current turn is refused naming `input`, the field that holds the
/// Responses conversation (chat names `messages`), on the real route and the preview.
#[tokio::test]
async fn forbidden_call_in_the_current_turn_names_input() {
    use sha2::Digest;
    let tenant = format!(
        "keys:\n  - sha256: {}\n    role: viewer\nupstream:\n  base_url: {{upstream}}\n  api_key_env: HOME\ntools:\n  roles:\n    viewer: [search_web]\n    finance: [search_web, get_account_balance]\n  default_role: viewer\n",
        hex::encode(sha2::Sha256::digest(b"sk-viewer"))
    );
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default().only_tenant("corp", &tenant)).await;
    let input = json!([
        {"role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "c1", "name": "get_account_balance", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "100"}
    ]);
    let body = json!({"model": "m", "input": input});
    let resp = client()
        .post(format!("{}/responses", proxy.base_url()))
        .bearer_auth("sk-viewer")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(assert_openai_error(&err)["code"], "tool_not_allowed");
    assert_eq!(err["error"]["param"], "input", "{err}");

    let (status, err) = preview(&proxy, "sk-viewer", &body).await;
    assert_eq!(status, 403);
    assert_eq!(err["error"]["code"], "tool_not_allowed");
    assert_eq!(err["error"]["param"], "input", "{err}");

    // Chat keeps naming its own field.
    let resp = client()
        .post(format!("{}/chat/completions", proxy.base_url()))
        .bearer_auth("sk-viewer")
        .json(&json!({"model": "m", "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_account_balance", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "100"}
        ]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["param"], "messages", "{err}");
    assert!(mock.requests().is_empty());
}

/// OpenAI takes a Responses request with no `input` when its conversation is elsewhere (a
/// stored `prompt`, an upstream `conversation`, a `previous_response_id`), as the SDK's
/// `responses.create(prompt=...)` sends it: it goes without one. Without any of those, a
/// missing `input` is a 400 naming it (SPEC 3).
#[tokio::test]
async fn input_may_be_left_out_only_where_the_conversation_is_elsewhere() {
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    let post = |body: Value| {
        client()
            .post(format!("{}/responses", proxy.base_url()))
            .json(&body)
            .send()
    };
    let resp = post(json!({"model": "m"})).await.unwrap();
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(assert_openai_error(&v)["param"], "input");
    assert!(mock.requests().is_empty());

    let prompt = json!({"id": "pmpt_1", "variables": {"city": "Paris"}});
    let resp = post(json!({"model": "m", "prompt": prompt})).await.unwrap();
    assert_eq!(resp.status(), 200);
    let sent = mock.requests()[0].body_json().unwrap();
    assert!(sent.get("input").is_none(), "no input added: {sent}");
    assert_eq!(sent["prompt"], prompt);
    // An input the client did send, even empty, goes as sent.
    let resp = post(json!({"model": "m", "prompt": prompt, "input": []}))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let sent = mock.requests()[1].body_json().unwrap();
    assert_eq!(sent["input"], json!([]), "{sent}");
}

/// Reads a Responses stream until its `response.created` event; the response id it names.
async fn created_response_id(stream: &mut reqwest::Response) -> String {
    let mut text = String::new();
    loop {
        let chunk = stream.chunk().await.unwrap().expect("response.created");
        text.push_str(&String::from_utf8_lossy(&chunk));
        if let Some(data) = sse_data(&text)
            .into_iter()
            .find(|d| d.contains("response.created"))
        {
            let event: Value = serde_json::from_str(&data).unwrap();
            return event["response"]["id"].as_str().unwrap().to_string();
        }
    }
}

/// A Responses stream names its response in its first event. A client that cancels the stream
/// there (or acts on that event) and continues from that id at once continues the same
/// conversation: its `previous_response_id` waits until the stream's reply and id are stored,
/// instead of being taken for an id the proxy does not know.
#[tokio::test]
async fn continuing_from_a_response_still_streaming_waits_for_it() {
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    let mut first = client()
        .post(format!("{}/responses", proxy.base_url()))
        .header("x-mock-chunk-delay-ms", "150")
        .json(&json!({"model": "m", "stream": true, "input": "hi"}))
        .send()
        .await
        .unwrap();
    let session = first.headers()["x-ctxproxy-session"].clone();
    let id = created_response_id(&mut first).await;
    drop(first);
    let next = client()
        .post(format!("{}/responses", proxy.base_url()))
        .json(&json!({"model": "m", "input": "next", "previous_response_id": id}))
        .send()
        .await
        .unwrap();
    assert_eq!(next.status(), 200);
    assert_eq!(next.headers()["x-ctxproxy-session"], session);
    let sent = mock.requests()[1].body_json().unwrap();
    assert!(sent.get("previous_response_id").is_none(), "{sent}");
    let input = sent["input"].as_array().unwrap();
    assert_eq!(input.len(), 3, "question, its reply, the next one: {sent}");
}

/// Another process sharing the database may be streaming the response a request continues
/// from: the id is not stored yet, but that stream holds the session's lease until it is.
/// A request naming the session waits for the lease and looks the id up again, instead of
/// forwarding it unresolved (here the test plays the other process: it holds the lease, then
/// records the response and lets go).
#[tokio::test]
async fn an_id_another_process_is_still_streaming_is_looked_up_once_the_session_is_free() {
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    let url = format!("{}/responses", proxy.base_url());
    let first = client()
        .post(&url)
        .header("x-session-id", "shared")
        .json(&json!({"model": "m", "input": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    proxy.state.pending.settle_all().await;
    let store = proxy.state.store.clone();
    let head = store
        .get_session("default", "shared")
        .await
        .unwrap()
        .unwrap()
        .head
        .unwrap();
    let other = store
        .lock_session(
            "default",
            "shared",
            std::time::Duration::from_secs(30),
            std::time::Duration::ZERO,
        )
        .await
        .unwrap();
    let next = tokio::spawn(
        client()
            .post(&url)
            .header("x-session-id", "shared")
            .json(&json!({"model": "m", "input": "next", "previous_response_id": "resp_elsewhere"}))
            .send(),
    );
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    store
        .record_response("default", "resp_elsewhere", "shared", head, None, None)
        .await
        .unwrap();
    store.unlock_session(&other).await.unwrap();
    assert_eq!(next.await.unwrap().unwrap().status(), 200);
    let sent = mock.requests()[1].body_json().unwrap();
    assert!(sent.get("previous_response_id").is_none(), "{sent}");
    assert_eq!(sent["input"].as_array().unwrap().len(), 3, "{sent}");
}

/// The wait for a response still streaming is bounded as a wait for a session is, by the
/// tenant's `timeout_s`: after it the id is looked up as it stands (here: not stored yet, so
/// forwarded as an unknown id), not held for as long as the stream runs.
#[tokio::test]
async fn the_wait_for_a_streaming_response_is_bounded_by_the_tenant_timeout() {
    let tenant = "keys: any\nupstream:\n  base_url: {upstream}\n  timeout_s: 1\n";
    let (proxy, mock) =
        proxy_and_mock(ProxyOptions::default().only_tenant("default", tenant)).await;
    let mut first = client()
        .post(format!("{}/responses", proxy.base_url()))
        .header("x-mock-chunk-delay-ms", "700")
        .json(&json!({"model": "m", "stream": true, "input": "hi"}))
        .send()
        .await
        .unwrap();
    let id = created_response_id(&mut first).await;
    let next = client()
        .post(format!("{}/responses", proxy.base_url()))
        .json(&json!({"model": "m", "input": "next", "previous_response_id": id}))
        .send()
        .await
        .unwrap();
    assert_eq!(next.status(), 200);
    let sent = mock.requests()[1].body_json().unwrap();
    assert_eq!(
        sent["previous_response_id"],
        json!(id),
        "not resolved: {sent}"
    );
    while first.chunk().await.unwrap().is_some() {}
}

/// A fake Responses upstream that answers a request of one input item (a conversation's first
/// turn) as a reasoning model cut off by `max_output_tokens` does: `incomplete`, with a
/// reasoning item and nothing after it. Later turns get a plain message. Returns its `/v1` base
/// URL and the bodies it received, in order.
async fn reasoning_only_upstream() -> (String, std::sync::Arc<std::sync::Mutex<Vec<Value>>>) {
    use axum::routing::post;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
    let log = seen.clone();
    let answer = move |axum::Json(body): axum::Json<Value>| {
        let log = log.clone();
        async move {
            let n = {
                let mut log = log.lock().unwrap();
                log.push(body.clone());
                log.len()
            };
            let first = body["input"].as_array().is_none_or(|i| i.len() == 1);
            let reply = if first {
                json!({"id": format!("resp_c{n}"), "object": "response", "status": "incomplete",
                    "incomplete_details": {"reason": "max_output_tokens"},
                    "output": [{"type": "reasoning", "id": "rs_c5", "summary": []}]})
            } else {
                json!({"id": format!("resp_c{n}"), "object": "response", "status": "completed",
                    "output": [{"type": "message", "id": format!("msg_{n}"), "role": "assistant",
                        "status": "completed",
                        "content": [{"type": "output_text", "text": "fine", "annotations": []}]}]})
            };
            axum::Json(reply)
        }
    };
    let app = axum::Router::new().route("/v1/responses", post(answer));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/v1"), seen)
}

/// The audit's case (SPEC 5 step 7, 7): a reply that is only a reasoning item (a reasoning
/// model that hit `max_output_tokens`) is stored as it came, but a later turn does not send
/// that reasoning item, which OpenAI refuses without the item it led; repair reports it. Both
/// for a server-history session and for a `previous_response_id` chain.
#[tokio::test]
async fn a_reply_of_reasoning_alone_is_not_sent_on_later_turns() {
    let (upstream, seen) = reasoning_only_upstream().await;
    let server = "keys: any\nupstream:\n  base_url: {upstream}\nsession:\n  history: server\n";
    let opts = ProxyOptions::default().only_tenant("default", server);
    let proxy = Proxy::start(opts, &upstream).await;
    let ask = |input: &str| {
        client()
            .post(format!("{}/responses", proxy.base_url()))
            .header("x-session-id", "s-rs")
            .json(&json!({"model": "o3", "input": input}))
            .send()
    };
    let first: Value = ask("hard question").await.unwrap().json().await.unwrap();
    assert_eq!(first["status"], "incomplete");
    let resp = ask("second").await.unwrap();
    assert_eq!(resp.status(), 200);
    let sent = seen.lock().unwrap()[1]["input"].clone();
    assert_eq!(
        sent,
        json!([{"role": "user", "content": "hard question"}, {"role": "user", "content": "second"}]),
        "the reasoning item goes only with an item it leads"
    );
    // Stored as received, reasoning included; the record names the reasoning as repaired.
    let kept = stored(&proxy, "s-rs").await;
    assert_eq!(kept[1], output(&first)[0], "{kept:?}");
    assert_eq!(kept.len(), 4, "{kept:?}");
    let records = proxy.request_records("default", "s-rs").await;
    let repaired = &records[1]["report"]["repaired"];
    assert_eq!(
        repaired,
        &json!([{"index": 1, "kind": "empty_assistant"}]),
        "{records:?}"
    );

    // A `previous_response_id` chain, in client history mode: the same.
    let proxy = Proxy::start(ProxyOptions::default(), &upstream).await;
    let (first, _) = respond(&proxy, &json!({"model": "o3", "input": "hard question"})).await;
    let (_, _) = respond(
        &proxy,
        &json!({"model": "o3", "input": "second", "previous_response_id": first["id"]}),
    )
    .await;
    let sent = seen.lock().unwrap().last().unwrap()["input"].clone();
    assert_eq!(
        types(sent.as_array().unwrap()),
        ["message", "message"],
        "{sent}"
    );
}

/// The Responses audit's cases (SPEC 7, 5 step 7): a request in an upstream `conversation`
/// continues history the proxy never saw, as an unknown `previous_response_id` does. A tool
/// loop sends only the new `function_call_output`: it goes as received, not dropped as an
/// orphan (OpenAI would answer "No tool output found"); and server mode does not prepend the
/// stored head, whose items the conversation already holds (OpenAI refuses duplicates).
#[tokio::test]
async fn an_upstream_conversation_goes_with_its_items_as_received() {
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    for conversation in [json!("conv_68ab"), json!({"id": "conv_68ab"})] {
        let input = json!([{"type": "function_call_output", "call_id": "call_up", "output": "42"}]);
        let body = json!({"model": "m", "conversation": conversation, "input": input});
        let (status, previewed) = preview(&proxy, "sk-test", &body).await;
        assert_eq!(status, 200, "{previewed}");
        assert_eq!(previewed["input"], input);
        assert_eq!(previewed["report"]["repaired"], json!([]));
        let before = mock.requests().len();
        respond(&proxy, &body).await;
        let sent = mock.requests()[before].body_json().unwrap();
        assert_eq!(sent["input"], input, "{sent}");
        assert_eq!(sent["conversation"], conversation);
    }

    // With a stored `previous_response_id` beside it (which OpenAI refuses), the request goes
    // as received: resolving the id would resend what the conversation holds.
    let (first, _) = respond(
        &proxy,
        &json!({"model": "m", "conversation": "conv_both", "input": "hello"}),
    )
    .await;
    let body = json!({"model": "m", "conversation": "conv_both", "previous_response_id": first["id"], "input": "again"});
    let before = mock.requests().len();
    respond(&proxy, &body).await;
    let sent = mock.requests()[before].body_json().unwrap();
    assert_eq!(
        sent["input"],
        json!([{"role": "user", "content": "again"}]),
        "{sent}"
    );
    assert_eq!(sent["previous_response_id"], first["id"]);

    // Server mode, both turns in one conversation: the second sends its own item only.
    let server = |text: &str| {
        client()
            .post(format!("{}/responses", proxy.base_url()))
            .header("x-ctxproxy-history", "server")
            .header("x-session-id", "conv-session")
            .json(&json!({"model": "m", "conversation": "conv_abc", "input": text}))
            .send()
    };
    assert_eq!(server("first").await.unwrap().status(), 200);
    let before = mock.requests().len();
    assert_eq!(server("second").await.unwrap().status(), 200);
    let sent = mock.requests()[before].body_json().unwrap();
    assert_eq!(
        sent["input"],
        json!([{"role": "user", "content": "second"}]),
        "{sent}"
    );
    // Stored after the session's head, as the client sends only what is new.
    let kept = stored(&proxy, "conv-session").await;
    assert_eq!(kept.len(), 4);
    assert_eq!(kept[0], json!({"role": "user", "content": "first"}));
    assert_eq!(kept[2], json!({"role": "user", "content": "second"}));

    // Without a session named, the conversation's turns find the session of its last turn (as
    // a `previous_response_id` does its response's), for the key that made it; each sends its
    // own items, and the session holds the whole conversation in order.
    let mut session = None;
    for (k, text) in ["one", "two", "three"].iter().enumerate() {
        let before = mock.requests().len();
        let (_, s) = respond(
            &proxy,
            &json!({"model": "m", "conversation": {"id": "conv_chain"}, "input": text}),
        )
        .await;
        assert_eq!(*session.get_or_insert(s.clone()), s, "turn {k}");
        let sent = mock.requests()[before].body_json().unwrap();
        assert_eq!(sent["input"], json!([{"role": "user", "content": text}]));
    }
    let kept = stored(&proxy, session.as_deref().unwrap()).await;
    let users: Vec<&Value> = kept.iter().map(|i| &i["content"]).step_by(2).collect();
    assert_eq!(users, ["one", "two", "three"]);
    assert_eq!(kept.len(), 6);
    // Another key's request in the same conversation id is another client's: a session of its
    // own.
    let other = client()
        .post(format!("{}/responses", proxy.base_url()))
        .bearer_auth("sk-other")
        .json(&json!({"model": "m", "conversation": "conv_chain", "input": "four"}))
        .send()
        .await
        .unwrap();
    assert_ne!(
        other.headers()["x-ctxproxy-session"].to_str().unwrap(),
        session.as_deref().unwrap()
    );
}

/// The Responses audit's cases (SPEC 7): a client that sends stored items by reference (the
/// Vercel AI SDK with `store: true`). An output after an `item_reference` whose call the proxy
/// cannot see is sent, not repaired away as an orphan; a reference to a reasoning item goes
/// with the call it leads when a step removes that call.
#[tokio::test]
async fn items_sent_by_reference_keep_their_outputs_and_reasoning_goes_with_its_call() {
    let tenant = "keys: any\nupstream:\n  base_url: {upstream}\npolicy:\n  tool_filter: {exclude: [debug_tool]}\n";
    let (proxy, _mock) =
        proxy_and_mock(ProxyOptions::default().only_tenant("default", tenant)).await;
    let by_reference = json!([
        {"role": "user", "content": "run grammar tool"},
        {"type": "item_reference", "id": "ctc_68a1"},
        {"type": "custom_tool_call_output", "call_id": "call_Xyz", "output": "tool result 42"},
        {"type": "item_reference", "id": "fc_68a2"},
        {"type": "function_call_output", "call_id": "call_Abc", "output": "7"},
    ]);
    let body = json!({"model": "gpt-5", "input": by_reference, "tools": [{"type": "custom", "name": "grammar"}]});
    let (status, previewed) = preview(&proxy, "sk-test", &body).await;
    assert_eq!(status, 200, "{previewed}");
    assert_eq!(previewed["input"], by_reference);
    assert_eq!(previewed["report"]["repaired"], json!([]));

    // A second output for a referenced call answers it twice: it goes.
    let twice = json!([
        {"role": "user", "content": "q"},
        {"type": "item_reference", "id": "fc_1"},
        {"type": "function_call_output", "call_id": "call_1", "output": "a"},
        {"type": "function_call_output", "call_id": "call_1", "output": "b"},
        {"role": "user", "content": "q2"},
    ]);
    let (_, previewed) = preview(&proxy, "sk-test", &json!({"model": "m", "input": twice})).await;
    assert_eq!(
        previewed["input"],
        json!([twice[0], twice[1], twice[2], twice[4]]),
        "{previewed}"
    );
    assert_eq!(
        previewed["report"]["repaired"],
        json!([{"index": 3, "kind": "orphan_result"}])
    );

    // An output with no call at all, and no reference it could be, is still an orphan.
    let orphan = json!([
        {"role": "user", "content": "q"},
        {"type": "function_call_output", "call_id": "call_gone", "output": "x"},
        {"type": "item_reference", "id": "msg_1"},
    ]);
    let (_, previewed) = preview(&proxy, "sk-test", &json!({"model": "m", "input": orphan})).await;
    assert_eq!(
        previewed["report"]["repaired"],
        json!([{"index": 1, "kind": "orphan_result"}])
    );

    // A reasoning reference that leads nothing goes, as a reasoning item there does.
    let lone = json!([
        {"role": "user", "content": "q"},
        {"type": "item_reference", "id": "rs_1"},
        {"type": "function_call_output", "call_id": "call_1", "output": "x"},
        {"role": "user", "content": "q2"},
    ]);
    let (_, previewed) = preview(&proxy, "sk-test", &json!({"model": "m", "input": lone})).await;
    assert_eq!(previewed["input"], json!([lone[0], lone[3]]), "{previewed}");
    assert_eq!(
        previewed["report"]["repaired"],
        json!([{"index": 1, "kind": "empty_assistant"}, {"index": 2, "kind": "orphan_result"}])
    );

    let reasoning_by_reference = json!([
        {"role": "user", "content": "q1"},
        {"type": "item_reference", "id": "rs_abc"},
        {"type": "function_call", "id": "fc_1", "call_id": "d1", "name": "debug_tool", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "d1", "output": "dbg"},
        {"type": "item_reference", "id": "msg_abc"},
        {"role": "user", "content": "q2"},
    ]);
    let (status, previewed) = preview(
        &proxy,
        "sk-test",
        &json!({"model": "m", "input": reasoning_by_reference}),
    )
    .await;
    assert_eq!(status, 200, "{previewed}");
    let items = reasoning_by_reference.as_array().unwrap();
    assert_eq!(
        previewed["input"],
        json!([items[0], items[4], items[5]]),
        "the reasoning reference went with its call"
    );
    assert_eq!(
        previewed["report"]["removed"],
        json!([
            {"index": 1, "role": "assistant", "reason": "tool_filter"},
            {"index": 2, "role": "assistant", "reason": "tool_filter"},
            {"index": 3, "role": "tool", "reason": "tool_filter"},
        ])
    );
}

/// Posts a Responses request in `conversation` with `key`; the status and session.
async fn in_conversation(
    proxy: &Proxy,
    key: &str,
    conversation: &str,
    text: &str,
) -> (u16, String) {
    let resp = client()
        .post(format!("{}/responses", proxy.base_url()))
        .bearer_auth(key)
        .json(&json!({"model": "m", "conversation": conversation, "input": text}))
        .send()
        .await
        .unwrap();
    let session = resp.headers()["x-ctxproxy-session"]
        .to_str()
        .unwrap()
        .to_string();
    (resp.status().as_u16(), session)
}

/// The final re-check's cases: first turns of one new conversation sent at once make one
/// session; two keys in one conversation each keep their own session; a first turn that failed
/// is retried in its own session, not a second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_conversation_is_one_session_per_key_whatever_the_timing() {
    use ctxproxy::mock_upstream::ScriptEntry;
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    let (a, b, c) = tokio::join!(
        in_conversation(&proxy, "sk-a", "conv_at_once", "one"),
        in_conversation(&proxy, "sk-a", "conv_at_once", "two"),
        in_conversation(&proxy, "sk-a", "conv_at_once", "three"),
    );
    assert_eq!((a.1 == b.1, b.1 == c.1), (true, true), "{a:?} {b:?} {c:?}");
    assert_eq!(stored(&proxy, &a.1).await.len(), 6);

    let mut sessions = std::collections::HashMap::new();
    for key in ["sk-1", "sk-2", "sk-1", "sk-2", "sk-1"] {
        let (_, session) = in_conversation(&proxy, key, "conv_two_keys", key).await;
        assert_eq!(
            *sessions.entry(key).or_insert(session.clone()),
            session,
            "{key}"
        );
    }
    assert_ne!(sessions["sk-1"], sessions["sk-2"]);

    mock.set_script(vec![ScriptEntry {
        matches: "first try".into(),
        status: 500,
        content: "overloaded".into(),
    }]);
    let (status, failed) = in_conversation(&proxy, "sk-a", "conv_retried", "first try").await;
    assert_eq!(status, 500);
    mock.set_script(Vec::new());
    let (status, retried) = in_conversation(&proxy, "sk-a", "conv_retried", "first try").await;
    assert_eq!((status, &retried), (200, &failed));
    let kept = stored(&proxy, &failed).await;
    assert_eq!(
        kept.len(),
        2,
        "the retried turn once, and its reply: {kept:?}"
    );
}

/// The framework audit's case (the Vercel AI SDK with `store`, its default): earlier replies
/// come back as `item_reference`s. Those to reply items the proxy stored, for the same key,
/// are the items themselves: the conversation matches its session (auto matching), nothing is
/// stored twice, and the upstream gets the items (a provider without stored state can read
/// them). Another key's reference stays a reference.
#[tokio::test]
async fn references_to_stored_replies_are_the_replies() {
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    let (first, session) = respond(&proxy, &json!({"model": "m", "input": "hi"})).await;
    let reply = output(&first)[0].clone();
    let reply_id = reply["id"].as_str().unwrap().to_string();
    let input = json!([
        {"role": "user", "content": "hi"},
        {"type": "item_reference", "id": reply_id},
        {"role": "user", "content": "again"},
    ]);
    let before = mock.requests().len();
    let (_, again) = respond(&proxy, &json!({"model": "m", "input": input})).await;
    assert_eq!(again, session, "the conversation continues its session");
    let sent = mock.requests()[before].body_json().unwrap();
    assert_eq!(sent["input"][1], reply, "{sent}");
    let kept = stored(&proxy, &session).await;
    assert_eq!(kept.len(), 4, "{kept:?}");
    assert_eq!(kept[1], reply);

    // Turn after turn, each sent the moment the last answer came (its reply may still be being
    // written): every reference is resolved, and the session stays one branch.
    let mut items = kept.clone();
    for n in 0..10 {
        let replies: Vec<Value> = items
            .iter()
            .map(|i| match i["id"].as_str() {
                Some(id) => json!({"type": "item_reference", "id": id}),
                None => i.clone(),
            })
            .collect();
        let mut input = replies;
        input.push(json!({"role": "user", "content": format!("turn {n}")}));
        let before = mock.requests().len();
        let (answer, s) = respond(&proxy, &json!({"model": "m", "input": input})).await;
        assert_eq!(s, session, "turn {n}");
        let sent = mock.requests()[before].body_json().unwrap();
        assert!(
            !sent.to_string().contains("item_reference"),
            "turn {n}: {sent}"
        );
        items.push(json!({"role": "user", "content": format!("turn {n}")}));
        items.extend(output(&answer));
    }
    assert_eq!(stored(&proxy, &session).await, items);

    // The preview resolves it alike.
    let (status, previewed) =
        preview(&proxy, "sk-test", &json!({"model": "m", "input": input})).await;
    assert_eq!(status, 200);
    assert_eq!(previewed["input"][1], reply);

    // Another client's key: its reference is not this client's reply.
    let other = client()
        .post(format!("{}/responses", proxy.base_url()))
        .bearer_auth("sk-other")
        .json(&json!({"model": "m", "input": input}))
        .send()
        .await
        .unwrap();
    assert_ne!(
        other.headers()["x-ctxproxy-session"].to_str().unwrap(),
        session
    );
    let sent = mock.requests().last().unwrap().body_json().unwrap();
    assert_eq!(sent["input"][1], input[1]);
}
