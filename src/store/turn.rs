//! A managed request visits the store twice, and each visit is one store call: opening the turn
//! (session created if absent, lease taken, the request's new messages appended) and closing it
//! (reply appended, Responses id recorded, request record written, lease released).
//!
//! Why one call each: on SQLite every call is a hand-off to the writer thread, and those
//! hand-offs (thread wake-ups, not SQL) were most of the proxy's cost per request (issue 5);
//! SQLite runs each visit as one job. The default implementations here compose the single
//! calls, which is what PostgreSQL uses.

use std::time::Duration;

use tokio::sync::oneshot;

use super::types::{Lease, NewMessage, NewRequestRecord, Scope};
use super::{Appended, Store};
use crate::Error;
use crate::Result;
use crate::conversation::MessageId;

/// Messages to append as a chain under `parent` (see [`Store::append_messages`]).
#[derive(Debug, Clone)]
pub struct Append {
    pub parent: Option<MessageId>,
    pub messages: Vec<NewMessage>,
}

/// What opening a turn does.
#[derive(Debug, Clone)]
pub struct TurnOpen {
    pub tenant: String,
    pub session: String,
    /// The scope recorded if the session is created.
    pub scope: Scope,
    /// The lease's time to live.
    pub ttl: Duration,
    /// How long to wait for a lease someone else holds (then `SessionBusy`).
    pub wait: Duration,
    /// Stored once the lease is held (client mode knows it before reading anything).
    pub append: Option<Append>,
}

/// An opened turn: the held lease, what the append did, and whether it is committed yet.
#[derive(Debug)]
pub struct TurnOpened {
    pub lease: Lease,
    pub appended: Vec<Appended>,
    pub committed: Committed,
}

/// Whether a write is committed. SQLite answers a turn's open as soon as its writes have run,
/// and commits them while the request goes upstream (issue 5: the commit was a tenth of a
/// small request's added latency); whatever the client is answered waits for this, so an
/// answer never goes out for a turn that is not stored (SPEC 4.2).
#[derive(Debug)]
pub struct Committed(CommitState);

#[derive(Debug)]
enum CommitState {
    Done,
    /// Answered with the reason when the commit failed.
    Waiting(oneshot::Receiver<std::result::Result<(), String>>),
    Failed(String),
}

impl Committed {
    /// A write committed before its answer (PostgreSQL's, and every single store call's).
    pub fn done() -> Committed {
        Committed(CommitState::Done)
    }

    /// A write whose commit `commit` will report.
    pub(crate) fn pending(commit: oneshot::Receiver<std::result::Result<(), String>>) -> Committed {
        Committed(CommitState::Waiting(commit))
    }

    /// Waits for the commit (at once once it is known); a failure stays for later callers.
    pub async fn wait(&mut self) -> Result<()> {
        if let CommitState::Waiting(commit) = &mut self.0 {
            let outcome = commit
                .await
                .unwrap_or_else(|_| Err("the store closed before the commit".into()));
            self.0 = match outcome {
                Ok(()) => CommitState::Done,
                Err(reason) => CommitState::Failed(reason),
            };
        }
        match &self.0 {
            CommitState::Failed(reason) => Err(Error::StoreUnavailable(reason.clone())),
            _ => Ok(()),
        }
    }
}

/// What closing a turn does, in order; each part is kept or undone on its own, so a failing
/// reply append still leaves the request record and still releases the lease.
#[derive(Debug, Clone)]
pub struct TurnClose {
    /// The reply, chained under the request's last message.
    pub reply: Option<Append>,
    /// A Responses API id, recorded as ending on the head after the reply.
    pub response_id: Option<String>,
    /// The `previous_response_id` the request was forwarded with, recorded with `response_id`.
    pub upstream_root: Option<String>,
    /// The hex sha256 of the client's key, recorded with `response_id` (see
    /// [`crate::store::ResponseRef::key_hash`]).
    pub key_hash: Option<String>,
    /// The upstream conversation the request continued, as its
    /// [`conversation_key`](crate::store::conversation_key): recorded like a response id, on
    /// the head after the reply, so the conversation's next turn finds this session.
    pub conversation: Option<String>,
    /// Its `head` is replaced by the reply's last message when the reply is stored.
    pub record: NewRequestRecord,
    /// Released last.
    pub lease: Option<Lease>,
    /// Someone waits for this close (a stream ends only once its reply is stored; an error
    /// answer goes out after it): a store that may hold writes back to group them must not.
    pub awaited: bool,
}

/// The parts of a close that failed (they are logged and counted by the caller: the answer has
/// gone out, or is going out, whatever happens here).
#[derive(Debug, Default)]
pub struct TurnClosed {
    pub failures: Vec<(&'static str, Error)>,
    /// The close itself, handed back when its request record was not stored (the store was
    /// down, or its file locked by another process past the busy timeout), so the caller can
    /// try it again as it is instead of losing the reply and the record.
    pub unstored: Option<TurnClose>,
}

/// The failure of a close whose job did not run at all (nothing of it was written).
pub(crate) const CLOSE_FAILED: &str = "close the turn";
/// The failure of a close's last part.
pub(crate) const RELEASE_FAILED: &str = "release the session lease";
/// The failure of a close whose session lease is no longer its owner's: the session was
/// deleted (and maybe begun again under its id) or taken over while the request ran. Nothing of
/// the close is written: it would land in someone else's turn.
pub(crate) const LEASE_LOST: &str = "close the turn: the session is no longer this request's";
/// The failure of a close's request record.
pub(crate) const RECORD_FAILED: &str = "store the request record";
/// How long [`close_by_parts`] renews the session's lease for before writing its parts: long
/// enough for a few store calls, after which the close releases it anyway.
const PARTS_LEASE_TTL: Duration = Duration::from_secs(30);

impl TurnClosed {
    /// Whether nothing was written because the session is no longer the request's (see
    /// [`LEASE_LOST`]).
    pub fn session_lost(&self) -> bool {
        self.failures.iter().any(|(what, _)| *what == LEASE_LOST)
    }

    /// Whether the session's lease is still held: the close failed as a whole, or its record
    /// (then it is not released), or its release.
    pub fn lease_kept(&self) -> bool {
        self.failures
            .iter()
            .any(|(what, _)| matches!(*what, CLOSE_FAILED | RECORD_FAILED | RELEASE_FAILED))
    }
}

/// How many times [`open_by_parts`] begins a session again that was deleted under it.
const MAX_BEGUN_AGAIN: usize = 1000;

/// [`Store::open_turn`] from the single calls.
pub(crate) async fn open_by_parts<S: Store + ?Sized>(
    store: &S,
    open: TurnOpen,
) -> Result<TurnOpened> {
    let deadline = std::time::Instant::now() + open.wait;
    let mut begun_again = 0;
    loop {
        match open_once(store, &open, deadline).await {
            // Deleted between two of the calls (while this request waited for it, or even
            // once its lease was held: a delete does not wait for the lease): the session
            // begins again under its id, as it would have had the request come after the
            // delete. Deleted again and again, it is tried until the request's wait is over
            // (bounded, should the clock stand still).
            Err(Error::NotFound(_))
                if begun_again < MAX_BEGUN_AGAIN && std::time::Instant::now() < deadline =>
            {
                begun_again += 1
            }
            other => return other,
        }
    }
}

/// One try of [`open_by_parts`]: the session, its lease, the append.
async fn open_once<S: Store + ?Sized>(
    store: &S,
    open: &TurnOpen,
    deadline: std::time::Instant,
) -> Result<TurnOpened> {
    store
        .get_or_create_session(&open.tenant, &open.session, &open.scope)
        .await?;
    let wait = deadline.saturating_duration_since(std::time::Instant::now());
    let lease = store
        .lock_session(&open.tenant, &open.session, open.ttl, wait)
        .await?;
    match append_under(store, &lease, open.append.as_ref()).await {
        Ok(appended) => Ok(TurnOpened {
            lease,
            appended,
            committed: Committed::done(),
        }),
        Err(e) => {
            let _ = store.unlock_session(&lease).await;
            Err(e)
        }
    }
}

/// The append of an opened turn, once its lease is held.
async fn append_under<S: Store + ?Sized>(
    store: &S,
    lease: &Lease,
    append: Option<&Append>,
) -> Result<Vec<Appended>> {
    match append {
        None => Ok(Vec::new()),
        Some(a) => {
            store
                .append_messages(&lease.tenant, &lease.session, a.parent, &a.messages)
                .await
        }
    }
}

/// A close's parts as they are tried, each a write of its own (or a savepoint of its own).
#[derive(Debug, Default)]
pub(crate) struct CloseParts {
    failures: Vec<(&'static str, Error)>,
}

impl CloseParts {
    /// Notes one part's outcome (a failure under `what`).
    pub(crate) fn tried<T>(&mut self, what: &'static str, outcome: Result<T>) -> Option<T> {
        outcome.map_err(|e| self.failures.push((what, e))).ok()
    }

    /// The close's outcome. When its request record was not written, the close is handed back
    /// whole (`close` is called only then): every other part can be done again without harm
    /// (an append leaves stored messages alone, the response id is an upsert, a release checks
    /// its owner), so trying it again stores what is missing and nothing twice.
    pub(crate) fn closed(self, close: impl FnOnce() -> TurnClose) -> TurnClosed {
        let unstored = self
            .failures
            .iter()
            .any(|(what, _)| *what == RECORD_FAILED)
            .then(close);
        TurnClosed {
            failures: self.failures,
            unstored,
        }
    }
}

/// [`Store::close_turn`] from the single calls.
pub(crate) async fn close_by_parts<S: Store + ?Sized>(store: &S, close: TurnClose) -> TurnClosed {
    // The parts are separate calls, so none of them can check the lease as it writes: it is
    // renewed first, which says whether it is still the request's and keeps it so while the
    // parts run (the one-call closes check it inside their own transaction or job).
    if let Some(lease) = &close.lease {
        match store.renew_session_lease(lease, PARTS_LEASE_TTL).await {
            Ok(Some(_)) => {}
            Ok(None) => {
                let gone = Error::NotFound(format!("session {} (its lease)", lease.session));
                return TurnClosed {
                    failures: vec![(LEASE_LOST, gone)],
                    unstored: None,
                };
            }
            // Nothing written: the close comes back whole, to be tried again.
            Err(e) => {
                return TurnClosed {
                    failures: vec![(CLOSE_FAILED, e)],
                    unstored: Some(close),
                };
            }
        }
    }
    let mut record = close.record.clone();
    let mut parts = CloseParts::default();
    if let Some(reply) = close.reply.as_ref().filter(|r| !r.messages.is_empty()) {
        let (tenant, session) = (&record.tenant, &record.session);
        let stored = store
            .append_messages(tenant, session, reply.parent, &reply.messages)
            .await;
        if parts.tried("store the reply", stored).is_some() {
            record.head = reply.messages.last().map(|m| m.id);
            let key = close.key_hash.as_deref();
            let recorded = store
                .record_reply_items(tenant, session, key, &reply.messages)
                .await;
            parts.tried("record the reply items", recorded);
        }
        if let (Some(id), Some(head)) = (&close.response_id, record.head) {
            let (root, key) = (close.upstream_root.as_deref(), close.key_hash.as_deref());
            let recorded = store
                .record_response(&record.tenant, id, &record.session, head, root, key)
                .await;
            parts.tried("record the response id", recorded);
        }
    }
    // Also for a turn that got no answer: its retry finds the session it is stored in.
    if let (Some(key), Some(head)) = (&close.conversation, record.head) {
        let recorded = store
            .record_response(
                &record.tenant,
                key,
                &record.session,
                head,
                None,
                close.key_hash.as_deref(),
            )
            .await;
        parts.tried("record the conversation", recorded);
    }
    let inserted = store.insert_request(&record).await;
    // Without its record the turn is not closed: the lease stays for the close to be tried again.
    let recorded = parts.tried(RECORD_FAILED, inserted).is_some();
    if let Some(lease) = close.lease.as_ref().filter(|_| recorded) {
        parts.tried(RELEASE_FAILED, store.unlock_session(lease).await);
    }
    parts.closed(|| close)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::store::{NewMessage, Origin, SqliteStore};

    fn open(append: Append) -> TurnOpen {
        TurnOpen {
            tenant: "t".into(),
            session: "s".into(),
            scope: Scope::default(),
            ttl: Duration::from_secs(60),
            wait: Duration::from_secs(5),
            append: Some(append),
        }
    }

    /// PostgreSQL falls back to the part-by-part close when its one-transaction close fails.
    /// By then the session may have been deleted and begun again under its id by another
    /// request: the parts, each a call of its own, must not write into that request's turn.
    #[tokio::test]
    async fn a_close_by_parts_writes_nothing_once_the_lease_is_someone_elses() {
        let store = SqliteStore::connect("sqlite::memory:", 1).await.unwrap();
        store.migrate().await.unwrap();
        let question = [json!({"role": "user", "content": "q"})];
        let request = || Append {
            parent: None,
            messages: NewMessage::chain(None, &question, Origin::Client),
        };
        let first = store.open_turn(open(request())).await.unwrap();
        assert!(store.delete_session("t", "s").await.unwrap());
        // The same question again: the new session holds the very message the reply hangs under.
        let second = store.open_turn(open(request())).await.unwrap();
        let last = first.appended.last().map(|a| a.id);
        let reply = [json!({"role": "assistant", "content": "a"})];
        let close = TurnClose {
            reply: Some(Append {
                parent: last,
                messages: NewMessage::chain(last.as_ref(), &reply, Origin::Reply),
            }),
            response_id: None,
            conversation: None,
            upstream_root: None,
            key_hash: None,
            record: NewRequestRecord {
                tenant: "t".into(),
                session: "s".into(),
                head: last,
                endpoint: "chat.completions".into(),
                status: 200,
                ..Default::default()
            },
            lease: Some(first.lease),
            awaited: true,
        };
        let closed = close_by_parts(&store, close).await;
        assert!(closed.session_lost(), "{:?}", closed.failures);
        assert!(closed.unstored.is_none());
        assert_eq!(store.head_branch("t", "s").await.unwrap().len(), 1);
        assert!(store.list_requests("t", "s").await.unwrap().is_empty());
        // The new owner's lease is untouched: it renews.
        let renewed = store
            .renew_session_lease(&second.lease, Duration::from_secs(60))
            .await
            .unwrap();
        assert!(renewed.is_some());
    }
}
