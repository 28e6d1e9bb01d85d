//! Removing history tool calls, shared by tool access, tool filter and tool-call window (SPEC 5,
//! "Removing a tool call"): the result message goes; the call leaves its assistant message's
//! `tool_calls`; an assistant message left with no calls keeps its text and loses the
//! `tool_calls` key, or is dropped if it has no text. With placeholders, each removed call adds
//! `[tool call omitted: NAME]` to the content instead, so that message always stays.

use std::collections::HashSet;

use serde_json::{Value, json};

use crate::conversation::{Message, Role, ToolCall};

use super::report::{RemoveReason, Removed};
use super::segments::link_results;
use super::work::Work;

/// Removes the history calls for which `doomed(assistant position, call index, call)` is true,
/// with their results. Calls in the current turn are never offered. (A result of a history call
/// counts as history wherever it sits; see `work::Item::history`.)
pub(crate) fn remove_calls(
    work: &mut Work<'_>,
    reason: RemoveReason,
    placeholder: bool,
    mut doomed: impl FnMut(usize, usize, &ToolCall) -> bool,
) {
    let mut gone: HashSet<(usize, usize)> = HashSet::new();
    for (pos, item) in work.items.iter().enumerate() {
        if item.history && item.msg.role == Role::Assistant {
            for (i, call) in item.msg.tool_calls().iter().enumerate() {
                if doomed(pos, i, call) {
                    gone.insert((pos, i));
                }
            }
        }
    }
    if gone.is_empty() {
        return;
    }
    let links = link_results(work.items.iter().map(|i| &*i.msg));

    let mut drop_pos: HashSet<usize> = HashSet::new();
    for (pos, link) in links.iter().enumerate() {
        if link.is_some_and(|call| gone.contains(&call)) {
            drop_pos.insert(pos);
        }
    }
    let encoding = work.encoding;
    let mut placeholders = 0u64;
    for pos in 0..work.items.len() {
        let doomed_here: Vec<usize> = (0..work.items[pos].msg.tool_calls().len())
            .filter(|i| gone.contains(&(pos, *i)))
            .collect();
        if doomed_here.is_empty() {
            continue;
        }
        let item = &mut work.items[pos];
        // A message that loses every call and has nothing else to say is dropped: decide that
        // before copying it, since on a long conversation most removed calls are of this kind.
        if !placeholder
            && doomed_here.len() == item.msg.tool_calls().len()
            && !has_payload(&item.msg)
        {
            drop_pos.insert(pos);
            continue;
        }
        let msg = item.msg.to_mut();
        let names = take_calls(msg, &doomed_here);
        if placeholder {
            placeholders += names.len() as u64;
            let lines: Vec<String> = names
                .iter()
                .map(|n| format!("[tool call omitted: {n}]"))
                .collect();
            append_text(msg, &lines.join("\n"));
        }
        if !msg.has_tool_calls() {
            msg.tool_calls = None;
            if !has_payload(msg) {
                drop_pos.insert(pos);
                continue;
            }
        }
        item.tokens = crate::tokens::message_tokens(encoding, msg);
    }
    work.report.placeholders += placeholders;
    let items = std::mem::take(&mut work.items);
    for (pos, item) in items.into_iter().enumerate() {
        if drop_pos.contains(&pos) {
            if let Some(index) = item.index {
                work.report.removed.push(Removed {
                    index,
                    role: item.msg.role.clone(),
                    reason,
                });
            }
        } else {
            work.items.push(item);
        }
    }
}

/// Takes the calls at `indices` (ascending) out of `msg`, returning their function names.
fn take_calls(msg: &mut Message, indices: &[usize]) -> Vec<String> {
    let mut names = Vec::new();
    if let Some(calls) = msg.tool_calls_mut() {
        for &i in indices.iter().rev() {
            if i < calls.len() {
                names.push(calls.remove(i).function.name);
            }
        }
    }
    names.reverse();
    names
}

/// Appends a line of text after any existing text (joined by `\n`).
pub(crate) fn append_text(msg: &mut Message, text: &str) {
    match &mut msg.content {
        Some(Value::String(s)) if !s.is_empty() => {
            s.push('\n');
            s.push_str(text);
        }
        Some(Value::Array(parts)) if !parts.is_empty() => {
            parts.push(json!({"type": "text", "text": format!("\n{text}")}));
        }
        _ => msg.content = Some(Value::String(text.to_string())),
    }
}

/// Whether an assistant message says anything without tool calls: text, a refusal, audio or a
/// legacy `function_call`. Such a message is valid on its own.
pub(crate) fn has_payload(msg: &Message) -> bool {
    msg.has_content()
        || ["refusal", "audio", "function_call"]
            .iter()
            .any(|k| msg.extra.get(*k).is_some_and(|v| !v.is_null()))
}
