//! Watching the configuration files: a change to the server file or to a tenant file triggers a
//! reload (debounced, since editors write files in several steps).
//!
//! The files are polled (metadata and a hash of the contents, twice a second), not watched with
//! inotify, because inotify misses or mistakes the ways configuration is really updated:
//! - Kubernetes mounts a ConfigMap as `tenants/acme.yaml -> ..data/acme.yaml` and updates it by
//!   swapping the `..data` symlink: no event ever names `acme.yaml`;
//! - a tenants directory deleted and created again leaves an inotify watch on the dead inode,
//!   and every later change goes unseen;
//! - the server file's folder often holds the SQLite database too (`--config ./ctxproxy.yaml`
//!   with `sqlite://ctxproxy.db`): every write to its WAL woke the watcher, several times per
//!   request (measured: 7.5 % of the proxy's CPU on 200-message requests).
//!
//! Polling follows symlinks and rescans from the paths each time, so all three work, for the
//! cost of reading a few small files twice a second. Contents are hashed because the poller's
//! modification times have a resolution of one second, and two saves within a second are
//! common (scripts, tests).

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// How often the files are checked.
const POLL: Duration = Duration::from_millis(500);
/// How long a burst of changes (one save, a `git checkout`) must be quiet before one reload.
const SETTLE: Duration = Duration::from_millis(150);

/// Keeps the file watcher alive; dropping it stops watching.
pub struct WatchGuard {
    _watcher: notify::PollWatcher,
}

/// Calls `reload` (on a tokio task) after `server_file` or a tenant file (`*.yaml`, `*.yml`)
/// in `tenants_dir` changes, appears or goes, at most once per quiet period.
pub fn watch<F>(server_file: &Path, tenants_dir: &Path, reload: F) -> notify::Result<WatchGuard>
where
    F: Fn() + Send + 'static,
{
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let relevant = Relevant {
        server_file: server_file.to_path_buf(),
        tenants_dir: tenants_dir.to_path_buf(),
    };
    let handler = move |event: notify::Result<notify::Event>| {
        if let Ok(e) = event
            && !e.kind.is_access()
            && e.paths.iter().any(|p| relevant.matches(p))
        {
            let _ = tx.send(());
        }
    };
    let mut watcher = notify::PollWatcher::new(
        handler,
        notify::Config::default()
            .with_poll_interval(POLL)
            .with_compare_contents(true),
    )?;
    watcher.watch(server_file, RecursiveMode::NonRecursive)?;
    watcher.watch(tenants_dir, RecursiveMode::NonRecursive)?;
    tokio::spawn(async move {
        while rx.recv().await.is_some() {
            tokio::time::sleep(SETTLE).await;
            while rx.try_recv().is_ok() {}
            reload();
        }
    });
    Ok(WatchGuard { _watcher: watcher })
}

/// Which paths are configuration: an editor's swap file or backup beside them is not.
struct Relevant {
    server_file: PathBuf,
    tenants_dir: PathBuf,
}

impl Relevant {
    fn matches(&self, path: &Path) -> bool {
        // The folder itself: created again empty after it was deleted, no tenant file changes,
        // but what is in force (the last good tenants, kept while it was missing) must go.
        path == self.server_file
            || path == self.tenants_dir
            || (super::is_tenant_file(path) && path.parent() == Some(self.tenants_dir.as_path()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_server_file_and_tenant_files_count() {
        let r = Relevant {
            server_file: PathBuf::from("cfg/ctxproxy.yaml"),
            tenants_dir: PathBuf::from("cfg/tenants"),
        };
        assert!(r.matches(Path::new("cfg/ctxproxy.yaml")));
        assert!(r.matches(Path::new("cfg/tenants/acme.yaml")));
        assert!(r.matches(Path::new("cfg/tenants/acme.yml")));
        assert!(r.matches(Path::new("cfg/tenants")));
        assert!(!r.matches(Path::new("cfg/tenants/.acme.yaml.swp")));
        assert!(!r.matches(Path::new("cfg/tenants/.acme.yaml")));
        assert!(!r.matches(Path::new("cfg/tenants/._acme.yaml")));
        assert!(!r.matches(Path::new("cfg/tenants/sub/acme.yaml")));
        assert!(!r.matches(Path::new("cfg/other.yaml")));
        assert!(!r.matches(Path::new("cfg/ctxproxy.db-wal")));
    }
}
