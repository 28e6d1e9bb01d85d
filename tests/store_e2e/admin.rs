//! The admin API as a client pages and audits it (SPEC 3, 4.2): the session list pages both by
//! the proxy's `next` cursor and OpenAI-style by the last session id seen, a session id that is
//! unknown or shared by two tenants is an OpenAI-shaped 400 on `after`, and a streamed reply's
//! request record keeps the rebuilt choice (with its finish reason) and the usage.

use std::time::Duration;

use serde_json::{Value, json};

use super::common::*;
use super::sessions::{ACME_KEY, two_tenants};
use super::{Backend, chat, request, user};

/// Opens session `id` with one turn (so it is stored with a reply), then waits a little so the
/// next session is usually updated later (equal times are paged correctly too).
async fn open_session(base: &str, key: &str, id: &str) {
    let answer = chat(base, key, &[("x-session-id", id)], &request(&[user(id)])).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    tokio::time::sleep(Duration::from_millis(5)).await;
}

/// Every page of the session list from `first_query`, each following query made by `follow`
/// from the previous page. Checks the OpenAI list fields of every page on the way.
async fn all_pages(
    proxy: &Proxy,
    first_query: &str,
    follow: impl Fn(&Value) -> String,
) -> Vec<String> {
    let mut ids = Vec::new();
    let mut query = first_query.to_string();
    for _ in 0..20 {
        let (status, page) = proxy
            .admin_get(&format!("/ctxproxy/v1/sessions?{query}"))
            .await;
        assert_eq!(status, 200, "{query}: {page}");
        assert_eq!(page["object"], "list", "{page}");
        let data = page["data"].as_array().unwrap();
        let page_ids: Vec<String> = data
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(
            page["first_id"].as_str(),
            page_ids.first().map(String::as_str)
        );
        assert_eq!(
            page["last_id"].as_str(),
            page_ids.last().map(String::as_str)
        );
        let has_more = page["has_more"].as_bool().expect("has_more is a boolean");
        assert_eq!(has_more, page["next"].is_string(), "{page}");
        ids.extend(page_ids);
        if !has_more {
            return ids;
        }
        query = follow(&page);
    }
    panic!("the session list never ended");
}

async fn session_list_pages_by_next_cursor_and_by_last_session_id(b: Backend) {
    let (proxy, _mock) = proxy_and_mock(b.options()).await;
    let base = proxy.base_url();
    for i in 0..5 {
        open_session(&base, "sk-a", &format!("page-{i}")).await;
    }
    let newest_first: Vec<String> = (0..5).rev().map(|i| format!("page-{i}")).collect();

    let by_cursor = all_pages(&proxy, "tenant=default&limit=2", |page| {
        format!(
            "tenant=default&limit=2&after={}",
            page["next"].as_str().unwrap()
        )
    })
    .await;
    assert_eq!(by_cursor, newest_first, "pages by the proxy's cursor");

    let by_id = all_pages(&proxy, "tenant=default&limit=2", |page| {
        format!(
            "tenant=default&limit=2&after={}",
            page["last_id"].as_str().unwrap()
        )
    })
    .await;
    assert_eq!(by_id, newest_first, "pages by the last id seen");

    // Without a tenant too, while the id names one session only; an empty `tenant=` names none.
    let by_id = all_pages(&proxy, "limit=3", |page| {
        format!("limit=3&after={}", page["last_id"].as_str().unwrap())
    })
    .await;
    assert_eq!(by_id, newest_first);
    let by_id = all_pages(&proxy, "tenant=&limit=3", |page| {
        format!(
            "tenant=&limit=3&after={}",
            page["last_id"].as_str().unwrap()
        )
    })
    .await;
    assert_eq!(by_id, newest_first);

    // Empty fields, as a form sends them, are as if absent.
    let (status, page) = proxy
        .admin_get("/ctxproxy/v1/sessions?tenant=&limit=&after=")
        .await;
    assert_eq!(status, 200, "{page}");
    let ids: Vec<&str> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, newest_first);

    let (status, page) = proxy.admin_get("/ctxproxy/v1/sessions?after=page-0").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["data"], json!([]), "nothing is older than the oldest");
    assert_eq!(page["has_more"], false);
    assert_eq!(page["first_id"], Value::Null);
    assert_eq!(page["last_id"], Value::Null);
}

/// Asserts a 400 `invalid_request_error` on `after` and returns its message.
fn bad_after(status: u16, body: &Value) -> String {
    assert_eq!(status, 400, "{body}");
    let err = assert_openai_error(body);
    assert_eq!(err["type"], "invalid_request_error", "{body}");
    assert_eq!(err["param"], "after", "{body}");
    err["message"].as_str().unwrap().to_string()
}

async fn session_list_after_an_unknown_or_ambiguous_session_id_is_a_400(b: Backend) {
    let (proxy, _mock) = proxy_and_mock(two_tenants(&b)).await;
    let base = proxy.base_url();
    open_session(&base, ACME_KEY, "dup").await;
    open_session(&base, ACME_KEY, "acme-only").await;
    open_session(&base, "sk-anyone", "dup").await;
    open_session(&base, "sk-anyone", "open-only").await;

    let (status, body) = proxy.admin_get("/ctxproxy/v1/sessions?after=dup").await;
    let message = bad_after(status, &body);
    assert!(
        message.contains("acme") && message.contains("open") && message.contains("tenant"),
        "the ambiguity is explained: {message}"
    );

    // Within a tenant the id is unique: acme's list after its "dup" is empty (acme-only is
    // newer), open's after its "dup" likewise.
    for tenant in ["acme", "open"] {
        let (status, page) = proxy
            .admin_get(&format!("/ctxproxy/v1/sessions?tenant={tenant}&after=dup"))
            .await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(page["data"], json!([]), "{tenant}: {page}");
    }
    let (status, page) = proxy
        .admin_get("/ctxproxy/v1/sessions?tenant=acme&after=acme-only")
        .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["first_id"], "dup");
    assert_eq!(page["data"][0]["tenant"], "acme");

    // Known, but in another tenant than the one asked for; or known nowhere.
    let (status, body) = proxy
        .admin_get("/ctxproxy/v1/sessions?tenant=acme&after=open-only")
        .await;
    bad_after(status, &body);
    let (status, body) = proxy
        .admin_get("/ctxproxy/v1/sessions?after=no-such-session")
        .await;
    bad_after(status, &body);

    // A limit that is not a page size of 1 to 1000 names `limit` (not silently 1 or 1000).
    for limit in ["-1", "lots", "0", "1001"] {
        let (status, body) = proxy
            .admin_get(&format!("/ctxproxy/v1/sessions?limit={limit}"))
            .await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(assert_openai_error(&body)["param"], "limit", "{body}");
    }
    // A unique id needs no tenant: after open-only (newest) come the three others.
    let (status, page) = proxy
        .admin_get("/ctxproxy/v1/sessions?after=open-only")
        .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["data"].as_array().unwrap().len(), 3, "{page}");
}

async fn streamed_chat_record_keeps_the_rebuilt_choice_and_usage(b: Backend) {
    let (proxy, _mock) = proxy_and_mock(b.options()).await;
    let mut body = request(&[user("stream me")]);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let resp = client()
        .post(format!("{}/chat/completions", proxy.base_url()))
        .header("x-session-id", "streamed")
        .bearer_auth("sk-a")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let sse = resp.text().await.unwrap();
    let streamed_usage = sse_data(&sse)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|v| v.get("usage").filter(|u| !u.is_null()).cloned())
        .expect("the stream carried usage");

    proxy.wait_for_records("default", "streamed", 1).await;
    let records = proxy.request_records("default", "streamed").await;
    assert_eq!(
        records[0]["choices"],
        json!([{
            "index": 0,
            "message": {"role": "assistant", "content": "ok: 1 messages", "refusal": null},
            "logprobs": null,
            "finish_reason": "stop",
        }]),
        "the one choice, rebuilt from the deltas: {}",
        records[0]
    );
    assert_eq!(records[0]["usage"], streamed_usage, "{}", records[0]);
    assert!(records[0]["usage"]["prompt_tokens"].as_u64().unwrap() > 0);

    // A whole (n = 1) answer is recorded the same way, as the upstream sent it.
    let answer = chat(
        &proxy.base_url(),
        "sk-a",
        &[("x-session-id", "whole")],
        &request(&[user("whole please")]),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    proxy.wait_for_records("default", "whole", 1).await;
    let records = proxy.request_records("default", "whole").await;
    assert_eq!(records[0]["choices"], answer.body["choices"]);
    assert_eq!(records[0]["usage"], answer.body["usage"]);
}

/// An admin DELETE of a session whose request is still waiting on the upstream: the client
/// gets its answer, the reply has nowhere to go, and that is no store error to alert on.
async fn a_session_deleted_while_its_request_runs_is_no_store_error(b: Backend) {
    let (proxy, mock) = proxy_and_mock(b.options()).await;
    let errors_before = proxy.store_errors_total().await;
    let slow = tokio::spawn(
        client()
            .post(format!("{}/chat/completions", proxy.base_url()))
            .header("x-session-id", "doomed")
            .header("x-mock-delay-ms", "1000")
            .bearer_auth("sk-a")
            .json(&request(&[user("hi")]))
            .send(),
    );
    while mock.requests().is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let deleted = client()
        .delete(proxy.url("/ctxproxy/v1/sessions/default/doomed"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert!(deleted.status().is_success(), "{}", deleted.status());
    let answer = slow.await.unwrap().unwrap();
    assert_eq!(answer.status(), 200);
    proxy.store().await;
    let (status, _) = proxy
        .admin_get("/ctxproxy/v1/sessions/default/doomed")
        .await;
    assert_eq!(status, 404, "the deleted session stays deleted");
    assert_eq!(proxy.store_errors_total().await, errors_before);
}

/// A session deleted while its request runs and begun again under the same id at once: the
/// old request's reply and record stay out of the new session, which holds its own turn only.
async fn a_deleted_session_begun_again_keeps_nothing_of_the_old_request(b: Backend) {
    let (proxy, mock) = proxy_and_mock(b.options()).await;
    let slow = tokio::spawn(
        client()
            .post(format!("{}/chat/completions", proxy.base_url()))
            .header("x-session-id", "reborn")
            .header("x-mock-delay-ms", "1500")
            .bearer_auth("sk-a")
            .json(&request(&[user("old")]))
            .send(),
    );
    while mock.requests().is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let deleted = client()
        .delete(proxy.url("/ctxproxy/v1/sessions/default/reborn"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert!(deleted.status().is_success(), "{}", deleted.status());
    let new = chat(
        &proxy.base_url(),
        "sk-a",
        &[("x-session-id", "reborn")],
        &request(&[user("new")]),
    )
    .await;
    assert_eq!(new.status, 200, "{}", new.body);
    assert_eq!(slow.await.unwrap().unwrap().status(), 200);
    proxy.store().await;
    let records = proxy.request_records("default", "reborn").await;
    assert_eq!(records.len(), 1, "only the new request's: {records:?}");
    let messages = proxy.stored_messages("default", "reborn").await;
    let texts: Vec<_> = messages.iter().map(|m| m["content"].clone()).collect();
    assert_eq!(texts.len(), 2, "{messages:?}");
    assert_eq!(texts[0], "new", "{messages:?}");
}

/// A request waiting for a session's lease when the session is deleted takes the session as
/// begun again under its id, instead of waiting out its timeout for a lease nobody holds.
async fn a_request_waiting_for_a_deleted_session_begins_it_again(b: Backend) {
    let tenant = "keys: any\nupstream:\n  base_url: {upstream}\n  timeout_s: 20\nsession:\n  history: server\n";
    let opts = ProxyOptions {
        tenants: vec![("default".into(), tenant.into())],
        ..b.options()
    };
    let (proxy, mock) = proxy_and_mock(opts).await;
    let ask = |text: &'static str, delay: &'static str| {
        client()
            .post(format!("{}/chat/completions", proxy.base_url()))
            .header("x-session-id", "waited")
            .header("x-mock-delay-ms", delay)
            .bearer_auth("sk-a")
            .json(&request(&[user(text)]))
            .send()
    };
    let holder = tokio::spawn(ask("old", "1500"));
    while mock.requests().is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let waiter = tokio::spawn(ask("new", "0"));
    // The waiter is waiting for the lease once its turn has no other way to go.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let deleted = client()
        .delete(proxy.url("/ctxproxy/v1/sessions/default/waited"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert!(deleted.status().is_success(), "{}", deleted.status());
    assert_eq!(holder.await.unwrap().unwrap().status(), 200);
    let answer = waiter.await.unwrap().unwrap();
    assert_eq!(answer.status(), 200, "{}", answer.text().await.unwrap());
    let body: Value = answer.json().await.unwrap();
    assert_eq!(
        body["choices"][0]["message"]["content"], "ok: 1 messages",
        "the new session holds nothing of the deleted one"
    );
    let messages = proxy.stored_messages("default", "waited").await;
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[0]["content"], "new");
}

/// Deletes racing requests on one session, whichever step of opening its turn a delete lands
/// between (the session made, its lease taken, its messages stored): every request is answered,
/// its session begun again under its id, never a 404 or a 500.
async fn requests_racing_deletes_of_their_session_are_all_answered(b: Backend) {
    let (proxy, _mock) = proxy_and_mock(b.options()).await;
    let base = proxy.base_url();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let deleter = {
        let (done, url) = (
            done.clone(),
            proxy.url("/ctxproxy/v1/sessions/default/raced"),
        );
        tokio::spawn(async move {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let deleted = client().delete(&url).bearer_auth(ADMIN_TOKEN).send().await;
                assert!(deleted.is_ok());
            }
        })
    };
    let posters = (0..4).map(|p| {
        let base = base.clone();
        tokio::spawn(async move {
            for i in 0..15 {
                let text = format!("hi {p}.{i}");
                let a = chat(
                    &base,
                    "sk-a",
                    &[("x-session-id", "raced")],
                    &request(&[user(&text)]),
                )
                .await;
                assert_eq!(a.status, 200, "{text}: {}", a.body);
            }
        })
    });
    for poster in futures_util::future::join_all(posters).await {
        poster.unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    deleter.await.unwrap();
}

/// A session route whose names do not decode to UTF-8 is an OpenAI-shaped 400, and only for
/// an admitted caller (401 without the token).
async fn an_undecodable_session_path_is_a_shaped_400_after_the_token(b: Backend) {
    let (proxy, _mock) = proxy_and_mock(b.options()).await;
    for path in [
        "/ctxproxy/v1/sessions/default/%ff%fe",
        "/ctxproxy/v1/sessions/%c0/x/messages",
    ] {
        let (status, body) = proxy.admin_get(path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert_eq!(assert_openai_error(&body)["type"], "invalid_request_error");
        let anonymous = client().get(proxy.url(path)).send().await.unwrap();
        assert_eq!(anonymous.status(), 401, "{path}");
    }
}

on_both_backends!(
    an_undecodable_session_path_is_a_shaped_400_after_the_token,
    requests_racing_deletes_of_their_session_are_all_answered,
    session_list_pages_by_next_cursor_and_by_last_session_id,
    session_list_after_an_unknown_or_ambiguous_session_id_is_a_400,
    streamed_chat_record_keeps_the_rebuilt_choice_and_usage,
    a_session_deleted_while_its_request_runs_is_no_store_error,
    a_deleted_session_begun_again_keeps_nothing_of_the_old_request,
    a_request_waiting_for_a_deleted_session_begins_it_again,
);
