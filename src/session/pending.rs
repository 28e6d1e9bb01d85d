//! Replies whose answer has already gone to the client but which are still being written to
//! the store. On a single-process store the reply of a non-streamed answer is written after the
//! answer is sent (it is off the response path), so a client that continues at once could look
//! for a reply that is not stored yet. Session resolution that depends on stored replies (auto
//! matching, `previous_response_id`) first waits here for the writes it would see; requests
//! that name their session are serialised by the session lease instead, which is held until the
//! write is done.
//!
//! Only writes a request could depend on make it wait: a reply is known by the chained ids of
//! its messages (an incoming conversation containing one of them continues it), by its
//! Responses id and by its session (the admin API reads a session as the answers left it).
//! With nothing pending, checking costs one uncontended lock.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::conversation::MessageId;

/// The replies being written in this process.
#[derive(Default)]
pub struct PendingReplies {
    inner: Mutex<Inner>,
    done: Notify,
    /// Called when someone starts waiting: the store may be holding writes back to batch them.
    hurry: Option<Box<dyn Fn() + Send + Sync>>,
}

#[derive(Default)]
struct Inner {
    /// Chained ids of reply messages being written, with how many writes carry each.
    messages: HashMap<MessageId, usize>,
    /// Responses API ids being recorded.
    responses: HashMap<String, usize>,
    /// (tenant, session) of every write.
    sessions: HashMap<(String, String), usize>,
    /// Tickets of the writes in flight, and the next one to hand out: "every write begun before
    /// now" is every open ticket below the current `next`.
    open: BTreeSet<u64>,
    next: u64,
}

/// One reply write in flight; dropping it (after the write, or if the write task is torn
/// down) wakes whoever waits for it.
pub struct PendingWrite {
    owner: Arc<PendingReplies>,
    ticket: u64,
    session: (String, String),
    messages: Vec<MessageId>,
    response: Option<String>,
}

impl PendingReplies {
    /// A registry whose waiters call `hurry` (see [`crate::store::Store::hurry`]).
    pub fn hurrying(hurry: impl Fn() + Send + Sync + 'static) -> Self {
        PendingReplies {
            hurry: Some(Box::new(hurry)),
            ..Default::default()
        }
    }

    /// Registers a reply of `tenant`'s `session` about to be written after its answer went out.
    pub fn begin(
        self: &Arc<Self>,
        tenant: &str,
        session: &str,
        messages: Vec<MessageId>,
        response: Option<String>,
    ) -> PendingWrite {
        let session = (tenant.to_string(), session.to_string());
        let ticket = {
            let mut inner = self.lock();
            for id in &messages {
                *inner.messages.entry(*id).or_default() += 1;
            }
            if let Some(r) = &response {
                *inner.responses.entry(r.clone()).or_default() += 1;
            }
            *inner.sessions.entry(session.clone()).or_default() += 1;
            let ticket = inner.next;
            inner.next += 1;
            inner.open.insert(ticket);
            ticket
        };
        PendingWrite {
            owner: self.clone(),
            ticket,
            session,
            messages,
            response,
        }
    }

    /// Announces a Responses id known before its reply is written: a stream names its response
    /// in its first event, and a client that cancels the stream (or acts on that event) may
    /// continue from it at once. A `previous_response_id` naming it waits (in [`settle`]) until
    /// the guard is dropped, once the stream's reply and id are stored; nothing else does.
    ///
    /// [`settle`]: PendingReplies::settle
    pub fn announce_response(self: &Arc<Self>, response: &str) -> AnnouncedResponse {
        *self
            .lock()
            .responses
            .entry(response.to_string())
            .or_default() += 1;
        AnnouncedResponse {
            owner: self.clone(),
            response: response.to_string(),
        }
    }

    /// Announces `key` once no one else in this process has it announced, the check and the
    /// announcement one step: requests that take it go one after another, each from before it
    /// looks the key up until its own turn is stored. An upstream conversation's turns take
    /// its key, so that two first turns at once do not both find no session and make two.
    pub async fn claim_response(self: &Arc<Self>, key: &str) -> AnnouncedResponse {
        loop {
            let done = self.done.notified();
            tokio::pin!(done);
            // Registered before checking, so a release in between still wakes us.
            done.as_mut().enable();
            {
                let mut inner = self.lock();
                if !inner.responses.contains_key(key) {
                    inner.responses.insert(key.to_string(), 1);
                    return AnnouncedResponse {
                        owner: self.clone(),
                        response: key.to_string(),
                    };
                }
            }
            if let Some(hurry) = &self.hurry {
                hurry();
            }
            done.await;
        }
    }

    /// Waits until no reply that `ids` (an incoming conversation's chained ids) or `response`
    /// (a `previous_response_id`) refers to is still being written.
    pub async fn settle(&self, ids: &[MessageId], response: Option<&str>) {
        self.wait_until(|| !self.refers_to_pending(ids, response))
            .await
    }

    /// Waits until no reply of the session is still being written.
    pub async fn settle_session(&self, tenant: &str, session: &str) {
        self.wait_until(|| {
            let inner = self.lock();
            inner.sessions.is_empty()
                || !inner
                    .sessions
                    .contains_key(&(tenant.to_string(), session.to_string()))
        })
        .await
    }

    /// Waits until every write begun before this call is done (later ones are not waited for,
    /// so a steady stream of writes cannot starve the caller).
    pub async fn settle_all(&self) {
        let horizon = self.lock().next;
        self.wait_until(|| {
            self.lock()
                .open
                .first()
                .is_none_or(|&oldest| oldest >= horizon)
        })
        .await
    }

    async fn wait_until(&self, settled: impl Fn() -> bool) {
        loop {
            let done = self.done.notified();
            tokio::pin!(done);
            // Registered before checking, so a write finishing in between still wakes us.
            done.as_mut().enable();
            if settled() {
                return;
            }
            if let Some(hurry) = &self.hurry {
                hurry();
            }
            done.await;
        }
    }

    fn refers_to_pending(&self, ids: &[MessageId], response: Option<&str>) -> bool {
        let inner = self.lock();
        if inner.messages.is_empty() && inner.responses.is_empty() {
            return false;
        }
        response.is_some_and(|r| inner.responses.contains_key(r))
            || ids.iter().any(|id| inner.messages.contains_key(id))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The map holds plain counters: a panic elsewhere cannot leave it inconsistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for PendingWrite {
    fn drop(&mut self) {
        {
            let mut inner = self.owner.lock();
            for id in &self.messages {
                decrement(&mut inner.messages, id);
            }
            if let Some(r) = &self.response {
                decrement(&mut inner.responses, r);
            }
            decrement(&mut inner.sessions, &self.session);
            inner.open.remove(&self.ticket);
        }
        self.owner.done.notify_waiters();
    }
}

/// A Responses id announced before its reply is stored (see
/// [`PendingReplies::announce_response`]); dropping it wakes whoever waits for it.
pub struct AnnouncedResponse {
    owner: Arc<PendingReplies>,
    response: String,
}

impl Drop for AnnouncedResponse {
    fn drop(&mut self) {
        decrement(&mut self.owner.lock().responses, &self.response);
        self.owner.done.notify_waiters();
    }
}

fn decrement<K: std::hash::Hash + Eq>(map: &mut HashMap<K, usize>, key: &K) {
    if let Some(n) = map.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            map.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn id(n: u8) -> MessageId {
        MessageId([n; 32])
    }

    #[tokio::test]
    async fn a_claimed_key_is_taken_by_one_at_a_time() {
        let pending = Arc::new(PendingReplies::default());
        let first = pending.claim_response("conversation:k:c").await;
        let second = {
            let pending = pending.clone();
            tokio::spawn(async move { pending.claim_response("conversation:k:c").await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!second.is_finished(), "taken while the first holds it");
        let _other = pending.claim_response("conversation:k:d").await;
        drop(first);
        let _second = second.await.unwrap();
    }

    #[tokio::test]
    async fn unrelated_requests_do_not_wait() {
        let pending = Arc::new(PendingReplies::default());
        let _write = pending.begin("t", "s", vec![id(1)], Some("resp_1".into()));
        // Would hang (and the test time out) if it waited.
        pending.settle(&[id(2), id(3)], Some("resp_2")).await;
        pending.settle(&[], None).await;
    }

    #[tokio::test]
    async fn a_request_continuing_a_pending_reply_waits_for_its_write() {
        let pending = Arc::new(PendingReplies::default());
        let write = pending.begin("t", "s", vec![id(1), id(2)], None);
        let waiter = {
            let pending = pending.clone();
            tokio::spawn(async move { pending.settle(&[id(0), id(2)], None).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !waiter.is_finished(),
            "settled while the reply was still pending"
        );
        drop(write);
        waiter.await.unwrap();
    }

    #[tokio::test]
    async fn an_announced_response_holds_back_only_requests_continuing_it() {
        let pending = Arc::new(PendingReplies::default());
        let announced = pending.announce_response("resp_s");
        // Neither the admin API (every write begun) nor a session's readers wait for a stream.
        pending.settle_all().await;
        pending.settle_session("t", "s").await;
        let waiter = {
            let pending = pending.clone();
            tokio::spawn(async move { pending.settle(&[], Some("resp_s")).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !waiter.is_finished(),
            "settled before the stream was stored"
        );
        drop(announced);
        waiter.await.unwrap();
    }

    #[tokio::test]
    async fn a_previous_response_id_waits_for_its_record() {
        let pending = Arc::new(PendingReplies::default());
        let write = pending.begin("t", "s", vec![], Some("resp_9".into()));
        let waiter = {
            let pending = pending.clone();
            tokio::spawn(async move { pending.settle(&[], Some("resp_9")).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        drop(write);
        waiter.await.unwrap();
        // Counts go back to zero: the same id no longer waits.
        pending.settle(&[], Some("resp_9")).await;
    }

    #[tokio::test]
    async fn two_writes_of_one_id_both_have_to_finish() {
        let pending = Arc::new(PendingReplies::default());
        let a = pending.begin("t", "s", vec![id(5)], None);
        let b = pending.begin("t", "s", vec![id(5)], None);
        drop(a);
        assert!(pending.refers_to_pending(&[id(5)], None));
        drop(b);
        assert!(!pending.refers_to_pending(&[id(5)], None));
    }

    #[tokio::test]
    async fn session_and_global_reads_wait_for_earlier_writes_only() {
        let pending = Arc::new(PendingReplies::default());
        let write = pending.begin("t", "s1", vec![id(1)], None);
        // Another session, or nothing pending for it: no wait.
        pending.settle_session("t", "s2").await;
        pending.settle_session("u", "s1").await;
        let session_reader = {
            let pending = pending.clone();
            tokio::spawn(async move { pending.settle_session("t", "s1").await })
        };
        let global_reader = {
            let pending = pending.clone();
            tokio::spawn(async move { pending.settle_all().await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        // A write begun after the global reader started is not waited for.
        let _later = pending.begin("t", "s3", vec![], None);
        assert!(!session_reader.is_finished());
        assert!(!global_reader.is_finished());
        drop(write);
        session_reader.await.unwrap();
        global_reader.await.unwrap();
    }
}
