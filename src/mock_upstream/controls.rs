//! The per-request test controls read from `x-mock-*` headers, the OpenAI-shaped error body the
//! mock answers with, and the SSE body that paces a stream as those controls ask.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::json;

/// What the `x-mock-*` headers of one request ask for. Unparsable values are ignored, so a typo
/// shows up as default behaviour rather than as a mock failure mid-test.
#[derive(Debug, Clone, Default)]
pub(crate) struct Controls {
    /// `x-mock-status`: answer this status with an error body.
    pub status: Option<StatusCode>,
    /// `x-mock-delay-ms`: wait before the first byte (overrides the instance delay).
    pub delay: Option<Duration>,
    /// `x-mock-hold-ms`: after the first stream event, wait this long.
    pub hold: Duration,
    /// `x-mock-chunk-delay-ms`: wait this long between stream events.
    pub chunk_delay: Duration,
}

impl Controls {
    pub fn from_headers(headers: &HeaderMap) -> Self {
        let num = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        Controls {
            status: num("x-mock-status")
                .and_then(|s| u16::try_from(s).ok())
                .and_then(|s| StatusCode::from_u16(s).ok()),
            delay: num("x-mock-delay-ms").map(Duration::from_millis),
            hold: Duration::from_millis(num("x-mock-hold-ms").unwrap_or(0)),
            chunk_delay: Duration::from_millis(num("x-mock-chunk-delay-ms").unwrap_or(0)),
        }
    }
}

/// The OpenAI error `type` that goes with a status, as the real API pairs them.
fn error_type(status: StatusCode) -> (&'static str, Option<&'static str>) {
    match status.as_u16() {
        401 => ("authentication_error", Some("invalid_api_key")),
        403 => ("permission_error", None),
        404 => ("not_found_error", None),
        413 => ("invalid_request_error", Some("request_too_large")),
        429 => ("rate_limit_error", Some("rate_limit_exceeded")),
        s if s >= 500 => ("server_error", None),
        _ => ("invalid_request_error", None),
    }
}

/// `status` with `{"error": {"message", "type", "param", "code"}}`.
pub(crate) fn error_response(status: StatusCode, message: &str) -> Response {
    let (kind, code) = error_type(status);
    let body = json!({
        "error": { "message": message, "type": kind, "param": null, "code": code }
    });
    (status, axum::Json(body)).into_response()
}

/// A 400 naming the request field at fault.
pub(crate) fn invalid_request(message: &str, param: &str) -> Response {
    let body = json!({
        "error": { "message": message, "type": "invalid_request_error", "param": param, "code": null }
    });
    (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
}

/// A `text/event-stream` response sending `events` one by one, paced by `hold`/`chunk_delay`.
/// Events are built up front (they are small) so the stream itself only waits and yields.
pub(crate) fn sse_response(events: Vec<Bytes>, ctl: &Controls) -> Response {
    let (hold, gap) = (ctl.hold, ctl.chunk_delay);
    let stream = futures_util::stream::iter(events.into_iter().enumerate()).then(
        move |(i, event)| async move {
            let mut wait = Duration::ZERO;
            if i > 0 {
                wait += gap;
            }
            if i == 1 {
                wait += hold;
            }
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            Ok::<_, Infallible>(event)
        },
    );
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

/// `data: {json}\n\n`, a chat-completions SSE event.
pub(crate) fn data_event(value: &serde_json::Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// `event: NAME\ndata: {json}\n\n`, a Responses API SSE event.
pub(crate) fn named_event(name: &str, value: &serde_json::Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {value}\n\n"))
}

/// Seconds since the epoch, for `created` / `created_at`.
pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
