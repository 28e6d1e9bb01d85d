//! Shape checks of the request fields the proxy reads but keeps as JSON (so that whatever else
//! they carry is forwarded as sent). SPEC 3: a field of the wrong type is a 400 naming it, found
//! before anything is stored or forwarded, rather than a request the provider refuses later
//! with the proxy having stored it.

use serde_json::{Map, Value};

use crate::conversation::{ChatRequest, ResponsesRequest};
use crate::error::{Error, Result};

/// A 400 naming `param`, worded like the body parser's own errors.
fn wrong(param: String, expected: &str, got: &Value) -> Error {
    let got = match got {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    Error::invalid(
        format!("Invalid value for '{param}': expected {expected}, got {got}"),
        Some(param),
    )
}

/// `tool_choice`: a mode name or an object naming a tool.
fn check_tool_choice(choice: Option<&Value>) -> Result<()> {
    match choice {
        None | Some(Value::Null | Value::String(_) | Value::Object(_)) => Ok(()),
        Some(v) => Err(wrong("tool_choice".into(), "a string or an object", v)),
    }
}

/// `metadata`: an object; its `session_id`, which the proxy reads, a string.
fn check_metadata(metadata: Option<&Value>) -> Result<()> {
    match metadata {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Object(m)) => match m.get("session_id") {
            None | Some(Value::Null | Value::String(_)) => Ok(()),
            Some(v) => Err(wrong("metadata.session_id".into(), "a string", v)),
        },
        Some(v) => Err(wrong("metadata".into(), "an object", v)),
    }
}

/// A chat request: every message's `content` is text, content parts or null.
pub fn check_chat(r: &ChatRequest) -> Result<()> {
    for (i, m) in r.messages.iter().enumerate() {
        match &m.content {
            None | Some(Value::Null | Value::String(_) | Value::Array(_)) => {}
            Some(v) => {
                return Err(wrong(
                    format!("messages[{i}].content"),
                    "a string, an array of content parts or null",
                    v,
                ));
            }
        }
    }
    check_tools(r.tools.as_deref())?;
    check_tool_choice(r.tool_choice.as_ref())?;
    check_metadata(r.metadata.as_ref())
}

/// A Responses request: `input` a string or items (objects; calls and their outputs with a
/// `call_id`, which links them), `instructions` text.
pub fn check_responses(r: &ResponsesRequest) -> Result<()> {
    match &r.input {
        // No input: only where the conversation is elsewhere (`responses.create(prompt=...)`).
        Value::Null if r.continues_elsewhere() => {}
        Value::Null => {
            return Err(Error::invalid(
                "Missing required parameter: 'input'.",
                Some("input".to_string()),
            ));
        }
        Value::String(_) => {}
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let Value::Object(fields) = item else {
                    return Err(wrong(format!("input[{i}]"), "an object", item));
                };
                check_call_id(i, fields)?;
                check_item_fields(i, fields)?;
            }
        }
        v => {
            return Err(wrong("input".into(), "a string or an array of items", v));
        }
    }
    match &r.instructions {
        None | Some(Value::Null | Value::String(_) | Value::Array(_)) => {}
        Some(v) => return Err(wrong("instructions".into(), "a string", v)),
    }
    check_tools(r.tools.as_deref())?;
    check_tool_choice(r.extra.get("tool_choice"))?;
    check_metadata(r.metadata.as_ref())
}

/// `tools`: each one an object (a tool names itself by its fields).
fn check_tools(tools: Option<&[Value]>) -> Result<()> {
    for (i, tool) in tools.unwrap_or_default().iter().enumerate() {
        if !tool.is_object() {
            return Err(wrong(format!("tools[{i}]"), "an object", tool));
        }
    }
    Ok(())
}

/// The fields of an input item that the proxy reads, as chat checks its messages': a message
/// item's `role` (required) and `content`, a call's `name` and `arguments` (or a custom call's
/// `input`), an output's `output`.
fn check_item_fields(i: usize, item: &Map<String, Value>) -> Result<()> {
    let field = |key: &str, expected: &str, ok: fn(&Value) -> bool| match item.get(key) {
        Some(v) if !ok(v) => Err(wrong(format!("input[{i}].{key}"), expected, v)),
        _ => Ok(()),
    };
    let text_or_parts = |v: &Value| v.is_string() || v.is_array();
    match item.get("type").and_then(Value::as_str) {
        // An item reference may leave out its `type`: `{"id": "msg_…"}`.
        None if item.get("role").is_none() && item.get("id").is_some_and(Value::is_string) => {
            Ok(())
        }
        None | Some("message") => {
            if item.get("role").is_none() {
                return Err(Error::invalid(
                    format!("Missing required parameter: 'input[{i}].role'"),
                    Some(format!("input[{i}].role")),
                ));
            }
            field("role", "a string", Value::is_string)?;
            field(
                "content",
                "a string or an array of content parts",
                text_or_parts,
            )
        }
        Some("function_call") => {
            field("name", "a string", Value::is_string)?;
            field("arguments", "a string", Value::is_string)
        }
        Some("custom_tool_call") => {
            field("name", "a string", Value::is_string)?;
            field("input", "a string", Value::is_string)
        }
        Some("function_call_output" | "custom_tool_call_output") => field(
            "output",
            "a string or an array of content parts",
            text_or_parts,
        ),
        Some(_) => Ok(()),
    }
}

/// A call or call-output item (`function_call[_output]`, `custom_tool_call[_output]`) names its
/// call by a string `call_id`.
fn check_call_id(i: usize, item: &Map<String, Value>) -> Result<()> {
    let kind = item.get("type").and_then(Value::as_str);
    if !matches!(
        kind,
        Some(
            "function_call"
                | "function_call_output"
                | "custom_tool_call"
                | "custom_tool_call_output"
        )
    ) {
        return Ok(());
    }
    match item.get("call_id") {
        Some(Value::String(_)) => Ok(()),
        Some(v) => Err(wrong(format!("input[{i}].call_id"), "a string", v)),
        None => Err(Error::invalid(
            format!("Missing required parameter: 'input[{i}].call_id'"),
            Some(format!("input[{i}].call_id")),
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn chat(body: Value) -> Result<()> {
        check_chat(&serde_json::from_value(body).unwrap())
    }

    fn responses(body: Value) -> Result<()> {
        check_responses(&serde_json::from_value(body).unwrap())
    }

    fn param(r: Result<()>) -> String {
        match r {
            Err(Error::InvalidRequest { param, .. }) => param.unwrap_or_default(),
            other => panic!("expected a 400, got {other:?}"),
        }
    }

    #[test]
    fn chat_fields_of_the_wrong_type_are_named() {
        let user = json!({"role": "user", "content": "hi"});
        assert_eq!(
            param(chat(
                json!({"model": "m", "messages": [user, {"role": "user", "content": 5}]})
            )),
            "messages[1].content"
        );
        assert_eq!(
            param(chat(
                json!({"model": "m", "messages": [user], "tool_choice": 5})
            )),
            "tool_choice"
        );
        assert_eq!(
            param(chat(
                json!({"model": "m", "messages": [user], "metadata": "x"})
            )),
            "metadata"
        );
        assert_eq!(
            param(chat(
                json!({"model": "m", "messages": [user], "metadata": {"session_id": 5}})
            )),
            "metadata.session_id"
        );
    }

    #[test]
    fn chat_fields_of_every_accepted_shape_pass() {
        let parts = json!([{"type": "text", "text": "hi"}]);
        chat(json!({
            "model": "m",
            "messages": [
                {"role": "user", "content": parts},
                {"role": "assistant", "content": null, "tool_calls": []},
                {"role": "user", "content": "hi"}
            ],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
            "metadata": {"session_id": "s", "other": "x"}
        }))
        .unwrap();
        chat(json!({"model": "m", "messages": [], "tool_choice": "auto", "metadata": null}))
            .unwrap();
    }

    #[test]
    fn responses_fields_of_the_wrong_type_are_named() {
        assert_eq!(
            param(responses(
                json!({"model": "m", "input": "x", "instructions": 5})
            )),
            "instructions"
        );
        assert_eq!(
            param(responses(json!({"model": "m", "input": [5]}))),
            "input[0]"
        );
        assert_eq!(param(responses(json!({"model": "m", "input": 5}))), "input");
        let call = json!({"type": "function_call", "name": "f", "arguments": "{}"});
        assert_eq!(
            param(responses(
                json!({"model": "m", "input": [{"role": "user", "content": "q"}, call]})
            )),
            "input[1].call_id"
        );
        let output = json!({"type": "function_call_output", "call_id": 7, "output": "x"});
        assert_eq!(
            param(responses(json!({"model": "m", "input": [output]}))),
            "input[0].call_id"
        );
        for (item, expected) in [
            (json!({"role": "user", "content": 5}), "input[0].content"),
            (json!({"type": "message", "content": "x"}), "input[0].role"),
            (json!({"role": 1, "content": "x"}), "input[0].role"),
            (
                json!({"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}),
                "input[0].arguments",
            ),
            (
                json!({"type": "function_call_output", "call_id": "c", "output": 5}),
                "input[0].output",
            ),
            (
                json!({"type": "custom_tool_call", "call_id": "c", "name": "p", "input": 5}),
                "input[0].input",
            ),
        ] {
            assert_eq!(
                param(responses(json!({"model": "m", "input": [item]}))),
                expected,
                "{item}"
            );
        }
        assert_eq!(
            param(responses(
                json!({"model": "m", "input": "x", "tools": ["a"]})
            )),
            "tools[0]"
        );
        // An item reference without its (optional) type is an item, not a message.
        for reference in [json!({"id": "msg_1"}), json!({"type": null, "id": "msg_1"})] {
            let input = json!([{"role": "user", "content": "q"}, reference]);
            assert!(responses(json!({"model": "m", "input": input})).is_ok());
        }
        let user = json!({"role": "user", "content": "q"});
        assert_eq!(
            param(chat(
                json!({"model": "m", "messages": [user], "tools": [{}, 5]})
            )),
            "tools[1]"
        );
        let custom = json!({"type": "custom_tool_call", "name": "p", "input": "x"});
        assert_eq!(
            param(responses(json!({"model": "m", "input": [custom]}))),
            "input[0].call_id"
        );
        let custom_output = json!({"type": "custom_tool_call_output", "call_id": 7, "output": "x"});
        assert_eq!(
            param(responses(json!({"model": "m", "input": [custom_output]}))),
            "input[0].call_id"
        );
        assert_eq!(
            param(responses(
                json!({"model": "m", "input": "x", "tool_choice": 1})
            )),
            "tool_choice"
        );
    }

    #[test]
    fn responses_fields_of_every_accepted_shape_pass() {
        responses(json!({
            "model": "m",
            "instructions": "be brief",
            "input": [
                {"role": "user", "content": "q"},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "42"}
            ],
            "tool_choice": "auto",
            "metadata": {"session_id": "s"}
        }))
        .unwrap();
    }
}
