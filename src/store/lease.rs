//! Waiting for a session lease. The lease itself is a conditional UPDATE on the session row
//! (each backend's own SQL); this is the loop around it: poll with capped, jittered backoff so
//! other processes are noticed, and wake same-process waiters at once on release so they do
//! not spin or sleep needlessly. No connection is held while waiting or while the lease is held.
//!
//! Waking this process's waiters at once would starve another process's, which only poll: a
//! process with a request always ready took every release. So a waiter that finds the lease
//! taken claims the next turn (the session row's `lock_claim`, for [`CLAIM_TTL`], renewed by
//! every attempt that fails) unless a waiter that began waiting earlier holds the claim, and
//! while another waiter's claim stands a free lease is not taken: the longest waiter goes next,
//! whichever process it is in.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;

use super::types::Lease;
use crate::{Error, Result};

const FIRST_BACKOFF: Duration = Duration::from_millis(5);
const MAX_BACKOFF: Duration = Duration::from_millis(200);

/// How long a waiter's claim on a session's next turn lasts unless it renews it (at least every
/// [`MAX_BACKOFF`] while it waits). A waiter that gives up takes its claim back; one whose
/// request was dropped holds others up no longer than this.
pub(crate) const CLAIM_TTL: Duration = Duration::from_millis(600);

/// In-process wakeups per (tenant, session). Entries are weak so that sessions nobody waits
/// on do not accumulate.
#[derive(Default)]
pub(crate) struct Wakeups {
    map: Mutex<HashMap<(String, String), Weak<Notify>>>,
}

/// A waiter's claim on a session's next turn: who it is, and when it began to wait (unix ms),
/// which decides between claimants.
#[derive(Clone, Debug)]
pub(crate) struct Claim {
    pub claimant: String,
    pub since: i64,
}

impl Claim {
    /// The claim of a waiter that begins to wait now.
    pub(crate) fn new() -> Claim {
        Claim {
            claimant: new_owner(),
            since: super::time::Timestamp::now().millis(),
        }
    }
}

impl Wakeups {
    fn subscribe(&self, tenant: &str, session: &str) -> Arc<Notify> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let key = (tenant.to_string(), session.to_string());
        if let Some(existing) = map.get(&key).and_then(Weak::upgrade) {
            return existing;
        }
        if map.len() >= 1024 {
            map.retain(|_, w| w.strong_count() > 0);
        }
        let notify = Arc::new(Notify::new());
        map.insert(key, Arc::downgrade(&notify));
        notify
    }

    /// Whether a request in this process is waiting for this session's lease.
    pub(crate) fn awaited(&self, tenant: &str, session: &str) -> bool {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&(tenant.to_string(), session.to_string()))
            .is_some_and(|w| w.strong_count() > 0)
    }

    /// Wakes every same-process waiter of this session (after a release).
    pub(crate) fn wake(&self, tenant: &str, session: &str) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let key = (tenant.to_string(), session.to_string());
        match map.get(&key).and_then(Weak::upgrade) {
            Some(notify) => notify.notify_waiters(),
            None => {
                map.remove(&key);
            }
        }
    }
}

/// Calls `attempt` until it returns a lease or `wait` has passed (then `SessionBusy`).
pub(crate) async fn acquire<F, Fut>(
    wakeups: &Wakeups,
    tenant: &str,
    session: &str,
    wait: Duration,
    mut attempt: F,
) -> Result<Lease>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<Lease>>>,
{
    let notify = wakeups.subscribe(tenant, session);
    let deadline = Instant::now() + wait;
    let mut backoff = FIRST_BACKOFF;
    loop {
        // Register for the wakeup before trying, so a release between a failed attempt and
        // the wait below is not missed.
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if let Some(lease) = attempt().await? {
            return Ok(lease);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::SessionBusy {
                session: session.to_string(),
                waited: wait,
            });
        }
        let pause = jitter(backoff).min(deadline - now);
        tokio::select! {
            _ = notified => {}
            _ = tokio::time::sleep(pause) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Somewhere between half and all of `d`, so pollers from several processes spread out.
fn jitter(d: Duration) -> Duration {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|t| t.subsec_nanos())
        .unwrap_or(0);
    let half = d / 2;
    half + Duration::from_nanos(u64::from(nanos) % (half.as_nanos() as u64).max(1))
}

/// A fresh lease owner token.
pub(crate) fn new_owner() -> String {
    uuid::Uuid::now_v7().to_string()
}
