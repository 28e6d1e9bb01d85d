//! Keeps the requests the mock received, in order and bounded, so tests can check what a proxy
//! actually sent upstream. Stores raw parts and turns them into JSON only when asked, which keeps
//! recording cheap on the hot path.

use std::collections::VecDeque;
use std::sync::Mutex;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, request::Parts};
use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::MockState;

/// One request as the mock received it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path, e.g. `/v1/chat/completions`.
    pub path: String,
    /// The raw query string, without `?`.
    pub query: Option<String>,
    /// Every header as received.
    pub headers: HeaderMap,
    /// The raw body.
    pub body: Bytes,
}

impl RecordedRequest {
    /// The body parsed as JSON, if it is JSON.
    pub fn body_json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// The first value of a header, if present and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// `{"method", "path", "query", "headers", "body"}`, as `GET /_mock/requests` shows it.
    pub fn to_json(&self) -> Value {
        json!({
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "headers": headers_json(&self.headers),
            "body": body_json_or_text(&self.body),
        })
    }
}

/// Headers as a JSON object; a repeated header's values are joined with `, ` as HTTP allows.
pub(crate) fn headers_json(headers: &HeaderMap) -> Value {
    let mut out = Map::new();
    for (name, value) in headers {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        match out.get_mut(name.as_str()) {
            Some(Value::String(prev)) => {
                prev.push_str(", ");
                prev.push_str(&value);
            }
            _ => {
                out.insert(name.as_str().to_owned(), Value::String(value));
            }
        }
    }
    Value::Object(out)
}

/// The body as JSON when it parses, else as text; `null` when empty.
pub(crate) fn body_json_or_text(body: &[u8]) -> Value {
    if body.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned()))
}

/// A bounded in-memory log of requests; a disabled one records nothing.
pub(crate) struct Recorder {
    enabled: bool,
    limit: usize,
    log: Mutex<VecDeque<RecordedRequest>>,
}

impl Recorder {
    pub fn new(enabled: bool, limit: usize) -> Self {
        Recorder {
            enabled: enabled && limit > 0,
            limit,
            log: Mutex::new(VecDeque::new()),
        }
    }

    pub fn record(&self, parts: &Parts, body: &Bytes) {
        if !self.enabled {
            return;
        }
        let entry = RecordedRequest {
            method: parts.method.to_string(),
            path: parts.uri.path().to_owned(),
            query: parts.uri.query().map(str::to_owned),
            headers: parts.headers.clone(),
            body: body.clone(),
        };
        // A poisoned lock only means another request panicked mid-push; the log is still usable.
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        if log.len() >= self.limit {
            log.pop_front();
        }
        log.push_back(entry);
    }

    pub fn snapshot(&self) -> Vec<RecordedRequest> {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.iter().cloned().collect()
    }

    pub fn clear(&self) {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// `GET /_mock/requests`.
pub(crate) async fn list(State(state): State<MockState>) -> Json<Value> {
    let requests = state.requests();
    Json(Value::Array(
        requests.iter().map(RecordedRequest::to_json).collect(),
    ))
}

/// `DELETE /_mock/requests`.
pub(crate) async fn clear(State(state): State<MockState>) -> StatusCode {
    state.clear_requests();
    StatusCode::NO_CONTENT
}
