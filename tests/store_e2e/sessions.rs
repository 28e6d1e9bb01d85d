//! Which session a request lands in, and who can see it: auto matching without a header,
//! tenants (selected by key) that share a session id, and branches made by an edited turn.

use serde_json::Value;

use super::common::*;
use super::{Backend, chat, reply_message, request, upstream_histories, user, without_seq};

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

/// Two runs of one deterministic script (an eval, a replay, a temperature-0 model): the same
/// questions get the same answers, so every message of the second run is also in the first
/// run's session. The second run keeps a session of its own (SPEC 4: a new conversation is
/// never a branch of someone else's): the new turn's own messages, after the last reply, do not
/// make the first run's session the longer match. Runs that interleave are the same
/// conversation at every step, so which of the two sessions a turn continues cannot be told;
/// each turn continues a session's head, so both sessions stay whole, with no branch.
async fn two_identical_runs_keep_their_own_sessions(b: Backend) {
    let (proxy, _mock) = proxy_and_mock(b.options()).await;
    let base = proxy.base_url();
    let questions = ["What is 2 + 2?", "And times 3?", "Thanks."];
    // One turn of a run: its conversation so far plus the next question; the session it went to.
    let turn = |history: &mut Vec<Value>, q: &str| {
        history.push(user(q));
        let body = request(history);
        let base = base.clone();
        async move {
            let answer = chat(&base, "sk-a", &[], &body).await;
            assert_eq!(answer.status, 200, "{}", answer.body);
            (answer.session.clone().unwrap(), reply_message(&answer))
        }
    };

    let mut runs = [Vec::new(), Vec::new()];
    let mut sessions = [Vec::new(), Vec::new()];
    for k in 0..2 {
        for q in questions {
            let (session, reply) = turn(&mut runs[k], q).await;
            runs[k].push(reply);
            sessions[k].push(session);
        }
    }
    assert_eq!(runs[0], runs[1], "the same script");
    for k in 0..2 {
        assert!(
            sessions[k].iter().all(|s| *s == sessions[k][0]),
            "{sessions:?}"
        );
    }
    assert_ne!(sessions[0][0], sessions[1][0], "one session per run");
    for k in 0..2 {
        let stored = proxy.stored_messages("default", &sessions[k][0]).await;
        assert_eq!(without_seq(&stored), runs[k], "each session holds its run");
        proxy
            .state
            .store
            .delete_session("default", &sessions[k][0])
            .await
            .unwrap();
    }

    let mut runs = [Vec::new(), Vec::new()];
    let mut used = std::collections::BTreeSet::new();
    for q in questions {
        for run in runs.iter_mut() {
            let (session, reply) = turn(run, q).await;
            run.push(reply);
            used.insert(session);
        }
    }
    assert_eq!(used.len(), 2, "{used:?}");
    for session in &used {
        let stored = proxy.stored_messages("default", session).await;
        assert_eq!(without_seq(&stored), runs[0], "{session}: whole, in order");
        let (_, detail) = proxy
            .admin_get(&format!("/ctxproxy/v1/sessions/default/{session}"))
            .await;
        assert_eq!(detail["branches"].as_array().unwrap().len(), 1, "{detail}");
        proxy
            .state
            .store
            .delete_session("default", session)
            .await
            .unwrap();
    }

    // A run whose second turn failed, then a second run, then the first one's retry: the
    // retry goes back to its own session, whose unanswered turn it is.
    let mut a = Vec::new();
    let (a_session, reply) = turn(&mut a, questions[0]).await;
    a.push(reply);
    a.push(user(questions[1]));
    let failed = chat(&base, "sk-a", &[("x-mock-status", "500")], &request(&a)).await;
    assert_eq!(failed.status, 500, "{}", failed.body);
    let mut b_run = Vec::new();
    for q in &questions[..2] {
        let (session, reply) = turn(&mut b_run, q).await;
        b_run.push(reply);
        assert_ne!(session, a_session, "the second run has its own session");
    }
    let retried = chat(&base, "sk-a", &[], &request(&a)).await;
    assert_eq!(retried.status, 200, "{}", retried.body);
    assert_eq!(
        retried.session.as_deref(),
        Some(a_session.as_str()),
        "the retry found its turn"
    );
}

pub(super) const ACME_KEY: &str = "sk-proxy-acme-store-e2e";
const ACME_UPSTREAM_ENV: &str = "CTXPROXY_STORE_E2E_ACME_KEY";

pub(super) fn two_tenants(b: &Backend) -> ProxyOptions {
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

/// `metadata.session_id` names the session; the upstream does not get the key unless the client
/// asked OpenAI to store the completion (OpenAI refuses `metadata` on a chat completion without
/// `store`). Other metadata keys stay.
async fn metadata_session_id_names_the_session_and_is_not_forwarded_unless_stored(b: Backend) {
    let (proxy, mock) = proxy_and_mock(b.options()).await;
    let base = proxy.base_url();
    let cases = [
        (serde_json::json!({"session_id": "meta-1"}), None, None),
        (
            serde_json::json!({"session_id": "meta-2", "team": "ai"}),
            None,
            Some(serde_json::json!({"team": "ai"})),
        ),
        (
            serde_json::json!({"session_id": "meta-3"}),
            Some(true),
            Some(serde_json::json!({"session_id": "meta-3"})),
        ),
    ];
    for (i, (metadata, store, sent_metadata)) in cases.into_iter().enumerate() {
        let mut body = request(&[user("hi")]);
        body["metadata"] = metadata.clone();
        if let Some(store) = store {
            body["store"] = Value::Bool(store);
        }
        let answered = chat(&base, "sk-a", &[], &body).await;
        assert_eq!(answered.status, 200, "{}", answered.body);
        assert_eq!(answered.session.as_deref(), metadata["session_id"].as_str());
        let sent = mock.requests()[i].body_json().unwrap();
        assert_eq!(sent.get("metadata"), sent_metadata.as_ref(), "{sent}");
        let session = metadata["session_id"].as_str().unwrap();
        assert_eq!(proxy.stored_messages("default", session).await.len(), 2);
    }
}

/// A chat request with no messages is a 400 naming `messages`, before a session is made.
async fn a_chat_request_without_messages_is_refused_and_stores_nothing(b: Backend) {
    let (proxy, mock) = proxy_and_mock(b.options()).await;
    let answered = chat(
        &proxy.base_url(),
        "sk-a",
        &[("x-session-id", "empty")],
        &request(&[]),
    )
    .await;
    assert_eq!(answered.status, 400, "{}", answered.body);
    let error = assert_openai_error(&answered.body);
    assert_eq!(error["param"], "messages");
    assert!(mock.requests().is_empty());
    let (status, _) = proxy.admin_get("/ctxproxy/v1/sessions/default/empty").await;
    assert_eq!(status, 404, "no session was made");
    // The preview answers as the real call does.
    let preview = client()
        .post(proxy.url("/ctxproxy/v1/preview/chat/completions"))
        .json(&request(&[]))
        .send()
        .await
        .unwrap();
    assert_eq!(preview.status(), 400);
    let body: Value = preview.json().await.unwrap();
    assert_eq!(assert_openai_error(&body)["param"], "messages");
}

on_both_backends!(
    two_identical_runs_keep_their_own_sessions,
    metadata_session_id_names_the_session_and_is_not_forwarded_unless_stored,
    a_chat_request_without_messages_is_refused_and_stores_nothing,
    auto_mode_separates_conversations_and_finds_a_continued_one,
    tenants_sharing_a_session_id_never_see_each_other,
    edited_turn_makes_a_branch_and_both_stay_retrievable,
);
