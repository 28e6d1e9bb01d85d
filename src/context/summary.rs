//! Step 5, `summary`: applying a stored rolling summary, and deciding when a new one is due.
//! Both are pure; making the summary (an upstream call) and storing it happen outside.
//!
//! Applying: the summary goes in as a `system` message right after the leading system/developer
//! messages, reading `"Summary of the earlier conversation:\n" + text`, and the history it covers
//! is removed (reason `summary`). The cut never splits a segment: if it would fall between a call
//! and its results, the whole segment is kept (a little duplicated context is better than a
//! broken pair). Instruction messages are never removed.

use serde::{Deserialize, Serialize};

use super::policy::SummaryPolicy;
use super::report::{RemoveReason, SummaryUse};
use super::segments::segments;
use super::work::{Item, Msg, Work, current_turn_start};
use crate::conversation::{Message, Role};

/// The prefix of the summary message.
pub const SUMMARY_PREFIX: &str = "Summary of the earlier conversation:\n";

/// A summary kept in the store, as the pipeline needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSummary {
    pub text: String,
    /// Index of the last message of the conversation (as given to the pipeline) that the summary
    /// covers, inclusive. The caller maps its stored seq to this index.
    pub covers_until: usize,
}

impl StoredSummary {
    /// The system message that carries this summary.
    pub fn message(&self) -> Message {
        Message::text(Role::System, format!("{SUMMARY_PREFIX}{}", self.text))
    }
}

/// Number of leading system/developer messages.
fn leading_instructions(items: &[Item<'_>]) -> usize {
    items
        .iter()
        .take_while(|i| i.msg.role.is_instruction())
        .count()
}

pub(crate) fn apply(work: &mut Work<'_>, summary: &StoredSummary) {
    let lead = leading_instructions(&work.items);
    let history_end = work
        .items
        .iter()
        .position(|i| !i.history)
        .unwrap_or(work.items.len());
    // First history position the summary does not cover.
    let mut cut = (lead..history_end)
        .find(|&p| work.items[p].index.is_none_or(|i| i > summary.covers_until))
        .unwrap_or(history_end);
    let items = &work.items;
    if let Some(seg) = segments(|p| &*items[p].msg, lead..history_end)
        .into_iter()
        .find(|s| s.contains(&cut))
    {
        cut = seg.start;
    }
    work.remove_where(RemoveReason::Summary, |pos, item| {
        pos >= lead && pos < cut && !item.msg.role.is_instruction()
    });
    let msg = summary.message();
    let tokens = work.count(&msg);
    work.items.insert(
        lead,
        Item {
            msg: Msg::owned(msg),
            index: None,
            tokens,
            history: true,
        },
    );
    work.report.summary = SummaryUse {
        used: true,
        covers_until: Some(summary.covers_until as u64),
    };
}

/// Which messages a new summary should cover.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SummaryPlan {
    /// First message to summarise (index into the conversation); the summariser also gets the
    /// previous summary's text, so what it already covers is never re-read.
    pub from: usize,
    /// Last message to summarise, inclusive; becomes the new summary's `covers_until`.
    pub until: usize,
    /// Tokens of the history as it stands (uncovered messages plus the previous summary) that
    /// made the summary due.
    pub history_tokens: u64,
}

/// Whether a new summary is due for `messages`, and over which range.
///
/// `tokens` holds each message's count (parallel to `messages`; see
/// [`TokenCounter::message_with_id`](crate::tokens::TokenCounter::message_with_id));
/// `previous` is the summary in force, with `previous_tokens` the tokens of its message. Due when
/// the history (messages before the last `user` message, less what `previous` covers, plus
/// `previous_tokens`) exceeds `trigger_tokens` and has at least `min_messages` uncovered
/// messages. The plan covers the oldest uncovered history, leaving the newest whole segments that
/// fit in `target_tokens - previous_tokens` (the new summary is assumed no larger than the old).
pub fn plan_summary(
    policy: &SummaryPolicy,
    messages: &[Message],
    tokens: &[u64],
    previous: Option<&StoredSummary>,
    previous_tokens: u64,
) -> Option<SummaryPlan> {
    if tokens.len() != messages.len() {
        return None;
    }
    let history_end = current_turn_start(messages);
    let lead = messages
        .iter()
        .take_while(|m| m.role.is_instruction())
        .count();
    let from = previous.map_or(lead, |p| p.covers_until + 1).max(lead);
    if from >= history_end {
        return None;
    }
    let counted = |r: std::ops::Range<usize>| -> (u64, usize) {
        r.filter(|&i| !messages[i].role.is_instruction())
            .fold((0, 0), |(t, n), i| (t + tokens[i], n + 1))
    };
    let (uncovered_tokens, uncovered_count) = counted(from..history_end);
    let history_tokens = uncovered_tokens + previous_tokens;
    if history_tokens <= policy.trigger_tokens || uncovered_count < policy.min_messages {
        return None;
    }
    let keep_budget = policy.target_tokens.saturating_sub(previous_tokens);
    let mut keep_start = history_end;
    let mut kept = 0u64;
    for seg in segments(|i| &messages[i], from..history_end)
        .into_iter()
        .rev()
    {
        let (t, _) = counted(seg.clone());
        if kept + t > keep_budget {
            break;
        }
        kept += t;
        keep_start = seg.start;
    }
    if keep_start <= from {
        return None;
    }
    Some(SummaryPlan {
        from,
        until: keep_start - 1,
        history_tokens,
    })
}
