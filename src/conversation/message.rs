//! One chat message with the fields the pipeline reads typed and everything else kept as JSON.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// How the role of a Responses item the proxy does not model begins (see [`Role::is_item`]).
pub const ITEM_ROLE_PREFIX: &str = "item:";

/// A message role. Unknown roles are kept verbatim so the proxy never rejects what the
/// provider might accept.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
    Function,
    Other(String),
}

impl Role {
    pub fn as_str(&self) -> &str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
            Role::Function => "function",
            Role::Other(s) => s,
        }
    }

    /// System and developer messages carry instructions and are always kept.
    pub fn is_instruction(&self) -> bool {
        matches!(self, Role::System | Role::Developer)
    }

    /// The role the Responses mapping gives an item it does not model (`item:<type>`, see
    /// `responses_items`): a label of the proxy's, never sent as a role.
    pub fn is_item(&self) -> bool {
        matches!(self, Role::Other(s) if s.starts_with(ITEM_ROLE_PREFIX))
    }
}

impl From<&str> for Role {
    fn from(s: &str) -> Self {
        match s {
            "system" => Role::System,
            "developer" => Role::Developer,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            "function" => Role::Function,
            other => Role::Other(other.to_string()),
        }
    }
}

impl Serialize for Role {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Role {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(Role::from(s.as_str()))
    }
}

/// Deserialises a present field (even `null`) as `Some`, so that `"content": null` and an
/// absent `content` stay distinct and are re-emitted as received.
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// A chat message. `content` is `None` when absent and `Some(Value::Null)` when sent as null.
/// A `name` or `tool_call_id` sent as null is kept in `extra` (the typed fields hold strings
/// only), so the message is stored and forwarded as received. Read through [`WireMessage`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "WireMessage")]
pub struct Message {
    pub role: Role,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `None` when absent; `Some(None)` when sent as `null`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Option<Vec<ToolCall>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A chat message as read off the wire, before the nulls of `name` and `tool_call_id` move
/// into `extra`.
#[derive(Deserialize)]
struct WireMessage {
    role: Role,
    #[serde(default, deserialize_with = "present")]
    content: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    name: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    tool_calls: Option<Option<Vec<ToolCall>>>,
    #[serde(default, deserialize_with = "present")]
    tool_call_id: Option<Option<String>>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

impl From<WireMessage> for Message {
    fn from(wire: WireMessage) -> Message {
        let mut extra = wire.extra;
        let mut keep_null = |key: &str, field: Option<Option<String>>| match field {
            Some(None) => {
                extra.insert(key.to_string(), Value::Null);
                None
            }
            other => other.flatten(),
        };
        let name = keep_null("name", wire.name);
        let tool_call_id = keep_null("tool_call_id", wire.tool_call_id);
        Message {
            role: wire.role,
            content: wire.content,
            name,
            tool_calls: wire.tool_calls,
            tool_call_id,
            extra,
        }
    }
}

/// One tool call of an assistant message: a function call (`function`: name and JSON
/// arguments) or a custom tool call (`"type": "custom"`, `custom`: name and free-text input).
/// Each part is kept only if it was sent, so a custom call is never re-emitted with an empty
/// `function` beside its `custom`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    #[serde(default)]
    pub id: String,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<FunctionCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom: Option<CustomCall>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ToolCall {
    /// A function call.
    pub fn function(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> Self {
        ToolCall {
            id: id.into(),
            kind: Some("function".into()),
            function: Some(FunctionCall {
                name: name.into(),
                arguments: arguments.into(),
                extra: Map::new(),
            }),
            custom: None,
            extra: Map::new(),
        }
    }

    /// A custom tool call: free-text `input` to the custom tool `name`.
    pub fn custom(
        id: impl Into<String>,
        name: impl Into<String>,
        input: impl Into<String>,
    ) -> Self {
        ToolCall {
            id: id.into(),
            kind: Some("custom".into()),
            function: None,
            custom: Some(CustomCall {
                name: name.into(),
                input: input.into(),
                extra: Map::new(),
            }),
            extra: Map::new(),
        }
    }

    /// The name of the tool called: `function.name`, or `custom.name` for a custom tool call;
    /// empty when the call names none.
    pub fn name(&self) -> &str {
        match (&self.function, &self.custom) {
            (Some(f), _) => &f.name,
            (None, Some(c)) => &c.name,
            (None, None) => "",
        }
    }

    /// What the call passes to the tool: `function.arguments` (JSON text), or a custom tool
    /// call's `custom.input`.
    pub fn arguments(&self) -> &str {
        match (&self.function, &self.custom) {
            (Some(f), _) => &f.arguments,
            (None, Some(c)) => &c.input,
            (None, None) => "",
        }
    }
}

/// The function named by a tool call and its JSON-encoded arguments.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub arguments: String,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The custom tool named by a custom tool call and its free-text input.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CustomCall {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub input: String,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Message {
    /// A user message with nothing in it: what a message moved out of a list leaves behind
    /// (no allocation).
    #[inline]
    pub fn empty() -> Self {
        Message {
            role: Role::User,
            content: None,
            name: None,
            tool_calls: None,
            tool_call_id: None,
            extra: Map::new(),
        }
    }

    /// A message with just a role and a string content.
    pub fn text(role: Role, text: impl Into<String>) -> Self {
        Message {
            role,
            content: Some(Value::String(text.into())),
            name: None,
            tool_calls: None,
            tool_call_id: None,
            extra: Map::new(),
        }
    }

    /// The tool calls of this message; empty when it has none.
    pub fn tool_calls(&self) -> &[ToolCall] {
        match &self.tool_calls {
            Some(Some(calls)) => calls,
            _ => &[],
        }
    }

    /// Mutable access to the tool calls, if the message has a `tool_calls` array.
    pub fn tool_calls_mut(&mut self) -> Option<&mut Vec<ToolCall>> {
        match &mut self.tool_calls {
            Some(Some(calls)) => Some(calls),
            _ => None,
        }
    }

    /// True for an assistant message that calls at least one tool.
    pub fn has_tool_calls(&self) -> bool {
        !self.tool_calls().is_empty()
    }

    /// The text of `content`: the string itself, or the `text` of every text part joined.
    pub fn text_content(&self) -> String {
        match &self.content {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(""),
            _ => String::new(),
        }
    }

    /// True when the message carries text (a non-empty string or any content part).
    pub fn has_content(&self) -> bool {
        match &self.content {
            Some(Value::String(s)) => !s.is_empty(),
            Some(Value::Array(parts)) => !parts.is_empty(),
            Some(Value::Null) | None => false,
            Some(_) => true,
        }
    }
}

impl Message {
    /// Reads a message from a JSON value without consuming it.
    pub fn deserialize_value(v: &Value) -> Result<Message, serde_json::Error> {
        Message::deserialize(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nulls_and_absences_are_re_emitted_as_received() {
        for wire in [
            json!({"role": "user", "content": "hi", "name": null}),
            json!({"role": "tool", "content": "42", "tool_call_id": null}),
            json!({"role": "assistant", "content": null, "tool_calls": null, "name": "bot"}),
            json!({"role": "user", "content": "hi", "x_extra": {"a": [1, null]}}),
        ] {
            let m = Message::deserialize_value(&wire).unwrap();
            assert_eq!(serde_json::to_value(&m).unwrap(), wire);
        }
        let m = Message::deserialize_value(&json!({"role": "user", "name": null})).unwrap();
        assert_eq!(m.name, None, "the typed field holds strings only");
    }

    #[test]
    fn a_custom_tool_call_is_named_by_custom_and_re_emitted_as_received() {
        let wire = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "custom", "custom": {"name": "run_sql", "input": "SELECT 1"}},
            {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ]});
        let m = Message::deserialize_value(&wire).unwrap();
        assert_eq!(serde_json::to_value(&m).unwrap(), wire);
        let calls = m.tool_calls();
        assert_eq!(
            (calls[0].name(), calls[0].arguments()),
            ("run_sql", "SELECT 1")
        );
        assert_eq!((calls[1].name(), calls[1].arguments()), ("f", "{}"));
    }

    #[test]
    fn a_wrong_type_is_still_an_error() {
        assert!(Message::deserialize_value(&json!({"role": "user", "name": 5})).is_err());
        assert!(Message::deserialize_value(&json!({"role": "tool", "tool_call_id": []})).is_err());
    }
}
