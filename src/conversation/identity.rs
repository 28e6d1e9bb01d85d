//! Message identity: a hash of the message's canonical form chained to its parent's id, so one
//! id names a whole prefix of a conversation. The canonical form keeps what a client resends
//! (role, text, name, tool calls, tool_call_id) and drops what SDKs add or omit at will (null
//! fields, empty arrays, provider extras such as `annotations` or `refusal: null`), so a reply
//! stored from the upstream matches the same reply when the client sends it back.

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
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
    parts_text(content).map_or_else(|| content.clone(), Value::String)
}

/// The text of a content array made only of text parts; `None` for anything else, which the
/// canonical form keeps as it is.
fn parts_text(content: &Value) -> Option<String> {
    let Value::Array(parts) = content else {
        return None;
    };
    let all_text = parts.iter().all(|p| {
        matches!(
            p.get("type").and_then(Value::as_str),
            Some("text" | "input_text" | "output_text")
        )
    });
    all_text.then(|| {
        parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect()
    })
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

/// [`canonical`]`(message)` as it serialises, written straight from the message without
/// building the canonical value: the same bytes (keys in serde_json's sorted order, the way a
/// `Map` of the canonical form iterates), without copying every string of a long history on
/// every turn just to hash it.
struct CanonicalForm<'a>(&'a Value);

impl Serialize for CanonicalForm<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Some(obj) = self.0.as_object() else {
            return self.0.serialize(s);
        };
        let field = |key: &str| obj.get(key).filter(|v| !is_empty(v));
        let content = field("content");
        // A parts array of text only is reduced to its text; anything else is written as is
        // (an image part is not copied to be hashed).
        let reduced = content.and_then(parts_text);
        let calls = match obj.get("tool_calls") {
            Some(Value::Array(calls)) if !calls.is_empty() => Some(calls),
            _ => None,
        };
        let mut map = s.serialize_map(None)?;
        // The keys of `canonical`, in sorted order.
        for key in ["arguments", "call_id"] {
            if let Some(v) = field(key) {
                map.serialize_entry(key, v)?;
            }
        }
        match (&reduced, content) {
            (Some(reduced), _) => map.serialize_entry("content", reduced)?,
            (None, Some(content)) => map.serialize_entry("content", content)?,
            (None, None) => {}
        }
        for key in ["name", "output", "role", "tool_call_id"] {
            if let Some(v) = field(key) {
                map.serialize_entry(key, v)?;
            }
        }
        if let Some(calls) = calls {
            map.serialize_entry("tool_calls", &CanonicalCalls(calls))?;
        }
        if let Some(v) = field("type").filter(|v| *v != "message") {
            map.serialize_entry("type", v)?;
        }
        map.end()
    }
}

/// The tool calls of [`CanonicalForm`], each as [`canonical_tool_call`] serialises.
struct CanonicalCalls<'a>(&'a [Value]);

impl Serialize for CanonicalCalls<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for call in self.0 {
            seq.serialize_element(&CanonicalCall(call))?;
        }
        seq.end()
    }
}

struct CanonicalCall<'a>(&'a Value);

impl Serialize for CanonicalCall<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let function = self.0.get("function");
        let mut map = s.serialize_map(None)?;
        if let Some(v) = function.and_then(|f| f.get("arguments")) {
            map.serialize_entry("arguments", v)?;
        }
        if let Some(v) = self.0.get("id") {
            map.serialize_entry("id", v)?;
        }
        if let Some(v) = function.and_then(|f| f.get("name")) {
            map.serialize_entry("name", v)?;
        }
        map.end()
    }
}

/// The id of `message` as the child of `parent`, hashing its canonical form through `buf` (a
/// scratch buffer, reused across a conversation).
fn chained_id(parent: Option<&MessageId>, message: &Value, buf: &mut Vec<u8>) -> MessageId {
    let mut hasher = Sha256::new();
    match parent {
        Some(p) => hasher.update(p.0),
        None => hasher.update([0u8; 32]),
    }
    buf.clear();
    // Writing into a Vec cannot fail, and every key is a string.
    let _ = serde_json::to_writer(&mut *buf, &CanonicalForm(message));
    hasher.update(&buf[..]);
    MessageId(hasher.finalize().into())
}

/// The id of `message` as the child of `parent` (`None` for the first message): sha256 over
/// the parent id and the serialised [`canonical`] form.
pub fn message_id(parent: Option<&MessageId>, message: &Value) -> MessageId {
    chained_id(parent, message, &mut Vec::new())
}

/// The chained ids of a whole conversation, first message first.
pub fn chain_ids(messages: &[Value]) -> Vec<MessageId> {
    let mut ids = Vec::with_capacity(messages.len());
    let mut parent: Option<MessageId> = None;
    let mut buf = Vec::new();
    for m in messages {
        let id = chained_id(parent.as_ref(), m, &mut buf);
        ids.push(id);
        parent = Some(id);
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
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

    /// Any JSON, weighted towards the shapes the canonical form looks at.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            Just(json!("")),
            Just(json!([])),
            Just(json!("message")),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            "[a-z\"\\ é\n]{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            let key = prop_oneof![
                Just("role".to_string()),
                Just("type".to_string()),
                Just("text".to_string()),
                Just("id".to_string()),
                Just("function".to_string()),
                Just("name".to_string()),
                Just("arguments".to_string()),
                "[a-z_]{1,6}",
            ];
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
                prop::collection::vec((key, inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    /// A message-like object: every key the canonical form reads, with any value.
    fn message_value() -> impl Strategy<Value = Value> {
        let keys = [
            "role",
            "type",
            "name",
            "tool_call_id",
            "call_id",
            "arguments",
            "output",
            "content",
            "tool_calls",
            "refusal",
        ];
        let text_part = "[a-z ]{0,6}".prop_map(|t| json!({"type": "text", "text": t}));
        let content = prop_oneof![
            json_value(),
            prop::collection::vec(text_part, 0..3).prop_map(Value::from),
        ];
        let call = (json_value(), json_value(), json_value()).prop_map(|(id, name, args)| {
            json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
        });
        let calls = prop_oneof![
            json_value(),
            prop::collection::vec(prop_oneof![call, json_value()], 0..3).prop_map(Value::from),
        ];
        (
            prop::collection::vec((prop::sample::select(keys.to_vec()), json_value()), 0..8),
            prop::option::of(content),
            prop::option::of(calls),
        )
            .prop_map(|(fields, content, calls)| {
                let mut m: Map<String, Value> = fields
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect();
                if let Some(c) = content {
                    m.insert("content".into(), c);
                }
                if let Some(c) = calls {
                    m.insert("tool_calls".into(), c);
                }
                Value::Object(m)
            })
    }

    proptest! {
        #[test]
        fn streamed_canonical_form_is_the_canonical_value_serialised(
            m in prop_oneof![message_value(), json_value()]
        ) {
            let built = serde_json::to_vec(&canonical(&m)).unwrap();
            let streamed = serde_json::to_vec(&CanonicalForm(&m)).unwrap();
            prop_assert_eq!(
                String::from_utf8_lossy(&streamed),
                String::from_utf8_lossy(&built)
            );
        }
    }

    #[test]
    fn ids_are_those_of_earlier_versions() {
        // Stored conversations are found by these ids: they must never change.
        let m = json!({"role": "assistant", "content": [{"type": "text", "text": "ok"}],
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]});
        assert_eq!(
            message_id(None, &m).to_hex(),
            "93f69a03cd38ffbe9188059f1e8872813f0c6a5d7b30ac6265ce3eb24fbf8b97"
        );
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
