//! Opening a managed request's turn: afterwards the session exists, its lease is held (and kept
//! renewed), and the request's new messages are stored. In client mode what to store is known
//! from the request alone ([`history::client_turn`]), so the store does all of it in one call,
//! [`lock_and_append`]; server mode (and an anchored `previous_response_id`) must read the
//! stored history under the lease first, [`open_on_stored`].

use std::sync::Arc;
use std::time::Duration;

use super::history::{self, Assembled, Base, Incoming};
use super::lock::SessionLock;
use crate::config::HistoryMode;
use crate::error::Result;
use crate::store::{Append, Committed, Scope, Store, TurnOpen};

/// The session a turn is opened on, and how its lease is held.
pub struct Target<'a> {
    pub tenant: &'a str,
    pub session: &'a str,
    /// Recorded if the session is created.
    pub scope: &'a Scope,
    pub ttl: Duration,
    /// How long to wait for another request on the same session.
    pub wait: Duration,
}

/// Opens the turn of a request whose conversation includes stored history (`server` mode, or
/// an anchored `previous_response_id`): the lease first, then the stored history is read under
/// it and the request's new messages appended. Returns the held lock with the conversation.
///
/// `still_wanted` is asked once the lease is held: a request whose client went away while it
/// waited stores nothing (`ClientClosed`). Its messages would follow whatever was written
/// meanwhile, such as the client's own retry of them, and stand there twice.
pub async fn open_on_stored(
    store: &Arc<dyn Store>,
    target: &Target<'_>,
    mode: HistoryMode,
    base: Base,
    incoming: Incoming,
    still_wanted: impl FnOnce() -> bool,
) -> Result<(SessionLock, Assembled)> {
    let (lock, mut committed) = lock_and_append(store, target, None).await?;
    // The stored history is read next, beside the writer: the new session must be visible.
    committed.wait().await?;
    if !still_wanted() {
        return Err(crate::Error::ClientClosed);
    }
    // Dropping the lock on an error below releases the lease.
    let assembled = history::assemble(
        store.as_ref(),
        target.tenant,
        target.session,
        mode,
        Some(base),
        incoming,
        true,
    )
    .await?;
    Ok((lock, assembled))
}

/// Takes the lease (creating the session if need be) and stores `append` under it, in one
/// store call. The store may answer before that call is committed: nothing the request sends
/// its client may go before [`Committed::wait`] says it is (reads of the store do not see it
/// before either).
pub async fn lock_and_append(
    store: &Arc<dyn Store>,
    target: &Target<'_>,
    append: Option<Append>,
) -> Result<(SessionLock, Committed)> {
    let opened = store
        .open_turn(TurnOpen {
            tenant: target.tenant.to_string(),
            session: target.session.to_string(),
            scope: target.scope.clone(),
            ttl: target.ttl,
            wait: target.wait,
            append,
        })
        .await?;
    let lock = SessionLock::held(store.clone(), opened.lease, target.ttl);
    Ok((lock, opened.committed))
}
