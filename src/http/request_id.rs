//! The request id: taken from an incoming `x-request-id` when it is sane, else a new UUIDv7.
//! It is returned as `x-ctxproxy-request-id`, logged on every line and kept in the record.

use axum::http::HeaderMap;

/// The response header carrying the request id.
pub const RESPONSE_HEADER: &str = "x-ctxproxy-request-id";

/// The id for this request.
pub fn from_headers(headers: &HeaderMap) -> String {
    headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_string)
        .unwrap_or_else(|| uuid::Uuid::now_v7().to_string())
}
