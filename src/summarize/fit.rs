//! Keeping the summariser's input within its model's reach. A first summary of a long session
//! (summaries switched on late, or a history imported whole) could cover more than the
//! summariser can read; the plan is then shortened to what fits, ending at a segment boundary,
//! and the rest is folded in by the next, rolling, summary.

use crate::context::segments::segments;
use crate::context::summary::with_late_results;
use crate::context::{Entry, SummaryPlan};
use crate::conversation::Role;

/// `plan` cut to at most `cap` tokens of transcript (`entries`: the conversation the plan was
/// made over; `cost`: what an entry takes of the transcript, which shortens long messages),
/// always keeping at least its first segment so a session can never be stuck without progress.
pub(crate) fn fit_plan(
    plan: SummaryPlan,
    entries: &[Entry<'_>],
    cap: u64,
    cost: impl Fn(&Entry<'_>) -> u64,
) -> SummaryPlan {
    // The plan names messages by their index as given; the entries may have gaps.
    let start = entries.partition_point(|e| e.index < plan.from);
    let end = entries.partition_point(|e| e.index <= plan.until);
    let mut total = 0u64;
    let mut until = None;
    // The last cut after which a user message comes: the kept history then begins at one, as
    // `plan_summary` made it (some chat templates refuse system, summary, assistant). Any
    // segment boundary only when no such cut fits.
    let mut at_user = None;
    for seg in segments(|pos| entries[pos].message, start..end) {
        let t: u64 = entries[seg.clone()].iter().map(&cost).sum();
        if until.is_some() && total + t > cap {
            let until = at_user.or(until).unwrap_or(plan.until);
            // Nor may the shorter plan cover a call whose result comes late, after its end.
            let keep_start = entries.partition_point(|e| e.index <= until);
            let guarded = with_late_results(entries, start, keep_start);
            // Unless that leaves nothing to cover: progress comes first.
            let until = if guarded > start {
                entries[guarded - 1].index
            } else {
                until
            };
            return SummaryPlan { until, ..plan };
        }
        total += t;
        until = Some(entries[seg.end - 1].index);
        if entries
            .get(seg.end)
            .is_none_or(|next| next.message.role == Role::User)
        {
            at_user = until;
        }
    }
    // All of it fits: the plan stands as `plan_summary` made it.
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::{Message, Role, ToolCall};

    fn call(id: &str) -> Message {
        let mut m = Message::text(Role::Assistant, "");
        m.tool_calls = Some(Some(vec![ToolCall::function(id, "", "")]));
        m
    }

    fn result(id: &str) -> Message {
        let mut m = Message::text(Role::Tool, "r");
        m.tool_call_id = Some(id.into());
        m
    }

    /// Every message whole in the transcript.
    fn whole(e: &Entry<'_>) -> u64 {
        e.tokens
    }

    fn plan(from: usize, until: usize) -> SummaryPlan {
        SummaryPlan {
            from,
            until,
            history_tokens: 0,
        }
    }

    #[test]
    fn cut_to_the_cap_at_a_segment_boundary() {
        let msgs = vec![
            Message::text(Role::User, "a"),
            call("c1"),
            result("c1"),
            Message::text(Role::User, "b"),
            Message::text(Role::Assistant, "c"),
        ];
        let entries = Entry::given(&msgs, &[10; 5]);
        // 25 tokens would end inside the call's segment; the cut goes before it.
        assert_eq!(fit_plan(plan(0, 4), &entries, 25, whole).until, 0);
        assert_eq!(fit_plan(plan(0, 4), &entries, 30, whole).until, 2);
        assert_eq!(fit_plan(plan(0, 4), &entries, 1000, whole).until, 4);
    }

    /// The cut leaves the kept history beginning at a user message when one such cut fits.
    #[test]
    fn the_cut_leaves_a_user_message_first() {
        let msgs = vec![
            Message::text(Role::User, "a"),
            Message::text(Role::Assistant, "x"),
            Message::text(Role::User, "b"),
            Message::text(Role::Assistant, "y"),
            Message::text(Role::User, "c"),
        ];
        let entries = Entry::given(&msgs, &[10; 5]);
        // 30 tokens reach past "b"; the cut goes after "x" so that "b" comes first.
        assert_eq!(fit_plan(plan(0, 3), &entries, 30, whole).until, 1);
        assert_eq!(fit_plan(plan(0, 3), &entries, 40, whole).until, 3);
        // No such cut fits: any boundary, as before.
        assert_eq!(fit_plan(plan(0, 3), &entries, 10, whole).until, 0);
        // Not cut at all: the plan stands, wherever it ends (an agent's run of calls).
        assert_eq!(fit_plan(plan(0, 3), &entries, 1000, whole).until, 3);
        assert_eq!(fit_plan(plan(0, 1), &entries, 1000, whole).until, 1);
        // An earlier user message does not pull a plan that ends in an agent's run back to it.
        let run = vec![
            Message::text(Role::User, "hello"),
            Message::text(Role::Assistant, "hi"),
            Message::text(Role::User, "find"),
            call("c1"),
            result("c1"),
            call("c2"),
            result("c2"),
        ];
        let run_entries = Entry::given(&run, &[10; 7]);
        assert_eq!(fit_plan(plan(0, 4), &run_entries, 1000, whole).until, 4);
    }

    #[test]
    fn at_least_one_segment_is_taken() {
        let msgs = vec![call("c1"), result("c1"), Message::text(Role::User, "b")];
        let fitted = fit_plan(plan(0, 2), &Entry::given(&msgs, &[100; 3]), 10, whole);
        assert_eq!((fitted.from, fitted.until), (0, 1));
    }
}
