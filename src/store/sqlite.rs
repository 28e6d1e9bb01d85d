//! The SQLite backend: the default, single-process store, on `rusqlite` with dedicated threads.
//!
//! Why threads: SQLite calls block, so they must not run on tokio's workers. sqlx ran every
//! connection on a worker thread of its own and paid one channel round trip (and futex wake-ups)
//! per *statement*; a new-session request ran ~19 of them and those hand-offs were the biggest
//! cost of the proxy (issue 5). Here every store call is one closure sent to the thread that
//! owns a connection: one hand-off per call, whatever it runs (see `threads.rs`).
//!
//! Why group commit: SQLite has one writer at a time anyway, so all writes go to one writer
//! thread. It runs whatever is queued in one `BEGIN IMMEDIATE` transaction, each job inside its
//! own savepoint (atomic and isolated: a failing job is rolled back alone and gets its error),
//! and commits once: under load many calls share one WAL write. Answers go out only after the
//! commit, so a caller never sees a write that could still be lost, and a later read on a
//! reader connection always sees it. `BEGIN IMMEDIATE` takes the write lock up front, so another
//! process on the same file queues in the busy handler instead of failing to upgrade a lock.
//!
//! Reads run on a few reader threads (WAL lets them read beside the writer); an in-memory
//! database has a single connection, so there everything runs on the writer. The lease is the
//! same conditional UPDATE as on PostgreSQL, so two processes on one file are still serialised
//! correctly. Column encodings are those the sqlx version wrote (ids as BLOBs, times as integer
//! unix milliseconds, JSON as TEXT, booleans as 0/1), so its databases open unchanged.

mod instances;
mod open;
mod records;
mod threads;
mod tree;
mod turn;

use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::Store;
use super::lease::{self, Claim, Wakeups};
use super::migrations::{self, LOCK_ROW};
use super::time::Timestamp;
use super::turn::{TurnClose, TurnClosed, TurnOpen, TurnOpened};
use super::types::*;
use crate::conversation::MessageId;
use crate::{Error, Result};
use open::Target;
use threads::Threads;

/// Reader threads at most, whatever `max_connections` says: reads are short and CPU-bound, so
/// more readers than cores only add threads and page caches.
const MAX_READERS: u32 = 4;

/// The store on one SQLite file.
pub struct SqliteStore {
    threads: Threads,
    wakeups: Wakeups,
    /// Held while the store is open, so other processes see this one (`instances.rs`).
    _instance: Option<instances::Instance>,
}

impl SqliteStore {
    /// Opens (creating if needed) the database named by a `sqlite:` URL, with
    /// `max_connections` reader threads (at least 1, at most 4; none for an in-memory database).
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self> {
        let target = Target::parse(url)?;
        if target.in_memory() {
            tracing::warn!(
                "database.url names an in-memory SQLite database: nothing is kept after a restart"
            );
        }
        let readers = max_connections.clamp(1, MAX_READERS) as usize;
        target.create_dir()?;
        let opened = match target.writable_file() {
            Some(path) => {
                let path = path.to_owned();
                // `flock` may wait for a process between its two locks: not on a worker.
                let opened = tokio::task::spawn_blocking(move || instances::open(&path))
                    .await
                    .map_err(|e| Error::Internal(format!("instance lock task failed: {e}")))??;
                Some(opened)
            }
            None => None,
        };
        let threads = Threads::start(target, readers).await?;
        let alone = opened.as_ref().is_some_and(|o| o.alone);
        if alone {
            let cleared = threads.write(instances::clear_leases).await?;
            if cleared > 0 {
                tracing::info!(
                    sessions = cleared,
                    "cleared the session leases a stopped process left behind"
                );
            }
        }
        Ok(SqliteStore {
            threads,
            wakeups: Wakeups::default(),
            _instance: opened.map(|o| o.instance),
        })
    }

    /// Checks a `sqlite:` URL without opening anything.
    pub(super) fn check_url(url: &str) -> Result<()> {
        Target::parse(url).map(|_| ())
    }

    async fn try_lease(
        &self,
        kind: LeaseKind,
        tenant: &str,
        session: &str,
        ttl: Duration,
        claim: Option<&Claim>,
    ) -> Result<Option<Lease>> {
        let (tenant, session) = (tenant.to_string(), session.to_string());
        let claim = claim.cloned();
        self.threads
            .write(move |conn| {
                Ok(take_lease(conn, kind, tenant, session, ttl, claim.as_ref())?.ok())
            })
            .await
    }

    async fn release(&self, kind: LeaseKind, lease: &Lease) -> Result<()> {
        let lease = lease.clone();
        self.threads
            .write(move |conn| release_lease(conn, kind, &lease).map(|_| ()))
            .await
    }
}

/// Withdraws a waiter's claim on a session's next turn when dropped, unless `claimant` was
/// taken (the lease was: that cleared it).
struct WithdrawClaim<'a> {
    threads: &'a Threads,
    tenant: String,
    session: String,
    claimant: Option<String>,
}

impl Drop for WithdrawClaim<'_> {
    fn drop(&mut self) {
        let Some(claimant) = self.claimant.take() else {
            return;
        };
        let (tenant, session) = (
            std::mem::take(&mut self.tenant),
            std::mem::take(&mut self.session),
        );
        self.threads.write_detached(move |conn| {
            conn.prepare_cached(
                "UPDATE sessions SET lock_claim = NULL, lock_claim_since = NULL, \
                 lock_claim_until = NULL WHERE tenant = ? AND id = ? AND lock_claim = ?",
            )?
            .execute(params![tenant, session, claimant])?;
            Ok(())
        });
    }
}

#[derive(Clone, Copy)]
enum LeaseKind {
    Session,
    Summary,
}

/// Releases a lease if its owner still holds it (otherwise a no-op).
/// Releases `lease`; `false` when it was not held (any more) by its owner.
fn release_lease(conn: &Connection, kind: LeaseKind, lease: &Lease) -> Result<bool> {
    let sql = match kind {
        LeaseKind::Session => {
            "UPDATE sessions SET lock_owner = NULL, lock_until = NULL \
             WHERE tenant = ? AND id = ? AND lock_owner = ?"
        }
        LeaseKind::Summary => {
            "UPDATE sessions SET summary_owner = NULL, summary_until = NULL \
             WHERE tenant = ? AND id = ? AND summary_owner = ?"
        }
    };
    let changed =
        conn.prepare_cached(sql)?
            .execute(params![lease.tenant, lease.session, lease.owner])?;
    Ok(changed == 1)
}

/// Whether the session's lease is still `lease`'s owner's (expired or not: nobody took it). A
/// session deleted and begun again under the same id while a request ran has another owner.
fn holds_session_lease(conn: &Connection, lease: &Lease) -> Result<bool> {
    let held = conn
        .prepare_cached("SELECT 1 FROM sessions WHERE tenant = ? AND id = ? AND lock_owner = ?")?
        .query_row(
            params![lease.tenant, lease.session, lease.owner],
            |_| Ok(()),
        )
        .optional()?;
    Ok(held.is_some())
}

/// One attempt at a lease: the conditional UPDATE. `Err(())` inside: someone else holds it.
/// `claim`: the waiter asking. A session lease is not taken while another waiter's claim on
/// the next turn stands, and a waiter's attempt that fails claims it (unless an earlier waiter
/// holds it), so that another process's waiters are not starved by this one's (see
/// `store/lease.rs`). Without one (a first try before any wait, a summary lease) nothing is
/// claimed.
fn take_lease(
    conn: &Connection,
    kind: LeaseKind,
    tenant: String,
    session: String,
    ttl: Duration,
    claim: Option<&Claim>,
) -> Result<Result<Lease, ()>> {
    let now = Timestamp::now();
    let lease = Lease {
        tenant,
        session,
        owner: lease::new_owner(),
        until: now.plus(ttl),
    };
    let changed = match kind {
        LeaseKind::Session => conn
            .prepare_cached(
                "UPDATE sessions SET lock_owner = ?1, lock_until = ?2, lock_claim = NULL, lock_claim_since = NULL, \
                 lock_claim_until = NULL WHERE tenant = ?3 AND id = ?4 \
                 AND (lock_owner IS NULL OR lock_until <= ?5) \
                 AND (lock_claim IS NULL OR lock_claim = ?6 OR lock_claim_until <= ?5)",
            )?
            .execute(params![
                lease.owner,
                lease.until.millis(),
                lease.tenant,
                lease.session,
                now.millis(),
                claim.map(|c| c.claimant.as_str())
            ])?,
        LeaseKind::Summary => conn
            .prepare_cached(
                "UPDATE sessions SET summary_owner = ?, summary_until = ? WHERE tenant = ? \
                 AND id = ? AND (summary_owner IS NULL OR summary_until <= ?)",
            )?
            .execute(params![
                lease.owner,
                lease.until.millis(),
                lease.tenant,
                lease.session,
                now.millis()
            ])?,
    };
    if changed == 1 {
        return Ok(Ok(lease));
    }
    if let (LeaseKind::Session, Some(claim)) = (kind, claim) {
        conn.prepare_cached(
            "UPDATE sessions SET lock_claim = ?1, lock_claim_since = ?2, lock_claim_until = ?3 \
             WHERE tenant = ?4 AND id = ?6 AND (lock_claim IS NULL OR lock_claim = ?1 \
             OR lock_claim_until <= ?5 OR lock_claim_since > ?2)",
        )?
        .execute(params![
            claim.claimant,
            claim.since,
            now.plus(lease::CLAIM_TTL).millis(),
            lease.tenant,
            now.millis(),
            lease.session
        ])?;
    }
    Ok(Err(()))
}

const SESSION_COLUMNS: &str = "s.tenant, s.id, s.key_hash, s.user_id, s.created_at, \
     s.updated_at, s.head_id, (SELECT COUNT(*) FROM messages m \
     WHERE m.tenant = s.tenant AND m.session_id = s.id) AS message_count";

fn session_from_row(row: &Row<'_>) -> Result<Session> {
    let head: Option<Vec<u8>> = row.get("head_id")?;
    Ok(Session {
        tenant: row.get("tenant")?,
        id: row.get("id")?,
        key_hash: row.get("key_hash")?,
        user: row.get("user_id")?,
        created_at: Timestamp(row.get("created_at")?),
        updated_at: Timestamp(row.get("updated_at")?),
        head: head.as_deref().map(id_from_bytes).transpose()?,
        message_count: row.get("message_count")?,
    })
}

fn session_by_id(conn: &Connection, tenant: &str, session: &str) -> Result<Option<Session>> {
    let sql = format!("SELECT {SESSION_COLUMNS} FROM sessions s WHERE s.tenant = ? AND s.id = ?");
    conn.prepare_cached(&sql)?
        .query_row(params![tenant, session], |row| Ok(session_from_row(row)))
        .optional()?
        .transpose()
}

/// Creates the session with `scope` unless it exists (then it is left as it was).
fn create_session(conn: &Connection, tenant: &str, session: &str, scope: &Scope) -> Result<()> {
    let now = Timestamp::now().millis();
    conn.prepare_cached(
        "INSERT INTO sessions (tenant, id, key_hash, user_id, created_at, updated_at) \
         VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, id) DO NOTHING",
    )?
    .execute(params![
        tenant,
        session,
        scope.key_hash,
        scope.user,
        now,
        now
    ])?;
    Ok(())
}

fn run_migrations(conn: &Connection) -> Result<()> {
    // Inside the writer's `BEGIN IMMEDIATE`: concurrent runners (other processes) queue on the
    // write lock, and a failing migration leaves nothing behind.
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS ctxproxy_migrations (version INTEGER PRIMARY KEY, \
         description TEXT NOT NULL, checksum TEXT NOT NULL, applied_at INTEGER NOT NULL)",
    )?;
    let applied: Vec<(i64, String)> = conn
        .prepare("SELECT version, checksum FROM ctxproxy_migrations WHERE version <> ?")?
        .query_map([LOCK_ROW], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let versions: Vec<i64> = applied.iter().map(|(v, _)| *v).collect();
    migrations::refuse_newer(&versions, migrations::SQLITE)?;
    for m in migrations::SQLITE {
        if let Some((_, sum)) = applied.iter().find(|(v, _)| *v == m.version) {
            migrations::verify(m, sum)?;
            continue;
        }
        conn.execute_batch(m.sql)?;
        conn.execute(
            "INSERT INTO ctxproxy_migrations (version, description, checksum, applied_at) \
             VALUES (?, ?, ?, ?)",
            params![
                m.version,
                m.description,
                m.checksum(),
                Timestamp::now().millis()
            ],
        )?;
    }
    Ok(())
}

fn delete_everything(conn: &Connection, tenant: &str, session: &str) -> Result<bool> {
    // Explicit deletes rather than relying on ON DELETE CASCADE alone: a connection opened
    // without `foreign_keys` must not leave orphans behind.
    for sql in [
        "DELETE FROM responses WHERE tenant = ? AND session_id = ?",
        "DELETE FROM reply_items WHERE tenant = ? AND session_id = ?",
        "DELETE FROM summaries WHERE tenant = ? AND session_id = ?",
        "DELETE FROM requests WHERE tenant = ? AND session_id = ?",
        "DELETE FROM messages WHERE tenant = ? AND session_id = ?",
    ] {
        conn.prepare_cached(sql)?
            .execute(params![tenant, session])?;
    }
    let deleted = conn
        .prepare_cached("DELETE FROM sessions WHERE tenant = ? AND id = ?")?
        .execute(params![tenant, session])?;
    Ok(deleted > 0)
}

fn not_found(session: &str) -> Error {
    Error::NotFound(format!("session '{session}' not found"))
}

/// Owned copies of the usual (tenant, session) arguments, for a job that outlives the call.
fn owned(tenant: &str, session: &str) -> (String, String) {
    (tenant.to_string(), session.to_string())
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn migrate(&self) -> Result<()> {
        self.threads.write(run_migrations).await
    }

    async fn ping(&self) -> Result<()> {
        self.threads
            .read(|conn| {
                conn.prepare_cached(super::PING)?.exists([])?;
                Ok(())
            })
            .await
    }

    async fn close(&self) {
        // The write-ahead log copied into the database file and emptied first: SQLite does it
        // itself only on the last connection's close, which connections closing together
        // (writer, readers, checkpointer) may each take for not the last. On a reader: the
        // writer's jobs run inside its transaction, where no checkpoint can finish.
        let _ = self
            .threads
            .read(|conn| {
                conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
                Ok(())
            })
            .await;
        self.threads.close().await;
    }

    async fn get_or_create_session(
        &self,
        tenant: &str,
        session: &str,
        scope: &Scope,
    ) -> Result<Session> {
        let (tenant, session) = owned(tenant, session);
        let scope = scope.clone();
        self.threads
            .write(move |conn| {
                create_session(conn, &tenant, &session, &scope)?;
                session_by_id(conn, &tenant, &session)?.ok_or_else(|| {
                    Error::NotFound(format!(
                        "session '{session}' deleted right after its creation"
                    ))
                })
            })
            .await
    }

    async fn get_session(&self, tenant: &str, session: &str) -> Result<Option<Session>> {
        let (tenant, session) = owned(tenant, session);
        self.threads
            .read(move |conn| session_by_id(conn, &tenant, &session))
            .await
    }

    async fn lock_session(
        &self,
        tenant: &str,
        session: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lease> {
        // The common case, a free lease, costs one job; existence is checked in the same job
        // only when that fails (a missing session must be `NotFound`, not a timeout).
        let (t, s) = owned(tenant, session);
        let claim = Claim::new();
        let first_claim = claim.clone();
        // Until the lease is taken, a waiter that gives up or is dropped (its client left)
        // withdraws its claim: the next turn is not its to hold up.
        let mut withdraw = WithdrawClaim {
            threads: &self.threads,
            tenant: tenant.to_string(),
            session: session.to_string(),
            claimant: Some(claim.claimant.clone()),
        };
        let first = self
            .threads
            .write(move |conn| {
                let (t2, s2) = (t.clone(), s.clone());
                match take_lease(conn, LeaseKind::Session, t, s, ttl, Some(&first_claim))? {
                    Ok(lease) => Ok(Some(lease)),
                    Err(()) => {
                        let exists: Option<i64> = conn
                            .prepare_cached("SELECT 1 FROM sessions WHERE tenant = ? AND id = ?")?
                            .query_row(params![t2, s2], |row| row.get(0))
                            .optional()?;
                        match exists {
                            Some(_) => Ok(None),
                            None => Err(not_found(&s2)),
                        }
                    }
                }
            })
            .await?;
        if let Some(lease) = first {
            withdraw.claimant = None;
            return Ok(lease);
        }
        // A session deleted while this waits is `NotFound` too, not a wait to the deadline.
        let acquired = lease::acquire(&self.wakeups, tenant, session, wait, || async {
            match self
                .try_lease(LeaseKind::Session, tenant, session, ttl, Some(&claim))
                .await?
            {
                None if self.get_session(tenant, session).await?.is_none() => {
                    Err(not_found(session))
                }
                taken => Ok(taken),
            }
        })
        .await;
        if acquired.is_ok() {
            // Taking the lease cleared the claim.
            withdraw.claimant = None;
        }
        acquired
    }

    async fn renew_session_lease(&self, held: &Lease, ttl: Duration) -> Result<Option<Lease>> {
        let held = held.clone();
        self.threads
            .write(move |conn| {
                let until = Timestamp::now().plus(ttl);
                let changed = conn
                    .prepare_cached(
                        "UPDATE sessions SET lock_until = ? \
                         WHERE tenant = ? AND id = ? AND lock_owner = ?",
                    )?
                    .execute(params![
                        until.millis(),
                        held.tenant,
                        held.session,
                        held.owner
                    ])?;
                Ok((changed == 1).then_some(Lease { until, ..held }))
            })
            .await
    }

    async fn unlock_session(&self, held: &Lease) -> Result<()> {
        let result = self.release(LeaseKind::Session, held).await;
        self.wakeups.wake(&held.tenant, &held.session);
        result
    }

    async fn append_messages(
        &self,
        tenant: &str,
        session: &str,
        parent: Option<MessageId>,
        messages: &[NewMessage],
    ) -> Result<Vec<Appended>> {
        let (tenant, session) = owned(tenant, session);
        let messages = messages.to_vec();
        self.threads
            .write(move |conn| tree::append(conn, &tenant, &session, parent, &messages))
            .await
    }

    async fn open_turn(&self, open: TurnOpen) -> Result<TurnOpened> {
        self.open_turn_job(open).await
    }

    async fn close_turn(&self, close: TurnClose) -> TurnClosed {
        self.close_turn_job(close).await
    }

    fn hurry(&self) {
        self.threads.hurry();
    }

    async fn head_branch(&self, tenant: &str, session: &str) -> Result<Vec<StoredMessage>> {
        let (tenant, session) = owned(tenant, session);
        self.threads
            .read(move |conn| tree::path(conn, &tenant, &session, None))
            .await
    }

    async fn load_path(
        &self,
        tenant: &str,
        session: &str,
        message: MessageId,
    ) -> Result<Vec<StoredMessage>> {
        let (tenant, session) = owned(tenant, session);
        self.threads
            .read(move |conn| tree::path(conn, &tenant, &session, Some(message)))
            .await
    }

    async fn list_branches(&self, tenant: &str, session: &str) -> Result<Vec<Branch>> {
        let (tenant, session) = owned(tenant, session);
        self.threads
            .read(move |conn| tree::branches(conn, &tenant, &session))
            .await
    }

    async fn find_session_continued(
        &self,
        tenant: &str,
        scope: &Scope,
        ids: &[MessageId],
        through: usize,
    ) -> Result<Option<PrefixMatch>> {
        let tenant = tenant.to_string();
        let scope = scope.clone();
        let ids = ids.to_vec();
        self.threads
            .read(move |conn| tree::find_by_prefix(conn, &tenant, &scope, &ids, through))
            .await
    }

    async fn insert_request(&self, record: &NewRequestRecord) -> Result<RequestRecord> {
        let record = record.clone();
        self.threads
            .write(move |conn| records::insert_request(conn, &record))
            .await
    }

    async fn list_requests(&self, tenant: &str, session: &str) -> Result<Vec<RequestRecord>> {
        let (tenant, session) = owned(tenant, session);
        self.threads
            .read(move |conn| records::list_requests(conn, &tenant, &session))
            .await
    }

    async fn list_sessions(&self, query: &SessionQuery) -> Result<SessionPage> {
        let query = query.clone();
        self.threads
            .read(move |conn| records::list_sessions(conn, &query))
            .await
    }

    async fn delete_session(&self, tenant: &str, session: &str) -> Result<bool> {
        let (tenant, session) = owned(tenant, session);
        self.threads
            .write(move |conn| delete_everything(conn, &tenant, &session))
            .await
    }

    async fn insert_summary(
        &self,
        tenant: &str,
        session: &str,
        summary: &NewSummary,
    ) -> Result<Summary> {
        let (tenant, session) = owned(tenant, session);
        let summary = summary.clone();
        self.threads
            .write(move |conn| records::insert_summary(conn, &tenant, &session, &summary))
            .await
    }

    async fn latest_summary(
        &self,
        tenant: &str,
        session: &str,
        leaf: Option<MessageId>,
    ) -> Result<Option<Summary>> {
        let (tenant, session) = owned(tenant, session);
        self.threads
            .read(move |conn| records::latest_summary(conn, &tenant, &session, leaf))
            .await
    }

    async fn list_summaries(&self, tenant: &str, session: &str) -> Result<Vec<Summary>> {
        let (tenant, session) = owned(tenant, session);
        self.threads
            .read(move |conn| records::list_summaries(conn, &tenant, &session))
            .await
    }

    async fn try_lock_summary(
        &self,
        tenant: &str,
        session: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>> {
        self.try_lease(LeaseKind::Summary, tenant, session, ttl, None)
            .await
    }

    async fn unlock_summary(&self, held: &Lease) -> Result<()> {
        self.release(LeaseKind::Summary, held).await
    }

    async fn record_response(
        &self,
        tenant: &str,
        response_id: &str,
        session: &str,
        message: MessageId,
        upstream_root: Option<&str>,
        key_hash: Option<&str>,
    ) -> Result<()> {
        let (tenant, session) = owned(tenant, session);
        let (response_id, root) = (response_id.to_string(), upstream_root.map(str::to_string));
        let key_hash = key_hash.map(str::to_string);
        self.threads
            .write(move |conn| {
                let (root, key) = (root.as_deref(), key_hash.as_deref());
                records::record_response(conn, &tenant, &response_id, &session, message, root, key)
            })
            .await
    }

    async fn record_reply_items(
        &self,
        tenant: &str,
        session: &str,
        key_hash: Option<&str>,
        messages: &[NewMessage],
    ) -> Result<()> {
        let (tenant, session) = owned(tenant, session);
        let key_hash = key_hash.map(str::to_string);
        let messages = messages.to_vec();
        self.threads
            .write(move |conn| {
                records::record_reply_items(conn, &tenant, &session, key_hash.as_deref(), &messages)
            })
            .await
    }

    async fn find_reply_items(
        &self,
        tenant: &str,
        key_hash: Option<&str>,
        item_ids: &[String],
    ) -> Result<Vec<(String, serde_json::Value)>> {
        let tenant = tenant.to_string();
        let key_hash = key_hash.map(str::to_string);
        let item_ids = item_ids.to_vec();
        self.threads
            .read(move |conn| {
                records::find_reply_items(conn, &tenant, key_hash.as_deref(), &item_ids)
            })
            .await
    }

    async fn latest_reply(&self, tenant: &str, session: &str) -> Result<Option<MessageId>> {
        let (tenant, session) = owned(tenant, session);
        self.threads
            .read(move |conn| {
                let id: Option<Vec<u8>> = conn
                    .prepare_cached(
                        "SELECT id FROM messages WHERE tenant = ? AND session_id = ? \
                         AND origin = 'reply' ORDER BY seq DESC LIMIT 1",
                    )?
                    .query_row(params![tenant, session], |row| row.get(0))
                    .optional()?;
                id.map(|id| id_from_bytes(&id)).transpose()
            })
            .await
    }

    async fn upstream_root_at(
        &self,
        tenant: &str,
        session: &str,
        message: MessageId,
    ) -> Result<Option<String>> {
        let (tenant, session) = owned(tenant, session);
        self.threads
            .read(move |conn| {
                let root: Option<String> = conn
                    .prepare_cached(
                        "SELECT upstream_root FROM responses WHERE tenant = ? AND session_id = ? \
                         AND message_id = ? AND upstream_root IS NOT NULL LIMIT 1",
                    )?
                    .query_row(params![tenant, session, message.0.to_vec()], |row| {
                        row.get(0)
                    })
                    .optional()?;
                Ok(root)
            })
            .await
    }

    async fn find_response(&self, tenant: &str, response_id: &str) -> Result<Option<ResponseRef>> {
        let (tenant, response_id) = owned(tenant, response_id);
        self.threads
            .read(move |conn| {
                let row: Option<(String, Vec<u8>, Option<String>, Option<String>)> = conn
                    .prepare_cached(
                        "SELECT session_id, message_id, upstream_root, key_hash FROM responses \
                         WHERE tenant = ? AND response_id = ?",
                    )?
                    .query_row(params![tenant, response_id], |row| {
                        Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
                    })
                    .optional()?;
                row.map(|(session, id, upstream_root, key_hash)| {
                    Ok(ResponseRef {
                        session,
                        message: id_from_bytes(&id)?,
                        upstream_root,
                        key_hash,
                    })
                })
                .transpose()
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database that answers but has lost its schema is not ready: every request would fail.
    #[tokio::test]
    async fn ping_fails_once_the_schema_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ping.db");
        let store = SqliteStore::connect(&format!("sqlite://{}", path.display()), 1)
            .await
            .unwrap();
        store.migrate().await.unwrap();
        store.ping().await.unwrap();
        let other = Connection::open(&path).unwrap();
        other
            .execute_batch(
                "PRAGMA foreign_keys = OFF; DROP TABLE responses; DROP TABLE summaries; \
                 DROP TABLE requests; DROP TABLE messages; DROP TABLE sessions;",
            )
            .unwrap();
        assert!(store.ping().await.is_err());
    }
}
