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
pub mod serve;
pub mod shape;
pub mod tenant;
pub mod upgrade;

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
        .method_not_allowed_fallback(method_not_allowed)
        // Bodies are read by handlers with their own limit (413 in OpenAI shape) or streamed.
        .layer(DefaultBodyLimit::disable())
        .with_state(state)
}

async fn not_found(uri: axum::http::Uri) -> Error {
    Error::NotFound(format!("no route for {}", uri.path()))
}

/// A known route called with the wrong method. The admin routes answer as their handlers would
/// first (404 while the admin API is disabled, 401 without the token), so a wrong method does
/// not reveal them.
async fn method_not_allowed(
    axum::extract::State(state): axum::extract::State<Arc<AppState>>,
    method: axum::http::Method,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
) -> Error {
    if uri.path().starts_with("/ctxproxy/v1/sessions")
        && let Err(e) = admin::authorize(&state, &headers)
    {
        return e;
    }
    Error::MethodNotAllowed(format!("{method} is not allowed on {}", uri.path()))
}
