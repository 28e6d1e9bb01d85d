//! Step 6, `token_budget`: keeps the system messages, the summary and the current turn, then
//! adds history newest first in whole segments while the request fits, stopping at the first
//! segment that does not (the kept history is contiguous, never a gap). The kept history then
//! starts at a `user` message: leading assistant or tool messages are let go too.
//!
//! Repair runs after this step and may add `[no result recorded]` results (placeholder mode), so
//! a segment's cost includes those it would get; the budget therefore holds for what is sent.

use std::collections::HashSet;

use super::policy::{TokenBudget, UnansweredCalls};
use super::report::RemoveReason;
use super::segments::{link_near, link_results, segments};
use super::work::{Item, Work};
use crate::conversation::{Message, Role};
use crate::tokens::{Encoding, REQUEST_OVERHEAD, message_tokens};

/// The content of a result made up for an unanswered call.
pub const NO_RESULT: &str = "[no result recorded]";

/// The tool message repair adds for an unanswered call.
pub fn no_result_message(call_id: &str) -> Message {
    let mut m = Message::text(Role::Tool, NO_RESULT);
    m.tool_call_id = Some(call_id.to_string());
    m
}

/// Always kept by the budget: instructions, the summary, the current turn (and anything after
/// its start, such as a late result of a history call).
fn fixed(item: &Item<'_>, pos: usize, current_start: usize) -> bool {
    pos >= current_start || !droppable(item)
}

/// Whether an item before the current turn may be dropped by the budget at all: history the
/// caller gave that is not an instruction.
fn droppable(item: &Item<'_>) -> bool {
    item.history && item.index.is_some() && !item.msg.role.is_instruction()
}

/// What the budget did, for remembering a settled start (see `settled.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Budgeted {
    /// The whole request fitted (`keeps_all`): nothing was dropped.
    KeptAll,
    /// Newest first, a segment did not fit: it and all history before it went (and those after
    /// it up to a `user` message). The kept history starts at this index of the conversation as
    /// given (`None`: none is kept); `dropped` holds each dropped segment's first index and cost.
    Cut {
        first_kept: Option<usize>,
        dropped: Vec<(usize, u64)>,
    },
    /// Every segment fitted, yet not the whole request as `keeps_all` reads it.
    Reached,
    /// Every segment fitted, and so did the newest segment before the working copy (`Before`):
    /// over the whole, the budget would have gone on into what came before.
    ReachedBefore,
}

impl Budgeted {
    /// The cost of the newest segment the budget dropped that starts before `end`.
    pub(crate) fn newest_dropped_before(&self, end: usize) -> Option<u64> {
        let Budgeted::Cut { dropped, .. } = self else {
            return None;
        };
        dropped
            .iter()
            .rev()
            .find(|&&(index, _)| index < end)
            .map(|&(_, cost)| cost)
    }

    /// The first index of the newest dropped segment that has more than `margin` tokens of
    /// dropped history from it to the kept history.
    pub(crate) fn dropped_beyond(&self, margin: u64) -> Option<usize> {
        let Budgeted::Cut { dropped, .. } = self else {
            return None;
        };
        let mut behind = 0;
        dropped.iter().rev().find_map(|&(index, cost)| {
            behind += cost;
            (behind > margin).then_some(index)
        })
    }
}

/// Messages before the working copy (a settled start, see `settled.rs`) as the budget sees
/// them: what of them it always keeps (instructions), and the cost of their newest segment it
/// may drop, if any.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Before {
    pub fixed: u64,
    pub newest_droppable: Option<u64>,
}

/// Applies the budget to the working copy, as over the whole conversation when messages come
/// before it (`before`).
pub(crate) fn apply(
    work: &mut Work<'_>,
    budget: &TokenBudget,
    context_window: u64,
    tools_tokens: u64,
    unanswered: UnansweredCalls,
    before: Before,
) -> Budgeted {
    let limit = budget.limit(context_window);
    let tools_tokens = tools_tokens + before.fixed;
    // With droppable history before the working copy, whether everything fits is up to that
    // history too: the scan below tells.
    if unanswered == UnansweredCalls::Drop
        && before.newest_droppable.is_none()
        && keeps_all(&work.items, limit, tools_tokens)
    {
        return Budgeted::KeptAll;
    }
    let encoding = work.encoding;
    let items = &work.items;
    let current_start = items.iter().position(|i| !i.history).unwrap_or(items.len());
    let groups = groups(items, current_start);
    let cost = |group: &[usize]| -> u64 {
        let mut n: u64 = group.iter().map(|&p| items[p].tokens).sum();
        if unanswered == UnansweredCalls::Placeholder {
            n += placeholder_cost(encoding, items, group);
        }
        n
    };
    let mut used = REQUEST_OVERHEAD + tools_tokens;
    let mut candidates = Vec::new();
    for group in groups {
        if fixed(&items[group[0]], group[0], current_start) {
            used += cost(&group);
        } else {
            candidates.push(group);
        }
    }
    // Newest first, while it fits; the first that does not ends the kept history.
    let mut kept = candidates.len();
    let mut stopped = false;
    for (k, group) in candidates.iter().enumerate().rev() {
        let c = cost(group);
        if used + c > limit {
            stopped = true;
            break;
        }
        used += c;
        kept = k;
    }
    if !stopped && let Some(c) = before.newest_droppable {
        if used + c <= limit {
            return Budgeted::ReachedBefore;
        }
        stopped = true; // at the segment before: all of the working copy's history is kept
    }
    // The kept history begins at a user message.
    while kept < candidates.len() && items[candidates[kept][0]].msg.role != Role::User {
        kept += 1;
    }
    let first_kept = candidates.get(kept).and_then(|g| items[g[0]].index);
    let dropped: Vec<(usize, u64)> = candidates[..kept]
        .iter()
        .map(|g| (items[g[0]].index.unwrap_or(0), cost(g)))
        .collect();
    if kept > 0 {
        let mut drop = vec![false; items.len()];
        for &p in candidates[..kept].iter().flatten() {
            drop[p] = true;
        }
        work.remove_marked(RemoveReason::TokenBudget, &drop);
    }
    if stopped {
        Budgeted::Cut {
            first_kept,
            dropped,
        }
    } else {
        Budgeted::Reached
    }
}

/// The segments of SPEC 5 step 6 (positions; oldest first by their first message): an
/// assistant message with tool calls together with all its results, or any other single message.
/// A history result that comes late (after another message) is in its call's segment, not in the
/// one where it sits: kept or dropped with its call, never left an orphan for repair to drop. A
/// late result in the current turn stays where it is (steps 2–6 leave the current turn alone).
fn groups(items: &[Item<'_>], current_start: usize) -> Vec<Vec<usize>> {
    let msg = |p: usize| &*items[p].msg;
    let mut groups: Vec<Vec<usize>> = Vec::new();
    // The group an assistant message with calls leads, by its position.
    let mut led_by = vec![usize::MAX; items.len()];
    let mut last_caller = None;
    // The full map of results to calls, made only if a result is not where `link_near` looks.
    let mut links = None;
    for seg in segments(msg, 0..items.len()) {
        let mut group = Vec::with_capacity(seg.len());
        for p in seg {
            let owner = match link_near(msg, p, last_caller) {
                Some(link) => link,
                None => links.get_or_insert_with(|| link_results(items.iter().map(|i| &*i.msg)))[p],
            };
            match owner {
                // A late history result: to its call's segment, an earlier one.
                Some((caller, _)) if p < current_start && led_by[caller] < groups.len() => {
                    groups[led_by[caller]].push(p)
                }
                _ => group.push(p),
            }
            if msg(p).has_tool_calls() {
                last_caller = Some(p);
                led_by[p] = groups.len();
            }
        }
        if !group.is_empty() {
            groups.push(group);
        }
    }
    groups
}

/// Whether the budget keeps every message, known without cutting the history into segments
/// and costing each: the whole request fits (so every segment fits, newest first) and the first
/// segment the budget may drop starts at a `user` message (so none is let go to make the kept
/// history start at one). Only for `unanswered_calls: drop`, where a segment costs its tokens.
pub(crate) fn keeps_all(items: &[Item<'_>], limit: u64, tools_tokens: u64) -> bool {
    let total: u64 = items.iter().map(|i| i.tokens).sum();
    REQUEST_OVERHEAD + tools_tokens + total <= limit
        && first_droppable(items).is_none_or(|(_, user)| user)
}

/// The first segment the budget may drop, as the index (in the conversation as given) of its
/// first message and whether that is a `user` message; `None` when the budget may drop none.
pub(crate) fn first_droppable(items: &[Item<'_>]) -> Option<(usize, bool)> {
    // The segments from the start, as `segments` makes them, up to the first the budget may
    // drop; `current` tells whether the current turn has started at or before a position.
    let mut pos = 0;
    let mut current = false;
    while pos < items.len() {
        let start = pos;
        current |= !items[pos].history;
        pos += 1;
        if items[start].msg.has_tool_calls() {
            while pos < items.len() && items[pos].msg.role == Role::Tool {
                current |= !items[pos].history;
                pos += 1;
            }
        }
        if !current && droppable(&items[start]) {
            let index = items[start].index.unwrap_or(0);
            return Some((index, items[start].msg.role == Role::User));
        }
    }
    None
}

/// Tokens of the results repair would make up for the calls of a segment that has no result
/// for them.
fn placeholder_cost(encoding: Encoding, items: &[Item<'_>], group: &[usize]) -> u64 {
    let answered: HashSet<&str> = group[1..]
        .iter()
        .filter_map(|&p| items[p].msg.tool_call_id.as_deref())
        .collect();
    items[group[0]]
        .msg
        .tool_calls()
        .iter()
        .filter(|c| !answered.contains(c.id.as_str()))
        .map(|c| message_tokens(encoding, &no_result_message(&c.id)))
        .sum()
}
