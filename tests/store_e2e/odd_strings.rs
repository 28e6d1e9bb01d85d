//! Strings a JSON body may carry but a store column might not: the NUL character in a request's
//! `user`, `model` or `previous_response_id`, and in names the admin API is asked for. Both
//! backends answer as OpenAI would (PostgreSQL's text cannot hold NUL: it used to refuse the
//! request with 503 store_unavailable, or silently lose its record).

use serde_json::json;

use super::common::*;
use super::{Backend, chat, user};

async fn nul_in_user_and_model_is_served_and_recorded(b: Backend) {
    let (proxy, _mock) = proxy_and_mock(b.options()).await;
    let body = json!({"model": "gpt\u{0}x", "user": "bo\u{0}b", "messages": [user("hi")]});
    let a = chat(&proxy.base_url(), "sk-a", &[("x-session-id", "nul")], &body).await;
    assert_eq!(a.status, 200, "{}", a.body);
    proxy.wait_for_records("default", "nul", 1).await;
    let (status, records) = proxy
        .admin_get("/ctxproxy/v1/sessions/default/nul/requests")
        .await;
    assert_eq!(status, 200, "{records}");
    let model = records[0]["model"].as_str().unwrap();
    assert!(
        model.starts_with("gpt") && model.ends_with('x'),
        "{model:?}"
    );
    assert_eq!(proxy.store_errors_total().await, 0.0);

    // Auto matching is scoped by `user`: the same user, NUL and all, continues the session.
    let first = chat(&proxy.base_url(), "sk-a", &[], &body).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let reply = first.body["choices"][0]["message"].clone();
    let next = json!({"model": "gpt\u{0}x", "user": "bo\u{0}b",
        "messages": [user("hi"), reply, user("more")]});
    let second = chat(&proxy.base_url(), "sk-a", &[], &next).await;
    assert_eq!(second.status, 200, "{}", second.body);
    assert_eq!(first.session, second.session);
}

async fn nul_in_previous_response_id_is_an_unknown_id(b: Backend) {
    let (proxy, mock) = proxy_and_mock(b.options()).await;
    let resp = client()
        .post(format!("{}/responses", proxy.base_url()))
        .bearer_auth("sk-a")
        .json(
            &json!({"model": "gpt-4o-mini", "input": "hi", "previous_response_id": "resp_\u{0}x"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let sent = mock.requests()[0].body_json().unwrap();
    assert_eq!(
        sent["previous_response_id"], "resp_\u{0}x",
        "forwarded unchanged"
    );
}

async fn nul_in_admin_names_is_not_found(b: Backend) {
    let (proxy, _mock) = proxy_and_mock(b.options()).await;
    for path in [
        "/ctxproxy/v1/sessions/default/a%00b",
        "/ctxproxy/v1/sessions/default/a%00b/messages",
        "/ctxproxy/v1/sessions/default/a%00b/requests",
        "/ctxproxy/v1/sessions/de%00fault/x",
    ] {
        let (status, body) = proxy.admin_get(path).await;
        assert_eq!(status, 404, "{path}: {body}");
    }
    let (status, body) = proxy.admin_get("/ctxproxy/v1/sessions?after=a%00b").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "after");
    let (status, body) = proxy
        .admin_get("/ctxproxy/v1/sessions?tenant=de%00fault")
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"], json!([]));
    let resp = client()
        .delete(proxy.url("/ctxproxy/v1/sessions/default/a%00b"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    assert_eq!(proxy.store_errors_total().await, 0.0);
}

on_both_backends!(
    nul_in_user_and_model_is_served_and_recorded,
    nul_in_previous_response_id_is_an_unknown_id,
    nul_in_admin_names_is_not_found,
);
