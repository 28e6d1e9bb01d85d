//! Message identity: a hash of the message's canonical form chained to its parent's id, so one
//! id names a whole prefix of a conversation. The canonical form keeps what a client resends
//! (role, text, name, tool calls, tool_call_id) and drops what SDKs add or omit at will (null
//! fields, empty arrays, provider extras such as `annotations` or `refusal: null`), so a reply
//! stored from the upstream matches the same reply when the client sends it back.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// The id of a message in a conversation tree: sha256 over the parent id and canonical form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(pub [u8; 32]);

impl MessageId {
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    pub fn from_hex(s: &str) -> Option<Self> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(MessageId(out))
    }
}

impl std::fmt::Display for MessageId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// The canonical form of a wire message (chat message or Responses item) as JSON.
pub fn canonical(message: &Value) -> Value {
    let Some(obj) = message.as_object() else {
        return message.clone();
    };
    let mut out = Map::new();
    for key in [
        "role",
        "type",
        "name",
        "tool_call_id",
        "call_id",
        "arguments",
        "output",
    ] {
        if let Some(v) = obj.get(key).filter(|v| !is_empty(v)) {
            // A Responses `message` item may come with or without its type (SPEC 7): a string
            // `input` is stored without one and resent with one, and both are one message.
            if key == "type" && v == "message" {
                continue;
            }
            out.insert(key.to_string(), v.clone());
        }
    }
    if let Some(content) = obj.get("content").filter(|v| !is_empty(v)) {
        out.insert("content".into(), canonical_content(content));
    }
    if let Some(Value::Array(calls)) = obj.get("tool_calls") {
        let calls: Vec<Value> = calls.iter().map(canonical_tool_call).collect();
        if !calls.is_empty() {
            out.insert("tool_calls".into(), Value::Array(calls));
        }
    }
    Value::Object(out)
}

/// Text content parts are reduced to their text so `"hi"` and `[{"type":"text","text":"hi"}]`
/// (and the Responses API's `input_text`/`output_text` parts) are the same message.
fn canonical_content(content: &Value) -> Value {
    match content {
        Value::Array(parts) => {
            let all_text = parts.iter().all(|p| {
                matches!(
                    p.get("type").and_then(Value::as_str),
                    Some("text" | "input_text" | "output_text")
                )
            });
            if all_text {
                let text: String = parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect();
                Value::String(text)
            } else {
                content.clone()
            }
        }
        other => other.clone(),
    }
}

fn canonical_tool_call(call: &Value) -> Value {
    let mut out = Map::new();
    if let Some(id) = call.get("id") {
        out.insert("id".into(), id.clone());
    }
    if let Some(f) = call.get("function") {
        for key in ["name", "arguments"] {
            if let Some(v) = f.get(key) {
                out.insert(key.into(), v.clone());
            }
        }
    }
    Value::Object(out)
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// The id of `message` as the child of `parent` (`None` for the first message).
pub fn message_id(parent: Option<&MessageId>, message: &Value) -> MessageId {
    let mut hasher = Sha256::new();
    match parent {
        Some(p) => hasher.update(p.0),
        None => hasher.update([0u8; 32]),
    }
    // serde_json's Map is ordered by key, so this serialisation is canonical.
    let bytes = serde_json::to_vec(&canonical(message)).unwrap_or_default();
    hasher.update(&bytes);
    MessageId(hasher.finalize().into())
}

/// The chained ids of a whole conversation, first message first.
pub fn chain_ids(messages: &[Value]) -> Vec<MessageId> {
    let mut ids = Vec::with_capacity(messages.len());
    let mut parent: Option<MessageId> = None;
    for m in messages {
        let id = message_id(parent.as_ref(), m);
        ids.push(id);
        parent = Some(id);
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reply_as_stored_matches_reply_as_resent() {
        let stored = json!({"role":"assistant","content":"ok","refusal":null,"annotations":[]});
        let resent = json!({"role":"assistant","content":"ok"});
        assert_eq!(message_id(None, &stored), message_id(None, &resent));
    }

    #[test]
    fn a_message_item_is_the_same_message_with_or_without_its_type() {
        let typed = json!({"type":"message","role":"user","content":"hello"});
        let untyped = json!({"role":"user","content":"hello"});
        assert_eq!(message_id(None, &typed), message_id(None, &untyped));
        let call = json!({"type":"function_call","call_id":"c1","name":"f","arguments":"{}"});
        let untyped_call = json!({"call_id":"c1","name":"f","arguments":"{}"});
        assert_ne!(message_id(None, &call), message_id(None, &untyped_call));
    }

    #[test]
    fn different_parents_give_different_ids() {
        let m = json!({"role":"user","content":"hi"});
        let a = message_id(None, &m);
        let b = message_id(Some(&a), &m);
        assert_ne!(a, b);
    }

    #[test]
    fn null_and_empty_content_are_the_same_for_tool_call_messages() {
        let calls = json!([{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]);
        let a = json!({"role":"assistant","content":null,"tool_calls":calls});
        let b = json!({"role":"assistant","content":"","tool_calls":calls});
        assert_eq!(message_id(None, &a), message_id(None, &b));
    }
}
