//! Removing history tool calls, shared by tool access, tool filter and tool-call window (SPEC 5,
//! "Removing a tool call"): the result message goes; the call leaves its assistant message's
//! `tool_calls`; an assistant message left with no calls keeps its text and loses the
//! `tool_calls` key, or is dropped if it has no text. With placeholders, each removed call adds
//! `[tool call omitted: NAME]` to the content instead, so that message always stays.

use serde_json::{Value, json};

use crate::conversation::{Message, Role, ToolCall};

use super::report::RemoveReason;
use super::segments::{link_near, link_results};
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
    // Flat tables indexed by position (no hashing per message): `first_call[pos]` is where the
    // calls of the message at `pos` start in `gone`.
    let mut first_call = Vec::with_capacity(work.items.len() + 1);
    let mut gone = Vec::new();
    let mut losing = Vec::new(); // positions of the messages that lose a call
    for (pos, item) in work.items.iter().enumerate() {
        first_call.push(gone.len());
        if !(item.history && item.msg.role == Role::Assistant) {
            continue;
        }
        let mut any = false;
        for (i, call) in item.msg.tool_calls().iter().enumerate() {
            let doomed = doomed(pos, i, call);
            any |= doomed;
            gone.push(doomed);
        }
        if any {
            losing.push(pos);
        }
    }
    if losing.is_empty() {
        return;
    }
    // Only history assistant messages have entries in `gone`, so only they can lose calls.
    let is_gone = |pos: usize, i: usize| {
        let item = &work.items[pos];
        item.history && item.msg.role == Role::Assistant && gone[first_call[pos] + i]
    };
    let mut drop_pos = doomed_results(work, is_gone);
    let encoding = work.encoding;
    let mut placeholders = 0u64;
    for pos in losing {
        let item = &mut work.items[pos];
        let n_calls = item.msg.tool_calls().len();
        let doomed_here: Vec<usize> = (0..n_calls)
            .filter(|&i| gone[first_call[pos] + i])
            .collect();
        // A message that loses every call and has nothing else to say is dropped: decide that
        // before copying it, since on a long conversation most removed calls are of this kind.
        if !placeholder && doomed_here.len() == n_calls && !has_payload(&item.msg) {
            drop_pos[pos] = true;
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
                drop_pos[pos] = true;
                continue;
            }
        }
        item.tokens = crate::tokens::message_tokens(encoding, msg);
    }
    work.report.placeholders += placeholders;
    work.remove_where(reason, |pos, _| drop_pos[pos]);
}

/// Which positions hold a result of a call for which `is_gone(assistant position, call index)`.
fn doomed_results(work: &Work<'_>, is_gone: impl Fn(usize, usize) -> bool) -> Vec<bool> {
    let items = &work.items;
    let at = |p: usize| &*items[p].msg;
    let mut out = vec![false; items.len()];
    let mut last_caller = None;
    let mut full: Option<Vec<Option<(usize, usize)>>> = None;
    for (pos, item) in items.iter().enumerate() {
        let link = match &full {
            Some(links) => links[pos],
            None => match link_near(at, pos, last_caller) {
                Some(link) => link,
                None => full.insert(link_results(items.iter().map(|i| &*i.msg)))[pos],
            },
        };
        out[pos] = link.is_some_and(|(owner, i)| is_gone(owner, i));
        if item.msg.role == Role::Assistant && item.msg.has_tool_calls() {
            last_caller = Some(pos);
        }
    }
    out
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
