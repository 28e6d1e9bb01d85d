//! Removing history tool calls, shared by tool access, tool filter and tool-call window (SPEC 5,
//! "Removing a tool call"): the result message goes; the call leaves its assistant message's
//! `tool_calls`; an assistant message left with no calls keeps its text and loses the
//! `tool_calls` key, or is dropped if it has no text. With placeholders, each removed call adds
//! `[tool call omitted: NAME]` to the content instead, so that message always stays.

use serde_json::{Value, json};

use crate::conversation::{Message, Role, ToolCall};

use super::report::{Change, RemoveReason};
use super::segments::{link_near, link_results};
use super::work::{Work, record_calls, sent_tokens};

/// Removes the history calls for which `doomed(assistant position, call index, call)` is true,
/// with their results. Calls in the current turn are never offered. A result goes with its call
/// wherever it sits, also late in the current turn: left there it would be an orphan for repair,
/// which would drop it under a vaguer name, or hand it to an older call that shares its id.
pub(crate) fn remove_calls(
    work: &mut Work<'_>,
    reason: RemoveReason,
    placeholder: bool,
    mut doomed: impl FnMut(usize, usize, &ToolCall) -> bool,
) {
    let items = &work.items;
    let n = items.len();
    let at = |p: usize| &*items[p].msg;
    // One pass: a call is decided before any result of it is seen (results follow their call),
    // so a result is only linked once some call has gone. `gone_calls` holds the doomed call
    // indices of the messages in `losing`, flat (no allocation per message).
    let mut losing: Vec<Losing> = Vec::new();
    let mut gone_calls: Vec<usize> = Vec::new();
    let mut drop_pos: Vec<bool> = Vec::new();
    let mut last_caller = None;
    let mut full: Option<Vec<Option<(usize, usize)>>> = None;
    for (pos, item) in items.iter().enumerate() {
        match item.msg.role {
            Role::Assistant if item.msg.has_tool_calls() => {
                if item.history {
                    let start = gone_calls.len();
                    for (i, call) in item.msg.tool_calls().iter().enumerate() {
                        if doomed(pos, i, call) {
                            gone_calls.push(i);
                        }
                    }
                    if gone_calls.len() > start {
                        losing.push(Losing {
                            pos,
                            calls: start..gone_calls.len(),
                        });
                    }
                }
                last_caller = Some(pos);
            }
            Role::Tool if !losing.is_empty() => {
                let link = match &full {
                    Some(links) => links[pos],
                    None => match link_near(at, pos, last_caller) {
                        Some(link) => link,
                        None => full.insert(link_results(items.iter().map(|i| &*i.msg)))[pos],
                    },
                };
                if link.is_some_and(|(owner, i)| is_gone(&losing, &gone_calls, owner, i)) {
                    if drop_pos.is_empty() {
                        drop_pos = vec![false; n];
                    }
                    drop_pos[pos] = true;
                }
            }
            _ => {}
        }
    }
    if losing.is_empty() {
        return;
    }
    if drop_pos.is_empty() {
        drop_pos = vec![false; n];
    }
    let encoding = work.encoding;
    let apart = work.text_apart_from_calls;
    let given = work.given;
    let mut changes = Vec::new();
    let mut placeholders = 0u64;
    for Losing { pos, calls } in losing {
        let item = &mut work.items[pos];
        let doomed_here = &gone_calls[calls];
        // A message that loses every call and has nothing else to say is dropped: decide that
        // before copying it, since on a long conversation most removed calls are of this kind.
        if !placeholder
            && doomed_here.len() == item.msg.tool_calls().len()
            && !has_payload(&item.msg)
        {
            drop_pos[pos] = true;
            continue;
        }
        // The message stays (or goes for another reason below): name the calls it loses.
        let gone = Change::Removed(reason);
        record_calls(given, item, doomed_here.iter().copied(), gone, &mut changes);
        let msg = item.msg.to_mut();
        let names = take_calls(msg, doomed_here);
        if placeholder {
            item.placeholders += names.len() as u32;
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
        item.tokens = sent_tokens(encoding, apart, msg);
    }
    work.report.placeholders += placeholders;
    work.calls.extend(changes);
    work.remove_marked(reason, &drop_pos);
}

/// A history assistant message that loses calls: its position, and where its doomed call
/// indices are in the flat list.
struct Losing {
    pos: usize,
    calls: std::ops::Range<usize>,
}

/// Whether call `i` of the message at `owner` is doomed. The owner is nearly always the last
/// losing message (results sit right after their call); otherwise a binary search finds it.
fn is_gone(losing: &[Losing], gone_calls: &[usize], owner: usize, i: usize) -> bool {
    let entry = match losing.last() {
        Some(last) if last.pos == owner => Some(last),
        _ => losing
            .binary_search_by_key(&owner, |l| l.pos)
            .ok()
            .map(|k| &losing[k]),
    };
    entry.is_some_and(|l| gone_calls[l.calls.clone()].contains(&i))
}

/// Takes the calls at `indices` (ascending) out of `msg`, returning their function names.
fn take_calls(msg: &mut Message, indices: &[usize]) -> Vec<String> {
    let mut names = Vec::new();
    if let Some(calls) = msg.tool_calls_mut() {
        for &i in indices.iter().rev() {
            if i < calls.len() {
                names.push(calls.remove(i).name().to_string());
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
            let after_text = parts.iter().any(|p| {
                p.get("type").and_then(Value::as_str) != Some("refusal")
                    && part_text(p).is_some_and(|t| !t.is_empty())
            });
            let line = if after_text {
                format!("\n{text}")
            } else {
                text.to_string()
            };
            parts.push(json!({"type": "text", "text": line}));
        }
        _ => msg.content = Some(Value::String(text.to_string())),
    }
}

/// Whether an assistant message says anything without tool calls: text, a refusal, audio or a
/// legacy `function_call`. Such a message is valid on its own.
pub(crate) fn has_payload(msg: &Message) -> bool {
    says_something(msg.content.as_ref())
        || ["refusal", "audio", "function_call"]
            .iter()
            .any(|k| msg.extra.get(*k).is_some_and(|v| !v.is_null()))
}

/// Whether content says anything: a non-empty string, or a part other than an empty text (or
/// refusal) part. `[{"type": "text", "text": ""}]` has no text, as `""` has none.
fn says_something(content: Option<&Value>) -> bool {
    match content {
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(parts)) => parts
            .iter()
            .any(|p| part_text(p).is_none_or(|t| !t.is_empty())),
        Some(Value::Null) | None => false,
        Some(_) => true,
    }
}

/// The text of a text or refusal content part; `None` for other parts (images, audio, …).
fn part_text(part: &Value) -> Option<&str> {
    let key = match part.get("type").and_then(Value::as_str)? {
        "text" | "output_text" | "input_text" => "text",
        "refusal" => "refusal",
        _ => return None,
    };
    part.get(key).and_then(Value::as_str)
}
