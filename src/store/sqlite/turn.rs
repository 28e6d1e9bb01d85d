//! SQLite: opening and closing a managed request's turn, each as one writer job (see
//! `store/turn.rs` for why). Opening creates the session, takes the lease and appends the
//! request's messages; only when another request holds the lease does it fall back to waiting.
//! Closing runs its parts in savepoints of their own inside the job, so one failing part is
//! undone alone, as it would be if each were its own call.

use rusqlite::Connection;

use super::super::Appended;
use super::super::turn::{
    CLOSE_FAILED, RELEASE_FAILED, TurnClose, TurnClosed, TurnOpen, TurnOpened, open_by_parts,
};
use super::threads::exec;
use super::{LeaseKind, SqliteStore, create_session, records, release_lease, take_lease, tree};
use crate::{Error, Result};

/// What the one job of an open did.
enum FirstTry {
    Opened(TurnOpened),
    /// Someone else holds the lease: the open (its append not done) comes back for the wait.
    Busy(TurnOpen),
}

impl SqliteStore {
    pub(super) async fn open_turn_job(&self, open: TurnOpen) -> Result<TurnOpened> {
        let first = self
            .threads
            .write(move |conn| {
                create_session(conn, &open.tenant, &open.session, &open.scope)?;
                let (tenant, session) = (open.tenant.clone(), open.session.clone());
                let lease = match take_lease(conn, LeaseKind::Session, tenant, session, open.ttl)? {
                    Ok(lease) => lease,
                    Err(()) => return Ok(FirstTry::Busy(open)),
                };
                // A failing append fails the job: its savepoint undoes the lease too.
                let appended = match &open.append {
                    None => Vec::new(),
                    Some(a) => {
                        tree::append(conn, &lease.tenant, &lease.session, a.parent, &a.messages)?
                    }
                };
                Ok(FirstTry::Opened(TurnOpened { lease, appended }))
            })
            .await?;
        match first {
            FirstTry::Opened(opened) => Ok(opened),
            FirstTry::Busy(open) => {
                // The holder's close may be queued, deferred: it should not wait for company.
                self.threads.hurry();
                open_by_parts(self, open).await
            }
        }
    }

    pub(super) async fn close_turn_job(&self, close: TurnClose) -> TurnClosed {
        let released = close
            .lease
            .as_ref()
            .map(|l| (l.tenant.clone(), l.session.clone()));
        // A reply stored after its answer went out is waited on by nobody but the next request
        // of the session, whose own (urgent) open commits it at once: unless the caller waits
        // (a stream's end) or that request already waits for the lease, the close may share a
        // commit with the writes that follow.
        let awaited = close.awaited
            || released
                .as_ref()
                .is_some_and(|(tenant, session)| self.wakeups.awaited(tenant, session));
        let job = move |conn: &Connection| Ok(close_in(conn, close));
        let closed = if awaited {
            self.threads.write(job).await
        } else {
            self.threads.write_deferred(job).await
        };
        let closed = closed.unwrap_or_else(|e| TurnClosed {
            failures: vec![(CLOSE_FAILED, e)],
        });
        if let Some((tenant, session)) = released {
            self.wakeups.wake(&tenant, &session);
        }
        closed
    }
}

/// The parts of a close, in order, inside the writer's transaction.
fn close_in(conn: &Connection, close: TurnClose) -> TurnClosed {
    let TurnClose {
        reply,
        response_id,
        upstream_root,
        mut record,
        lease,
        awaited: _,
    } = close;
    let mut failures = Vec::new();
    if let Some(reply) = reply.filter(|r| !r.messages.is_empty()) {
        let stored = part(conn, || -> Result<Vec<Appended>> {
            tree::append(
                conn,
                &record.tenant,
                &record.session,
                reply.parent,
                &reply.messages,
            )
        });
        match stored {
            Ok(_) => record.head = reply.messages.last().map(|m| m.id),
            Err(e) => failures.push(("store the reply", e)),
        }
        if let (Some(id), Some(head)) = (&response_id, record.head)
            && let Err(e) = part(conn, || {
                let root = upstream_root.as_deref();
                records::record_response(conn, &record.tenant, id, &record.session, head, root)
            })
        {
            failures.push(("record the response id", e));
        }
    }
    if let Err(e) = part(conn, || records::insert_request(conn, &record)) {
        failures.push(("store the request record", e));
    }
    if let Some(lease) = &lease
        && let Err(e) = part(conn, || release_lease(conn, LeaseKind::Session, lease))
    {
        failures.push((RELEASE_FAILED, e));
    }
    TurnClosed { failures }
}

/// Runs one part of a job in a savepoint of its own: a failure undoes that part only.
fn part<T>(conn: &Connection, work: impl FnOnce() -> Result<T>) -> Result<T> {
    exec(conn, "SAVEPOINT turn_part")?;
    match work() {
        Ok(v) => {
            exec(conn, "RELEASE turn_part")?;
            Ok(v)
        }
        Err(e) => {
            exec(conn, "ROLLBACK TO turn_part")
                .and_then(|()| exec(conn, "RELEASE turn_part"))
                .map_err(|rollback| {
                    Error::StoreUnavailable(format!("{e}; undoing it failed too: {rollback}"))
                })?;
            Err(e)
        }
    }
}
