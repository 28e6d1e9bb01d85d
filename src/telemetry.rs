//! Logging set-up: `CTXPROXY_LOG` is the filter (default `info`), `CTXPROXY_LOG_FORMAT` picks
//! `text` or `json`; text is coloured only on a terminal. Keys and Authorization values are never
//! logged by any code path.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::env;

/// `info`, less the file watcher's own warnings: while a watched path is missing it warns on
/// every poll (twice a second), in its debug format; the reload that fails on it says so once.
const DEFAULT_FILTER: &str = "info,notify=error";

/// Installs the global subscriber once; later calls are ignored (tests call it freely). A
/// filter or format that does not parse falls back to the default and is logged as a warning
/// once logging is up, so a typo does not go unnoticed.
pub fn init_logging() {
    let mut problems = Vec::new();
    let filter = match std::env::var(env::LOG) {
        Ok(f) if !f.is_empty() => EnvFilter::try_new(&f).unwrap_or_else(|e| {
            problems.push(format!(
                "{}: not a log filter ({e}); using `info`",
                env::LOG
            ));
            EnvFilter::new(DEFAULT_FILTER)
        }),
        _ => EnvFilter::new(DEFAULT_FILTER),
    };
    let json = match std::env::var(env::LOG_FORMAT) {
        Ok(f) if f.eq_ignore_ascii_case("json") => true,
        Ok(f) if f.is_empty() || f.eq_ignore_ascii_case("text") => false,
        Ok(f) => {
            problems.push(format!(
                "{}: expected `text` or `json`, not `{f}`; using text",
                env::LOG_FORMAT
            ));
            false
        }
        Err(_) => false,
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        // Colours only for a person at a terminal: a log file or `docker logs` gets plain text.
        .with_ansi(std::io::stdout().is_terminal());
    let installed = if json {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init()
    } else {
        builder.try_init()
    };
    if installed.is_ok() {
        for problem in problems {
            tracing::warn!("{problem}");
        }
    }
}
