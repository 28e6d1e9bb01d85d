//! ctxproxy: a context-managing reverse proxy for OpenAI-compatible APIs.
//!
//! The request path: `http` (routes, tenant, errors) → `store` (session, history) →
//! `context` (the pure rewrite pipeline) → `upstream` (forward, relay, accumulate) → `store`.

pub mod context;
pub mod conversation;
pub mod error;
pub mod tokens;

pub use error::{Error, Result};
