//! Step 3, `tool_call_window`: keeps only the N most recent tool calls of the history
//! (Agno's `max_tool_calls_from_history`). With `unit: call` every call counts one, parallel
//! calls separately; with `unit: turn` every assistant message with tool calls counts one.
//! Calls are ordered by where they were made, so the window is stable under repair (which may
//! move or add results) and running it twice changes nothing.

use std::collections::HashSet;

use super::policy::{ToolCallWindow, WindowUnit};
use super::removal::remove_calls;
use super::report::RemoveReason;
use super::work::Work;
use crate::conversation::Role;

pub(crate) fn apply(work: &mut Work<'_>, window: &ToolCallWindow) {
    // History calls oldest first, as (assistant position, call index).
    let calls: Vec<(usize, usize)> = work
        .items
        .iter()
        .enumerate()
        .filter(|(_, it)| it.history && it.msg.role == Role::Assistant)
        .flat_map(|(pos, it)| (0..it.msg.tool_calls().len()).map(move |i| (pos, i)))
        .collect();
    let doomed: HashSet<(usize, usize)> = match window.unit {
        WindowUnit::Call => {
            let excess = calls.len().saturating_sub(window.max);
            calls[..excess].iter().copied().collect()
        }
        WindowUnit::Turn => {
            let mut turns: Vec<usize> = calls.iter().map(|&(pos, _)| pos).collect();
            turns.dedup();
            let excess = turns.len().saturating_sub(window.max);
            let old: HashSet<usize> = turns[..excess].iter().copied().collect();
            calls
                .iter()
                .copied()
                .filter(|(p, _)| old.contains(p))
                .collect()
        }
    };
    if doomed.is_empty() {
        return;
    }
    remove_calls(work, RemoveReason::ToolCallWindow, false, |pos, i, _| {
        doomed.contains(&(pos, i))
    });
}
