//! Step 7, `repair`: always on, runs last, on the whole conversation. Afterwards every `tool`
//! message answers a call of the nearest preceding assistant message with tool calls, with no
//! other role between them; every call id is answered exactly once; no assistant message is
//! left with neither content nor tool calls. Orphan results are dropped, late results moved back
//! to their call, duplicate ids keep the first, unanswered calls are dropped or answered with
//! `[no result recorded]`. A Responses reasoning item that leads no item of its reply (see
//! `responses_items`) is dropped as an empty assistant message. An assistant message's empty
//! `tool_calls` array (older clients send `[]`), which OpenAI refuses, loses the key; that
//! message is then judged by its content alone.
//!
//! Results stay in the order they came in: those already right after their call first, then the
//! moved ones, then made-up ones, so a conversation that is already valid comes out unchanged.

use std::collections::HashSet;

use super::budget::no_result_message;
use super::policy::{Repair, UnansweredCalls};
use super::removal::has_payload;
use super::report::{Change, RepairKind, Repaired};
use super::segments::link_results;
use super::work::{Item, Msg, Work, record_calls};
use crate::conversation::responses_items::is_lone_reasoning;
use crate::conversation::{Message, Role};

pub(crate) fn apply(work: &mut Work<'_>, policy: &Repair) {
    // The usual case: nothing to repair, and no need to link every result to its call.
    if already_valid(&work.items) {
        return;
    }
    let items = std::mem::take(&mut work.items);
    let links = link_results(items.iter().map(|i| &*i.msg));
    let n = items.len();
    let original: Vec<Option<usize>> = items.iter().map(|i| i.index).collect();
    // The tool block after a call: its results, and lone reasoning among them, which goes (so
    // a result after one is in place, not moved).
    let in_block: Vec<bool> = items
        .iter()
        .map(|i| i.msg.role == Role::Tool || is_lone_reasoning(&i.msg))
        .collect();

    // Which position answers each call, first come first served; later ones are duplicates.
    let mut answer: Vec<Vec<Option<usize>>> = items
        .iter()
        .map(|i| vec![None; i.msg.tool_calls().len()])
        .collect();
    let mut repaired: Vec<(usize, RepairKind)> = Vec::new();
    let mut placeholders = 0u64;
    for (pos, link) in links.iter().enumerate() {
        if items[pos].msg.role != Role::Tool {
            continue;
        }
        match *link {
            None => {
                repaired.push((pos, RepairKind::OrphanResult));
            }
            Some((owner, call)) => match answer[owner][call] {
                Some(_) => {
                    repaired.push((pos, RepairKind::DuplicateId));
                }
                None => answer[owner][call] = Some(pos),
            },
        }
    }

    let mut out: Vec<Item<'_>> = Vec::with_capacity(n);
    let mut changes = Vec::new();
    let mut items: Vec<Option<Item<'_>>> = items.into_iter().map(Some).collect();
    for pos in 0..n {
        let Some(mut item) = items[pos].take() else {
            continue; // already emitted as a moved result
        };
        match item.msg.role {
            Role::Tool => {
                // A result is taken by its call, which comes first (an answered call is always
                // kept); what reaches here is an orphan or a duplicate, reported above.
                drop(item);
            }
            Role::Assistant if item.msg.has_tool_calls() => {
                let calls = item.msg.tool_calls();
                let mut seen: HashSet<&str> = HashSet::new();
                let mut keep = vec![true; calls.len()];
                let mut missing: Vec<String> = Vec::new();
                for (i, call) in calls.iter().enumerate() {
                    let kind = if !seen.insert(call.id.as_str()) {
                        keep[i] = false;
                        RepairKind::DuplicateId
                    } else if answer[pos][i].is_none() {
                        match policy.unanswered_calls {
                            UnansweredCalls::Drop => keep[i] = false,
                            UnansweredCalls::Placeholder => missing.push(call.id.clone()),
                        }
                        RepairKind::UnansweredCall
                    } else {
                        continue;
                    };
                    repaired.push((pos, kind));
                    let dropped = !keep[i];
                    let change = Change::Repaired { kind, dropped };
                    record_calls(work.given, &item, [i], change, &mut changes);
                }
                if keep.iter().any(|k| !k) {
                    let msg = item.msg.to_mut();
                    if let Some(calls) = msg.tool_calls_mut() {
                        let mut i = 0;
                        calls.retain(|_| {
                            i += 1;
                            keep[i - 1]
                        });
                    }
                    if !msg.has_tool_calls() {
                        msg.tool_calls = None;
                    }
                    item.tokens = work.count(msg);
                }
                if !item.msg.has_tool_calls() && !has_payload(&item.msg) {
                    repaired.push((pos, RepairKind::EmptyAssistant));
                    continue;
                }
                let history = item.history;
                out.push(item);
                // Results already in place (the tool block right after the call), then moved ones.
                let mut results: Vec<usize> = answer[pos].iter().flatten().copied().collect();
                results.sort_unstable();
                let block_end = (pos + 1..n).find(|&p| !in_block[p]).unwrap_or(n);
                let (in_place, moved): (Vec<usize>, Vec<usize>) =
                    results.into_iter().partition(|&r| r < block_end);
                for r in in_place.into_iter().chain(moved.iter().copied()) {
                    if let Some(res) = items[r].take() {
                        out.push(res);
                    }
                }
                for r in moved {
                    repaired.push((r, RepairKind::MovedResult));
                }
                for id in missing {
                    let msg = no_result_message(&id);
                    let tokens = work.count(&msg);
                    placeholders += 1;
                    out.push(Item {
                        msg: Msg::owned(msg),
                        index: None,
                        tokens,
                        history,
                        placeholders: 1,
                    });
                }
            }
            Role::Assistant if !has_payload(&item.msg) => {
                repaired.push((pos, RepairKind::EmptyAssistant));
            }
            // An assistant turn that is nothing but reasoning, as empty as one with neither
            // content nor calls; the provider refuses it.
            _ if is_lone_reasoning(&item.msg) => {
                repaired.push((pos, RepairKind::EmptyAssistant));
            }
            Role::Assistant if has_empty_calls(&item.msg) => {
                // Not reported: no call and no message goes, only a key OpenAI refuses (an
                // empty list costs no tokens either).
                item.msg.to_mut().tool_calls = None;
                out.push(item);
            }
            _ => out.push(item),
        }
    }

    work.report.placeholders += placeholders;
    work.calls.extend(changes);
    work.items = out;
    // Positions above are into the working copy; the report speaks in original indices.
    work.report.repaired.extend(
        repaired
            .into_iter()
            .filter_map(|(pos, kind)| original[pos].map(|index| Repaired { index, kind })),
    );
}

/// Most parallel calls checked pairwise by [`already_valid`]; a larger message takes the general
/// path (the pairwise check is quadratic).
const PAIRWISE_CALLS: usize = 16;

/// Whether repair would leave `items` as they are: every tool message is in the block right
/// after an assistant message with tool calls, and each block answers exactly that message's
/// calls (distinct ids, one result each, in any order); every assistant message has calls or a
/// payload, and none has an empty `tool_calls` array. Then every result links to its own
/// block's call (that message is the nearest with tool calls before it), so repair finds no
/// orphan, duplicate, moved result or unanswered call.
fn already_valid(items: &[Item<'_>]) -> bool {
    let mut pos = 0;
    while pos < items.len() {
        let msg = &items[pos].msg;
        pos += 1;
        match msg.role {
            Role::Tool => return false, // not in a block: orphan, duplicate or moved
            Role::Assistant if msg.has_tool_calls() => {
                let calls = msg.tool_calls();
                let block = items[pos..]
                    .iter()
                    .take_while(|i| i.msg.role == Role::Tool)
                    .count();
                if block != calls.len() || calls.len() > PAIRWISE_CALLS {
                    return false;
                }
                let mut answered = [false; PAIRWISE_CALLS];
                for (k, call) in calls.iter().enumerate() {
                    if calls[..k].iter().any(|c| c.id == call.id) {
                        return false;
                    }
                }
                for result in &items[pos..pos + block] {
                    let id = result.msg.tool_call_id.as_deref();
                    match calls.iter().position(|c| Some(c.id.as_str()) == id) {
                        Some(k) if !answered[k] => answered[k] = true,
                        _ => return false,
                    }
                }
                pos += block;
            }
            Role::Assistant if !has_payload(msg) || has_empty_calls(msg) => return false,
            _ if is_lone_reasoning(msg) => return false,
            _ => {}
        }
    }
    true
}

/// Whether `msg` has a `tool_calls` array with nothing in it.
fn has_empty_calls(msg: &Message) -> bool {
    matches!(&msg.tool_calls, Some(Some(calls)) if calls.is_empty())
}
