//! Scripted replies: canned answers chosen by a substring of the request body, for tests that need
//! a specific reply (a summary text, an upstream error on one turn) instead of the default.

use std::sync::{Arc, RwLock};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::MockState;
use super::controls::invalid_request;

/// One canned reply: a request whose body contains `match` is answered with `status` and `content`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptEntry {
    /// Substring of the raw request body that selects this entry.
    #[serde(rename = "match")]
    pub matches: String,
    /// 2xx: a normal reply with `content` as its text; anything else: an error with it as message.
    #[serde(default = "ok_status")]
    pub status: u16,
    /// The reply text (or error message).
    #[serde(default)]
    pub content: String,
}

fn ok_status() -> u16 {
    200
}

/// The current script. Readers take a snapshot of the `Arc`, so a request never holds the lock
/// while it scans its body, and an empty script costs one lock and a length check.
#[derive(Default)]
pub(crate) struct Script {
    entries: RwLock<Arc<Vec<ScriptEntry>>>,
}

impl Script {
    pub fn set(&self, entries: Vec<ScriptEntry>) {
        *self.entries.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(entries);
    }

    /// The first entry whose `match` occurs in `body`.
    pub fn find(&self, body: &[u8]) -> Option<ScriptEntry> {
        let entries = self
            .entries
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if entries.is_empty() {
            return None;
        }
        let body = String::from_utf8_lossy(body);
        entries
            .iter()
            .find(|e| body.contains(e.matches.as_str()))
            .cloned()
    }
}

/// `POST /_mock/script`: replaces the script with the posted list.
pub(crate) async fn set(State(state): State<MockState>, body: Bytes) -> Response {
    match serde_json::from_slice::<Vec<ScriptEntry>>(&body) {
        Ok(entries) => {
            let count = entries.len();
            state.set_script(entries);
            Json(json!({ "count": count })).into_response()
        }
        Err(err) => invalid_request(&format!("bad script: {err}"), "script"),
    }
}

/// `DELETE /_mock/script`.
pub(crate) async fn clear(State(state): State<MockState>) -> StatusCode {
    state.clear_script();
    StatusCode::NO_CONTENT
}
