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
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // Only the server file and tenant files count: other files in those folders (an
        // SQLite database and its -wal next to the server file) change on every request.
        if let Ok(e) = event
            && !e.kind.is_access()
            && (e.paths.is_empty()
                || e.paths
                    .iter()
                    .any(|p| is_config_file(p, server_name.as_deref(), &tenants)))
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

/// The server file itself, or a YAML file directly in the tenants folder.
fn is_config_file(path: &Path, server_name: Option<&std::ffi::OsStr>, tenants: &Path) -> bool {
    if path.file_name().is_some() && path.file_name() == server_name {
        return true;
    }
    let yaml = path.extension().is_some_and(|e| e == "yaml" || e == "yml");
    yaml && path
        .parent()
        .is_some_and(|d| d.file_name() == tenants.file_name())
}

fn parent_dir(file: &Path) -> PathBuf {
    match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}
