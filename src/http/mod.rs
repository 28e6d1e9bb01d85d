//! The HTTP surface: the route table (routes only; handlers live in one file per family) and
//! the pieces every handler shares.

pub mod admin;
pub mod body;
pub mod call;
pub mod completion;
pub mod error;
pub mod health;
pub mod managed;
pub mod passthrough;
pub mod preview;
pub mod request_id;
pub mod rewrite;
pub mod tenant;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{any, get, post};

use crate::app::AppState;
use crate::error::Error;

/// Every route of SPEC section 3.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route(
            "/v1/chat/completions",
            post(managed::chat_completions).fallback(passthrough::forward),
        )
        .route(
            "/v1/responses",
            post(managed::responses).fallback(passthrough::forward),
        )
        .route("/v1/{*rest}", any(passthrough::forward))
        .route(
            "/ctxproxy/v1/preview/chat/completions",
            post(preview::chat_completions),
        )
        .route("/ctxproxy/v1/preview/responses", post(preview::responses))
        .route("/ctxproxy/v1/sessions", get(admin::list_sessions))
        .route(
            "/ctxproxy/v1/sessions/{tenant}/{session}",
            get(admin::get_session).delete(admin::delete_session),
        )
        .route(
            "/ctxproxy/v1/sessions/{tenant}/{session}/messages",
            get(admin::messages),
        )
        .route(
            "/ctxproxy/v1/sessions/{tenant}/{session}/requests",
            get(admin::requests),
        )
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .fallback(not_found)
        // Bodies are read by handlers with their own limit (413 in OpenAI shape) or streamed.
        .layer(DefaultBodyLimit::disable())
        .with_state(state)
}

async fn not_found(uri: axum::http::Uri) -> Error {
    Error::NotFound(format!("no route for {}", uri.path()))
}
