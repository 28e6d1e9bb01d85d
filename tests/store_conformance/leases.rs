//! Conformance: session and summary leases, and failure when the database is gone.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use ctxproxy::store::{NewMessage, Origin, Store};

use super::{Fixture, msg, scope};

const LONG: Duration = Duration::from_secs(60);

pub async fn summary_lease_is_exclusive_until_released_or_expired(fx: &Fixture) {
    let s = fx.store.as_ref();
    s.get_or_create_session("t", "s", &scope()).await.unwrap();
    let other = fx.second_store().await;
    let held = s.try_lock_summary("t", "s", LONG).await.unwrap().unwrap();
    assert!(s.try_lock_summary("t", "s", LONG).await.unwrap().is_none());
    assert!(
        other
            .try_lock_summary("t", "s", LONG)
            .await
            .unwrap()
            .is_none()
    );
    // Another session's lease is independent.
    s.get_or_create_session("t", "s2", &scope()).await.unwrap();
    assert!(
        other
            .try_lock_summary("t", "s2", LONG)
            .await
            .unwrap()
            .is_some()
    );
    s.unlock_summary(&held).await.unwrap();
    let short = other
        .try_lock_summary("t", "s", Duration::from_millis(50))
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    // Expired: a crashed holder does not block the session forever.
    let taken = s.try_lock_summary("t", "s", LONG).await.unwrap().unwrap();
    // The old owner's release does not free the new owner's lease.
    other.unlock_summary(&short).await.unwrap();
    assert!(
        other
            .try_lock_summary("t", "s", LONG)
            .await
            .unwrap()
            .is_none()
    );
    s.unlock_summary(&taken).await.unwrap();
    other.close().await;
}

pub async fn session_lease_is_exclusive_and_expired_one_is_taken_over(fx: &Fixture) {
    let s = fx.store.as_ref();
    assert!(matches!(
        s.lock_session("t", "missing", LONG, LONG).await,
        Err(ctxproxy::Error::NotFound(_))
    ));
    s.get_or_create_session("t", "s", &scope()).await.unwrap();
    let held = s.lock_session("t", "s", LONG, LONG).await.unwrap();
    // A second locker gives up after its wait.
    let waited = s
        .lock_session("t", "s", LONG, Duration::from_millis(100))
        .await;
    assert!(matches!(waited, Err(ctxproxy::Error::SessionBusy { .. })));
    // Renewal keeps it; release lets the next one in at once.
    let renewed = s.renew_session_lease(&held, LONG).await.unwrap().unwrap();
    let store = fx.store.clone();
    let waiter = tokio::spawn(async move { store.lock_session("t", "s", LONG, LONG).await });
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(!waiter.is_finished());
    s.unlock_session(&renewed).await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    // The holder that crashed (never unlocked) is overtaken once its ttl passed.
    let _ = next;
    s.get_or_create_session("t", "crash", &scope())
        .await
        .unwrap();
    let crashed = s
        .lock_session("t", "crash", Duration::from_millis(50), LONG)
        .await
        .unwrap();
    let other = fx.second_store().await;
    let started = std::time::Instant::now();
    let taken = other
        .lock_session("t", "crash", LONG, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_ne!(taken.owner, crashed.owner);
    assert!(
        s.renew_session_lease(&crashed, LONG)
            .await
            .unwrap()
            .is_none()
    );
    other.unlock_session(&taken).await.unwrap();
    other.close().await;
}

/// One proxied turn: lock, read the head, append the user message, "call upstream", append
/// the reply, unlock.
async fn turn(store: Arc<dyn Store>, k: usize) {
    let lease = store.lock_session("t", "busy", LONG, LONG).await.unwrap();
    let head = store.head_branch("t", "busy").await.unwrap();
    let parent = head.last().map(|m| m.id);
    let user = NewMessage::chain(
        parent.as_ref(),
        &[msg("user", &format!("q{k}"))],
        Origin::Client,
    );
    store
        .append_messages("t", "busy", parent, &user)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2)).await;
    let reply = NewMessage::chain(
        Some(&user[0].id),
        &[msg("assistant", &format!("a{k}"))],
        Origin::Reply,
    );
    store
        .append_messages("t", "busy", Some(user[0].id), &reply)
        .await
        .unwrap();
    store.unlock_session(&lease).await.unwrap();
}

pub async fn session_lease_serialises_turns_across_two_stores(fx: &Fixture) {
    fx.store
        .get_or_create_session("t", "busy", &scope())
        .await
        .unwrap();
    let second = fx.second_store().await;
    let tasks: Vec<_> = (0..50)
        .map(|k| {
            let store = if k % 2 == 0 {
                fx.store.clone()
            } else {
                second.clone()
            };
            tokio::spawn(turn(store, k))
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let head = fx.store.head_branch("t", "busy").await.unwrap();
    assert_eq!(head.len(), 100);
    let session = fx.store.get_session("t", "busy").await.unwrap().unwrap();
    assert_eq!(
        session.message_count, 100,
        "every message stored once, on one branch"
    );
    let mut seen = HashSet::new();
    for pair in head.chunks(2) {
        assert_eq!(pair[0].body["role"], "user");
        assert_eq!(pair[1].body["role"], "assistant");
        let q = pair[0].body["content"].as_str().unwrap();
        let a = pair[1].body["content"].as_str().unwrap();
        assert_eq!(&q[1..], &a[1..], "a turn was interleaved");
        assert!(seen.insert(q.to_string()));
    }
    assert_eq!(seen.len(), 50);
    second.close().await;
}

/// A process that always has a request waiting for a session wakes it the moment it releases
/// the lease, while another process's waiter only polls: without claims it got in only when a
/// poll happened to land between a release and the next local take (seconds, hundreds of
/// turns; or never, until its wait ran out). Here one store keeps four requests going back to
/// back on a session, and the other store's request gets its turn after the ones already
/// waiting: a few of the busy store's turns, not hundreds.
pub async fn a_busy_process_does_not_starve_another_s_waiter(fx: &Fixture) {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    fx.store
        .get_or_create_session("t", "contended", &scope())
        .await
        .unwrap();
    let busy = fx.second_store().await;
    let stop = Arc::new(AtomicBool::new(false));
    let turns = Arc::new(AtomicU32::new(0));
    let churn: Vec<_> = (0..4)
        .map(|_| {
            let (busy, stop, turns) = (busy.clone(), stop.clone(), turns.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let lease = busy
                        .lock_session("t", "contended", LONG, LONG)
                        .await
                        .unwrap();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    busy.unlock_session(&lease).await.unwrap();
                    turns.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    // Let the busy store's turns get going first.
    while turns.load(Ordering::Relaxed) < 5 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before = turns.load(Ordering::Relaxed);
    let got = fx
        .store
        .lock_session("t", "contended", LONG, Duration::from_secs(30))
        .await;
    let waited_turns = turns.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    let lease = got.expect("the other store's waiter got its turn");
    fx.store.unlock_session(&lease).await.unwrap();
    for task in churn {
        task.await.unwrap();
    }
    assert!(
        waited_turns < 30,
        "the waiter let {waited_turns} of the busy store's turns go first"
    );
    busy.close().await;
}

/// A waiter dropped while it waits (its client left) withdraws its claim on the next turn, so
/// the next waiter does not sit out the claim's lapse behind nobody.
pub async fn a_dropped_waiter_withdraws_its_claim(fx: &Fixture) {
    let s = fx.store.clone();
    s.get_or_create_session("t", "dropped", &scope())
        .await
        .unwrap();
    let held = s.lock_session("t", "dropped", LONG, LONG).await.unwrap();
    let waiter = {
        let s = s.clone();
        tokio::spawn(async move { s.lock_session("t", "dropped", LONG, LONG).await })
    };
    // Long enough for it to fail an attempt and claim the next turn.
    tokio::time::sleep(Duration::from_millis(100)).await;
    waiter.abort();
    let _ = waiter.await;
    s.unlock_session(&held).await.unwrap();
    // Well within the 0.6 s a claim lasts unrenewed.
    let next = s
        .lock_session("t", "dropped", LONG, Duration::from_millis(450))
        .await
        .expect("no claim left to wait behind");
    s.unlock_session(&next).await.unwrap();
}

pub async fn lost_database_is_store_unavailable(fx: &Fixture) {
    let s = fx.store.as_ref();
    s.get_or_create_session("t", "s", &scope()).await.unwrap();
    // PostgreSQL: the database really disappears under an open pool. SQLite: an open file
    // cannot be taken away from a process, so the pool is closed instead.
    let doomed = fx.second_store().await;
    doomed.ping().await.unwrap();
    if doomed.backend() == "postgres" {
        drop_database(&fx.url).await;
    } else {
        doomed.close().await;
    }
    let results = [
        doomed.ping().await.err(),
        doomed.get_session("t", "s").await.err(),
        doomed.head_branch("t", "s").await.err(),
        doomed.lock_session("t", "s", LONG, LONG).await.err(),
    ];
    for r in results {
        assert!(
            matches!(r, Some(ctxproxy::Error::StoreUnavailable(_))),
            "expected StoreUnavailable, got {r:?}"
        );
    }
}

async fn drop_database(url: &str) {
    use sqlx::Connection;
    let admin = super::pg::admin_url().unwrap();
    let name = url
        .rsplit('/')
        .next()
        .unwrap()
        .split('?')
        .next()
        .unwrap()
        .to_string();
    let mut conn = sqlx::PgConnection::connect(&admin).await.unwrap();
    let sql = format!("DROP DATABASE \"{name}\" WITH (FORCE)");
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&mut conn)
        .await
        .unwrap();
}
