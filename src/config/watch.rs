//! Watching the configuration files: any change under the tenants directory or to the server
//! file triggers a reload (debounced, since editors write files in several steps).

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// Keeps the file watcher alive; dropping it stops watching.
pub struct WatchGuard {
    _watcher: notify::RecommendedWatcher,
}

/// Calls `reload` (on a tokio task) after the files under `server_file`'s folder or
/// `tenants_dir` change, at most once per quiet period.
pub fn watch<F>(server_file: &Path, tenants_dir: &Path, reload: F) -> notify::Result<WatchGuard>
where
    F: Fn() + Send + 'static,
{
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let server_name = server_file.file_name().map(|n| n.to_os_string());
    let tenants = tenants_dir.to_path_buf();
    // Only configuration files count: a database or log file beside them must not cause reloads.
    let relevant = move |path: &Path| {
        let is_server = path.file_name().map(|n| n.to_os_string()) == server_name;
        let is_tenant = path.extension().is_some_and(|x| x == "yaml" || x == "yml")
            && path.parent().is_some_and(|p| same_dir(p, &tenants));
        is_server || is_tenant
    };
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(e) = event
            && !e.kind.is_access()
            && e.paths.iter().any(|p| relevant(p))
        {
            let _ = tx.send(());
        }
    })?;
    let server_dir = parent_dir(server_file);
    watcher.watch(&server_dir, RecursiveMode::NonRecursive)?;
    if tenants_dir != server_dir.as_path() {
        watcher.watch(tenants_dir, RecursiveMode::NonRecursive)?;
    }
    tokio::spawn(async move {
        while rx.recv().await.is_some() {
            // Let the burst of events of one save settle, then reload once.
            tokio::time::sleep(Duration::from_millis(150)).await;
            while rx.try_recv().is_ok() {}
            reload();
        }
    });
    Ok(WatchGuard { _watcher: watcher })
}

fn parent_dir(file: &Path) -> PathBuf {
    match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn same_dir(a: &Path, b: &Path) -> bool {
    a == b
        || match (a.canonicalize(), b.canonicalize()) {
            (Ok(x), Ok(y)) => x == y,
            _ => false,
        }
}
