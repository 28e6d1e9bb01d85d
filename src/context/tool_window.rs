//! Step 3, `tool_call_window`: keeps only the N most recent tool calls of the history
//! (Agno's `max_tool_calls_from_history`). With `unit: call` every tool result counts one,
//! parallel calls separately; with `unit: turn` every assistant message with tool calls counts
//! one (that is, each one still sent with `tool_calls`). Only calls that go out with a result
//! count: one that has a result, or (with `unanswered_calls: placeholder`) one repair will
//! answer. An unanswered call that repair drops takes no place in the window, so it cannot push
//! out an answered one.
//!
//! Calls are ordered by where they were made, so the window is stable under repair (which may
//! move or add results) and running it twice changes nothing.

use std::collections::HashSet;

use super::policy::{ToolCallWindow, UnansweredCalls, WindowUnit};
use super::removal::remove_calls;
use super::report::RemoveReason;
use super::segments::{link_near, link_results};
use super::work::{Item, Work};
use crate::conversation::Role;

/// What the window decided, for remembering a settled start (`settled.rs`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WindowCut {
    /// Whether the window found `max` calls and removed every history call before them.
    pub found: bool,
    /// No history call before this index (of the conversation as given) is still sent: the
    /// index of the message holding the first kept call, or of the first history call when
    /// the window cut nothing (`usize::MAX` when there is none).
    pub floor: usize,
}

pub(crate) fn apply(
    work: &mut Work<'_>,
    window: &ToolCallWindow,
    unanswered: UnansweredCalls,
) -> WindowCut {
    // The first call kept, as (assistant position, call index): found newest first, counting
    // calls (unit call) or assistant messages with calls (unit turn) until `max` are in.
    // Every history call before it goes.
    let mut cut = (usize::MAX, 0);
    if window.max == 0 {
        // Nothing kept: every history call goes, so none is sent before any index.
        remove_calls(work, RemoveReason::ToolCallWindow, false, |_, _, _| true);
        return WindowCut {
            found: true,
            floor: usize::MAX,
        };
    }
    {
        let items = &work.items;
        let mut answered = None;
        let mut seen = 0usize;
        'newest_first: for (pos, item) in items.iter().enumerate().rev() {
            if !(item.history && item.msg.role == Role::Assistant && item.msg.has_tool_calls()) {
                continue;
            }
            let counts = counted_calls(items, pos, unanswered, &mut answered);
            let units: Vec<usize> = match window.unit {
                WindowUnit::Call => (0..counts.len()).rev().filter(|&i| counts[i]).collect(),
                WindowUnit::Turn if counts.contains(&true) => vec![0],
                WindowUnit::Turn => Vec::new(),
            };
            for i in units {
                seen += 1;
                if seen == window.max {
                    cut = (pos, i);
                    break 'newest_first;
                }
            }
        }
        if cut.0 == usize::MAX {
            // Fewer than `max` calls: all stay.
            let first_call = items
                .iter()
                .find(|i| i.history && i.msg.role == Role::Assistant && i.msg.has_tool_calls());
            return WindowCut {
                found: false,
                floor: first_call.and_then(|i| i.index).unwrap_or(usize::MAX),
            };
        }
    }
    // The message holding the first kept call stays (with that call and those after it).
    let floor = work.items[cut.0].index.unwrap_or(0);
    remove_calls(work, RemoveReason::ToolCallWindow, false, |pos, i, _| {
        (pos, i) < cut
    });
    WindowCut { found: true, floor }
}

/// For each call of the assistant message at `pos`, whether it counts in the window: whether
/// it goes out with a result when the window keeps it and the calls after it.
///
/// With `drop`, a call counts when it has a result. Results link to the first call of their id
/// in a message, so a repeated id never counts (repair drops it, and when the window removes
/// the first, that first's result goes too). Results are found in the tool block right after
/// the message; only a call not answered there needs `answered` (every call that has a result
/// anywhere, found once).
///
/// With `placeholder`, repair answers every call it keeps, and of a repeated id it keeps the
/// first that the window left: the last of each id counts, so that the calls kept from a cut
/// onwards hold as many distinct ids as the window counted.
fn counted_calls(
    items: &[Item<'_>],
    pos: usize,
    unanswered: UnansweredCalls,
    answered: &mut Option<HashSet<(usize, usize)>>,
) -> Vec<bool> {
    let calls = items[pos].msg.tool_calls();
    let mut counts = vec![false; calls.len()];
    let mut ids: HashSet<&str> = HashSet::with_capacity(calls.len());
    if unanswered == UnansweredCalls::Placeholder {
        for (i, call) in calls.iter().enumerate().rev() {
            counts[i] = ids.insert(call.id.as_str());
        }
        return counts;
    }
    let at = |p: usize| &*items[p].msg;
    for p in (pos + 1..items.len()).take_while(|&p| items[p].msg.role == Role::Tool) {
        if let Some(Some((_, i))) = link_near(at, p, Some(pos)) {
            counts[i] = true;
        }
    }
    for (i, call) in calls.iter().enumerate() {
        if !ids.insert(call.id.as_str()) {
            counts[i] = false;
        } else if !counts[i] {
            counts[i] = answered
                .get_or_insert_with(|| {
                    link_results(items.iter().map(|i| &*i.msg))
                        .into_iter()
                        .flatten()
                        .collect()
                })
                .contains(&(pos, i));
        }
    }
    counts
}
