//! The `/v1/responses` request body: the fields ctxproxy reads, typed; the rest kept.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A Responses API request. `input` is a string or a list of items, kept as JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResponsesRequest {
    pub model: String,
    /// Absent (null) only where the conversation is elsewhere: see
    /// [`ResponsesRequest::continues_elsewhere`].
    #[serde(default, skip_serializing_if = "Value::is_null")]
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
    /// The client sent no `input`: none goes upstream unless there are items to send.
    #[serde(skip)]
    pub input_absent: bool,
}

impl ResponsesRequest {
    pub fn is_stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// Whether the conversation may be somewhere other than `input`: a previous response, an
    /// upstream conversation or a stored prompt, which OpenAI accepts with no input at all.
    pub fn continues_elsewhere(&self) -> bool {
        self.previous_response_id.is_some()
            || ["conversation", "prompt"]
                .iter()
                .any(|k| self.extra.get(*k).is_some_and(|v| !v.is_null()))
    }

    /// Whether the request continues a conversation the upstream keeps (`conversation`, an id
    /// or an object): the history is the upstream's, which the proxy never sees.
    pub fn in_upstream_conversation(&self) -> bool {
        self.extra.get("conversation").is_some_and(|v| !v.is_null())
    }

    /// The id of the upstream conversation the request continues (`"conversation": "conv_…"`
    /// or `{"id": "conv_…"}`).
    pub fn upstream_conversation_id(&self) -> Option<&str> {
        match self.extra.get("conversation")? {
            Value::String(id) => Some(id),
            other => other.get("id")?.as_str(),
        }
    }

    /// `metadata.session_id`, when the client names its session in the body.
    pub fn metadata_session_id(&self) -> Option<&str> {
        self.metadata.as_ref()?.get("session_id")?.as_str()
    }
}
