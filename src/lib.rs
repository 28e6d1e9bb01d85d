//! ctxproxy: a context-managing reverse proxy for OpenAI-compatible APIs.
//!
//! The request path: `http` (routes, tenant, errors) → `store` (session, history) →
//! `context` (the pure rewrite pipeline) → `upstream` (forward, relay, accumulate) → `store`.

pub mod access;
pub mod app;
pub mod config;
pub mod context;
pub mod conversation;
pub mod cpu;
pub mod error;
pub mod http;
pub mod metrics;
pub mod mock_upstream;
pub mod session;
pub mod store;
pub mod summarize;
pub mod telemetry;
pub mod tokens;
pub mod upstream;

pub use error::{Error, Result};

/// Installs rustls' ring provider; reqwest is built without one. Safe to call more than once.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
