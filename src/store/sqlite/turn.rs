//! SQLite: opening and closing a managed request's turn, each as one writer job (see
//! `store/turn.rs` for why). Opening creates the session, takes the lease and appends the
//! request's messages; only when another request holds the lease does it fall back to waiting.
//! Closing runs its parts in savepoints of their own inside the job, so one failing part is
//! undone alone, as it would be if each were its own call.

use std::sync::Arc;

use rusqlite::Connection;

use super::super::turn::{
    CLOSE_FAILED, CloseParts, LEASE_LOST, RECORD_FAILED, RELEASE_FAILED, TurnClose, TurnClosed,
    TurnOpen, TurnOpened, open_by_parts,
};
use super::threads::exec;
use super::{
    LeaseKind, SqliteStore, create_session, holds_session_lease, records, release_lease,
    take_lease, tree,
};
use crate::store::{Appended, Lease};
use crate::{Error, Result};

/// What the one job of an open did.
enum FirstTry {
    Opened((Lease, Vec<Appended>)),
    /// Someone else holds the lease: the open (its append not done) comes back for the wait.
    Busy(TurnOpen),
}

impl SqliteStore {
    pub(super) async fn open_turn_job(&self, open: TurnOpen) -> Result<TurnOpened> {
        // Answered once the job has run: the commit is written while the request goes on.
        let (first, committed) = self
            .threads
            .write_early(move |conn| {
                create_session(conn, &open.tenant, &open.session, &open.scope)?;
                let (tenant, session) = (open.tenant.clone(), open.session.clone());
                let taken = take_lease(conn, LeaseKind::Session, tenant, session, open.ttl, None)?;
                let lease = match taken {
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
                Ok(FirstTry::Opened((lease, appended)))
            })
            .await?;
        match first {
            FirstTry::Opened((lease, appended)) => Ok(TurnOpened {
                lease,
                appended,
                committed,
            }),
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
        // The job shares the close rather than taking it, so a close whose record was not
        // written can be handed back for another try.
        let close = Arc::new(close);
        let shared = close.clone();
        let job = move |conn: &Connection| close_in(conn, &shared);
        let closed = if awaited {
            self.threads.write(job).await
        } else {
            self.threads.write_deferred(job).await
        };
        let handed_back = || Arc::try_unwrap(close).unwrap_or_else(|close| (*close).clone());
        let closed = match closed {
            Ok(parts) => parts.closed(handed_back),
            Err(e) => TurnClosed {
                failures: vec![(CLOSE_FAILED, e)],
                unstored: Some(handed_back()),
            },
        };
        if let Some((tenant, session)) = released {
            self.wakeups.wake(&tenant, &session);
        }
        closed
    }
}

/// The parts of a close, in order, inside the writer's transaction.
fn close_in(conn: &Connection, close: &TurnClose) -> Result<CloseParts> {
    let TurnClose {
        reply,
        response_id,
        upstream_root,
        key_hash,
        conversation,
        record,
        lease,
        awaited: _,
    } = close;
    // The record's head is the reply's last message once the reply is stored.
    let mut head = record.head;
    let mut parts = CloseParts::default();
    if let Some(lease) = lease
        && !holds_session_lease(conn, lease)?
    {
        let gone = Error::NotFound(format!("session {} (its lease)", lease.session));
        parts.tried::<()>(LEASE_LOST, Err(gone));
        return Ok(parts);
    }
    if let Some(reply) = reply.as_ref().filter(|r| !r.messages.is_empty()) {
        let (tenant, session) = (&record.tenant, &record.session);
        let stored = part(conn, || {
            tree::append(conn, tenant, session, reply.parent, &reply.messages)
        });
        if parts.tried("store the reply", stored).is_some() {
            head = reply.messages.last().map(|m| m.id);
            let key = key_hash.as_deref();
            let recorded = part(conn, || {
                records::record_reply_items(conn, tenant, session, key, &reply.messages)
            });
            parts.tried("record the reply items", recorded);
        }
        if let (Some(id), Some(head)) = (response_id, head) {
            let (root, key) = (upstream_root.as_deref(), key_hash.as_deref());
            let recorded = part(conn, || {
                records::record_response(conn, tenant, id, session, head, root, key)
            });
            parts.tried("record the response id", recorded);
        }
    }
    // Also for a turn that got no answer: its retry finds the session it is stored in.
    if let (Some(key), Some(head)) = (conversation, head) {
        let (tenant, session) = (&record.tenant, &record.session);
        let recorded = part(conn, || {
            records::record_response(conn, tenant, key, session, head, None, key_hash.as_deref())
        });
        parts.tried("record the conversation", recorded);
    }
    let inserted = part(conn, || records::insert_request_row(conn, record, head));
    // Without its record the turn is not closed: the lease stays for the close to be tried again.
    let recorded = parts.tried(RECORD_FAILED, inserted).is_some();
    if let Some(lease) = lease.as_ref().filter(|_| recorded) {
        let released = part(conn, || {
            release_lease(conn, LeaseKind::Session, lease).map(|_| ())
        });
        parts.tried(RELEASE_FAILED, released);
    }
    Ok(parts)
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
