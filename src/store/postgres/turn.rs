//! PostgreSQL: opening and closing a managed request's turn, each in one transaction (see
//! `store/turn.rs`). With `synchronous_commit` on, every transaction waits for its WAL flush,
//! so the single calls (an autocommit each) paid three or four flushes per visit; now each
//! visit pays one. A close whose transaction fails is done again part by part, so one failing
//! part is undone alone.

use sqlx::postgres::PgConnection;

use super::super::lease::new_owner;
use super::super::time::Timestamp;
use super::super::turn::{
    Committed, LEASE_LOST, TurnClose, TurnClosed, TurnOpen, TurnOpened, close_by_parts,
    open_by_parts,
};
use super::super::types::Lease;
use super::{LeaseKind, PostgresStore, records, release_lease, text, tree};
use crate::Result;

impl PostgresStore {
    pub(super) async fn open_turn_tx(&self, open: TurnOpen) -> Result<TurnOpened> {
        let (tenant, session) = (open.tenant.as_str(), open.session.as_str());
        let mut tx = self.pool.begin().await?;
        if let Some(lease) = create_and_lease(&mut tx, &open).await? {
            // A failing append rolls the lease back with it (the transaction is dropped).
            let appended = match &open.append {
                None => Vec::new(),
                Some(a) => tree::append_in(&mut tx, tenant, session, a.parent, &a.messages).await?,
            };
            tx.commit().await?;
            return Ok(TurnOpened {
                lease,
                appended,
                committed: Committed::done(),
            });
        }
        // Someone holds the lease (so the session exists): wait for it as `lock_session` does.
        drop(tx);
        open_by_parts(self, open).await
    }

    pub(super) async fn close_turn_tx(&self, close: TurnClose) -> TurnClosed {
        let released = close
            .lease
            .as_ref()
            .map(|l| (l.tenant.clone(), l.session.clone()));
        // Usually nothing fails: every part in one transaction, without savepoints (they cost
        // a round trip each). If anything fails, that transaction is rolled back and the parts
        // are done again one by one, each kept or undone on its own.
        let closed = match self.close_at_once(&close).await {
            Ok(true) => TurnClosed::default(),
            Ok(false) => {
                let session = close.record.session.clone();
                let gone = crate::Error::NotFound(format!("session {session} (its lease)"));
                TurnClosed {
                    failures: vec![(LEASE_LOST, gone)],
                    unstored: None,
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "closing the turn in one transaction failed; retrying part by part");
                close_by_parts(self, close).await
            }
        };
        if let Some((tenant, session)) = released {
            self.wakeups.wake(&tenant, &session);
        }
        closed
    }

    /// `Ok(false)`: the session's lease is no longer the request's (see `LEASE_LOST`), and
    /// nothing was written.
    async fn close_at_once(&self, close: &TurnClose) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        // Released first, which no one sees before the commit: whether it was still held
        // decides whether anything is written, without a round trip of its own.
        if let Some(lease) = &close.lease
            && !release_lease(&mut tx, LeaseKind::Session, lease).await?
        {
            return Ok(false);
        }
        let mut record = close.record.clone();
        if let Some(reply) = close.reply.as_ref().filter(|r| !r.messages.is_empty()) {
            let (tenant, session) = (&record.tenant, &record.session);
            tree::append_in(&mut tx, tenant, session, reply.parent, &reply.messages).await?;
            record.head = reply.messages.last().map(|m| m.id);
            let key = close.key_hash.as_deref();
            records::record_reply_items(&mut tx, tenant, session, key, &reply.messages).await?;
            if let (Some(id), Some(head)) = (&close.response_id, record.head) {
                let (root, key) = (close.upstream_root.as_deref(), close.key_hash.as_deref());
                records::record_response(&mut tx, tenant, id, session, head, root, key).await?;
            }
        }
        // Also for a turn that got no answer: its retry finds the session it is stored in.
        if let (Some(conversation), Some(head)) = (&close.conversation, record.head) {
            let (tenant, session) = (&record.tenant, &record.session);
            let key = close.key_hash.as_deref();
            records::record_response(&mut tx, tenant, conversation, session, head, None, key)
                .await?;
        }
        records::insert_request(&mut tx, &record).await?;
        tx.commit().await?;
        Ok(true)
    }
}

/// Creates the session with its lease taken, or takes the lease of the existing session if it
/// is free: one statement (an upsert whose update only happens on a free lease) instead of an
/// insert and an update, so one round trip and one row version fewer. `None`: someone else
/// holds the lease, or a waiter's claim on the next turn stands (this first try claims
/// nothing: the wait that follows does, see `store/lease.rs`).
async fn create_and_lease(conn: &mut PgConnection, open: &TurnOpen) -> Result<Option<Lease>> {
    let now = Timestamp::now();
    let lease = Lease {
        tenant: open.tenant.clone(),
        session: open.session.clone(),
        owner: new_owner(),
        until: now.plus(open.ttl),
    };
    let done = sqlx::query(
        "INSERT INTO sessions (tenant, id, key_hash, user_id, created_at, updated_at, \
         lock_owner, lock_until) VALUES ($1, $2, $3, $4, $5, $5, $6, $7) \
         ON CONFLICT (tenant, id) DO UPDATE SET lock_owner = EXCLUDED.lock_owner, \
         lock_until = EXCLUDED.lock_until, lock_claim = NULL, lock_claim_since = NULL, \
         lock_claim_until = NULL \
         WHERE (sessions.lock_owner IS NULL OR sessions.lock_until <= $5) \
         AND (sessions.lock_claim IS NULL OR sessions.lock_claim_until <= $5)",
    )
    .bind(&lease.tenant)
    .bind(&lease.session)
    .bind(&open.scope.key_hash)
    .bind(text::opt_text(open.scope.user.as_deref()))
    .bind(now.millis())
    .bind(&lease.owner)
    .bind(lease.until.millis())
    .execute(&mut *conn)
    .await?;
    Ok((done.rows_affected() == 1).then_some(lease))
}
