//! A chat stream's chunk as the reply's rebuild reads it, borrowed from the event's text: the
//! usual chunk (text, refusal or call deltas, a finish reason, usage) is read without building
//! a `serde_json::Value` of the whole of it, which cost most of a chunk's relay (maps of every
//! field, each key hashed). A chunk this does not fit fails to parse here and is read as a
//! `Value` instead (`StreamAccumulator::read`): a delta with any other field (`audio`,
//! `reasoning_content`, a legacy `function_call`) or content parts, an `error`, a field of
//! another type than OpenAI sends. Fields the rebuild does not read (`object`, `model`,
//! `created`, `obfuscation`, …) are skipped, as the `Value` reading ignores them.

use std::borrow::Cow;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;

#[derive(Deserialize)]
pub(super) struct ChatChunk<'a> {
    #[serde(borrow)]
    pub id: Option<Cow<'a, str>>,
    pub usage: Option<Value>,
    #[serde(borrow)]
    pub choices: Option<Vec<ChatChoice<'a>>>,
    /// An error in the stream: read as a `Value`, where it is told.
    pub error: Option<IgnoredAny>,
}

#[derive(Deserialize)]
pub(super) struct ChatChoice<'a> {
    pub index: Option<u64>,
    pub finish_reason: Option<Value>,
    pub logprobs: Option<Value>,
    #[serde(borrow)]
    pub delta: Option<ChatDelta<'a>>,
}

/// Only the fields the rebuild reads by name: any other is merged as the SDK merges deltas,
/// which the `Value` reading does.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ChatDelta<'a> {
    #[serde(borrow)]
    pub role: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub refusal: Option<Cow<'a, str>>,
    pub tool_calls: Option<Vec<Value>>,
}

impl<'a> ChatChunk<'a> {
    /// The chunk, if it is one this view reads whole.
    pub fn parse(data: &'a str) -> Option<ChatChunk<'a>> {
        serde_json::from_str::<ChatChunk<'a>>(data)
            .ok()
            .filter(|chunk| chunk.error.is_none())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_usual_chunks_are_read_through_the_view_and_the_others_are_not() {
        let usual = [
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","service_tier":"default","system_fingerprint":"fp","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"obfuscation":"ab"}"#,
            r#"{"id":"c","choices":[{"index":0,"delta":{"content":"a \"quoted\"\nline"},"finish_reason":null}]}"#,
            r#"{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\""}}]}}]}"#,
            r#"{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}"#,
            r#"{"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}"#,
        ];
        for chunk in usual {
            assert!(ChatChunk::parse(chunk).is_some(), "{chunk}");
        }
        let others = [
            r#"{"choices":[{"index":0,"delta":{"reasoning_content":"hm"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":[{"type":"text","text":"a"}]}}]}"#,
            r#"{"error":{"message":"boom"}}"#,
            r#"{"id":7,"choices":[]}"#,
            r#"{"choices":[{"index":-1,"delta":{}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"a","content":"b"}}]}"#,
            "not json",
        ];
        for chunk in others {
            assert!(ChatChunk::parse(chunk).is_none(), "{chunk}");
        }
    }
}
