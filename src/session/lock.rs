//! Holding a session's lease for the length of one managed request. The lease lives in the
//! session row (no connection is held while it is), is renewed in the background while a long
//! upstream call runs, and is released when the reply is stored, or on drop if a path forgot.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::store::{Lease, Store};

/// A held session lease.
pub struct SessionLock {
    store: Arc<dyn Store>,
    lease: Option<Lease>,
    renewal: JoinHandle<()>,
}

impl SessionLock {
    /// Holds `lease` (just taken) and keeps it renewed every `ttl / 3`.
    pub fn held(store: Arc<dyn Store>, lease: Lease, ttl: Duration) -> SessionLock {
        let renewal = tokio::spawn(renew_forever(store.clone(), lease.clone(), ttl));
        SessionLock {
            store,
            lease: Some(lease),
            renewal,
        }
    }

    /// Stops renewing and hands the lease over, for a caller that releases it itself (as part
    /// of closing the turn).
    pub fn into_lease(mut self) -> Option<Lease> {
        self.renewal.abort();
        self.lease.take()
    }

    /// Releases the lease (errors are logged: an unreleased lease expires by itself).
    pub async fn release(mut self) {
        self.renewal.abort();
        if let Some(lease) = self.lease.take()
            && let Err(e) = self.store.unlock_session(&lease).await
        {
            tracing::warn!(error = %e, "could not release the session lease; it will expire");
        }
    }
}

impl Drop for SessionLock {
    fn drop(&mut self) {
        self.renewal.abort();
        if let Some(lease) = self.lease.take() {
            let store = self.store.clone();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = store.unlock_session(&lease).await;
                });
            }
        }
    }
}

async fn renew_forever(store: Arc<dyn Store>, lease: Lease, ttl: Duration) {
    let every = (ttl / 3).max(Duration::from_millis(100));
    loop {
        tokio::time::sleep(every).await;
        match store.renew_session_lease(&lease, ttl).await {
            Ok(Some(_)) => {}
            Ok(None) => {
                tracing::warn!("session lease lost while a request was still running");
                return;
            }
            Err(e) => tracing::warn!(error = %e, "could not renew the session lease"),
        }
    }
}
