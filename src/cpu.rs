//! CPU-heavy work on a request worker without stalling the other requests on it.
//!
//! A request of a few megabytes (a huge tool result) takes a large fraction of a second to parse
//! and count. Run plainly on a tokio worker, that time is taken from every other connection the
//! worker serves, small requests included. `tokio::task::block_in_place` hands the worker's other
//! tasks to another thread for the duration. It costs a thread hand-off, so only requests big
//! enough to need it pay it.

/// Request bodies from this size on are parsed and rewritten with the worker handed off: they
/// take tens of milliseconds or more, against the hand-off's tens of microseconds.
pub const HEAVY_BYTES: usize = 256 * 1024;

/// Runs `work`, for a request of `bytes` bytes, so that a heavy one does not hold up the other
/// tasks of its worker. Where that cannot be done (outside a runtime, or on a current-thread
/// runtime such as a test's, where `block_in_place` would panic) it simply runs.
pub fn run_heavy<T>(bytes: usize, work: impl FnOnce() -> T) -> T {
    if bytes >= HEAVY_BYTES && on_multi_thread_runtime() {
        tokio::task::block_in_place(work)
    } else {
        work()
    }
}

fn on_multi_thread_runtime() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn runs_outside_a_runtime() {
        assert_eq!(run_heavy(HEAVY_BYTES, || 7), 7);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn runs_on_a_current_thread_runtime() {
        assert_eq!(run_heavy(HEAVY_BYTES * 4, || "done"), "done");
    }

    /// With a single worker, heavy work that waits for another task of the same runtime can only
    /// finish if the worker's other tasks moved elsewhere meanwhile: without the hand-off this
    /// waits out the (generous) timeout and fails.
    #[test]
    fn heavy_work_leaves_the_workers_other_tasks_running() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let answered = runtime.block_on(async {
            let (tx, rx) = mpsc::channel();
            let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
            let helper = tokio::spawn(async move {
                go_rx.await.ok();
                tx.send(42).ok();
            });
            let heavy = tokio::spawn(async move {
                run_heavy(HEAVY_BYTES, || {
                    go_tx.send(()).ok();
                    rx.recv_timeout(Duration::from_secs(30)).ok()
                })
            });
            let answered = heavy.await.unwrap();
            helper.await.unwrap();
            answered
        });
        assert_eq!(answered, Some(42));
    }
}
