//! Server history mode (SPEC 4.1) around failures and odd requests: a turn that got no answer
//! is left out of the next one (it stays stored on a branch of its own), a `previous_response_id`
//! the proxy does not know goes with the items as received (the upstream holds that history), a
//! conversation that assembles to nothing is a 400, and a request whose client left while it
//! waited for its session is not forwarded.

use std::time::Duration;

use serde_json::{Value, json};

use super::common::*;
use super::{Backend, chat, reply_message, upstream_histories, user, without_seq};
use ctxproxy::mock_upstream::MockHandle;

fn server(session: &str) -> Vec<(&str, &str)> {
    vec![("x-session-id", session), ("x-ctxproxy-history", "server")]
}

fn plain(messages: &[Value]) -> Value {
    json!({"model": "gpt-4o-mini", "messages": messages})
}

/// POSTs a Responses request in server mode on `session` (the upstream failing with `fail`, if
/// given); returns the answer's status.
async fn post_responses(proxy: &Proxy, session: &str, body: Value, fail: Option<&str>) -> u16 {
    let mut req = client()
        .post(format!("{}/responses", proxy.base_url()))
        .bearer_auth("sk-a")
        .header("x-session-id", session)
        .header("x-ctxproxy-history", "server")
        .json(&body);
    if let Some(s) = fail {
        req = req.header("x-mock-status", s);
    }
    req.send().await.unwrap().status().as_u16()
}

async fn a_turn_that_failed_is_left_out_of_the_next_one(b: Backend) {
    let (proxy, mock) = proxy_and_mock(b.options()).await;
    let base = proxy.base_url();
    let hello = reply_message(&chat(&base, "sk-a", &server("f"), &plain(&[user("hello")])).await);
    let mut failing = server("f");
    failing.push(("x-mock-status", "400"));
    let refused = chat(&base, "sk-a", &failing, &plain(&[user("look at BAD")])).await;
    assert_eq!(refused.status, 400, "{}", refused.body);
    let after = chat(&base, "sk-a", &server("f"), &plain(&[user("forget it")])).await;
    assert_eq!(after.status, 200, "{}", after.body);
    let answer = reply_message(&after);

    let upstream = upstream_histories(&mock);
    assert_eq!(
        upstream[2],
        [user("hello"), hello.clone(), user("forget it")],
        "the refused turn is not sent again"
    );
    let head = without_seq(&proxy.stored_messages("default", "f").await);
    assert_eq!(head, [user("hello"), hello, user("forget it"), answer]);
    // Nothing is lost: the refused message is stored, on its own branch.
    let (_, detail) = proxy.admin_get("/ctxproxy/v1/sessions/default/f").await;
    assert_eq!(detail["message_count"], 5, "{detail}");
    assert_eq!(detail["branches"].as_array().unwrap().len(), 2, "{detail}");
}

async fn unknown_previous_response_id_goes_with_the_items_as_received(b: Backend) {
    let (proxy, mock) = proxy_and_mock(b.options()).await;
    let post = |body: Value| post_responses(&proxy, "r", body, None);
    assert_eq!(
        post(json!({"model": "gpt-4o-mini", "input": "u1"})).await,
        200
    );
    let status = post(json!({
        "model": "gpt-4o-mini",
        "input": "u2",
        "previous_response_id": "resp_only_upstream_knows"
    }))
    .await;
    assert_eq!(status, 200);
    let sent = mock.requests()[1].body_json().unwrap();
    assert_eq!(sent["previous_response_id"], "resp_only_upstream_knows");
    let input = sent["input"].as_array().unwrap();
    assert_eq!(input.len(), 1, "only the request's own item: {sent}");
    assert_eq!(input[0]["content"], "u2");
}

async fn a_chain_begun_upstream_goes_on_from_its_root_in_server_mode(b: Backend) {
    let (proxy, mock) = proxy_and_mock(b.options()).await;
    let post = |body: Value| post_responses(&proxy, "rooted", body, None);
    let first = json!({"model": "gpt-4o-mini", "input": "a1", "previous_response_id": "resp_root"});
    assert_eq!(post(first).await, 200);
    assert_eq!(
        post(json!({"model": "gpt-4o-mini", "input": "a2"})).await,
        200
    );
    let sent = mock.requests()[1].body_json().unwrap();
    assert_eq!(
        sent["previous_response_id"], "resp_root",
        "what only the upstream holds is still part of the conversation: {sent}"
    );
    let input = sent["input"].as_array().unwrap();
    assert_eq!(input.len(), 3, "a1, its reply, a2: {sent}");
    assert_eq!(input[2]["content"], "a2");
    // And on from that reply, too.
    assert_eq!(
        post(json!({"model": "gpt-4o-mini", "input": "a3"})).await,
        200
    );
    let sent = mock.requests()[2].body_json().unwrap();
    assert_eq!(sent["previous_response_id"], "resp_root", "{sent}");
}

async fn a_failed_turn_on_a_branch_of_its_own_leaves_the_conversation_where_it_was(b: Backend) {
    let (proxy, mock) = proxy_and_mock(b.options()).await;
    let post =
        |body: Value, fail: Option<&'static str>| post_responses(&proxy, "moved", body, fail);
    assert_eq!(post(json!({"model": "m", "input": "r1"}), None).await, 200);
    // Sent as received (the upstream holds that history), stored from the root, and failed.
    let elsewhere = json!({"model": "m", "input": "x", "previous_response_id": "resp_unknown"});
    assert_eq!(post(elsewhere, Some("500")).await, 500);
    assert_eq!(
        post(json!({"model": "m", "input": "next"}), None).await,
        200
    );
    let sent = mock.requests()[2].body_json().unwrap();
    let input = sent["input"].as_array().unwrap();
    assert_eq!(input.len(), 3, "r1, its reply, next: {sent}");
    assert_eq!(input[0]["content"], "r1");
    assert_eq!(input[2]["content"], "next");
    assert!(sent.get("previous_response_id").is_none(), "{sent}");
}

async fn a_server_mode_request_with_nothing_to_send_is_a_400(b: Backend) {
    let (proxy, mock) = proxy_and_mock(b.options()).await;
    let base = proxy.base_url();
    let empty = chat(&base, "sk-a", &server("new"), &plain(&[])).await;
    assert_eq!(empty.status, 400, "{}", empty.body);
    assert_eq!(empty.body["error"]["param"], "messages", "{}", empty.body);
    let resp = client()
        .post(format!("{base}/responses"))
        .bearer_auth("sk-a")
        .header("x-session-id", "new-items")
        .header("x-ctxproxy-history", "server")
        .json(&json!({"model": "gpt-4o-mini", "input": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["param"], "input", "{body}");
    assert!(mock.requests().is_empty(), "nothing went upstream");

    // With stored history the same request continues it; the header's case does not count.
    let hello = chat(&base, "sk-a", &server("old"), &plain(&[user("hello")])).await;
    assert_eq!(hello.status, 200);
    let headers = [("x-session-id", "old"), ("x-ctxproxy-history", "Server")];
    let again = chat(&base, "sk-a", &headers, &plain(&[])).await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(mock.requests().len(), 2);
}

/// Holds `session` with a slow request, sends `messages` behind it from a client that gives up
/// while it waits, and returns once the holder is answered. `server`: server history mode.
async fn give_up_behind_a_slow_request(
    base: &str,
    mock: &MockHandle,
    session: &str,
    server_mode: bool,
) {
    let mode = if server_mode { "server" } else { "client" };
    let before = mock.requests().len();
    let holder = {
        let (base, session) = (base.to_string(), session.to_string());
        tokio::spawn(async move {
            let headers = [
                ("x-session-id", session.as_str()),
                ("x-ctxproxy-history", mode),
                ("x-mock-delay-ms", "1500"),
            ];
            chat(&base, "sk-a", &headers, &plain(&[user("first")])).await
        })
    };
    // The holder has the session once its request reached the upstream (on a loaded machine
    // that can take longer than any fixed pause).
    for _ in 0..400 {
        if mock.requests().len() > before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let gave_up = client()
        .post(format!("{base}/chat/completions"))
        .bearer_auth("sk-a")
        .header("x-session-id", session)
        .header("x-ctxproxy-history", mode)
        .timeout(Duration::from_millis(400))
        .json(&plain(&[user("first"), user("never mind")]))
        .send()
        .await;
    assert!(gave_up.is_err(), "the client gave up waiting");
    let first = holder.await.unwrap();
    assert_eq!(first.status, 200, "{}", first.body);
}

async fn a_request_whose_client_left_while_it_waited_is_not_forwarded(b: Backend) {
    let (proxy, mock) = proxy_and_mock(b.options()).await;
    let base = proxy.base_url();

    // Client mode: its messages went to the store with the lease; they stay, and its record
    // says 499.
    give_up_behind_a_slow_request(&base, &mock, "busy-client", false).await;
    proxy.wait_for_records("default", "busy-client", 2).await;
    let store = proxy.store().await;
    let records = store.list_requests("default", "busy-client").await.unwrap();
    let statuses: Vec<u16> = records.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 499]);

    // Server mode: nothing of it is stored (it would follow whatever came meanwhile, such as
    // the client's own retry), and the session is free at once.
    give_up_behind_a_slow_request(&base, &mock, "busy", true).await;
    let next = chat(&base, "sk-a", &server("busy"), &plain(&[user("next")])).await;
    assert_eq!(next.status, 200, "{}", next.body);
    assert_eq!(
        mock.requests().len(),
        3,
        "neither gave-up request went upstream"
    );
    let upstream = upstream_histories(&mock);
    assert_eq!(upstream[2].len(), 3, "{:?}", upstream[2]);
    assert_eq!(upstream[2][2], user("next"));
    let (_, detail) = proxy.admin_get("/ctxproxy/v1/sessions/default/busy").await;
    assert_eq!(
        detail["message_count"], 4,
        "first, its reply, next, its reply: {detail}"
    );
    let metrics = proxy.metrics_text().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("ctxproxy_requests_total")
                && l.contains("status=\"499\"")
                && l.ends_with(" 2")),
        "both counted as 499: {metrics}"
    );
}

/// A leading system message in a server-mode request stands in for the stored one for that
/// request only (SPEC 4.1): the branch keeps its own, and the one sent instead is kept with the
/// request's record (SPEC 4.2: nothing received is lost). Sending the stored one again keeps
/// nothing extra.
async fn a_system_message_sent_instead_of_the_stored_one_is_kept_in_the_record(b: Backend) {
    let (proxy, mock) = proxy_and_mock(b.options()).await;
    let base = proxy.base_url();
    let brief = json!({"role": "system", "content": "Be brief."});
    let pirate = json!({"role": "system", "content": "Talk like a pirate.", "x_kept": [1]});
    let first = reply_message(
        &chat(
            &base,
            "sk-a",
            &server("sys"),
            &plain(&[brief.clone(), user("hello")]),
        )
        .await,
    );
    let second = reply_message(
        &chat(
            &base,
            "sk-a",
            &server("sys"),
            &plain(&[pirate.clone(), user("again")]),
        )
        .await,
    );
    let third = reply_message(
        &chat(
            &base,
            "sk-a",
            &server("sys"),
            &plain(&[brief.clone(), user("thanks")]),
        )
        .await,
    );

    let upstream = upstream_histories(&mock);
    assert_eq!(
        upstream[1][0], pirate,
        "the pirate went upstream in place of the stored one"
    );
    let stored = without_seq(&proxy.stored_messages("default", "sys").await);
    assert_eq!(
        stored,
        [
            brief,
            user("hello"),
            first,
            user("again"),
            second,
            user("thanks"),
            third
        ],
        "the branch keeps its own system message"
    );
    let records = proxy.request_records("default", "sys").await;
    assert_eq!(records.len(), 3);
    assert_eq!(
        records[0]["system"],
        Value::Null,
        "the first turn stored it in the branch"
    );
    assert_eq!(records[1]["system"], json!([pirate]), "{}", records[1]);
    assert_eq!(
        records[2]["system"],
        Value::Null,
        "the stored one again: nothing replaced"
    );
}

on_both_backends!(
    a_system_message_sent_instead_of_the_stored_one_is_kept_in_the_record,
    a_turn_that_failed_is_left_out_of_the_next_one,
    unknown_previous_response_id_goes_with_the_items_as_received,
    a_chain_begun_upstream_goes_on_from_its_root_in_server_mode,
    a_failed_turn_on_a_branch_of_its_own_leaves_the_conversation_where_it_was,
    a_server_mode_request_with_nothing_to_send_is_a_400,
    a_request_whose_client_left_while_it_waited_is_not_forwarded,
);
