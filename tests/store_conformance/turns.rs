//! Conformance: opening and closing a managed request's turn (`open_turn`, `close_turn`), which
//! each do several things in one call and must leave the same state the single calls would.

use std::time::Duration;

use ctxproxy::conversation::MessageId;
use ctxproxy::store::{
    Append, NewMessage, NewRequestRecord, Origin, Scope, Store, TurnClose, TurnOpen,
    conversation_key,
};
use serde_json::Value;

use super::{Fixture, msg};

const LONG: Duration = Duration::from_secs(60);
const SHORT: Duration = Duration::from_millis(50);

fn open(session: &str, append: Option<Append>, wait: Duration) -> TurnOpen {
    TurnOpen {
        tenant: "t".into(),
        session: session.into(),
        scope: Scope {
            key_hash: Some("k-turn".into()),
            user: Some("u-turn".into()),
        },
        ttl: LONG,
        wait,
        append,
    }
}

fn chain(parent: Option<MessageId>, bodies: &[Value], origin: Origin) -> Append {
    Append {
        parent,
        messages: NewMessage::chain(parent.as_ref(), bodies, origin),
    }
}

fn record(session: &str, head: Option<MessageId>) -> NewRequestRecord {
    NewRequestRecord {
        tenant: "t".into(),
        session: session.into(),
        head,
        endpoint: "responses".into(),
        status: 200,
        request_id: Some(format!("req-{session}")),
        ..Default::default()
    }
}

/// The lease is free: taking it with a short wait succeeds (and it is released again).
async fn lease_is_free(s: &dyn Store, session: &str) -> bool {
    match s.lock_session("t", session, LONG, SHORT).await {
        Ok(lease) => {
            s.unlock_session(&lease).await.unwrap();
            true
        }
        Err(_) => false,
    }
}

pub async fn a_turn_stores_request_reply_record_and_response_id(fx: &Fixture) {
    let s = fx.store.as_ref();
    let request = chain(
        None,
        &[msg("system", "be brief"), msg("user", "hi")],
        Origin::Client,
    );
    let last = request.messages.last().map(|m| m.id);
    let mut opened = s
        .open_turn(open("turn", Some(request), LONG))
        .await
        .unwrap();
    opened.committed.wait().await.unwrap();
    assert_eq!(opened.appended.len(), 2);
    assert!(opened.appended.iter().all(|a| a.new));
    // Created with the turn's scope, and locked.
    let session = s.get_session("t", "turn").await.unwrap().unwrap();
    assert_eq!(session.key_hash.as_deref(), Some("k-turn"));
    assert_eq!(session.user.as_deref(), Some("u-turn"));
    assert_eq!(session.head, last);
    assert!(!lease_is_free(s, "turn").await);

    let reply = chain(last, &[msg("assistant", "hello")], Origin::Reply);
    let reply_id = reply.messages[0].id;
    let closed = s
        .close_turn(TurnClose {
            reply: Some(reply),
            response_id: Some("resp_turn".into()),
            upstream_root: Some("resp_upstream_only".into()),
            key_hash: Some("k-turn".into()),
            conversation: Some(conversation_key("conv_turn", Some("k-turn"))),
            record: record("turn", last),
            lease: Some(opened.lease),
            awaited: false,
        })
        .await;
    assert!(closed.failures.is_empty(), "{:?}", closed.failures);
    let head = s.head_branch("t", "turn").await.unwrap();
    let contents: Vec<&Value> = head.iter().map(|m| &m.body["content"]).collect();
    assert_eq!(contents, ["be brief", "hi", "hello"]);
    assert_eq!(head[2].origin, Origin::Reply);
    let records = s.list_requests("t", "turn").await.unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(
        records[0].head,
        Some(reply_id),
        "the record ends on the reply"
    );
    let found = s.find_response("t", "resp_turn").await.unwrap().unwrap();
    assert_eq!((found.session.as_str(), found.message), ("turn", reply_id));
    assert_eq!(
        found.upstream_root.as_deref(),
        Some("resp_upstream_only"),
        "the id the request was forwarded with is kept with the response id"
    );
    assert_eq!(
        found.key_hash.as_deref(),
        Some("k-turn"),
        "and the key it was made with"
    );
    assert!(found.belongs_to(Some("k-turn")) && !found.belongs_to(Some("k-other")));
    assert!(
        !found.belongs_to(None),
        "a request without a key is another client"
    );
    // The upstream conversation the request continued names this session and its head, for
    // the conversation's next turn, with the key that made it.
    let conversation = s
        .find_response("t", &conversation_key("conv_turn", Some("k-turn")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (conversation.session.as_str(), conversation.message),
        ("turn", reply_id)
    );
    assert_eq!(conversation.upstream_root, None);
    assert!(conversation.belongs_to(Some("k-turn")));
    assert!(lease_is_free(s, "turn").await, "closing released the lease");

    // The next turn resends everything: only the new message is stored, and the session keeps
    // the scope it was created with.
    let bodies = [
        msg("system", "be brief"),
        msg("user", "hi"),
        msg("assistant", "hello"),
        msg("user", "again"),
    ];
    let mut next = open("turn", Some(chain(None, &bodies, Origin::Client)), LONG);
    next.scope = Scope::default();
    let mut opened = s.open_turn(next).await.unwrap();
    opened.committed.wait().await.unwrap();
    let new: Vec<bool> = opened.appended.iter().map(|a| a.new).collect();
    assert_eq!(new, [false, false, false, true]);
    let seqs: Vec<i64> = opened.appended.iter().map(|a| a.seq).collect();
    assert_eq!(seqs, [0, 1, 2, 3]);
    let session = s.get_session("t", "turn").await.unwrap().unwrap();
    assert_eq!(session.key_hash.as_deref(), Some("k-turn"));
    assert_eq!(session.message_count, 4);
    s.unlock_session(&opened.lease).await.unwrap();
}

/// A turn that finds the lease taken waits for it with one claim on the next turn: its first
/// try leaves none of its own behind to hold it up once the lease is free (a claim lasts 0.6 s
/// unrenewed, longer than this turn may wait).
pub async fn a_waiting_turn_is_not_held_up_by_its_own_first_try(fx: &Fixture) {
    let s = fx.store.clone();
    s.get_or_create_session("t", "first-try", &Scope::default())
        .await
        .unwrap();
    let held = s.lock_session("t", "first-try", LONG, LONG).await.unwrap();
    let waiter = {
        let s = s.clone();
        tokio::spawn(async move {
            let append = chain(None, &[msg("user", "queued")], Origin::Client);
            s.open_turn(open("first-try", Some(append), Duration::from_millis(450)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.unlock_session(&held).await.unwrap();
    let opened = waiter
        .await
        .unwrap()
        .expect("the turn got the lease once it was free");
    s.unlock_session(&opened.lease).await.unwrap();
}

pub async fn a_turn_waits_for_the_lease_before_appending(fx: &Fixture) {
    let s = fx.store.clone();
    s.get_or_create_session("t", "busy", &Scope::default())
        .await
        .unwrap();
    let held = s.lock_session("t", "busy", LONG, LONG).await.unwrap();
    let waiter = {
        let s = s.clone();
        tokio::spawn(async move {
            let append = chain(None, &[msg("user", "queued")], Origin::Client);
            s.open_turn(open("busy", Some(append), LONG)).await
        })
    };
    // Whenever the waiter gets to run, it must not store anything while the lease is held.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(s.head_branch("t", "busy").await.unwrap().is_empty());
    assert!(!waiter.is_finished());
    s.unlock_session(&held).await.unwrap();
    let mut opened = waiter.await.unwrap().unwrap();
    opened.committed.wait().await.unwrap();
    assert_eq!(opened.appended.len(), 1);
    assert_eq!(s.head_branch("t", "busy").await.unwrap().len(), 1);
    // A turn that cannot get the lease in time fails and stores nothing.
    let late = chain(None, &[msg("user", "too late")], Origin::Client);
    assert!(matches!(
        s.open_turn(open("busy", Some(late), SHORT)).await,
        Err(ctxproxy::Error::SessionBusy { .. })
    ));
    assert_eq!(s.head_branch("t", "busy").await.unwrap().len(), 1);
    s.unlock_session(&opened.lease).await.unwrap();
}

pub async fn a_failed_open_holds_nothing(fx: &Fixture) {
    let s = fx.store.as_ref();
    let orphan = chain(
        Some(MessageId([7; 32])),
        &[msg("user", "under a parent that is not stored")],
        Origin::Client,
    );
    assert!(matches!(
        s.open_turn(open("bad", Some(orphan), LONG)).await,
        Err(ctxproxy::Error::NotFound(_))
    ));
    assert!(s.head_branch("t", "bad").await.unwrap().is_empty());
    // The session may exist, but its lease is free.
    if s.get_session("t", "bad").await.unwrap().is_some() {
        assert!(lease_is_free(s, "bad").await);
    }
}

pub async fn a_failing_reply_still_leaves_the_record_and_frees_the_lease(fx: &Fixture) {
    let s = fx.store.as_ref();
    let request = chain(None, &[msg("user", "q")], Origin::Client);
    let last = request.messages.last().map(|m| m.id);
    let mut opened = s
        .open_turn(open("partial", Some(request), LONG))
        .await
        .unwrap();
    opened.committed.wait().await.unwrap();
    // The reply hangs under a parent that is not stored: that part fails on its own.
    let reply = chain(
        Some(MessageId([9; 32])),
        &[msg("assistant", "a")],
        Origin::Reply,
    );
    let closed = s
        .close_turn(TurnClose {
            reply: Some(reply),
            response_id: None,
            upstream_root: None,
            key_hash: None,
            conversation: None,
            record: record("partial", last),
            lease: Some(opened.lease),
            awaited: true,
        })
        .await;
    assert_eq!(closed.failures.len(), 1, "{:?}", closed.failures);
    assert!(matches!(closed.failures[0].1, ctxproxy::Error::NotFound(_)));
    assert!(
        closed.unstored.is_none(),
        "partly stored: not to be tried again"
    );
    assert_eq!(s.head_branch("t", "partial").await.unwrap().len(), 1);
    let records = s.list_requests("t", "partial").await.unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(
        records[0].head, last,
        "the record ends where the request did"
    );
    assert!(lease_is_free(s, "partial").await);
}

/// A close none of whose parts could be written (here: its session does not exist) comes back
/// whole, for the caller to try again rather than lose the reply.
pub async fn a_close_nothing_of_which_was_stored_is_handed_back(fx: &Fixture) {
    let s = fx.store.as_ref();
    let reply = chain(None, &[msg("assistant", "a")], Origin::Reply);
    let closed = s
        .close_turn(TurnClose {
            reply: Some(reply.clone()),
            response_id: None,
            upstream_root: None,
            key_hash: None,
            conversation: None,
            record: record("never-created", None),
            lease: None,
            awaited: true,
        })
        .await;
    assert_eq!(closed.failures.len(), 2, "{:?}", closed.failures);
    let back = closed.unstored.expect("the close is handed back");
    assert_eq!(back.record.session, "never-created");
    let ids = |a: &Append| a.messages.iter().map(|m| m.id).collect::<Vec<_>>();
    assert_eq!(ids(back.reply.as_ref().unwrap()), ids(&reply));
    assert!(s.get_session("t", "never-created").await.unwrap().is_none());
}

/// Runs `sql` on the fixture's database, as an operator (or a failing disk) would meddle.
async fn meddle(fx: &Fixture, sqlite: &str, postgres: &str) {
    if let Some(rest) = fx.url.strip_prefix("sqlite://") {
        let path = rest.split('?').next().unwrap().to_string();
        let sql = sqlite.to_string();
        tokio::task::spawn_blocking(move || {
            rusqlite::Connection::open(path)
                .unwrap()
                .execute_batch(&sql)
                .unwrap()
        })
        .await
        .unwrap();
    } else {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&fx.url).await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(postgres.to_string()))
            .execute(&mut conn)
            .await
            .unwrap();
    }
}

/// A close whose request record could not be written comes back whole, even when its reply
/// was stored: trying it again stores the record and leaves the reply as it is (no second copy).
pub async fn a_close_whose_record_failed_is_handed_back_and_done_again_once(fx: &Fixture) {
    let s = fx.store.as_ref();
    let request = chain(None, &[msg("user", "q")], Origin::Client);
    let last = request.messages.last().map(|m| m.id);
    let mut opened = s
        .open_turn(open("record-refused", Some(request), LONG))
        .await
        .unwrap();
    opened.committed.wait().await.unwrap();
    meddle(
        fx,
        "CREATE TRIGGER no_records BEFORE INSERT ON requests BEGIN SELECT RAISE(ABORT, 'refused'); END;",
        "CREATE FUNCTION refuse() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$ \
         LANGUAGE plpgsql; CREATE TRIGGER no_records BEFORE INSERT ON requests FOR EACH ROW \
         EXECUTE FUNCTION refuse();",
    )
    .await;
    let reply = chain(last, &[msg("assistant", "a")], Origin::Reply);
    let closed = s
        .close_turn(TurnClose {
            reply: Some(reply),
            response_id: None,
            upstream_root: None,
            key_hash: None,
            conversation: None,
            record: record("record-refused", last),
            lease: Some(opened.lease),
            awaited: true,
        })
        .await;
    assert_eq!(closed.failures.len(), 1, "{:?}", closed.failures);
    assert!(closed.lease_kept(), "the turn is not closed");
    let back = closed.unstored.expect("handed back: its record is missing");
    assert!(
        s.list_requests("t", "record-refused")
            .await
            .unwrap()
            .is_empty()
    );
    assert!(!lease_is_free(s, "record-refused").await);
    meddle(
        fx,
        "DROP TRIGGER no_records;",
        "DROP TRIGGER no_records ON requests; DROP FUNCTION refuse();",
    )
    .await;
    let again = s.close_turn(back).await;
    assert!(again.failures.is_empty(), "{:?}", again.failures);
    assert!(again.unstored.is_none());
    let branch = s.head_branch("t", "record-refused").await.unwrap();
    assert_eq!(branch.len(), 2, "the reply once: {branch:?}");
    let records = s.list_requests("t", "record-refused").await.unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].head, branch.last().map(|m| m.id));
    assert!(lease_is_free(s, "record-refused").await);
}

/// A turn's reply items that have an id of their own (Responses output items) are found by
/// that id, for the key that made them, as they are stored; a chat reply has none; a deleted
/// session's are gone.
pub async fn reply_items_are_found_by_their_id_for_their_key(fx: &Fixture) {
    let s = fx.store.as_ref();
    let request = chain(None, &[msg("user", "hi")], Origin::Client);
    let last = request.messages.last().map(|m| m.id);
    let mut opened = s
        .open_turn(open("items", Some(request), LONG))
        .await
        .unwrap();
    opened.committed.wait().await.unwrap();
    let item = serde_json::json!({"type": "message", "id": "msg_conf", "role": "assistant",
        "content": [{"type": "output_text", "text": "hello", "annotations": []}]});
    let call = serde_json::json!({"type": "function_call", "id": "fc_conf", "call_id": "c1",
        "name": "f", "arguments": "{}"});
    let reply = chain(
        last,
        &[item.clone(), call.clone(), msg("assistant", "chat")],
        Origin::Reply,
    );
    let closed = s
        .close_turn(TurnClose {
            reply: Some(reply),
            response_id: None,
            upstream_root: None,
            key_hash: Some("k-items".into()),
            conversation: None,
            record: record("items", last),
            lease: Some(opened.lease),
            awaited: false,
        })
        .await;
    assert!(closed.failures.is_empty(), "{:?}", closed.failures);
    let ids = [
        "msg_conf".to_string(),
        "fc_conf".to_string(),
        "msg_none".to_string(),
    ];
    let mut found = s
        .find_reply_items("t", Some("k-items"), &ids)
        .await
        .unwrap();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        found,
        vec![
            ("fc_conf".to_string(), call),
            ("msg_conf".to_string(), item)
        ]
    );
    assert!(
        s.find_reply_items("t", Some("k-other"), &ids)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        s.find_reply_items("u", Some("k-items"), &ids)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(s.delete_session("t", "items").await.unwrap());
    assert!(
        s.find_reply_items("t", Some("k-items"), &ids)
            .await
            .unwrap()
            .is_empty()
    );
}
