//! Which processes have an SQLite database open, so that leases left by a process that died
//! (killed, crashed, its machine rebooted) do not block their sessions after a restart.
//!
//! Each process holds a shared `flock` on a file beside the database for as long as its store
//! is open; the kernel drops it when the process ends, however it ends. A process that opens
//! the database and gets that lock *exclusively* knows no other process has the database open
//! (SQLite itself needs every process on one kernel, so the lock sees them all, containers that
//! share a volume included): every lease in the file is then stale and is cleared. When another
//! process is running, leases are left alone and expire by their TTL as before.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

use rusqlite::Connection;

use crate::{Error, Result};

/// The shared lock this process holds on the database's instance file while the store is open.
pub(super) struct Instance {
    _file: File,
}

/// What opening the instance file found.
pub(super) struct Opened {
    pub(super) instance: Instance,
    /// No other process had the database open: its leases are all stale.
    pub(super) alone: bool,
}

/// The lock file of the database at `db`, beside its real path: a process that reaches the
/// same file through a symlink (or another spelling of its path) must find the same lock.
fn lock_path(db: &Path) -> PathBuf {
    let real = std::fs::canonicalize(db)
        .or_else(|_| {
            // Not created yet: its folder's real path, and its name.
            let folder = db.parent().filter(|p| !p.as_os_str().is_empty());
            let folder = std::fs::canonicalize(folder.unwrap_or(Path::new(".")))?;
            Ok::<_, std::io::Error>(folder.join(db.file_name().unwrap_or_default()))
        })
        .unwrap_or_else(|_| db.to_path_buf());
    let mut name = real.into_os_string();
    name.push("-ctxproxy-instances");
    PathBuf::from(name)
}

/// Takes this process's shared lock on the instance file of the database at `db`, finding out
/// on the way whether any other process holds one.
pub(super) fn open(db: &Path) -> Result<Opened> {
    let path = lock_path(db);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Error::StoreUnavailable(format!("cannot open {}: {e}", path.display())))?;
    let alone = match file.try_lock() {
        Ok(()) => true,
        Err(TryLockError::WouldBlock) => false,
        Err(TryLockError::Error(e)) => {
            return Err(Error::StoreUnavailable(format!(
                "cannot lock {}: {e}",
                path.display()
            )));
        }
    };
    // Exclusive → shared (or wait for a process that is itself between the two, briefly).
    file.lock_shared()
        .map_err(|e| Error::StoreUnavailable(format!("cannot lock {}: {e}", path.display())))?;
    Ok(Opened {
        instance: Instance { _file: file },
        alone,
    })
}

/// Clears every session and summary lease (run only when no other process has the database
/// open); returns how many sessions had one. A database not migrated yet has none.
pub(super) fn clear_leases(conn: &Connection) -> Result<usize> {
    let has_sessions: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sessions')",
        [],
        |row| row.get(0),
    )?;
    if !has_sessions {
        return Ok(0);
    }
    Ok(conn.execute(
        "UPDATE sessions SET lock_owner = NULL, lock_until = NULL, summary_owner = NULL, \
         summary_until = NULL WHERE lock_owner IS NOT NULL OR summary_owner IS NOT NULL",
        [],
    )?)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::store::sqlite::SqliteStore;
    use crate::store::{Scope, Store};

    const TTL: Duration = Duration::from_secs(60);

    async fn open(dir: &std::path::Path) -> SqliteStore {
        let url = format!("sqlite://{}?mode=rwc", dir.join("leases.db").display());
        let store = SqliteStore::connect(&url, 1).await.unwrap();
        store.migrate().await.unwrap();
        store
    }

    async fn held_store(dir: &std::path::Path) -> SqliteStore {
        let store = open(dir).await;
        store
            .get_or_create_session("t", "s", &Scope::default())
            .await
            .unwrap();
        store
            .lock_session("t", "s", TTL, Duration::ZERO)
            .await
            .unwrap();
        assert!(
            store
                .try_lock_summary("t", "s", TTL)
                .await
                .unwrap()
                .is_some()
        );
        store
    }

    #[tokio::test]
    async fn leases_of_a_store_nobody_has_open_any_more_are_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let first = held_store(dir.path()).await;
        first.close().await;
        drop(first);
        let second = open(dir.path()).await;
        second
            .lock_session("t", "s", TTL, Duration::ZERO)
            .await
            .unwrap();
        assert!(
            second
                .try_lock_summary("t", "s", TTL)
                .await
                .unwrap()
                .is_some()
        );
    }

    /// A second process that names the database through a symlink finds the first one too.
    #[tokio::test]
    async fn leases_stay_while_the_file_is_open_under_another_name() {
        let dir = tempfile::tempdir().unwrap();
        let first = held_store(dir.path()).await;
        let other = dir.path().join("other");
        std::fs::create_dir(&other).unwrap();
        std::os::unix::fs::symlink(dir.path().join("leases.db"), other.join("leases.db")).unwrap();
        let second = open(&other).await;
        assert!(matches!(
            second.lock_session("t", "s", TTL, Duration::ZERO).await,
            Err(crate::Error::SessionBusy { .. })
        ));
        drop(first);
    }

    #[tokio::test]
    async fn leases_stay_while_another_store_has_the_file_open() {
        let dir = tempfile::tempdir().unwrap();
        let first = held_store(dir.path()).await;
        let second = open(dir.path()).await;
        assert!(matches!(
            second.lock_session("t", "s", TTL, Duration::ZERO).await,
            Err(crate::Error::SessionBusy { .. })
        ));
        assert!(
            second
                .try_lock_summary("t", "s", TTL)
                .await
                .unwrap()
                .is_none()
        );
        drop(first);
    }
}
