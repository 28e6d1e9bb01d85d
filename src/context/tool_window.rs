//! Step 3, `tool_call_window`: keeps only the N most recent tool calls of the history
//! (Agno's `max_tool_calls_from_history`). With `unit: call` every call counts one, parallel
//! calls separately; with `unit: turn` every assistant message with tool calls counts one.
//! Calls are ordered by where they were made, so the window is stable under repair (which may
//! move or add results) and running it twice changes nothing.

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
    // Calls are listed oldest first, so the doomed ones are exactly those before a cut: the
    // first call kept (unit call) or the first assistant message kept (unit turn).
    let excess = match window.unit {
        WindowUnit::Call => calls.len().saturating_sub(window.max),
        WindowUnit::Turn => {
            let turns = calls.windows(2).filter(|w| w[0].0 != w[1].0).count()
                + usize::from(!calls.is_empty());
            turns.saturating_sub(window.max)
        }
    };
    if excess == 0 {
        return;
    }
    let cut: (usize, usize) = match window.unit {
        WindowUnit::Call => calls.get(excess).copied().unwrap_or((usize::MAX, 0)),
        WindowUnit::Turn => {
            let mut turn_starts = calls
                .iter()
                .enumerate()
                .filter(|&(k, c)| k == 0 || calls[k - 1].0 != c.0)
                .map(|(_, &(pos, _))| (pos, 0));
            turn_starts.nth(excess).unwrap_or((usize::MAX, 0))
        }
    };
    remove_calls(work, RemoveReason::ToolCallWindow, false, |pos, i, _| {
        (pos, i) < cut
    });
}
