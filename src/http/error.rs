//! The one place that maps the crate's [`Error`] to HTTP: a status code and an OpenAI-shaped
//! body `{"error": {"message", "type", "param", "code"}}`. Upstream errors never come through
//! here; they are relayed unchanged.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::managed::{TOKENS_IN_HEADER, TOKENS_OUT_HEADER};
use crate::error::Error;

impl Error {
    /// The HTTP status, OpenAI error `type` and `code` for this error.
    pub fn classify(&self) -> (StatusCode, &'static str, Option<&'static str>) {
        match self {
            Error::InvalidRequest { .. } => {
                (StatusCode::BAD_REQUEST, "invalid_request_error", None)
            }
            Error::ContextLengthExceeded { .. } => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("context_length_exceeded"),
            ),
            Error::InvalidApiKey => (
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                Some("invalid_api_key"),
            ),
            Error::AdminUnauthorized => (
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                Some("invalid_admin_token"),
            ),
            Error::NotFound(_) => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("not_found"),
            ),
            Error::MethodNotAllowed(_) => (
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                Some("method_not_allowed"),
            ),
            Error::ToolNotAllowed { .. } => (
                StatusCode::FORBIDDEN,
                "permission_error",
                Some("tool_not_allowed"),
            ),
            Error::UnknownRole(_) => (
                StatusCode::FORBIDDEN,
                "permission_error",
                Some("unknown_role"),
            ),
            Error::RequestTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                Some("request_too_large"),
            ),
            Error::UpstreamUnreachable(_) => (
                StatusCode::BAD_GATEWAY,
                "upstream_error",
                Some("upstream_unreachable"),
            ),
            // Only the proxy's own calls (summaries, never a client's answer) end this way.
            Error::UpstreamRefused(_) => (
                StatusCode::BAD_GATEWAY,
                "upstream_error",
                Some("upstream_refused"),
            ),
            Error::UpstreamTimeout(_) | Error::UpstreamConnectTimeout => (
                StatusCode::GATEWAY_TIMEOUT,
                "upstream_error",
                Some("upstream_timeout"),
            ),
            // 409, which OpenAI's SDKs retry (with backoff) by default.
            Error::SessionBusy { .. } => (
                StatusCode::CONFLICT,
                "invalid_request_error",
                Some("session_busy"),
            ),
            Error::ClientClosed => (
                StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
                "invalid_request_error",
                Some("client_closed_request"),
            ),
            Error::ShuttingDown => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                Some("shutting_down"),
            ),
            Error::StoreUnavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                Some("store_unavailable"),
            ),
            Error::Config(_) | Error::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                Some("internal_error"),
            ),
        }
    }

    /// The `param` of the OpenAI error body.
    fn param(&self) -> Option<&str> {
        match self {
            Error::InvalidRequest { param, .. } | Error::ToolNotAllowed { param, .. } => {
                param.as_deref()
            }
            Error::ContextLengthExceeded { param, .. } => Some(param),
            _ => None,
        }
    }

    /// The OpenAI-shaped error body. Store and upstream details stay in the logs: clients see a
    /// stable message without internals.
    pub fn body(&self) -> serde_json::Value {
        let (_, kind, code) = self.classify();
        let message = match self {
            Error::StoreUnavailable(_) => {
                "The conversation store is unavailable; nothing was sent upstream. Retry later."
                    .to_string()
            }
            Error::Internal(_) | Error::Config(_) => "Internal error in ctxproxy.".to_string(),
            other => other.to_string(),
        };
        json!({"error": {"message": message, "type": kind, "param": self.param(), "code": code}})
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let (status, _, _) = self.classify();
        match &self {
            Error::StoreUnavailable(detail) => {
                tracing::error!(%detail, "store unavailable");
                crate::metrics::store_error();
            }
            Error::Internal(detail) => tracing::error!(%detail, "internal error"),
            _ => {}
        }
        let body = serde_json::to_vec(&self.body()).unwrap_or_default();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        // A conversation refused as too long still says how long it was, and how long after
        // every rewrite, as an answered one does.
        if let Error::ContextLengthExceeded { report, .. } = &self {
            headers.insert(TOKENS_IN_HEADER, HeaderValue::from(report.tokens_in));
            headers.insert(TOKENS_OUT_HEADER, HeaderValue::from(report.tokens_out));
        }
        response
    }
}
