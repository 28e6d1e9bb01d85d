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
    // The first call kept, as (assistant position, call index): found newest first, counting
    // calls (unit call) or assistant messages with calls (unit turn) until `max` are in.
    // Every history call before it goes.
    let mut cut = (usize::MAX, 0);
    let mut seen = 0usize;
    if window.max > 0 {
        for (pos, item) in work.items.iter().enumerate().rev() {
            if !(item.history && item.msg.role == Role::Assistant) {
                continue;
            }
            let calls = item.msg.tool_calls().len();
            if calls == 0 {
                continue;
            }
            let units = match window.unit {
                WindowUnit::Call => calls,
                WindowUnit::Turn => 1,
            };
            if seen + units >= window.max {
                let keep_here = match window.unit {
                    WindowUnit::Call => window.max - seen,
                    WindowUnit::Turn => calls,
                };
                cut = (pos, calls - keep_here);
                break;
            }
            seen += units;
        }
        if cut.0 == usize::MAX {
            return; // fewer than `max` calls: all stay
        }
    }
    remove_calls(work, RemoveReason::ToolCallWindow, false, |pos, i, _| {
        (pos, i) < cut
    });
}
