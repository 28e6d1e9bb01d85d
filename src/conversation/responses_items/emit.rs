//! Messages back to Responses input items. A message the pipeline left alone is its original
//! items, verbatim. A call turn that lost calls keeps only the kept calls' original items, each
//! with the reasoning that led it. Reasoning leads the calls after it up to the next reasoning
//! (parallel calls share one): it stays while one of them is sent, since the provider wants a
//! sent call's reasoning before it, and goes with them when none is (SPEC 7: dropped with its
//! call; the provider refuses reasoning without the item it led). A compressed result is its original item with
//! `output` replaced. Messages the pipeline made (repair's `[no result recorded]`, a summary)
//! are written fresh; a result made for a custom tool's call is a `custom_tool_call_output`, as
//! the provider wants it.

use std::collections::HashSet;

use serde_json::{Map, Value, json};

use super::{CALL_ITEM_KEY, INSTRUCTIONS_KEY, Kind, ORIGINAL_KEY, kind};
use crate::conversation::{Message, Role};

/// The items to send for the (rewritten) `messages`; the instructions message is left out.
pub fn to_items<'m>(messages: impl IntoIterator<Item = &'m Message>) -> Vec<Value> {
    let messages = messages.into_iter();
    let mut out = Vec::with_capacity(messages.size_hint().0);
    // The call ids of custom tools' calls, for the results made for them.
    let mut custom_calls: HashSet<&str> = HashSet::new();
    for m in messages {
        if m.extra.contains_key(INSTRUCTIONS_KEY) {
            continue;
        }
        for call in m.tool_calls().iter().filter(|c| c.custom.is_some()) {
            custom_calls.insert(&call.id);
        }
        match m.extra.get(ORIGINAL_KEY).and_then(Value::as_array) {
            Some(items) if !items.is_empty() => from_originals(m, items, &mut out),
            _ => fresh(m, &custom_calls, &mut out),
        }
    }
    out
}

fn from_originals(m: &Message, items: &[Value], out: &mut Vec<Value>) {
    if items.iter().any(|it| kind(it) == Kind::Call) {
        return call_turn(m, items, out);
    }
    let (main, leads) = match items.split_last() {
        Some(split) => split,
        None => return,
    };
    out.extend(leads.iter().cloned());
    // An opaque message (an item the pipeline does not model, or an output it could not pair;
    // see `kinds_in_place`) is never changed: its content is only what it costs.
    if matches!(m.role, Role::Other(_)) {
        out.push(main.clone());
        return;
    }
    let field = match kind(main) {
        Kind::Output => "output",
        Kind::Message => "content",
        _ => {
            out.push(main.clone());
            return;
        }
    };
    if m.content.as_ref() == main.get(field) {
        out.push(main.clone());
    } else {
        let mut changed = main.clone();
        if let Value::Object(obj) = &mut changed {
            obj.insert(field.into(), m.content.clone().unwrap_or(Value::Null));
        }
        out.push(changed);
    }
}

/// A call turn: text a step added (placeholder lines) first, as an assistant message item of its
/// own (which the pipeline counts as such: `PipelineInput::text_apart_from_calls`), then each
/// kept call's original item with the reasoning items that led it or a dropped call of its
/// group before it.
fn call_turn(m: &Message, items: &[Value], out: &mut Vec<Value>) {
    if m.has_content() {
        out.push(json!({"type": "message", "role": "assistant", "content": m.content}));
    }
    // By position, not by `call_id`: ids may repeat within a turn.
    let kept: HashSet<u64> = m
        .tool_calls()
        .iter()
        .filter_map(|c| c.extra.get(CALL_ITEM_KEY).and_then(Value::as_u64))
        .collect();
    let mut pending: Vec<&Value> = Vec::new();
    let mut after_call = false;
    for (k, item) in items.iter().enumerate() {
        if kind(item) != Kind::Call {
            // Reasoning after a call leads the calls after it: what led the calls before it, if
            // none of them is sent, goes with them.
            if after_call {
                pending.clear();
            }
            after_call = false;
            pending.push(item);
        } else if kept.contains(&(k as u64)) {
            after_call = true;
            out.extend(pending.drain(..).cloned());
            out.push(item.clone());
        } else {
            after_call = true;
        }
    }
}

/// An item for a message that has no original: one the pipeline made.
fn fresh(m: &Message, custom_calls: &HashSet<&str>, out: &mut Vec<Value>) {
    match m.role {
        Role::Tool => {
            let call_id = m.tool_call_id.clone().unwrap_or_default();
            let kind = if custom_calls.contains(call_id.as_str()) {
                "custom_tool_call_output"
            } else {
                "function_call_output"
            };
            out.push(json!({
                "type": kind,
                "call_id": call_id,
                "output": m.content.clone().unwrap_or(Value::String(String::new())),
            }))
        }
        _ => {
            if m.has_content() || !m.has_tool_calls() {
                let mut item = Map::new();
                item.insert("role".into(), Value::String(m.role.as_str().to_string()));
                item.insert(
                    "content".into(),
                    m.content.clone().unwrap_or(Value::String(String::new())),
                );
                out.push(Value::Object(item));
            }
            for c in m.tool_calls() {
                out.push(match c.custom {
                    Some(_) => json!({
                        "type": "custom_tool_call",
                        "call_id": c.id,
                        "name": c.name(),
                        "input": c.arguments(),
                    }),
                    None => json!({
                        "type": "function_call",
                        "call_id": c.id,
                        "name": c.name(),
                        "arguments": c.arguments(),
                    }),
                });
            }
        }
    }
}
