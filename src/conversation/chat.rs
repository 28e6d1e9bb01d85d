//! The `/v1/chat/completions` request body: the fields ctxproxy reads, typed; the rest kept.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::Messages;

/// A chat completions request. Unknown fields are forwarded untouched.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatRequest {
    pub model: String,
    /// As received, then as rewritten (read in place from the received ones).
    pub messages: Messages,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ChatRequest {
    pub fn is_stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// `metadata.session_id`, when the client names its session in the body.
    pub fn metadata_session_id(&self) -> Option<&str> {
        self.metadata.as_ref()?.get("session_id")?.as_str()
    }
}
