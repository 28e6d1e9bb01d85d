//! Which database a `sqlite:` URL names and how each connection to it is set up. The URL forms
//! and query parameters are the ones the sqlx version accepted (`sqlite::memory:`,
//! `sqlite://path?mode=rwc`, `mode=ro|rw|rwc|memory`, `cache=shared|private`, `vfs=…`), so
//! existing configurations keep working.

use std::path::PathBuf;
use std::time::Duration;

use percent_encoding::percent_decode_str;
use rusqlite::{Connection, OpenFlags};

use crate::{Error, Result};

/// How long a connection waits for another process's write lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// Page cache per connection, in KiB (SQLite's negative `cache_size`). Small on purpose: the
/// working set of a request is a handful of pages and the OS caches the file anyway; every
/// connection pays this in resident memory once it has warmed up.
const WRITER_CACHE_KIB: i64 = 8 * 1024;
const READER_CACHE_KIB: i64 = 2 * 1024;
/// Distinct statements kept prepared per connection (padded IN lists count a few times).
const STATEMENT_CACHE: usize = 128;
/// WAL pages after which the writer checkpoints by itself (a fallback: normally the
/// checkpointer thread has done it long before; SQLite's default is 1000).
const WRITER_CHECKPOINT_PAGES: i64 = 16_000;
/// Bytes the WAL file is truncated to when it is reset after growing.
const WAL_SIZE_LIMIT: i64 = 64 * 1024 * 1024;

/// The database a URL names.
#[derive(Debug, Clone)]
pub(super) struct Target {
    /// A file path, or a `file:` URI for a named in-memory database.
    location: String,
    in_memory: bool,
    read_only: bool,
    vfs: Option<String>,
}

impl Target {
    /// Parses `sqlite:` URLs the way sqlx did; anything it rejected is `StoreUnavailable`.
    pub(super) fn parse(url: &str) -> Result<Target> {
        let rest = url
            .trim_start_matches("sqlite://")
            .trim_start_matches("sqlite:");
        let (database, params) = match rest.split_once('?') {
            Some((d, p)) => (d, Some(p)),
            None => (rest, None),
        };
        let bad = |what: String| Error::StoreUnavailable(format!("database.url: {what}"));
        let mut target = Target {
            location: percent_decode_str(database)
                .decode_utf8()
                .map_err(|e| bad(format!("path is not UTF-8: {e}")))?
                .into_owned(),
            in_memory: database == ":memory:" || database.is_empty(),
            read_only: false,
            vfs: None,
        };
        let mut shared_cache = true;
        for (key, value) in form_urlencoded::parse(params.unwrap_or("").as_bytes()) {
            match (&*key, &*value) {
                ("mode", "ro") => target.read_only = true,
                ("mode", "rw" | "rwc") => {}
                ("mode", "memory") => target.in_memory = true,
                ("cache", "shared") => shared_cache = true,
                ("cache", "private") => shared_cache = false,
                ("vfs", vfs) => target.vfs = Some(vfs.to_string()),
                ("mode" | "cache", other) => {
                    return Err(bad(format!("unknown value {other:?} for `{key}`")));
                }
                (other, _) => return Err(bad(format!("unknown query parameter `{other}`"))),
            }
        }
        if target.in_memory {
            // One connection does everything for an in-memory database, so a private one is
            // enough; a named one with a shared cache stays visible to other stores in this
            // process, as it was with sqlx.
            target.location = if target.location == ":memory:" || target.location.is_empty() {
                ":memory:".to_string()
            } else if shared_cache {
                format!("file:{}?mode=memory&cache=shared", target.location)
            } else {
                format!("file:{}?mode=memory", target.location)
            };
        }
        Ok(target)
    }

    /// Whether the database lives in memory (then one connection serves reads and writes).
    pub(super) fn in_memory(&self) -> bool {
        self.in_memory
    }

    /// Creates the directory of a writable file database if it is missing.
    pub(super) fn create_dir(&self) -> Result<()> {
        let dir = self.writable_file().and_then(std::path::Path::parent);
        if let Some(dir) = dir.filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                Error::StoreUnavailable(format!("cannot create {}: {e}", dir.display()))
            })?;
        }
        Ok(())
    }

    /// Opens the connection that writes (and runs the migrations): creates the file if needed
    /// (its directory exists: [`Target::create_dir`]) and switches it to WAL. Runs on the
    /// writer thread.
    pub(super) fn open_writer(&self) -> Result<Connection> {
        let conn = self.open(WRITER_CACHE_KIB)?;
        if !self.in_memory && !self.read_only {
            let _mode: String =
                conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
            // The checkpointer thread keeps the WAL short; the writer checkpoints by itself
            // (inside a commit) only if that falls far behind.
            conn.pragma_update(None, "wal_autocheckpoint", WRITER_CHECKPOINT_PAGES)?;
            conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT)?;
        }
        Ok(conn)
    }

    /// The file a writable file database lives in (`None` in memory or read-only).
    pub(super) fn writable_file(&self) -> Option<&std::path::Path> {
        (!self.in_memory && !self.read_only).then(|| std::path::Path::new(&self.location))
    }

    /// Whether the database was opened read-only (`mode=ro`).
    pub(super) fn read_only(&self) -> bool {
        self.read_only
    }

    /// Opens the checkpointer's connection (a file database in WAL mode only).
    pub(super) fn open_checkpointer(&self) -> Result<Connection> {
        self.open(READER_CACHE_KIB)
    }

    /// Opens one reader connection (only for a file; the writer has set WAL already).
    pub(super) fn open_reader(&self) -> Result<Connection> {
        self.open(READER_CACHE_KIB)
    }

    fn open(&self, cache_kib: i64) -> Result<Connection> {
        // NO_MUTEX: each connection is owned by one thread for its whole life.
        let mut flags = OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
        flags |= if self.read_only {
            OpenFlags::SQLITE_OPEN_READ_ONLY
        } else {
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE
        };
        let path = PathBuf::from(&self.location);
        let conn = match &self.vfs {
            Some(vfs) => Connection::open_with_flags_and_vfs(path, flags, vfs.as_str())?,
            None => Connection::open_with_flags(path, flags)?,
        };
        conn.busy_timeout(BUSY_TIMEOUT)?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "cache_size", -cache_kib)?;
        // Temporary files in memory: every job of the writer's batch runs in a savepoint, whose
        // sub-journal SQLite spills to a new file in the temp directory once it passes 64 KiB
        // (a batch of several turns). Under load that was one file created, written and
        // unlinked for every few requests, each a metadata change the file system journals.
        // A sub-journal holds at most the pages of one batch: a few MB.
        conn.pragma_update(None, "temp_store", "MEMORY")?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        Ok(conn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_url_forms_sqlx_accepted() {
        let file = Target::parse("sqlite://data/x%20y.db?mode=rwc").unwrap();
        assert_eq!(file.location, "data/x y.db");
        assert!(!file.in_memory());
        assert!(Target::parse("sqlite::memory:").unwrap().in_memory());
        assert!(Target::parse("sqlite://?mode=memory").unwrap().in_memory());
        let named = Target::parse("sqlite://shared?mode=memory").unwrap();
        assert_eq!(named.location, "file:shared?mode=memory&cache=shared");
        assert!(Target::parse("sqlite://a.db?mode=ro").unwrap().read_only);
        assert!(Target::parse("sqlite://a.db?mode=nope").is_err());
        assert!(Target::parse("sqlite://a.db?what=1").is_err());
    }

    /// Every connection keeps its temporary files (the savepoints' sub-journals of a batch) in
    /// memory, so that no write creates a file in the temp directory.
    #[test]
    fn connections_keep_temporary_files_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/t.db?mode=rwc", dir.path().display());
        let target = Target::parse(&url).unwrap();
        let writer = target.open_writer().unwrap();
        let reader = target.open_reader().unwrap();
        let checkpointer = target.open_checkpointer().unwrap();
        for conn in [&writer, &reader, &checkpointer] {
            let store: i64 = conn
                .query_row("PRAGMA temp_store", [], |r| r.get(0))
                .unwrap();
            assert_eq!(store, 2, "MEMORY");
        }
        let mode: String = writer
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
    }
}
