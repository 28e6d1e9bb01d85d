//! Message identity: a hash of the message's canonical form chained to its parent's id, so one
//! id names a whole prefix of a conversation. The canonical form keeps what a client resends
//! and what tells two replies apart (role, text, name, tool calls, tool_call_id, a refusal; a
//! Responses reasoning item's id, summary and encrypted content; an `item_reference`'s id; the
//! whole of an item type the proxy does not model, less its `status`) and drops what SDKs add
//! or omit at will (null fields, empty arrays, provider extras such as `annotations` or
//! `refusal: null`), so a reply stored from the upstream matches the same reply when the client
//! sends it back. Its object keys are sorted at every depth and tool-call arguments that are
//! JSON are compacted, so a client that resends a reply with its keys in another order, or its
//! arguments re-serialised (`json.dumps` writes `{"a": 1}` for `{"a":1}`), still matches.

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

/// The fields every message and modelled item is known by (ids of earlier versions hash
/// these), in sorted order. `function_call` and `refusal` came later; absent (or null), as
/// they are in every message that had an id before, they leave the id unchanged.
const MESSAGE_FIELDS: [&str; 11] = [
    "arguments",
    "call_id",
    "content",
    "function_call",
    "name",
    "output",
    "refusal",
    "role",
    "tool_call_id",
    "tool_calls",
    "type",
];

/// What a `reasoning` item is known by besides [`MESSAGE_FIELDS`]: without them every reasoning
/// item at one point of a conversation would look alike, and a regenerated turn's reasoning
/// (with its own encrypted content) would be taken for the first one's.
const REASONING_FIELDS: [&str; 3] = ["encrypted_content", "id", "summary"];

/// Item types the canonical form picks fields from; any other `type` is hashed whole.
const MODELLED_TYPES: [&str; 7] = [
    "message",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "reasoning",
    "item_reference",
];

/// What the canonical form writes for one field.
enum Part<'a> {
    /// The value, its object keys sorted at every depth (as ids were always made).
    Value(&'a Value),
    /// The value likewise, less its null object entries at every depth (SDKs write absent
    /// fields as null). Only for fields ids did not cover before: pruning inside the others
    /// would change ids already stored.
    Pruned(&'a Value),
    /// Text put in place of the value: content parts reduced to their text, or arguments
    /// normalised.
    Text(String),
    /// Chat tool calls, each as a [`Part::Call`].
    Calls(&'a [Value]),
    /// A tool call as its id (chat only), its function's name and its arguments, or for a
    /// custom tool call its `custom` object (name and input) as it is.
    Call {
        id: Option<&'a Value>,
        function: Option<&'a Value>,
        custom: Option<&'a Value>,
    },
}

/// The fields of the canonical form of `obj` in sorted key order, each with what is written
/// for it. [`canonical`] and [`CanonicalForm`] are both made from this, so they cannot differ.
fn fields(obj: &Map<String, Value>) -> Vec<(&str, Part<'_>)> {
    let present = |v: &&Value| !is_empty(v);
    let kind = obj.get("type").and_then(Value::as_str);
    if kind.is_some_and(|k| !k.is_empty() && !MODELLED_TYPES.contains(&k)) {
        // An item the proxy does not model (`web_search_call`, `mcp_call`, ...) carries its
        // content in fields of its own: all of them count, less its lifecycle `status`.
        let mut out: Vec<(&str, Part<'_>)> = obj
            .iter()
            .filter(|(k, v)| k.as_str() != "status" && present(v))
            .map(|(k, v)| match k.as_str() {
                "arguments" => (k.as_str(), arguments(v, Part::Pruned(v))),
                _ => (k.as_str(), Part::Pruned(v)),
            })
            .collect();
        out.sort_unstable_by(|a, b| a.0.cmp(b.0));
        return out;
    }
    // An item reference may leave out its `type` (`{"id": "msg_…"}`): it is known by its id,
    // as the typed one is, or every reference would be the same message.
    let untyped_reference = kind.is_none() && !obj.contains_key("role") && obj.contains_key("id");
    let extra: &[&str] = match kind {
        Some("reasoning") => &REASONING_FIELDS,
        Some("item_reference") => &["id"],
        None if untyped_reference => &["id"],
        // A custom tool's call is known as a function call is, its free-text `input` standing
        // for `arguments` (compared as written).
        Some("custom_tool_call") => &["input"],
        _ => &[],
    };
    // An assistant's `name` is the client's label, not the model's: frameworks add it to replies
    // they resend (LangGraph's named agents), which the proxy stored without one.
    let assistant = obj.get("role").and_then(Value::as_str) == Some("assistant");
    let mut out = Vec::with_capacity(obj.len().min(MESSAGE_FIELDS.len()) + extra.len());
    // The message's own few fields, each checked against the known ones: a lookup of each
    // known field would hash eleven keys per message.
    for (key, v) in obj {
        let Some(&key) = MESSAGE_FIELDS.iter().find(|f| **f == key.as_str()) else {
            continue;
        };
        if (assistant && key == "name") || !present(&v) {
            continue;
        }
        let part = match key {
            "arguments" => arguments(v, Part::Value(v)),
            // A parts array of text only is reduced to its text; anything else is written
            // as is (an image part is not copied to be hashed).
            "content" => parts_text(v).map_or(Part::Value(v), Part::Text),
            "function_call" => Part::Call {
                id: None,
                function: Some(v),
                custom: None,
            },
            "refusal" => Part::Pruned(v),
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
    for key in extra {
        if let Some(v) = obj.get(*key).filter(present) {
            out.push((key, Part::Pruned(v)));
        }
    }
    // Known fields in sorted order (MESSAGE_FIELDS is), the extra ones among them.
    out.sort_unstable_by(|a, b| a.0.cmp(b.0));
    out
}

/// Tool-call arguments that are JSON text, as compact JSON with sorted keys and whole numbers
/// written as integers: a client that re-serialises them (spaces, other key order, `\u`
/// escapes, JavaScript's `35` for `35.0`, `100` for `1e2`) sends the same call. Anything else
/// is written as `raw`.
fn arguments<'a>(v: &'a Value, raw: Part<'a>) -> Part<'a> {
    let Value::String(text) = v else {
        return raw;
    };
    match serde_json::from_str::<Value>(text) {
        Ok(mut parsed) => {
            whole_numbers_as_integers(&mut parsed);
            Part::Text(serde_json::to_string(&Sorted::new(&parsed, false)).unwrap_or_default())
        }
        Err(_) => raw,
    }
}

/// Floats with no fractional part, up to 2^53 (beyond it a float is not exact), as integers.
fn whole_numbers_as_integers(v: &mut Value) {
    const EXACT: f64 = 9_007_199_254_740_992.0;
    match v {
        Value::Number(n) => {
            if let Some(f) = as_float(n)
                && f.fract() == 0.0
                && f.abs() <= EXACT
            {
                *v = Value::from(f as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(whole_numbers_as_integers),
        Value::Object(map) => map.values_mut().for_each(whole_numbers_as_integers),
        _ => {}
    }
}

/// The canonical form of a wire message (chat message or Responses item) as JSON.
pub fn canonical(message: &Value) -> Value {
    let Some(obj) = message.as_object() else {
        return sorted(message, false);
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
            Part::Value(v) => sorted(v, false),
            Part::Pruned(v) => sorted(v, true),
            Part::Text(t) => Value::String(t.clone()),
            Part::Calls(calls) => Value::Array(calls.iter().map(|c| call(c).to_value()).collect()),
            Part::Call {
                id,
                function,
                custom,
            } => {
                let mut out = Map::new();
                let name = function.and_then(|f| f.get("name"));
                if let Some(v) = function.and_then(|f| f.get("arguments")) {
                    out.insert("arguments".into(), arguments(v, Part::Value(v)).to_value());
                }
                if let Some(v) = custom {
                    out.insert("custom".into(), sorted(v, true));
                }
                if let Some(v) = id {
                    out.insert("id".into(), sorted(v, false));
                }
                if let Some(v) = name {
                    out.insert("name".into(), sorted(v, false));
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
        custom: c.get("custom").filter(|v| !v.is_null()),
    }
}

/// `v` with its object keys in sorted order at every depth (and, with `prune`, no null object
/// entries), as a value: serialised, it is what [`Sorted`] writes.
fn sorted(v: &Value, prune: bool) -> Value {
    match v {
        Value::Object(m) => {
            let mut entries: Vec<(&String, &Value)> =
                m.iter().filter(|(_, v)| !(prune && v.is_null())).collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k.clone(), sorted(v, prune)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(|i| sorted(i, prune)).collect()),
        Value::Number(n) => as_float(n)
            .and_then(serde_json::Number::from_f64)
            .map_or_else(|| v.clone(), Value::Number),
        other => other.clone(),
    }
}

/// A number as ids have always hashed it: a fraction, an exponent or an integer beyond 64 bits
/// as the `f64` it is closest to (serde_json parsed numbers into `f64` before it was built with
/// `arbitrary_precision`, which now keeps them as written for the store and the upstream), so
/// `1.50` and `1.5` are one number and ids of stored messages do not change. `None` for 64-bit
/// integers, written as they are, and for numbers beyond `f64` (`1e400`), which older versions
/// refused and are hashed as written.
fn as_float(n: &serde_json::Number) -> Option<f64> {
    if n.is_u64() || n.is_i64() {
        // `-0` was parsed into the float `-0.0` (the sign kept), not into the integer 0.
        return (n.as_str() == "-0").then_some(-0.0);
    }
    // The nearest `f64`, exactly (`str::parse`), as Python and JavaScript read a number and
    // write it back: a client that re-serialises `-9.3245985289279929` sends
    // `-9.324598528927993`, the same double. (serde_json's own parser, without its
    // `float_roundtrip` feature, lands some 17-digit decimals one unit in the last place off,
    // which ids of earlier versions hashed: such a message stored by them takes one new branch
    // when resent, once.)
    n.as_str().parse::<f64>().ok().filter(|f| f.is_finite())
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
struct Sorted<'a> {
    value: &'a Value,
    /// Leave out null object entries, at every depth.
    prune: bool,
}

impl<'a> Sorted<'a> {
    fn new(value: &'a Value, prune: bool) -> Self {
        Sorted { value, prune }
    }
}

impl Serialize for Sorted<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.value {
            Value::Object(m) => {
                let mut entries: Vec<(&String, &Value)> = m
                    .iter()
                    .filter(|(_, v)| !(self.prune && v.is_null()))
                    .collect();
                entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(k, &Sorted::new(v, self.prune))?;
                }
                map.end()
            }
            Value::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(&Sorted::new(item, self.prune))?;
                }
                seq.end()
            }
            Value::Number(n) => match as_float(n) {
                Some(f) => s.serialize_f64(f),
                None => n.serialize(s),
            },
            other => other.serialize(s),
        }
    }
}

impl Serialize for Part<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Part::Value(v) => Sorted::new(v, false).serialize(s),
            Part::Pruned(v) => Sorted::new(v, true).serialize(s),
            Part::Text(t) => s.serialize_str(t),
            Part::Calls(calls) => {
                let mut seq = s.serialize_seq(Some(calls.len()))?;
                for c in *calls {
                    seq.serialize_element(&call(c))?;
                }
                seq.end()
            }
            Part::Call {
                id,
                function,
                custom,
            } => {
                let mut map = s.serialize_map(None)?;
                if let Some(v) = function.and_then(|f| f.get("arguments")) {
                    map.serialize_entry("arguments", &arguments(v, Part::Value(v)))?;
                }
                if let Some(v) = custom {
                    map.serialize_entry("custom", &Sorted::new(v, true))?;
                }
                if let Some(v) = id {
                    map.serialize_entry("id", &Sorted::new(v, false))?;
                }
                if let Some(v) = function.and_then(|f| f.get("name")) {
                    map.serialize_entry("name", &Sorted::new(v, false))?;
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
            return Sorted::new(self.0, false).serialize(s);
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
        // Made by the version before reasoning, refusals and unmodelled items counted and
        // before arguments were normalised (a field absent or null leaves an id as it was).
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
    fn reasoning_items_are_known_by_their_id_summary_and_encrypted_content() {
        let item = json!({"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"AAA"});
        let other_content =
            json!({"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"BBB"});
        assert_ne!(message_id(None, &item), message_id(None, &other_content));
        let other_id = json!({"type":"reasoning","id":"rs_2","summary":[]});
        let no_id = json!({"type":"reasoning","summary":[]});
        assert_ne!(message_id(None, &other_id), message_id(None, &no_id));
        let summary = |t: &str| {
            json!({"type":"reasoning","id":"rs_1",
            "summary":[{"type":"summary_text","text":t}]})
        };
        assert_ne!(
            message_id(None, &summary("a")),
            message_id(None, &summary("b"))
        );
        // As an SDK resends it: keys in its own order, absent fields as null, another status.
        let resent: Value = serde_json::from_str(
            r#"{"encrypted_content":"AAA","id":"rs_1","summary":[],"type":"reasoning",
                "content":null,"status":null}"#,
        )
        .unwrap();
        assert_eq!(message_id(None, &item), message_id(None, &resent));
    }

    #[test]
    fn refusals_tell_replies_apart() {
        let a = json!({"role":"assistant","content":null,"refusal":"I can't help with that."});
        let b = json!({"role":"assistant","content":null,"refusal":"No."});
        assert_ne!(message_id(None, &a), message_id(None, &b));
        let resent = json!({"role":"assistant","refusal":"No."});
        assert_eq!(message_id(None, &b), message_id(None, &resent));
    }

    #[test]
    fn item_references_are_known_by_their_id() {
        let a = json!({"type":"item_reference","id":"msg_1"});
        let b = json!({"type":"item_reference","id":"msg_2"});
        assert_ne!(message_id(None, &a), message_id(None, &b));
    }

    #[test]
    fn an_unmodelled_item_is_known_by_all_its_fields_but_status() {
        let search = |q: &str, status: &str| {
            json!({"type":"web_search_call","id":"ws_1",
            "status":status,"action":{"type":"search","query":q}})
        };
        assert_ne!(
            message_id(None, &search("rust", "completed")),
            message_id(None, &search("go", "completed"))
        );
        assert_eq!(
            message_id(None, &search("rust", "completed")),
            message_id(None, &search("rust", "in_progress"))
        );
        // Null fields an SDK writes for what was absent, at any depth.
        let resent = json!({"action":{"query":"rust","sources":null,"type":"search"},
            "id":"ws_1","type":"web_search_call"});
        assert_eq!(
            message_id(None, &search("rust", "completed")),
            message_id(None, &resent)
        );
    }

    #[test]
    fn custom_tool_calls_differ_by_their_input() {
        let call = |input: &str| {
            json!({"role":"assistant","content":null,"tool_calls":[
            {"id":"c1","type":"custom","custom":{"name":"shell","input":input}}]})
        };
        assert_ne!(message_id(None, &call("ls")), message_id(None, &call("rm")));
        assert_eq!(message_id(None, &call("ls")), message_id(None, &call("ls")));
    }

    #[test]
    fn untyped_item_references_differ_by_their_id() {
        let a = json!({"id": "msg_A"});
        let b = json!({"id": "msg_B"});
        assert_ne!(message_id(None, &a), message_id(None, &b));
        assert_eq!(
            message_id(None, &a),
            message_id(None, &json!({"id": "msg_A"}))
        );
    }

    /// A Responses custom tool call is known as a function call is: by its `call_id`, `name` and
    /// `input`, not by the item's `id` or `status` (an SDK may resend it without them).
    #[test]
    fn responses_custom_tool_calls_are_known_like_function_calls() {
        let call = |input: &str, id: Option<&str>| {
            let mut v =
                json!({"type":"custom_tool_call","call_id":"c1","name":"shell","input":input});
            if let Some(id) = id {
                v["id"] = json!(id);
                v["status"] = json!("completed");
            }
            v
        };
        let id = message_id(None, &call("ls", Some("ctc_1")));
        assert_eq!(id, message_id(None, &call("ls", None)));
        assert_ne!(id, message_id(None, &call("rm", Some("ctc_1"))));
        let output =
            |out: &str| json!({"type":"custom_tool_call_output","call_id":"c1","output":out});
        assert_ne!(
            message_id(None, &output("a")),
            message_id(None, &output("b"))
        );
        assert_ne!(
            message_id(None, &output("a")),
            message_id(
                None,
                &json!({"type":"function_call_output","call_id":"c1","output":"a"})
            )
        );
    }

    #[test]
    fn re_serialised_arguments_are_the_same_call() {
        let chat = |args: &str| {
            json!({"role":"assistant","content":null,"tool_calls":[
            {"id":"c1","type":"function","function":{"name":"f","arguments":args}}]})
        };
        let item = |args: &str| {
            json!({"type":"function_call","call_id":"c1","name":"f",
            "arguments":args})
        };
        for m in [chat, item] {
            let id = message_id(None, &m(r#"{"a":1,"b":"é"}"#));
            // json.dumps: spaces; ensure_ascii; another key order.
            assert_eq!(id, message_id(None, &m(r#"{"a": 1, "b": "é"}"#)));
            assert_eq!(id, message_id(None, &m(r#"{"b":"é","a":1}"#)));
            assert_ne!(id, message_id(None, &m(r#"{"a":2,"b":"é"}"#)));
            // Whole numbers as JavaScript writes them; a real fraction stays one.
            let floats = message_id(None, &m(r#"{"lat":35.0,"n":1e2}"#));
            assert_eq!(floats, message_id(None, &m(r#"{"lat":35,"n":100}"#)));
            assert_ne!(floats, message_id(None, &m(r#"{"lat":35.5,"n":100}"#)));
            // Arguments that are not JSON are compared as they are.
            assert_ne!(
                message_id(None, &m("{a: 1")),
                message_id(None, &m("{a:  1"))
            );
        }
    }

    /// Numbers are kept as written (`arbitrary_precision`), but ids hash them as the `f64` they
    /// were parsed into before, so ids of stored messages are unchanged and one number written
    /// two ways is one message, in a message's fields and in a call's arguments alike.
    #[test]
    fn numbers_are_hashed_as_before_whatever_their_spelling() {
        let parse = |s: &str| serde_json::from_str::<Value>(s).unwrap();
        // An item type the proxy does not model is known by all its fields.
        let plain =
            parse(r#"{"type":"future_item","x":1.5,"y":100.0,"z":1.2345678901234568e29,"n":7}"#);
        let spelled = parse(
            r#"{"type":"future_item","x":1.50,"y":1e2,"z":123456789012345678901234567890,"n":7}"#,
        );
        assert_eq!(message_id(None, &plain), message_id(None, &spelled));
        assert_eq!(canonical(&plain), canonical(&spelled));
        let other =
            parse(r#"{"type":"future_item","x":1.5,"y":100.0,"z":1.2345678901234568e29,"n":8}"#);
        assert_ne!(message_id(None, &plain), message_id(None, &other));
        let call =
            |args: &str| json!({"type":"function_call","call_id":"c1","name":"f","arguments":args});
        assert_eq!(
            message_id(
                None,
                &call(r#"{"lat":35.50,"big":123456789012345678901234567890}"#)
            ),
            message_id(None, &call(r#"{"lat":35.5,"big":1.2345678901234568e29}"#))
        );
        // A 17-digit decimal and the shortest form of the same double, as Python's json.dumps
        // writes it back, are one number.
        assert_eq!(
            message_id(None, &call(r#"{"v": -9.3245985289279929}"#)),
            message_id(None, &call(r#"{"v": -9.324598528927993}"#))
        );
        // `-0` was the float -0.0: a whole number in arguments (so `0`, as JavaScript and
        // Python write it back), and written `-0.0` elsewhere, as before.
        assert_eq!(
            message_id(None, &call(r#"{"a":-0}"#)),
            message_id(None, &call(r#"{"a":0}"#))
        );
        assert_eq!(
            serde_json::to_string(&canonical(&parse(r#"{"type":"future_item","x":-0}"#))).unwrap(),
            r#"{"type":"future_item","x":-0.0}"#
        );
    }

    /// A reply resent with the name a framework gave its agent (LangGraph's `name=`) is the
    /// reply the proxy stored; a user's `name` still counts.
    #[test]
    fn an_assistant_s_name_does_not_count() {
        let reply = json!({"role":"assistant","content":null,"refusal":null,"annotations":[],
            "tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]});
        let resent = json!({"role":"assistant","content":null,"name":"weather_agent",
            "tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]});
        assert_eq!(message_id(None, &reply), message_id(None, &resent));
        let user = |name: &str| json!({"role":"user","content":"hi","name":name});
        assert_ne!(message_id(None, &user("a")), message_id(None, &user("b")));
    }

    #[test]
    fn legacy_function_calls_tell_replies_apart() {
        let call = |args: &str| {
            json!({"role":"assistant","content":null,
            "function_call":{"name":"f","arguments":args}})
        };
        assert_ne!(
            message_id(None, &call("{\"a\":1}")),
            message_id(None, &call("{\"a\":2}"))
        );
        assert_eq!(
            message_id(None, &call("{\"a\":1}")),
            message_id(None, &call("{\"a\": 1}"))
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
