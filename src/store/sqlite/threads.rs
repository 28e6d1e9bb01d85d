//! The threads that own the SQLite connections, and the hand-off to them from async code.
//!
//! One writer thread owns the only write connection. Each job is one whole store operation (a
//! closure over the connection); the writer takes every job already queued (up to
//! [`MAX_BATCH`]), runs them in one `BEGIN IMMEDIATE` transaction, each inside its own
//! `SAVEPOINT` (a failing job is rolled back to it and keeps its error, the others go on),
//! commits once and only then answers. Each job stays atomic and isolated; the batch shares one
//! WAL write and one commit. An early job (a turn's open) is answered as soon as it has run, and
//! told apart whether its batch committed, so its caller can go on while the commit is written.
//!
//! Reader threads (for a file database) each own a connection and pull jobs from one shared
//! queue; WAL lets them read beside the writer. For an in-memory database there is one
//! connection, so reads queue on the writer too.
//!
//! Answers come back on a oneshot channel: one hand-off per store call, and no tokio worker
//! ever blocks on SQLite.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, bounded, unbounded};
use rusqlite::Connection;
use tokio::sync::oneshot;

use super::open::Target;
use crate::store::Committed;
use crate::{Error, Result};

/// Most jobs one commit covers: bounds how long the first job of a batch waits for its answer.
const MAX_BATCH: usize = 64;
/// How long a deferred write (one nobody is waiting on, such as a reply stored after its answer
/// went out) may wait for other writes to share its commit. Every commit rewrites whole pages
/// (the session, message and index leaves a turn touches), so one commit for two turns writes
/// far less than two; under load the next request's urgent write picks deferred ones up long
/// before this passes.
const DEFER: Duration = Duration::from_millis(2);
/// How often the checkpointer copies the WAL back into the database file.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(100);

/// A read: runs on some reader's connection and sends its own answer.
type ReadJob = Box<dyn FnOnce(&Connection) + Send>;

/// A write, run inside the writer's transaction; answered only once the batch is settled.
trait WriteJob: Send {
    /// Whether a caller waits on it: an urgent job is committed at once (with whatever is
    /// queued); deferred ones may wait up to [`DEFER`] for company.
    fn urgent(&self) -> bool;
    /// Runs the job; `true` if it succeeded (its changes are to be kept).
    fn run(&mut self, conn: &Connection) -> bool;
    /// Sends the answer. `lost`: the batch did not commit, for this reason.
    fn answer(self: Box<Self>, lost: Option<&str>);
}

struct Pending<T, F> {
    urgent: bool,
    work: Option<F>,
    result: Option<Result<T>>,
    reply: oneshot::Sender<Result<T>>,
}

impl<T, F> WriteJob for Pending<T, F>
where
    T: Send,
    F: FnOnce(&Connection) -> Result<T> + Send,
{
    fn urgent(&self) -> bool {
        self.urgent
    }

    fn run(&mut self, conn: &Connection) -> bool {
        let Some(work) = self.work.take() else {
            return false;
        };
        let result = guarded(|| work(conn));
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn answer(self: Box<Self>, lost: Option<&str>) {
        let result = match (self.result, lost) {
            // A job that failed keeps its own error: its changes were undone either way.
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(v)), None) => Ok(v),
            (_, Some(reason)) => Err(Error::StoreUnavailable(reason.to_string())),
            (None, None) => Err(Error::Internal("a store job was never run".into())),
        };
        // The caller may have gone away (its request was cancelled): nothing to tell.
        let _ = self.reply.send(result);
    }
}

/// A write answered twice: with its outcome as soon as it has run (before its batch commits),
/// and with whether the batch committed. For a caller that can go on while the commit is
/// written and needs it only before anyone sees the outcome (see [`Committed`]).
struct Early<T, F> {
    work: Option<F>,
    ran: Option<oneshot::Sender<Result<T>>>,
    /// The reason when the batch did not commit.
    committed: oneshot::Sender<std::result::Result<(), String>>,
}

impl<T, F> WriteJob for Early<T, F>
where
    T: Send,
    F: FnOnce(&Connection) -> Result<T> + Send,
{
    fn urgent(&self) -> bool {
        true
    }

    fn run(&mut self, conn: &Connection) -> bool {
        let Some(work) = self.work.take() else {
            return false;
        };
        let result = guarded(|| work(conn));
        let ok = result.is_ok();
        if let Some(ran) = self.ran.take() {
            let _ = ran.send(result);
        }
        ok
    }

    fn answer(self: Box<Self>, lost: Option<&str>) {
        // Never run (the batch could not begin): the outcome is the batch's.
        if let Some(ran) = self.ran {
            let reason = lost.unwrap_or_default().to_string();
            let _ = ran.send(Err(Error::StoreUnavailable(reason)));
        }
        let _ = self
            .committed
            .send(lost.map_or(Ok(()), |r| Err(r.to_string())));
    }
}

/// Runs a job, turning a panic into an error so that one bad job cannot kill a thread.
fn guarded<T>(work: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(work))
        .unwrap_or_else(|_| Err(Error::Internal("a store operation panicked".into())))
}

fn closed() -> Error {
    Error::StoreUnavailable("the SQLite store is closed".into())
}

struct Queues {
    write: Sender<Box<dyn WriteJob>>,
    /// Dropped to stop the checkpointer (none for an in-memory or read-only database).
    _checkpointer: Option<Sender<()>>,
    /// `None` for an in-memory database: reads go to the writer.
    read: Option<Sender<ReadJob>>,
}

/// The running threads of one store.
pub(super) struct Threads {
    /// Taken (dropped) by `close`: the threads finish what is queued, then exit.
    queues: RwLock<Option<Queues>>,
    handles: Mutex<Vec<JoinHandle<()>>>,
    /// An in-memory database has one connection: the writer's.
    reads_on_writer: bool,
    /// The database, for the last connection `close` opens.
    target: Target,
}

impl Threads {
    /// Starts the writer (which opens the database first) and `readers` reader threads.
    pub(super) async fn start(target: Target, readers: usize) -> Result<Threads> {
        let (write, write_jobs) = unbounded::<Box<dyn WriteJob>>();
        let mut handles = Vec::new();
        let writer = target.clone();
        handles.push(
            start_on_connection(
                "ctxproxy-sqlite-writer",
                move || writer.open_writer(),
                move |conn| write_loop(&conn, &write_jobs),
            )
            .await?,
        );

        let read = if target.in_memory() {
            None
        } else {
            let (read, read_jobs) = unbounded::<ReadJob>();
            for n in 0..readers.max(1) {
                let (reader, jobs) = (target.clone(), read_jobs.clone());
                handles.push(
                    start_on_connection(
                        &format!("ctxproxy-sqlite-reader-{n}"),
                        move || reader.open_reader(),
                        move |conn| {
                            while let Ok(job) = jobs.recv() {
                                job(&conn);
                            }
                        },
                    )
                    .await?,
                );
            }
            Some(read)
        };
        let checkpointer = if target.in_memory() || target.read_only() {
            None
        } else {
            let (stop, stopped) = bounded::<()>(0);
            let checkpoints = target.clone();
            handles.push(
                start_on_connection(
                    "ctxproxy-sqlite-checkpoint",
                    move || checkpoints.open_checkpointer(),
                    move |conn| checkpoint_loop(&conn, &stopped),
                )
                .await?,
            );
            Some(stop)
        };
        Ok(Threads {
            queues: RwLock::new(Some(Queues {
                write,
                _checkpointer: checkpointer,
                read,
            })),
            handles: Mutex::new(handles),
            reads_on_writer: target.in_memory(),
            target,
        })
    }

    /// Runs `work` as one atomic write, committed at once with whatever else is queued.
    pub(super) async fn write<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        self.submit(true, work).await
    }

    /// Like [`Threads::write`], for a write whose caller is not in a hurry: its commit may wait
    /// up to [`DEFER`] to be shared with the writes that follow.
    pub(super) async fn write_deferred<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        self.submit(false, work).await
    }

    /// Like [`Threads::write`], but answers as soon as `work` has run, before its batch
    /// commits; the returned [`Committed`] says whether the batch did. A failed commit undoes
    /// `work` like any other write of the batch.
    pub(super) async fn write_early<T, F>(&self, work: F) -> Result<(T, Committed)>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let (ran, outcome) = oneshot::channel();
        let (committed, commit) = oneshot::channel();
        let job = Box::new(Early {
            work: Some(work),
            ran: Some(ran),
            committed,
        });
        self.queue(job)?;
        let value = outcome.await.map_err(|_| closed())??;
        Ok((value, Committed::pending(commit)))
    }

    /// Queues `work` as a write whose outcome nobody waits for (a clean-up from a `Drop`, which
    /// cannot await); a closed store drops it.
    pub(super) fn write_detached<F>(&self, work: F)
    where
        F: FnOnce(&Connection) -> Result<()> + Send + 'static,
    {
        let job = Box::new(Pending {
            urgent: true,
            work: Some(work),
            result: None,
            reply: oneshot::channel().0,
        });
        // A closed store drops it.
        let _ = self.queue(job);
    }

    /// Commits deferred writes now (someone started waiting for one).
    pub(super) fn hurry(&self) {
        let nothing = Box::new(Pending {
            urgent: true,
            work: Some(|_: &Connection| Ok(())),
            result: None,
            reply: oneshot::channel().0,
        });
        let _ = self.queue(nothing);
    }

    async fn submit<T, F>(&self, urgent: bool, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job = Box::new(Pending {
            urgent,
            work: Some(work),
            result: None,
            reply,
        });
        self.queue(job)?;
        answer.await.map_err(|_| closed())?
    }

    /// Hands a job to the writer (`closed` once the store is).
    fn queue(&self, job: Box<dyn WriteJob>) -> Result<()> {
        let queues = self.queues.read().unwrap_or_else(|p| p.into_inner());
        let queues = queues.as_ref().ok_or_else(closed)?;
        queues.write.send(job).map_err(|_| closed())
    }

    /// Runs `work` on a reader connection (on the writer for an in-memory database).
    pub(super) async fn read<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        if self.reads_on_writer {
            return self.write(work).await;
        }
        let (reply, answer) = oneshot::channel();
        let job: ReadJob = Box::new(move |conn| {
            let _ = reply.send(guarded(|| work(conn)));
        });
        {
            let queues = self.queues.read().unwrap_or_else(|p| p.into_inner());
            let read = queues.as_ref().and_then(|q| q.read.as_ref());
            read.ok_or_else(closed)?.send(job).map_err(|_| closed())?;
        }
        answer.await.map_err(|_| closed())?
    }

    /// Stops taking jobs, lets the threads finish what is queued and waits for them to exit.
    pub(super) async fn close(&self) {
        drop(
            self.queues
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        let handles = std::mem::take(&mut *self.handles.lock().unwrap_or_else(|p| p.into_inner()));
        if handles.is_empty() {
            return;
        }
        let target = self.target.clone();
        // Joining blocks: not on a tokio worker.
        let _ = tokio::task::spawn_blocking(move || {
            for handle in handles {
                let _ = handle.join();
            }
            close_alone(&target);
        })
        .await;
    }
}

/// Opens one more connection once every thread's is closed, reads, and closes it. SQLite removes
/// the write-ahead log when the last connection to the database closes, but the threads' close
/// together and each may take another for the last (an empty log was left after one stop in
/// three): this one is the last, unless another process has the database open.
fn close_alone(target: &Target) {
    if target.in_memory() || target.read_only() {
        return;
    }
    if let Ok(conn) = target.open_reader() {
        let _ = conn.query_row("SELECT count(*) FROM sqlite_master", [], |_| Ok(()));
    }
}

/// Starts a thread that opens its own connection and then runs `body` on it; returns once the
/// connection is open, with the error if it could not be.
async fn start_on_connection(
    name: &str,
    open: impl FnOnce() -> Result<Connection> + Send + 'static,
    body: impl FnOnce(Connection) + Send + 'static,
) -> Result<JoinHandle<()>> {
    let (opened, ready) = oneshot::channel();
    let handle = spawn(name, move || {
        let conn = match open() {
            Ok(conn) => conn,
            Err(e) => {
                let _ = opened.send(Err(e));
                return;
            }
        };
        let _ = opened.send(Ok(()));
        body(conn);
    })?;
    ready.await.map_err(|_| closed())??;
    Ok(handle)
}

fn spawn(name: &str, body: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(body)
        .map_err(|e| Error::StoreUnavailable(format!("cannot start {name}: {e}")))
}

/// Until every sender is gone: take what is queued, run it as one batch. A batch of deferred
/// jobs only waits (up to [`DEFER`] from its first) for more, and goes as soon as an urgent
/// job comes.
fn write_loop(conn: &Connection, jobs: &Receiver<Box<dyn WriteJob>>) {
    while let Ok(first) = jobs.recv() {
        let deadline = Instant::now() + DEFER;
        let mut urgent = first.urgent();
        let mut batch = VecDeque::with_capacity(8);
        batch.push_back(first);
        while batch.len() < MAX_BATCH {
            let next = if urgent {
                jobs.try_recv().ok()
            } else {
                jobs.recv_deadline(deadline).ok()
            };
            let Some(job) = next else { break };
            urgent |= job.urgent();
            batch.push_back(job);
        }
        run_batch(conn, batch);
    }
}

/// Copies the WAL back into the database file every [`CHECKPOINT_EVERY`], on a connection of
/// its own, so that the writer never does it inside a commit (with `synchronous=NORMAL` the
/// checkpoint is where the fsyncs are). Passive: it never blocks the writer or the readers.
/// Stops when `stop` is dropped.
fn checkpoint_loop(conn: &Connection, stop: &Receiver<()>) {
    while let Err(RecvTimeoutError::Timeout) = stop.recv_timeout(CHECKPOINT_EVERY) {
        if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::warn!(error = %e, "SQLite checkpoint failed; the writer's own checkpoint is the fallback");
        }
    }
}

/// Runs a batch in as few transactions as possible: one, unless SQLite itself rolls one back
/// (an I/O error, a full disk), when the jobs of that transaction are lost and the rest start a
/// new one.
fn run_batch(conn: &Connection, mut batch: VecDeque<Box<dyn WriteJob>>) {
    while !batch.is_empty() {
        if let Err(e) = exec(conn, "BEGIN IMMEDIATE") {
            let reason = e.to_string();
            for job in batch.drain(..) {
                job.answer(Some(&reason));
            }
            return;
        }
        let mut group = Vec::with_capacity(batch.len());
        let mut lost = None;
        while let Some(mut job) = batch.pop_front() {
            if let Err(e) = exec(conn, "SAVEPOINT job") {
                lost = Some(e.to_string());
                group.push(job);
                break;
            }
            let ok = job.run(conn);
            group.push(job);
            if conn.is_autocommit() {
                lost = Some("SQLite rolled the transaction back".to_string());
                break;
            }
            let end = if ok {
                exec(conn, "RELEASE job")
            } else {
                exec(conn, "ROLLBACK TO job").and_then(|()| exec(conn, "RELEASE job"))
            };
            if let Err(e) = end {
                lost = Some(e.to_string());
                break;
            }
        }
        if lost.is_none() {
            lost = exec(conn, "COMMIT").err().map(|e| e.to_string());
        }
        if lost.is_some() && !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        for job in group {
            job.answer(lost.as_deref());
        }
    }
}

/// Runs one parameterless statement through the statement cache.
pub(super) fn exec(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A parent table and a child whose reference is checked only at COMMIT: a child without
    /// its parent runs fine and fails its batch's commit.
    async fn threads_with_a_deferred_constraint(dir: &std::path::Path) -> Threads {
        let url = format!("sqlite://{}/t.db?mode=rwc", dir.display());
        let threads = Threads::start(Target::parse(&url).unwrap(), 1)
            .await
            .unwrap();
        threads
            .write(|conn| {
                conn.execute_batch(
                    "CREATE TABLE parent (id INTEGER PRIMARY KEY);
                     CREATE TABLE child (parent INTEGER REFERENCES parent (id)
                        DEFERRABLE INITIALLY DEFERRED);",
                )?;
                Ok(())
            })
            .await
            .unwrap();
        threads
    }

    async fn children(threads: &Threads) -> i64 {
        let count =
            |conn: &Connection| Ok(conn.query_row("SELECT count(*) FROM child", [], |r| r.get(0))?);
        threads.read(count).await.unwrap()
    }

    #[tokio::test]
    async fn an_early_write_is_answered_when_it_has_run_and_then_told_of_its_commit() {
        let dir = tempfile::tempdir().unwrap();
        let threads = threads_with_a_deferred_constraint(dir.path()).await;
        let insert = |sql: &'static str| move |conn: &Connection| Ok(conn.execute(sql, [])?);

        let (rows, mut committed) = threads
            .write_early(|conn| {
                conn.execute("INSERT INTO parent VALUES (1)", [])?;
                Ok(conn.execute("INSERT INTO child VALUES (1)", [])?)
            })
            .await
            .unwrap();
        assert_eq!(rows, 1);
        committed.wait().await.unwrap();
        assert_eq!(children(&threads).await, 1, "committed: readers see it");

        // Runs (its answer is its outcome), then its batch's commit fails: undone.
        let (rows, mut committed) = threads
            .write_early(insert("INSERT INTO child VALUES (2)"))
            .await
            .unwrap();
        assert_eq!(rows, 1);
        let failed = committed.wait().await.unwrap_err();
        assert!(
            matches!(&failed, Error::StoreUnavailable(m) if m.contains("FOREIGN KEY")),
            "{failed:?}"
        );
        // Asked again, the same answer; nothing of it was kept.
        assert!(committed.wait().await.is_err());
        assert_eq!(children(&threads).await, 1);

        // A job that fails is answered with its own error, and the writer goes on.
        let refused = threads
            .write_early(insert("INSERT INTO nowhere VALUES (1)"))
            .await
            .unwrap_err();
        assert!(refused.to_string().contains("no such table"), "{refused:?}");
        threads
            .write(insert("INSERT INTO child VALUES (1)"))
            .await
            .unwrap();
        assert_eq!(children(&threads).await, 2);
        threads.close().await;
    }
}
