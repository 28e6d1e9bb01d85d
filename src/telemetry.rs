//! Logging set-up: `CTXPROXY_LOG` is the filter (default `info`), `CTXPROXY_LOG_FORMAT` picks
//! `text` or `json`; text is coloured only on a terminal. Keys and Authorization values are never
//! logged by any code path.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::env;

/// Installs the global subscriber once; later calls are ignored (tests call it freely).
pub fn init_logging() {
    let filter = std::env::var(env::LOG)
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let json = std::env::var(env::LOG_FORMAT).is_ok_and(|f| f.eq_ignore_ascii_case("json"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        // Colours only for a person at a terminal: a log file or `docker logs` gets plain text.
        .with_ansi(std::io::stdout().is_terminal());
    let _ = if json {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init()
    } else {
        builder.try_init()
    };
}
