//! The SQLite backend: the default, single-process store. Write transactions start with
//! `BEGIN IMMEDIATE` so that two writers never both read first and then fail to upgrade their
//! lock; WAL lets readers run beside the one writer. The lease code is the same conditional
//! UPDATE as on PostgreSQL, so two processes on one file are still serialised correctly.
//!
//! Writes go through one dedicated connection (`writer`), reads through a pool. SQLite allows
//! one writer at a time anyway; with several pooled connections writing, the losers of the race
//! get SQLITE_BUSY and sleep in SQLite's busy handler (1 ms, 2 ms, 5 ms, ...), which under load
//! put milliseconds on the tail of every request. Queueing for the one writer connection in
//! the async pool costs nothing like that. The busy timeout stays for other processes.

mod records;
mod tree;

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};

use super::Store;
use super::lease::{self, Wakeups};
use super::migrations::{self, LOCK_ROW};
use super::time::Timestamp;
use super::types::*;
use crate::conversation::MessageId;
use crate::{Error, Result};

/// The store on one SQLite file.
pub struct SqliteStore {
    /// Reads (WAL: they run beside the writer).
    pool: SqlitePool,
    /// Every write, on one connection (or the same pool for an in-memory database).
    writer: SqlitePool,
    wakeups: Wakeups,
}

impl SqliteStore {
    /// Opens (creating if needed) the database file named by a `sqlite:` URL.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        let file = options.get_filename();
        if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                Error::StoreUnavailable(format!("cannot create {}: {e}", dir.display()))
            })?;
        }
        let in_memory = options.get_filename().as_os_str().is_empty()
            || url.contains(":memory:")
            || url.contains("mode=memory");
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options.clone())
            .await?;
        let writer = if in_memory {
            pool.clone()
        } else {
            SqlitePoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_secs(10))
                .connect_with(options)
                .await?
        };
        Ok(SqliteStore {
            pool,
            writer,
            wakeups: Wakeups::default(),
        })
    }

    async fn try_lease(
        &self,
        owner_col: LeaseKind,
        tenant: &str,
        session: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>> {
        let now = Timestamp::now();
        let lease = Lease {
            tenant: tenant.to_string(),
            session: session.to_string(),
            owner: lease::new_owner(),
            until: now.plus(ttl),
        };
        let sql = match owner_col {
            LeaseKind::Session => {
                "UPDATE sessions SET lock_owner = ?, lock_until = ? WHERE tenant = ? AND id = ? \
                 AND (lock_owner IS NULL OR lock_until <= ?)"
            }
            LeaseKind::Summary => {
                "UPDATE sessions SET summary_owner = ?, summary_until = ? WHERE tenant = ? \
                 AND id = ? AND (summary_owner IS NULL OR summary_until <= ?)"
            }
        };
        let done = sqlx::query(sql)
            .bind(&lease.owner)
            .bind(lease.until.millis())
            .bind(tenant)
            .bind(session)
            .bind(now.millis())
            .execute(&self.writer)
            .await?;
        Ok((done.rows_affected() == 1).then_some(lease))
    }

    async fn release(&self, kind: LeaseKind, lease: &Lease) -> Result<()> {
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
        sqlx::query(sql)
            .bind(&lease.tenant)
            .bind(&lease.session)
            .bind(&lease.owner)
            .execute(&self.writer)
            .await?;
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum LeaseKind {
    Session,
    Summary,
}

const SESSION_COLUMNS: &str = "s.tenant, s.id, s.key_hash, s.user_id, s.created_at, \
     s.updated_at, s.head_id, (SELECT COUNT(*) FROM messages m \
     WHERE m.tenant = s.tenant AND m.session_id = s.id) AS message_count";

fn session_from_row(row: &SqliteRow) -> Result<Session> {
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
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn migrate(&self) -> Result<()> {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS ctxproxy_migrations (version INTEGER PRIMARY KEY, \
             description TEXT NOT NULL, checksum TEXT NOT NULL, applied_at INTEGER NOT NULL)",
        )
        .execute(&self.writer)
        .await?;
        // BEGIN IMMEDIATE takes the write lock first: concurrent runners queue here.
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        let applied: Vec<(i64, String)> =
            sqlx::query_as("SELECT version, checksum FROM ctxproxy_migrations WHERE version <> ?")
                .bind(LOCK_ROW)
                .fetch_all(&mut *tx)
                .await?;
        for m in migrations::SQLITE {
            if let Some((_, sum)) = applied.iter().find(|(v, _)| *v == m.version) {
                migrations::verify(m, sum)?;
                continue;
            }
            sqlx::raw_sql(m.sql).execute(&mut *tx).await?;
            sqlx::query(
                "INSERT INTO ctxproxy_migrations (version, description, checksum, applied_at) \
                 VALUES (?, ?, ?, ?)",
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

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn close(&self) {
        self.writer.close().await;
        self.pool.close().await;
    }

    async fn get_or_create_session(
        &self,
        tenant: &str,
        session: &str,
        scope: &Scope,
    ) -> Result<Session> {
        let now = Timestamp::now().millis();
        sqlx::query(
            "INSERT INTO sessions (tenant, id, key_hash, user_id, created_at, updated_at) \
             VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, id) DO NOTHING",
        )
        .bind(tenant)
        .bind(session)
        .bind(&scope.key_hash)
        .bind(&scope.user)
        .bind(now)
        .bind(now)
        .execute(&self.writer)
        .await?;
        self.get_session(tenant, session)
            .await?
            .ok_or_else(|| Error::Internal("session vanished right after creation".into()))
    }

    async fn get_session(&self, tenant: &str, session: &str) -> Result<Option<Session>> {
        let sql =
            format!("SELECT {SESSION_COLUMNS} FROM sessions s WHERE s.tenant = ? AND s.id = ?");
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
        // The common case, a free lease, costs one statement; existence is checked only when
        // that fails (a missing session must still be `NotFound`, not a timeout).
        if let Some(lease) = self
            .try_lease(LeaseKind::Session, tenant, session, ttl)
            .await?
        {
            return Ok(lease);
        }
        let exists: Option<i64> =
            sqlx::query_scalar("SELECT 1 FROM sessions WHERE tenant = ? AND id = ?")
                .bind(tenant)
                .bind(session)
                .fetch_optional(&self.pool)
                .await?;
        if exists.is_none() {
            return Err(Error::NotFound(format!("session '{session}' not found")));
        }
        lease::acquire(&self.wakeups, tenant, session, wait, || {
            self.try_lease(LeaseKind::Session, tenant, session, ttl)
        })
        .await
    }

    async fn renew_session_lease(&self, held: &Lease, ttl: Duration) -> Result<Option<Lease>> {
        let until = Timestamp::now().plus(ttl);
        let done = sqlx::query(
            "UPDATE sessions SET lock_until = ? WHERE tenant = ? AND id = ? AND lock_owner = ?",
        )
        .bind(until.millis())
        .bind(&held.tenant)
        .bind(&held.session)
        .bind(&held.owner)
        .execute(&self.writer)
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
        tree::append(&self.writer, tenant, session, parent, messages).await
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

    async fn find_session_by_prefix(
        &self,
        tenant: &str,
        scope: &Scope,
        ids: &[MessageId],
    ) -> Result<Option<PrefixMatch>> {
        tree::find_by_prefix(&self.pool, tenant, scope, ids).await
    }

    async fn insert_request(&self, record: &NewRequestRecord) -> Result<RequestRecord> {
        records::insert_request(&self.writer, record).await
    }

    async fn list_requests(&self, tenant: &str, session: &str) -> Result<Vec<RequestRecord>> {
        records::list_requests(&self.pool, tenant, session).await
    }

    async fn list_sessions(&self, query: &SessionQuery) -> Result<SessionPage> {
        records::list_sessions(&self.pool, query).await
    }

    async fn delete_session(&self, tenant: &str, session: &str) -> Result<bool> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        // Explicit deletes rather than relying on ON DELETE CASCADE alone: a connection opened
        // without `foreign_keys` must not leave orphans behind.
        for sql in [
            "DELETE FROM responses WHERE tenant = ? AND session_id = ?",
            "DELETE FROM summaries WHERE tenant = ? AND session_id = ?",
            "DELETE FROM requests WHERE tenant = ? AND session_id = ?",
            "DELETE FROM messages WHERE tenant = ? AND session_id = ?",
        ] {
            sqlx::query(sql)
                .bind(tenant)
                .bind(session)
                .execute(&mut *tx)
                .await?;
        }
        let done = sqlx::query("DELETE FROM sessions WHERE tenant = ? AND id = ?")
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
        records::insert_summary(&self.writer, tenant, session, summary).await
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
        self.try_lease(LeaseKind::Summary, tenant, session, ttl)
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
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO responses (tenant, response_id, session_id, message_id, created_at) \
             VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant, response_id) DO UPDATE SET \
             session_id = excluded.session_id, message_id = excluded.message_id, \
             created_at = excluded.created_at",
        )
        .bind(tenant)
        .bind(response_id)
        .bind(session)
        .bind(&message.0[..])
        .bind(Timestamp::now().millis())
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    async fn find_response(&self, tenant: &str, response_id: &str) -> Result<Option<ResponseRef>> {
        let row: Option<(String, Vec<u8>)> = sqlx::query_as(
            "SELECT session_id, message_id FROM responses WHERE tenant = ? AND response_id = ?",
        )
        .bind(tenant)
        .bind(response_id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|(session, id)| {
            Ok(ResponseRef {
                session,
                message: id_from_bytes(&id)?,
            })
        })
        .transpose()
    }
}
