//! Message identity: a hash of the message's canonical form chained to its parent's id, so one
//! id names a whole prefix of a conversation. The canonical form keeps what a client resends
//! (role, text, name, tool calls, tool_call_id) and drops what SDKs add or omit at will (null
//! fields, empty arrays, provider extras such as `annotations` or `refusal: null`), so a reply
//! stored from the upstream matches the same reply when the client sends it back. Its object
//! keys are sorted at every depth, so a client that resends a reply with its keys in another
//! order still matches.

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

/// The fields a message is known by, in sorted order.
const MESSAGE_FIELDS: [&str; 9] = [
    "arguments",
    "call_id",
    "content",
    "name",
    "output",
    "role",
    "tool_call_id",
    "tool_calls",
    "type",
];

/// What the canonical form writes for one field.
enum Part<'a> {
    /// The value, its object keys sorted at every depth (as ids were always made).
    Value(&'a Value),
    /// Text put in place of the value: content parts reduced to their text.
    Text(String),
    /// Chat tool calls, each as a [`Part::Call`].
    Calls(&'a [Value]),
    /// A tool call as its id, its function's name and its arguments.
    Call {
        id: Option<&'a Value>,
        function: Option<&'a Value>,
    },
}

/// The fields of the canonical form of `obj` in sorted key order, each with what is written
/// for it. [`canonical`] and [`CanonicalForm`] are both made from this, so they cannot differ.
fn fields(obj: &Map<String, Value>) -> Vec<(&str, Part<'_>)> {
    let present = |v: &&Value| !is_empty(v);
    let mut out = Vec::with_capacity(MESSAGE_FIELDS.len());
    for key in MESSAGE_FIELDS {
        let Some(v) = obj.get(key).filter(present) else {
            continue;
        };
        let part = match key {
            // A parts array of text only is reduced to its text; anything else is written
            // as is (an image part is not copied to be hashed).
            "content" => parts_text(v).map_or(Part::Value(v), Part::Text),
            "tool_calls" => match v {
                Value::Array(calls) => Part::Calls(calls),
                _ => continue,
            },
            // A Responses `message` item may come with or without its type (SPEC 7): a string
            // `input` is stored without one and resent with one, and both are one message.
            "type" if v == "message" => continue,
            _ => Part::Value(v),
        };
        out.push((key, part));
    }
    out
}

/// The canonical form of a wire message (chat message or Responses item) as JSON.
pub fn canonical(message: &Value) -> Value {
    let Some(obj) = message.as_object() else {
        return sorted(message);
    };
    let out: Map<String, Value> = fields(obj)
        .into_iter()
        .map(|(k, part)| (k.to_string(), part.to_value()))
        .collect();
    Value::Object(out)
}

impl Part<'_> {
    fn to_value(&self) -> Value {
        match self {
            Part::Value(v) => sorted(v),
            Part::Text(t) => Value::String(t.clone()),
            Part::Calls(calls) => Value::Array(calls.iter().map(|c| call(c).to_value()).collect()),
            Part::Call { id, function } => {
                let mut out = Map::new();
                let name = function.and_then(|f| f.get("name"));
                if let Some(v) = function.and_then(|f| f.get("arguments")) {
                    out.insert("arguments".into(), sorted(v));
                }
                if let Some(v) = id {
                    out.insert("id".into(), sorted(v));
                }
                if let Some(v) = name {
                    out.insert("name".into(), sorted(v));
                }
                Value::Object(out)
            }
        }
    }
}

/// One chat tool call as its canonical part.
fn call(c: &Value) -> Part<'_> {
    Part::Call {
        id: c.get("id"),
        function: c.get("function"),
    }
}

/// `v` with its object keys in sorted order at every depth, as a value: serialised, it is what
/// [`Sorted`] writes.
fn sorted(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut entries: Vec<(&String, &Value)> = m.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k.clone(), sorted(v)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// Text content parts are reduced to their text so `"hi"` and `[{"type":"text","text":"hi"}]`
/// (and the Responses API's `input_text`/`output_text` parts) are the same message. `None`
/// for anything else, which the canonical form keeps as it is.
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

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// A value written with its object keys sorted at every depth, the order ids have always been
/// made in (serde_json kept maps sorted before it was built with `preserve_order`).
struct Sorted<'a>(&'a Value);

impl Serialize for Sorted<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Object(m) => {
                let mut entries: Vec<(&String, &Value)> = m.iter().collect();
                entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(k, &Sorted(v))?;
                }
                map.end()
            }
            Value::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(&Sorted(item))?;
                }
                seq.end()
            }
            other => other.serialize(s),
        }
    }
}

impl Serialize for Part<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Part::Value(v) => Sorted(v).serialize(s),
            Part::Text(t) => s.serialize_str(t),
            Part::Calls(calls) => {
                let mut seq = s.serialize_seq(Some(calls.len()))?;
                for c in *calls {
                    seq.serialize_element(&call(c))?;
                }
                seq.end()
            }
            Part::Call { id, function } => {
                let mut map = s.serialize_map(None)?;
                if let Some(v) = function.and_then(|f| f.get("arguments")) {
                    map.serialize_entry("arguments", &Sorted(v))?;
                }
                if let Some(v) = id {
                    map.serialize_entry("id", &Sorted(v))?;
                }
                if let Some(v) = function.and_then(|f| f.get("name")) {
                    map.serialize_entry("name", &Sorted(v))?;
                }
                map.end()
            }
        }
    }
}

/// [`canonical`]`(message)` as it serialises, written straight from the message without
/// building the canonical value: the same bytes, without copying every string of a long
/// history on every turn just to hash it.
struct CanonicalForm<'a>(&'a Value);

impl Serialize for CanonicalForm<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Some(obj) = self.0.as_object() else {
            return Sorted(self.0).serialize(s);
        };
        let fields = fields(obj);
        let mut map = s.serialize_map(Some(fields.len()))?;
        for (key, part) in &fields {
            map.serialize_entry(key, part)?;
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
    fn ids_of_messages_calls_and_outputs_are_those_of_earlier_versions() {
        // Made by the version before keys were sorted by the canonical form itself.
        let pinned = [
            (
                json!({"role":"user","content":"hello"}),
                "9d8e0a0c4d473138b3fda90bf1d43e07accb1394ddd3b47b5b91e08ef11de44e",
            ),
            (
                json!({"role":"tool","tool_call_id":"c1","content":"{\"temp\": 21}"}),
                "472b3228816af29505da65d2a36d8a810e5e139cc10a4a4b6fa7c0f398b0642c",
            ),
            (
                json!({"type":"function_call","id":"fc_1","call_id":"c1","name":"get_weather",
                    "arguments":"{\"city\":\"Tokyo\"}","status":"completed"}),
                "5e0d3be5fac69693b23021f87ab6fc07f91e8c2f0aff65c5d3d2dc4a843ae7c7",
            ),
            (
                json!({"type":"function_call_output","call_id":"c1","output":"sunny"}),
                "1933fb4f27e7b35a1708ce691387ba810a59eb4b52af6383067ef91e9a134d2c",
            ),
            (
                json!({"type":"message","id":"msg_1","role":"assistant","status":"completed",
                    "refusal":null,
                    "content":[{"type":"output_text","text":"ok","annotations":[]}]}),
                "4ef59b3992418d49a1de082ae73c7d37f1dc542983b010b03c577b6c3680618c",
            ),
        ];
        for (m, id) in pinned {
            assert_eq!(message_id(None, &m).to_hex(), id, "{m}");
        }
    }

    #[test]
    fn key_order_does_not_change_an_id() {
        let a: Value = serde_json::from_str(
            r#"{"role":"user","content":[{"type":"image_url","image_url":{"url":"u","detail":"low"}}]}"#,
        )
        .unwrap();
        let b: Value = serde_json::from_str(
            r#"{"content":[{"image_url":{"detail":"low","url":"u"},"type":"image_url"}],"role":"user"}"#,
        )
        .unwrap();
        assert_eq!(message_id(None, &a), message_id(None, &b));
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
