//! A stream's events as the reply's rebuild reads them, borrowed from the event's text: the
//! events that come once per token (a chat chunk of text, refusal or call deltas, a finish
//! reason, usage; a Responses `*.delta` event) are read without building a `serde_json::Value`
//! of the whole event, which cost most of a chunk's relay (maps of every field, each key
//! hashed). An event these views do not fit fails to parse here and is read as a `Value`
//! instead (`StreamAccumulator::read`): a chat delta with any other field (`audio`,
//! `reasoning_content`, a legacy `function_call`) or content parts, an `error`, any Responses
//! event but a delta, a field of another type than OpenAI sends. Fields the rebuild does not
//! read (`object`, `model`, `created`, `obfuscation`, `sequence_number`, …) are skipped, as the
//! `Value` reading ignores them.

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

/// A Responses event that carries one token's worth of something: `response.output_text.delta`
/// (whose text the rebuild keeps, for a server that never sends the item), or another
/// `response.*.delta` (which only says its item is under way).
#[derive(Deserialize)]
pub(super) struct ResponsesDelta<'a> {
    #[serde(rename = "type", borrow)]
    pub kind: Cow<'a, str>,
    pub output_index: Option<u64>,
    #[serde(borrow)]
    pub item_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub delta: Option<Cow<'a, str>>,
}

impl<'a> ResponsesDelta<'a> {
    /// The event, if it is a delta this view reads whole.
    pub fn parse(data: &'a str) -> Option<ResponsesDelta<'a>> {
        serde_json::from_str::<ResponsesDelta<'a>>(data)
            .ok()
            .filter(|event| event.kind.starts_with("response.") && event.kind.ends_with(".delta"))
    }
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

    #[test]
    fn responses_deltas_are_read_through_the_view_and_other_events_are_not() {
        let deltas = [
            r#"{"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hi \"there\"","logprobs":[],"obfuscation":"x"}"#,
            r#"{"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":1,"delta":"{\"a\""}"#,
        ];
        for event in deltas {
            assert!(ResponsesDelta::parse(event).is_some(), "{event}");
        }
        let others = [
            r#"{"type":"response.created","response":{"id":"resp_1"}}"#,
            r#"{"type":"response.output_item.done","output_index":0,"item":{}}"#,
            r#"{"type":"response.completed","response":{"id":"resp_1","output":[]}}"#,
            r#"{"type":"error","message":"boom"}"#,
            r#"{"output_index":0,"delta":"no type"}"#,
            r#"{"type":"response.output_text.delta","output_index":-1,"delta":"x"}"#,
            r#"{"type":"response.audio.delta","output_index":0,"delta":{"data":"x"}}"#,
        ];
        for event in others {
            assert!(ResponsesDelta::parse(event).is_none(), "{event}");
        }
    }
}
