//! The SQLite backend's group commit: writes queued together share one transaction, each in its
//! own savepoint. A job that fails must get its own error and leave nothing behind, while the
//! jobs batched with it are committed. Also: an in-memory database (one connection) works.

use std::sync::Arc;

use ctxproxy::conversation::MessageId;
use ctxproxy::store::{self, NewMessage, NewRequestRecord, Origin, Scope};
use serde_json::json;

fn scope() -> Scope {
    Scope {
        key_hash: Some("k".into()),
        user: None,
    }
}

fn one_message(text: &str) -> Vec<NewMessage> {
    NewMessage::chain(
        None,
        &[json!({"role": "user", "content": text})],
        Origin::Client,
    )
}

fn record(session: &str, n: usize) -> NewRequestRecord {
    NewRequestRecord {
        tenant: "t".into(),
        session: session.into(),
        endpoint: "/v1/chat/completions".into(),
        status: 200,
        request_id: Some(format!("r{n}")),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failing_jobs_in_a_batch_do_not_affect_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/store.db?mode=rwc", dir.path().display());
    let store = store::connect(&url, 2).await.unwrap();
    store.migrate().await.unwrap();
    store
        .get_or_create_session("t", "s", &scope())
        .await
        .unwrap();

    // Many writes at once, so the writer finds them queued together; every third fails.
    const JOBS: usize = 300;
    let missing_parent = MessageId([7; 32]);
    let tasks: Vec<_> = (0..JOBS)
        .map(|n| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                match n % 6 {
                    // Succeed: a new root message, and a request record.
                    0 | 1 => store
                        .append_messages("t", "s", None, &one_message(&format!("ok {n}")))
                        .await
                        .map(|_| ()),
                    2 => store.insert_request(&record("s", n)).await.map(|_| ()),
                    3 => store.insert_request(&record("s", n)).await.map(|_| ()),
                    // Fail: a parent that is not stored (NotFound), a session that does not
                    // exist (NotFound), a request record of a missing session (foreign key).
                    4 => store
                        .append_messages(
                            "t",
                            "s",
                            Some(missing_parent),
                            &one_message(&format!("orphan {n}")),
                        )
                        .await
                        .map(|_| ()),
                    _ if n % 12 == 5 => store
                        .append_messages("t", "nope", None, &one_message(&format!("lost {n}")))
                        .await
                        .map(|_| ()),
                    _ => store.insert_request(&record("nope", n)).await.map(|_| ()),
                }
            })
        })
        .collect();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }

    for (n, result) in results.iter().enumerate() {
        match (n % 6, result) {
            (0..=3, Ok(())) => {}
            (4, Err(ctxproxy::Error::NotFound(_))) => {}
            (5, Err(ctxproxy::Error::NotFound(_))) if n % 12 == 5 => {}
            (5, Err(ctxproxy::Error::StoreUnavailable(_))) if n % 12 == 11 => {}
            (_, other) => panic!("job {n}: unexpected {other:?}"),
        }
    }
    let appended = (0..JOBS).filter(|n| n % 6 < 2).count();
    let recorded = (0..JOBS).filter(|n| (2..4).contains(&(n % 6))).count();
    let session = store.get_session("t", "s").await.unwrap().unwrap();
    assert_eq!(
        session.message_count as usize, appended,
        "no orphan was stored"
    );
    assert_eq!(store.list_branches("t", "s").await.unwrap().len(), appended);
    assert_eq!(store.list_requests("t", "s").await.unwrap().len(), recorded);
    assert!(store.get_session("t", "nope").await.unwrap().is_none());
    assert!(store.list_requests("t", "nope").await.unwrap().is_empty());

    // And what was committed is there for a second store on the same file (another process).
    let other = store::connect(&url, 1).await.unwrap();
    let seen = other.get_session("t", "s").await.unwrap().unwrap();
    assert_eq!(seen.message_count as usize, appended);
    other.close().await;
    store.close().await;
}

#[tokio::test]
async fn an_in_memory_database_works_on_one_connection() {
    for url in ["sqlite::memory:", "sqlite://?mode=memory"] {
        let store = store::connect(url, 4).await.unwrap();
        store.migrate().await.unwrap();
        store
            .get_or_create_session("t", "s", &scope())
            .await
            .unwrap();
        let chain = one_message("hello");
        store.append_messages("t", "s", None, &chain).await.unwrap();
        let head = store.head_branch("t", "s").await.unwrap();
        assert_eq!(head.len(), 1);
        assert_eq!(head[0].id, chain[0].id);
        store.ping().await.unwrap();
        store.close().await;
        assert!(matches!(
            store.ping().await,
            Err(ctxproxy::Error::StoreUnavailable(_))
        ));
    }
}

/// The checkpointer thread copies the WAL into the database file by itself: the writer never
/// has to do it inside a commit (its own threshold is far above what this test writes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_is_checkpointed_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let url = format!("sqlite://{}?mode=rwc", path.display());
    let s = store::connect(&url, 1).await.unwrap();
    s.migrate().await.unwrap();
    let before = std::fs::metadata(&path).unwrap().len();
    for n in 0..200 {
        let session = format!("s{n}");
        s.get_or_create_session("t", &session, &scope())
            .await
            .unwrap();
        s.append_messages("t", &session, None, &one_message(&"words ".repeat(200)))
            .await
            .unwrap();
    }
    // Eventually (it runs every 100 ms): the database file itself holds the new pages.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::fs::metadata(&path).unwrap().len() <= before {
        assert!(
            std::time::Instant::now() < deadline,
            "nothing was checkpointed into {}",
            path.display()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    s.close().await;
}
