//! The `/v1/responses` request body: the fields ctxproxy reads, typed; the rest kept.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A Responses API request. `input` is a string or a list of items, kept as JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResponsesRequest {
    pub model: String,
    pub input: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_response_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ResponsesRequest {
    pub fn is_stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// `metadata.session_id`, when the client names its session in the body.
    pub fn metadata_session_id(&self) -> Option<&str> {
        self.metadata.as_ref()?.get("session_id")?.as_str()
    }
}
