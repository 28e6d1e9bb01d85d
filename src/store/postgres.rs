//! The PostgreSQL backend, for several proxy replicas sharing one database. Appends lock the
//! session row (`SELECT … FOR UPDATE`) for one short transaction; request serialisation is a
//! lease on that row taken by a conditional UPDATE (no advisory locks, no connection held
//! across the upstream call), so any PostgreSQL-compatible database can serve.

mod records;
mod text;
mod tree;
mod turn;

use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;
use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions, PgRow};

use super::lease::{self, Claim, Wakeups};
use super::migrations::{self, LOCK_ROW};
use super::time::Timestamp;
use super::turn::{TurnClose, TurnClosed, TurnOpen, TurnOpened};
use super::types::*;
use super::{PING, Store};
use crate::conversation::MessageId;
use crate::{Error, Result};

/// The store on one PostgreSQL database.
pub struct PostgresStore {
    pool: PgPool,
    wakeups: Wakeups,
}

/// Withdraws a waiter's claim on a session's next turn when dropped, unless `claimant` was
/// taken (the lease was: that cleared it). The statement runs on a task of its own: a drop
/// cannot wait for it.
struct WithdrawClaim {
    pool: PgPool,
    tenant: String,
    session: String,
    claimant: Option<String>,
}

impl Drop for WithdrawClaim {
    fn drop(&mut self) {
        let Some(claimant) = self.claimant.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (pool, tenant, session) = (
            self.pool.clone(),
            std::mem::take(&mut self.tenant),
            std::mem::take(&mut self.session),
        );
        runtime.spawn(async move {
            let _ = sqlx::query(
                "UPDATE sessions SET lock_claim = NULL, lock_claim_since = NULL, \
                 lock_claim_until = NULL WHERE tenant = $1 AND id = $2 AND lock_claim = $3",
            )
            .bind(tenant)
            .bind(session)
            .bind(claimant)
            .execute(&pool)
            .await;
        });
    }
}

#[derive(Clone, Copy)]
enum LeaseKind {
    Session,
    Summary,
}

impl PostgresStore {
    /// Connects a pool to the database named by a `postgres://` URL.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self> {
        let pool = match PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(Duration::from_secs(10))
            .connect(url)
            .await
        {
            Ok(pool) => pool,
            // The pool says only that it timed out; one direct attempt says why ("connection
            // refused", an unknown database, a password), which is what an operator needs.
            Err(sqlx::Error::PoolTimedOut) => {
                let cause = match <PgConnection as sqlx::Connection>::connect(url).await {
                    Err(e) => e.to_string(),
                    Ok(_) => "no connection became free in 10 s".to_string(),
                };
                return Err(Error::StoreUnavailable(format!(
                    "cannot connect to PostgreSQL: {cause}"
                )));
            }
            Err(e) => return Err(e.into()),
        };
        Ok(PostgresStore {
            pool,
            wakeups: Wakeups::default(),
        })
    }

    async fn try_lease(
        &self,
        kind: LeaseKind,
        tenant: &str,
        session: &str,
        ttl: Duration,
        claim: Option<&Claim>,
    ) -> Result<Option<Lease>> {
        let mut conn = self.pool.acquire().await?;
        take_lease(&mut conn, kind, tenant, session, ttl, claim).await
    }

    async fn release(&self, kind: LeaseKind, lease: &Lease) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        release_lease(&mut conn, kind, lease).await.map(|_| ())
    }

    async fn migrate_once(&self) -> Result<()> {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS ctxproxy_migrations (version BIGINT PRIMARY KEY, \
             description TEXT NOT NULL, checksum TEXT NOT NULL, applied_at BIGINT NOT NULL)",
        )
        .execute(&self.pool)
        .await?;
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO ctxproxy_migrations (version, description, checksum, applied_at) \
             VALUES ($1, 'runner lock', '', 0) ON CONFLICT (version) DO NOTHING",
        )
        .bind(LOCK_ROW)
        .execute(&mut *tx)
        .await?;
        // Concurrent runners queue on this row lock; DDL is transactional, so a runner that
        // fails leaves nothing half-applied.
        sqlx::query("SELECT version FROM ctxproxy_migrations WHERE version = $1 FOR UPDATE")
            .bind(LOCK_ROW)
            .execute(&mut *tx)
            .await?;
        let applied: Vec<(i64, String)> =
            sqlx::query_as("SELECT version, checksum FROM ctxproxy_migrations WHERE version <> $1")
                .bind(LOCK_ROW)
                .fetch_all(&mut *tx)
                .await?;
        let versions: Vec<i64> = applied.iter().map(|(v, _)| *v).collect();
        migrations::refuse_newer(&versions, migrations::POSTGRES)?;
        for m in migrations::POSTGRES {
            if let Some((_, sum)) = applied.iter().find(|(v, _)| *v == m.version) {
                migrations::verify(m, sum)?;
                continue;
            }
            sqlx::raw_sql(m.sql).execute(&mut *tx).await?;
            sqlx::query(
                "INSERT INTO ctxproxy_migrations (version, description, checksum, applied_at) \
                 VALUES ($1, $2, $3, $4)",
            )
            .bind(m.version)
            .bind(m.description)
            .bind(m.checksum())
            .bind(Timestamp::now().millis())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

/// One attempt at a lease: a single conditional UPDATE. Under READ COMMITTED a concurrent
/// winner makes PostgreSQL re-check the WHERE clause on the new row version, so at most one of
/// them matches. `claim`: the waiter asking; a session lease is not taken while another
/// waiter's claim on the next turn stands, and a waiter's failed attempt claims it (unless an
/// earlier waiter holds it). Without one (a summary lease) nothing is claimed.
async fn take_lease(
    conn: &mut PgConnection,
    kind: LeaseKind,
    tenant: &str,
    session: &str,
    ttl: Duration,
    claim: Option<&Claim>,
) -> Result<Option<Lease>> {
    let now = Timestamp::now();
    let lease = Lease {
        tenant: tenant.to_string(),
        session: session.to_string(),
        owner: lease::new_owner(),
        until: now.plus(ttl),
    };
    let sql = match kind {
        LeaseKind::Session => {
            "UPDATE sessions SET lock_owner = $1, lock_until = $2, lock_claim = NULL, lock_claim_since = NULL, \
             lock_claim_until = NULL WHERE tenant = $3 AND id = $4 \
             AND (lock_owner IS NULL OR lock_until <= $5) \
             AND (lock_claim IS NULL OR lock_claim = $6 OR lock_claim_until <= $5)"
        }
        LeaseKind::Summary => {
            "UPDATE sessions SET summary_owner = $1, summary_until = $2 WHERE tenant = $3 \
             AND id = $4 AND (summary_owner IS NULL OR summary_until <= $5)"
        }
    };
    let mut query = sqlx::query(sql)
        .bind(&lease.owner)
        .bind(lease.until.millis())
        .bind(tenant)
        .bind(session)
        .bind(now.millis());
    if matches!(kind, LeaseKind::Session) {
        query = query.bind(claim.map(|c| c.claimant.as_str()));
    }
    let done = query.execute(&mut *conn).await?;
    if done.rows_affected() == 1 {
        return Ok(Some(lease));
    }
    if let (LeaseKind::Session, Some(claim)) = (kind, claim) {
        claim_next_turn(conn, tenant, session, claim, now).await?;
    }
    Ok(None)
}

/// Claims a session's next turn for the waiter `claim` (or renews its claim) unless another
/// waiter's stands that began waiting no later: see `store/lease.rs`.
async fn claim_next_turn(
    conn: &mut PgConnection,
    tenant: &str,
    session: &str,
    claim: &Claim,
    now: Timestamp,
) -> Result<()> {
    sqlx::query(
        "UPDATE sessions SET lock_claim = $1, lock_claim_since = $2, lock_claim_until = $3 \
         WHERE tenant = $4 AND id = $6 AND (lock_claim IS NULL OR lock_claim = $1 \
         OR lock_claim_until <= $5 OR lock_claim_since > $2)",
    )
    .bind(&claim.claimant)
    .bind(claim.since)
    .bind(now.plus(lease::CLAIM_TTL).millis())
    .bind(tenant)
    .bind(now.millis())
    .bind(session)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Releases a lease if its owner still holds it (otherwise a no-op).
/// Releases `lease`; `false` when it was not held (any more) by its owner.
async fn release_lease(conn: &mut PgConnection, kind: LeaseKind, lease: &Lease) -> Result<bool> {
    let sql = match kind {
        LeaseKind::Session => {
            "UPDATE sessions SET lock_owner = NULL, lock_until = NULL \
             WHERE tenant = $1 AND id = $2 AND lock_owner = $3"
        }
        LeaseKind::Summary => {
            "UPDATE sessions SET summary_owner = NULL, summary_until = NULL \
             WHERE tenant = $1 AND id = $2 AND summary_owner = $3"
        }
    };
    let done = sqlx::query(sql)
        .bind(&lease.tenant)
        .bind(&lease.session)
        .bind(&lease.owner)
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Creates the session with `scope` unless it exists (then it is left as it was).
async fn create_session(
    conn: &mut PgConnection,
    tenant: &str,
    session: &str,
    scope: &Scope,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO sessions (tenant, id, key_hash, user_id, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $5) ON CONFLICT (tenant, id) DO NOTHING",
    )
    .bind(tenant)
    .bind(session)
    .bind(&scope.key_hash)
    .bind(text::opt_text(scope.user.as_deref()))
    .bind(Timestamp::now().millis())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

const SESSION_COLUMNS: &str = "s.tenant, s.id, s.key_hash, s.user_id, s.created_at, \
     s.updated_at, s.head_id, (SELECT COUNT(*) FROM messages m \
     WHERE m.tenant = s.tenant AND m.session_id = s.id) AS message_count";

fn session_from_row(row: &PgRow) -> Result<Session> {
    let head: Option<Vec<u8>> = row.try_get("head_id")?;
    Ok(Session {
        tenant: row.try_get("tenant")?,
        id: row.try_get("id")?,
        key_hash: row.try_get("key_hash")?,
        user: row.try_get("user_id")?,
        created_at: Timestamp(row.try_get("created_at")?),
        updated_at: Timestamp(row.try_get("updated_at")?),
        head: head.as_deref().map(id_from_bytes).transpose()?,
        message_count: row.try_get("message_count")?,
    })
}

#[async_trait]
impl Store for PostgresStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn migrate(&self) -> Result<()> {
        // Two first-time runners can collide creating the bookkeeping table itself (a unique
        // violation in the catalog); the loser simply tries again and then queues on the lock.
        match self.migrate_once().await {
            Err(Error::StoreUnavailable(_)) => self.migrate_once().await,
            other => other,
        }
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query(PING).execute(&self.pool).await?;
        Ok(())
    }

    async fn close(&self) {
        self.pool.close().await;
    }

    async fn get_or_create_session(
        &self,
        tenant: &str,
        session: &str,
        scope: &Scope,
    ) -> Result<Session> {
        create_session(&mut *self.pool.acquire().await?, tenant, session, scope).await?;
        self.get_session(tenant, session).await?.ok_or_else(|| {
            Error::NotFound(format!(
                "session '{session}' deleted right after its creation"
            ))
        })
    }

    async fn get_session(&self, tenant: &str, session: &str) -> Result<Option<Session>> {
        let sql =
            format!("SELECT {SESSION_COLUMNS} FROM sessions s WHERE s.tenant = $1 AND s.id = $2");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(tenant)
            .bind(session)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(session_from_row).transpose()
    }

    async fn lock_session(
        &self,
        tenant: &str,
        session: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lease> {
        if self.get_session(tenant, session).await?.is_none() {
            return Err(Error::NotFound(format!("session '{session}' not found")));
        }
        // A session deleted while this waits is `NotFound` too, not a wait to the deadline.
        let claim = Claim::new();
        // Until the lease is taken, a waiter that gives up or is dropped (its client left)
        // withdraws its claim: the next turn is not its to hold up.
        let mut withdraw = WithdrawClaim {
            pool: self.pool.clone(),
            tenant: tenant.to_string(),
            session: session.to_string(),
            claimant: Some(claim.claimant.clone()),
        };
        let acquired = lease::acquire(&self.wakeups, tenant, session, wait, || async {
            match self
                .try_lease(LeaseKind::Session, tenant, session, ttl, Some(&claim))
                .await?
            {
                None if self.get_session(tenant, session).await?.is_none() => {
                    Err(Error::NotFound(format!("session '{session}' not found")))
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
        let until = Timestamp::now().plus(ttl);
        let done = sqlx::query(
            "UPDATE sessions SET lock_until = $1 WHERE tenant = $2 AND id = $3 AND lock_owner = $4",
        )
        .bind(until.millis())
        .bind(&held.tenant)
        .bind(&held.session)
        .bind(&held.owner)
        .execute(&self.pool)
        .await?;
        Ok((done.rows_affected() == 1).then(|| Lease {
            until,
            ..held.clone()
        }))
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
        tree::append(&self.pool, tenant, session, parent, messages).await
    }

    async fn open_turn(&self, open: TurnOpen) -> Result<TurnOpened> {
        self.open_turn_tx(open).await
    }

    async fn close_turn(&self, close: TurnClose) -> TurnClosed {
        self.close_turn_tx(close).await
    }

    async fn head_branch(&self, tenant: &str, session: &str) -> Result<Vec<StoredMessage>> {
        tree::path(&self.pool, tenant, session, None).await
    }

    async fn load_path(
        &self,
        tenant: &str,
        session: &str,
        message: MessageId,
    ) -> Result<Vec<StoredMessage>> {
        tree::path(&self.pool, tenant, session, Some(message)).await
    }

    async fn list_branches(&self, tenant: &str, session: &str) -> Result<Vec<Branch>> {
        tree::branches(&self.pool, tenant, session).await
    }

    async fn find_session_continued(
        &self,
        tenant: &str,
        scope: &Scope,
        ids: &[MessageId],
        through: usize,
    ) -> Result<Option<PrefixMatch>> {
        tree::find_by_prefix(&self.pool, tenant, scope, ids, through).await
    }

    async fn insert_request(&self, record: &NewRequestRecord) -> Result<RequestRecord> {
        records::insert_request(&mut *self.pool.acquire().await?, record).await
    }

    async fn list_requests(&self, tenant: &str, session: &str) -> Result<Vec<RequestRecord>> {
        records::list_requests(&self.pool, tenant, session).await
    }

    async fn list_sessions(&self, query: &SessionQuery) -> Result<SessionPage> {
        records::list_sessions(&self.pool, query).await
    }

    async fn delete_session(&self, tenant: &str, session: &str) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        for sql in [
            "DELETE FROM responses WHERE tenant = $1 AND session_id = $2",
            "DELETE FROM reply_items WHERE tenant = $1 AND session_id = $2",
            "DELETE FROM summaries WHERE tenant = $1 AND session_id = $2",
            "DELETE FROM requests WHERE tenant = $1 AND session_id = $2",
            "DELETE FROM messages WHERE tenant = $1 AND session_id = $2",
        ] {
            sqlx::query(sql)
                .bind(tenant)
                .bind(session)
                .execute(&mut *tx)
                .await?;
        }
        let done = sqlx::query("DELETE FROM sessions WHERE tenant = $1 AND id = $2")
            .bind(tenant)
            .bind(session)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(done.rows_affected() > 0)
    }

    async fn insert_summary(
        &self,
        tenant: &str,
        session: &str,
        summary: &NewSummary,
    ) -> Result<Summary> {
        records::insert_summary(&self.pool, tenant, session, summary).await
    }

    async fn latest_summary(
        &self,
        tenant: &str,
        session: &str,
        leaf: Option<MessageId>,
    ) -> Result<Option<Summary>> {
        records::latest_summary(&self.pool, tenant, session, leaf).await
    }

    async fn list_summaries(&self, tenant: &str, session: &str) -> Result<Vec<Summary>> {
        records::list_summaries(&self.pool, tenant, session).await
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
        let mut conn = self.pool.acquire().await?;
        records::record_response(
            &mut conn,
            tenant,
            response_id,
            session,
            message,
            upstream_root,
            key_hash,
        )
        .await
    }

    async fn latest_reply(&self, tenant: &str, session: &str) -> Result<Option<MessageId>> {
        let row: Option<(Vec<u8>,)> = sqlx::query_as(
            "SELECT id FROM messages WHERE tenant = $1 AND session_id = $2 \
             AND origin = 'reply' ORDER BY seq DESC LIMIT 1",
        )
        .bind(tenant)
        .bind(session)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|(id,)| id_from_bytes(&id)).transpose()
    }

    async fn upstream_root_at(
        &self,
        tenant: &str,
        session: &str,
        message: MessageId,
    ) -> Result<Option<String>> {
        let root: Option<(String,)> = sqlx::query_as(
            "SELECT upstream_root FROM responses WHERE tenant = $1 AND session_id = $2 \
             AND message_id = $3 AND upstream_root IS NOT NULL LIMIT 1",
        )
        .bind(tenant)
        .bind(session)
        .bind(message.0.to_vec())
        .fetch_optional(&self.pool)
        .await?;
        Ok(root.map(|(r,)| r))
    }

    async fn record_reply_items(
        &self,
        tenant: &str,
        session: &str,
        key_hash: Option<&str>,
        messages: &[NewMessage],
    ) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        records::record_reply_items(&mut conn, tenant, session, key_hash, messages).await
    }

    async fn find_reply_items(
        &self,
        tenant: &str,
        key_hash: Option<&str>,
        item_ids: &[String],
    ) -> Result<Vec<(String, serde_json::Value)>> {
        records::find_reply_items(&self.pool, tenant, key_hash, item_ids).await
    }

    async fn find_response(&self, tenant: &str, response_id: &str) -> Result<Option<ResponseRef>> {
        let row: Option<(String, Vec<u8>, Option<String>, Option<String>)> = sqlx::query_as(
            "SELECT session_id, message_id, upstream_root, key_hash FROM responses \
             WHERE tenant = $1 AND response_id = $2",
        )
        .bind(tenant)
        .bind(text::text(response_id))
        .fetch_optional(&self.pool)
        .await?;
        row.map(|(session, id, upstream_root, key_hash)| {
            Ok(ResponseRef {
                session,
                message: id_from_bytes(&id)?,
                upstream_root,
                key_hash,
            })
        })
        .transpose()
    }
}
