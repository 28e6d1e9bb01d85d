//! PostgreSQL: opening and closing a managed request's turn, each in one transaction (see
//! `store/turn.rs`). With `synchronous_commit` on, every transaction waits for its WAL flush,
//! so the single calls (an autocommit each) paid three or four flushes per visit; now each
//! visit pays one. Closing runs its parts in savepoints, so one failing part is undone alone.

use sqlx::Connection;
use sqlx::postgres::PgConnection;

use super::super::lease;
use super::super::turn::{Append, TurnClose, TurnClosed, TurnOpen, TurnOpened, append_under};
use super::{LeaseKind, PostgresStore, create_session, records, release_lease, take_lease, tree};
use crate::Result;

impl PostgresStore {
    pub(super) async fn open_turn_tx(&self, open: TurnOpen) -> Result<TurnOpened> {
        let TurnOpen {
            tenant,
            session,
            scope,
            ttl,
            wait,
            append,
        } = open;
        let mut tx = self.pool.begin().await?;
        create_session(&mut tx, &tenant, &session, &scope).await?;
        if let Some(lease) = take_lease(&mut tx, LeaseKind::Session, &tenant, &session, ttl).await?
        {
            // A failing append rolls the lease back with it (the transaction is dropped).
            let appended = match &append {
                None => Vec::new(),
                Some(a) => {
                    tree::append_in(&mut tx, &tenant, &session, a.parent, &a.messages).await?
                }
            };
            tx.commit().await?;
            return Ok(TurnOpened { lease, appended });
        }
        // Someone holds the lease: keep the session (it may be new) and wait as lock_session.
        tx.commit().await?;
        let lease = lease::acquire(&self.wakeups, &tenant, &session, wait, || {
            self.try_lease(LeaseKind::Session, &tenant, &session, ttl)
        })
        .await?;
        match append_under(self, &lease, append).await {
            Ok(appended) => Ok(TurnOpened { lease, appended }),
            Err(e) => {
                let _ = self.release(LeaseKind::Session, &lease).await;
                self.wakeups.wake(&tenant, &session);
                Err(e)
            }
        }
    }

    pub(super) async fn close_turn_tx(&self, close: TurnClose) -> TurnClosed {
        let released = close
            .lease
            .as_ref()
            .map(|l| (l.tenant.clone(), l.session.clone()));
        let closed = match self.pool.begin().await {
            Ok(mut tx) => {
                let closed = close_in(&mut tx, close).await;
                match tx.commit().await {
                    Ok(()) => closed,
                    Err(e) => TurnClosed {
                        failures: vec![("commit the close of the turn", e.into())],
                    },
                }
            }
            Err(e) => TurnClosed {
                failures: vec![("close the turn", e.into())],
            },
        };
        if let Some((tenant, session)) = released {
            self.wakeups.wake(&tenant, &session);
        }
        closed
    }
}

/// The parts of a close, in order, each in a savepoint of the caller's transaction.
async fn close_in(tx: &mut PgConnection, close: TurnClose) -> TurnClosed {
    let TurnClose {
        reply,
        response_id,
        mut record,
        lease,
    } = close;
    let mut failures = Vec::new();
    if let Some(Append { parent, messages }) = reply.filter(|r| !r.messages.is_empty()) {
        let (tenant, session) = (&record.tenant, &record.session);
        let stored = part(tx, async |c: &mut PgConnection| {
            tree::append_in(c, tenant, session, parent, &messages).await
        })
        .await;
        match stored {
            Ok(_) => record.head = messages.last().map(|m| m.id),
            Err(e) => failures.push(("store the reply", e)),
        }
        if let (Some(id), Some(head)) = (&response_id, record.head) {
            let (tenant, session) = (&record.tenant, &record.session);
            let recorded = part(tx, async |c: &mut PgConnection| {
                records::record_response(c, tenant, id, session, head).await
            })
            .await;
            if let Err(e) = recorded {
                failures.push(("record the response id", e));
            }
        }
    }
    let record = &record;
    if let Err(e) = part(tx, async |c: &mut PgConnection| {
        records::insert_request(c, record).await
    })
    .await
    {
        failures.push(("store the request record", e));
    }
    if let Some(lease) = &lease
        && let Err(e) = release_lease(tx, LeaseKind::Session, lease).await
    {
        failures.push(("release the session lease", e));
    }
    TurnClosed { failures }
}

/// Runs one part of a close in a savepoint: a failure undoes that part only.
async fn part<T>(
    tx: &mut PgConnection,
    work: impl AsyncFnOnce(&mut PgConnection) -> Result<T>,
) -> Result<T> {
    let mut savepoint = tx.begin().await?;
    let value = work(&mut savepoint).await?;
    savepoint.commit().await?;
    Ok(value)
}
