//! The conversation store: sessions, the message tree, request records, summaries, response ids
//! and the leases that serialise work on a session. One object-safe trait, [`Store`], with two
//! backends that each speak their own SQL (`sqlite.rs`, `postgres.rs`); [`connect`] picks one by
//! URL scheme. The conformance suite in `tests/store_conformance.rs` runs against both.
//!
//! The conversation is a tree of messages keyed by their chained ids
//! (`conversation::identity`): since an id hashes its whole prefix, "this id is stored in that
//! session" means "that whole prefix is stored there", which is what auto matching relies on.

mod cursor;
mod lease;
mod migrations;
mod postgres;
mod sqlite;
mod time;
mod turn;
mod types;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

pub(crate) use cursor::{After, Keyset, encode_cursor};
pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;
pub use time::Timestamp;
pub use turn::{Append, Committed, TurnClose, TurnClosed, TurnOpen, TurnOpened};
pub use types::{
    Appended, Branch, DEFAULT_LOCK_WAIT, Lease, NewMessage, NewRequestRecord, NewSummary, Origin,
    PrefixMatch, RequestRecord, ResponseRef, Scope, Session, SessionDetail, SessionPage,
    SessionQuery, StoredMessage, Summary, conversation_key, reply_item_ids,
};

use crate::conversation::MessageId;
use crate::{Error, Result};
use serde_json::Value;

/// Opens the store named by `url`: `sqlite://path?mode=rwc` (file and parent directory are
/// created; WAL, `synchronous=NORMAL`, a busy timeout and foreign keys are switched on) or
/// `postgres://…` / `postgresql://…`. Does not migrate: call [`Store::migrate`].
pub async fn connect(url: &str, max_connections: u32) -> Result<Arc<dyn Store>> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::connect(url, max_connections).await?))
    } else if is_postgres(url) {
        Ok(Arc::new(
            PostgresStore::connect(url, max_connections).await?,
        ))
    } else {
        Err(Error::Config(format!("database.url: {}", unsupported(url))))
    }
}

fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// Why `url` names no store, without repeating it: past its scheme a URL may hold a password.
fn unsupported(url: &str) -> String {
    let scheme = url.split_once(':').map(|(s, _)| s).filter(|s| {
        !s.is_empty()
            && s.len() <= 16
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
    });
    match scheme {
        Some(s) => format!("unsupported scheme '{s}' (expected sqlite:// or postgres://)"),
        None => "not a URL (expected sqlite://PATH or postgres://USER@HOST/DB)".to_string(),
    }
}

/// Checks that `url` names a store this build can open, without opening it (what
/// `check-config` can tell before a start). The message never repeats the URL.
pub fn check_url(url: &str) -> std::result::Result<(), String> {
    if url.starts_with("sqlite:") {
        SqliteStore::check_url(url).map_err(|e| match e {
            Error::StoreUnavailable(m) => m.trim_start_matches("database.url: ").to_string(),
            other => other.to_string(),
        })
    } else if is_postgres(url) {
        url.parse::<sqlx::postgres::PgConnectOptions>()
            .map(|_| ())
            .map_err(|e| format!("not a valid PostgreSQL URL: {e}"))
    } else {
        Err(unsupported(url))
    }
}

/// Everything the proxy keeps. All methods are scoped by tenant: session ids are only ever
/// compared within one tenant. Database failures come back as `Error::StoreUnavailable`.
#[async_trait]
pub trait Store: Send + Sync {
    /// `"sqlite"` or `"postgres"`.
    fn backend(&self) -> &'static str;

    /// Applies the pending embedded migrations in order (idempotent; safe to run from several
    /// processes at once: they serialise on a row of the migrations table).
    async fn migrate(&self) -> Result<()>;

    /// Readiness: one round trip to the database, reading the schema ([`PING`]).
    async fn ping(&self) -> Result<()>;

    /// Closes the pool; later calls fail with `StoreUnavailable`.
    async fn close(&self);

    /// Returns the session, creating it with `scope` and created = updated = now if absent.
    /// The scope of an existing session is left as it was recorded.
    async fn get_or_create_session(
        &self,
        tenant: &str,
        session: &str,
        scope: &Scope,
    ) -> Result<Session>;

    /// The session, if it exists.
    async fn get_session(&self, tenant: &str, session: &str) -> Result<Option<Session>>;

    /// Takes the session's lease for `ttl`, waiting (polling with backoff, woken at once by
    /// releases in this process) up to `wait`; then `StoreUnavailable`. An expired lease is taken
    /// over. The session must exist (`NotFound` otherwise). No connection is held while the
    /// lease is: release it with [`Store::unlock_session`], renew it for long upstream calls.
    async fn lock_session(
        &self,
        tenant: &str,
        session: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lease>;

    /// Extends a held lease to now + `ttl`. `Ok(None)`: it was lost (expired and taken over).
    async fn renew_session_lease(&self, lease: &Lease, ttl: Duration) -> Result<Option<Lease>>;

    /// Releases the lease if this owner still holds it (otherwise a no-op).
    async fn unlock_session(&self, lease: &Lease) -> Result<()>;

    /// Appends `messages` as a chain under `parent` (`None`: as a root). Idempotent: ids already
    /// stored are skipped; the result says, in order, which were new and each one's seq.
    /// Appending under a branch's leaf extends that branch; under an inner node (or as another
    /// root) it starts a new branch. The head moves to the last message when anything new was
    /// stored, or when the last message is an existing leaf (the client went back to that
    /// branch); `updated_at` is bumped when anything changed. `parent` must be stored in the
    /// session (`NotFound` otherwise).
    async fn append_messages(
        &self,
        tenant: &str,
        session: &str,
        parent: Option<MessageId>,
        messages: &[NewMessage],
    ) -> Result<Vec<Appended>>;

    /// Opens a managed request's turn in one call: creates the session if absent, takes its
    /// lease (waiting as [`Store::lock_session`] does) and appends `open.append` under it. On
    /// error nothing is held (the session may have been created). The store may answer before
    /// these writes are committed (SQLite does, so that the commit overlaps the upstream call):
    /// `committed` says when they are, and reads see them only from then on.
    async fn open_turn(&self, open: TurnOpen) -> Result<TurnOpened> {
        turn::open_by_parts(self, open).await
    }

    /// Closes a turn in one call: appends the reply, records the Responses id, writes the
    /// request record and releases the lease, each part kept or undone on its own.
    async fn close_turn(&self, close: TurnClose) -> TurnClosed {
        turn::close_by_parts(self, close).await
    }

    /// Commits now the writes the store holds back to share a commit (`close_turn` on
    /// SQLite waits up to a few milliseconds for company): someone is waiting for one. Does
    /// not wait for them.
    fn hurry(&self) {}

    /// The head branch, root first (empty for a new session).
    async fn head_branch(&self, tenant: &str, session: &str) -> Result<Vec<StoredMessage>>;

    /// The path from the root to `message` (a branch when `message` is a leaf), root first;
    /// empty if the message is not stored in the session.
    async fn load_path(
        &self,
        tenant: &str,
        session: &str,
        message: MessageId,
    ) -> Result<Vec<StoredMessage>>;

    /// Every branch (one per leaf), most recently written first.
    async fn list_branches(&self, tenant: &str, session: &str) -> Result<Vec<Branch>>;

    /// Auto matching: among the tenant's sessions with exactly this `scope`, the one whose
    /// stored messages cover the longest prefix of `ids` (the chained ids of the incoming
    /// conversation), counting only prefixes that contain a stored reply (origin `reply`).
    /// Ties go to the most recently updated session. One indexed query per 500 ids.
    async fn find_session_by_prefix(
        &self,
        tenant: &str,
        scope: &Scope,
        ids: &[MessageId],
    ) -> Result<Option<PrefixMatch>> {
        self.find_session_continued(tenant, scope, ids, ids.len())
            .await
    }

    /// [`Store::find_session_by_prefix`] over the first `through` of `ids` only (the
    /// conversation up to its last reply), with ties going first to a session whose head is
    /// one of `ids` (the conversation continues it, or retries its unanswered turn, rather
    /// than branching off it), then to the most recently updated.
    async fn find_session_continued(
        &self,
        tenant: &str,
        scope: &Scope,
        ids: &[MessageId],
        through: usize,
    ) -> Result<Option<PrefixMatch>>;

    /// Stores one request record; the session must exist.
    async fn insert_request(&self, record: &NewRequestRecord) -> Result<RequestRecord>;

    /// The session's request records, oldest first.
    async fn list_requests(&self, tenant: &str, session: &str) -> Result<Vec<RequestRecord>>;

    /// Sessions, most recently updated first, keyset-paginated: `after` is the opaque `next`
    /// cursor of the previous page or the id of the last session seen (see [`SessionQuery`]).
    async fn list_sessions(&self, query: &SessionQuery) -> Result<SessionPage>;

    /// Deletes the session and everything stored for it. `false`: there was no such session.
    async fn delete_session(&self, tenant: &str, session: &str) -> Result<bool>;

    /// Stores a summary (all are kept, as history).
    async fn insert_summary(
        &self,
        tenant: &str,
        session: &str,
        summary: &NewSummary,
    ) -> Result<Summary>;

    /// The summary that covers most of the branch ending at `leaf` (`None`: the head branch),
    /// newest first among equals: one whose anchor lies on that path.
    async fn latest_summary(
        &self,
        tenant: &str,
        session: &str,
        leaf: Option<MessageId>,
    ) -> Result<Option<Summary>>;

    /// All summaries of the session, oldest first.
    async fn list_summaries(&self, tenant: &str, session: &str) -> Result<Vec<Summary>>;

    /// Tries to take the session's summary lease for `ttl` (taking over an expired one).
    /// `None`: another owner holds it. Never waits.
    async fn try_lock_summary(
        &self,
        tenant: &str,
        session: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>>;

    /// Releases the summary lease if this owner still holds it.
    async fn unlock_summary(&self, lease: &Lease) -> Result<()>;

    /// Records that Responses API `response_id` ended with `message` as head of `session`, its
    /// request forwarded with `upstream_root` as `previous_response_id` (see
    /// [`ResponseRef::upstream_root`]) and made with the client key hashed as `key_hash` (see
    /// [`ResponseRef::key_hash`]); replaces an earlier record of the same id.
    async fn record_response(
        &self,
        tenant: &str,
        response_id: &str,
        session: &str,
        message: MessageId,
        upstream_root: Option<&str>,
        key_hash: Option<&str>,
    ) -> Result<()>;

    /// Looks a response id up within the tenant.
    async fn find_response(&self, tenant: &str, response_id: &str) -> Result<Option<ResponseRef>>;

    /// Records the reply items among `messages` (stored in `session`) that have an id of their
    /// own, for the client key hashed as `key_hash` (see [`reply_item_ids`]).
    async fn record_reply_items(
        &self,
        tenant: &str,
        session: &str,
        key_hash: Option<&str>,
        messages: &[NewMessage],
    ) -> Result<()>;

    /// The stored items that `item_ids` name (reply items recorded for the client key hashed as
    /// `key_hash`), each with its id; ids not found are left out.
    async fn find_reply_items(
        &self,
        tenant: &str,
        key_hash: Option<&str>,
        item_ids: &[String],
    ) -> Result<Vec<(String, Value)>>;

    /// The most recently stored reply of `session` (origin `reply`), on whatever branch.
    async fn latest_reply(&self, tenant: &str, session: &str) -> Result<Option<MessageId>>;

    /// The upstream root recorded with the response whose reply ends at `message` in `session`
    /// (see [`ResponseRef::upstream_root`]), if there is one.
    async fn upstream_root_at(
        &self,
        tenant: &str,
        session: &str,
        message: MessageId,
    ) -> Result<Option<String>>;

    /// The admin view of a session: the row, its branches and the head's latest summary.
    async fn session_detail(&self, tenant: &str, session: &str) -> Result<Option<SessionDetail>> {
        let Some(session_row) = self.get_session(tenant, session).await? else {
            return Ok(None);
        };
        let branches = self.list_branches(tenant, session).await?;
        let summary = self.latest_summary(tenant, session, None).await?;
        Ok(Some(SessionDetail {
            session: session_row,
            branches,
            summary,
        }))
    }
}

/// The readiness query: it reads a table, so a database that answers but has lost its schema
/// (recreated empty under a running proxy) is not ready, as every request would fail.
pub(crate) const PING: &str = "SELECT 1 FROM sessions LIMIT 1";

/// The page size actually used.
pub(crate) fn clamp_limit(limit: u32) -> i64 {
    i64::from(limit.clamp(1, 1000))
}

/// The head after an append (see [`Store::append_messages`]).
pub(crate) fn next_head(
    current: Option<MessageId>,
    last: Option<MessageId>,
    any_new: bool,
    last_is_leaf: bool,
) -> Option<MessageId> {
    match last {
        Some(last) if any_new || last_is_leaf => Some(last),
        _ => current,
    }
}
