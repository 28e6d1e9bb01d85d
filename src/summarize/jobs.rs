//! In-process bookkeeping of summary jobs: which sessions have one running here, and when a
//! session whose last attempt failed may try again. The store's summary lease is what keeps two
//! processes apart; this only spares a process from starting a second job of its own, or from
//! hammering a failing summariser on every turn.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Wait after the second consecutive failure; doubled after each further one. The first failure
/// waits for nothing: SPEC 5.2 retries on a later turn, and one failure is often a blip, so the
/// next turn tries again; only a summariser that keeps failing is left alone for a while.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait between attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

#[derive(Debug, Default)]
struct Entry {
    running: bool,
    failures: u32,
    /// No new attempt before this instant.
    next_attempt: Option<Instant>,
}

/// Summary jobs of this process, per (tenant, session). Shared through the app state.
#[derive(Debug, Default)]
pub struct Jobs {
    sessions: Mutex<HashMap<(String, String), Entry>>,
}

impl Jobs {
    fn lock(&self) -> MutexGuard<'_, HashMap<(String, String), Entry>> {
        // The map holds plain bookkeeping; a panic elsewhere cannot leave it inconsistent.
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks a job as running for the session, unless one already runs here or the session is
    /// still backing off after a failure. The returned ticket must be given its outcome.
    pub(crate) fn start(self: &Arc<Self>, tenant: &str, session: &str) -> Option<Ticket> {
        let mut map = self.lock();
        let key = (tenant.to_string(), session.to_string());
        let entry = map.entry(key.clone()).or_default();
        if entry.running || entry.next_attempt.is_some_and(|t| Instant::now() < t) {
            return None;
        }
        entry.running = true;
        Some(Ticket {
            jobs: self.clone(),
            key,
            done: false,
        })
    }

    /// Jobs running in this process now (tests wait for this to drop to zero).
    pub fn running(&self) -> usize {
        self.lock().values().filter(|e| e.running).count()
    }

    fn finish(&self, key: &(String, String), failed: bool) {
        let mut map = self.lock();
        if !failed {
            // Success (or another owner doing the work) clears the backoff.
            map.remove(key);
            return;
        }
        let entry = map.entry(key.clone()).or_default();
        entry.running = false;
        entry.failures = entry.failures.saturating_add(1);
        entry.next_attempt = Some(Instant::now() + backoff(entry.failures));
    }
}

/// The wait after `failures` consecutive failures.
fn backoff(failures: u32) -> Duration {
    if failures <= 1 {
        return Duration::ZERO;
    }
    let doublings = failures.saturating_sub(2).min(16);
    FIRST_BACKOFF
        .saturating_mul(1u32 << doublings)
        .min(MAX_BACKOFF)
}

/// A running job's claim on its session. Dropped without an outcome (a panic, a cancelled
/// task), it counts as a failure so the session is neither stuck nor retried at once.
#[derive(Debug)]
pub(crate) struct Ticket {
    jobs: Arc<Jobs>,
    key: (String, String),
    done: bool,
}

impl Ticket {
    /// Ends the job: `failed` starts (or lengthens) the session's backoff.
    pub(crate) fn finish(mut self, failed: bool) {
        self.done = true;
        self.jobs.finish(&self.key, failed);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done {
            self.jobs.finish(&self.key, true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_job_per_session_and_backoff_after_failure() {
        let jobs = Arc::new(Jobs::default());
        let t = jobs.start("t", "s").unwrap();
        assert!(jobs.start("t", "s").is_none(), "already running");
        let other = jobs.start("t", "other").unwrap();
        t.finish(true);
        let retry = jobs
            .start("t", "s")
            .expect("the next turn retries a first failure");
        retry.finish(true);
        assert!(
            jobs.start("t", "s").is_none(),
            "backing off after the second"
        );
        assert_eq!(jobs.running(), 1);
        drop(other);
        assert_eq!(jobs.running(), 0);
    }

    #[test]
    fn success_clears_the_backoff() {
        let jobs = Arc::new(Jobs::default());
        jobs.start("t", "s").unwrap().finish(false);
        assert!(jobs.start("t", "s").is_some());
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        assert_eq!(backoff(1), Duration::ZERO);
        assert_eq!(backoff(2), FIRST_BACKOFF);
        assert_eq!(backoff(3), FIRST_BACKOFF * 2);
        assert_eq!(backoff(40), MAX_BACKOFF);
    }
}
