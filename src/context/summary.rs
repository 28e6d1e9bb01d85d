//! Step 5, `summary`: applying a stored rolling summary, and deciding when a new one is due
//! (measured on the history as steps 1–4 leave it, see [`Entry`]). Both are pure; making the
//! summary (an upstream call) and storing it happen outside.
//!
//! Applying: the summary goes in as a `system` message right after the leading system/developer
//! messages, reading `"Summary of the earlier conversation:\n" + text`, and the history it covers
//! is removed (reason `summary`). The cut never splits a segment: if it would fall between a call
//! and its results, the whole segment is kept (a little duplicated context is better than a
//! broken pair). Instruction messages are never removed.

use serde::{Deserialize, Serialize};

use super::policy::SummaryPolicy;
use super::report::{RemoveReason, SummaryUse};
use super::segments::{link_results, segments};
use super::work::{Item, Msg, Work};
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
            placeholders: 0,
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
    /// First message to summarise (index into the conversation as given); the summariser also
    /// gets the previous summary's text, so what it already covers is never re-read.
    pub from: usize,
    /// Last message to summarise, inclusive (index into the conversation as given); becomes the
    /// new summary's `covers_until`.
    pub until: usize,
    /// Tokens of the history as it stands (uncovered messages plus the previous summary) that
    /// made the summary due.
    pub history_tokens: u64,
}

/// One message of the conversation as steps 1–4 leave it, which is what a new summary is
/// planned over and made from: a summary must neither read what those steps removed (a call the
/// role may not see) nor be triggered by what they already shortened.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'m> {
    pub message: &'m Message,
    /// Position in the conversation as given.
    pub index: usize,
    /// Tokens of the message as it stands.
    pub tokens: u64,
}

impl<'m> Entry<'m> {
    /// The conversation as given, untouched by any step (`tokens` parallel to `messages`).
    pub fn given(messages: &'m [Message], tokens: &[u64]) -> Vec<Entry<'m>> {
        messages
            .iter()
            .zip(tokens)
            .enumerate()
            .map(|(index, (message, &tokens))| Entry {
                message,
                index,
                tokens,
            })
            .collect()
    }
}

/// Whether a new summary is due for the conversation `entries` (as steps 1–4 leave it; see
/// [`Early::entries`](super::Early::entries)), and over which range.
///
/// `previous` is the summary in force, with `previous_tokens` the tokens of its message. Due when
/// the history (entries before the last `user` message, less what `previous` covers, plus
/// `previous_tokens`) exceeds `trigger_tokens` and has at least `min_messages` uncovered
/// messages. The plan covers the oldest uncovered history, leaving the newest whole segments that
/// fit in `target_tokens - previous_tokens` (the new summary is assumed no larger than the old),
/// from a user message on.
pub fn plan_summary(
    policy: &SummaryPolicy,
    entries: &[Entry<'_>],
    previous: Option<&StoredSummary>,
    previous_tokens: u64,
) -> Option<SummaryPlan> {
    let history_end = entries
        .iter()
        .rposition(|e| e.message.role == Role::User)
        .unwrap_or(0);
    let lead = entries
        .iter()
        .take_while(|e| e.message.role.is_instruction())
        .count();
    // Positions in `entries` from here on; the plan names messages by their given index.
    let from = match previous {
        Some(p) => (lead..history_end)
            .find(|&pos| entries[pos].index > p.covers_until)
            .unwrap_or(history_end),
        None => lead,
    };
    if from >= history_end {
        return None;
    }
    let counted = |r: std::ops::Range<usize>| -> (u64, usize) {
        entries[r]
            .iter()
            .filter(|e| !e.message.role.is_instruction())
            .fold((0, 0), |(t, n), e| (t + e.tokens, n + 1))
    };
    let (uncovered_tokens, uncovered_count) = counted(from..history_end);
    let history_tokens = uncovered_tokens + previous_tokens;
    if history_tokens <= policy.trigger_tokens || uncovered_count < policy.min_messages {
        return None;
    }
    let keep_budget = policy.target_tokens.saturating_sub(previous_tokens);
    let mut keep_start = history_end;
    let mut kept = 0u64;
    for seg in segments(|pos| entries[pos].message, from..history_end)
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
    // The kept history begins at a user message, as the token budget's does, when one is in
    // it: a conversation that goes on system, summary, assistant is refused by chat templates
    // that want the roles to alternate (vLLM's Mistral and Llama templates, some compatibility
    // layers). When none is (an agent's long run of calls after one question), the newest
    // segments are kept as they are rather than summarising everything up to the current turn.
    if let Some(user) =
        (keep_start..history_end).find(|&pos| entries[pos].message.role == Role::User)
    {
        keep_start = user;
    }
    let keep_start = with_late_results(entries, from, keep_start);
    if keep_start <= from {
        return None;
    }
    Some(SummaryPlan {
        from: entries[from].index,
        until: entries[keep_start - 1].index,
        history_tokens,
    })
}

/// Where the kept history must start (a position in `entries`, at most `keep_start`) so that no
/// call before it has a result after it. Segments keep a call with the results right after it;
/// a result that comes late (after a later message) is linked to its call only by id. Were the
/// call summarised and its result kept, repair would drop the result as an orphan: neither the
/// summariser nor the model would ever read it. So the call is kept, from the user message
/// before it where there is one after `from` (the kept history begins at a user message, as
/// above), else from the call itself.
/// `from`: the first position the summary may cover.
pub(crate) fn with_late_results(entries: &[Entry<'_>], from: usize, keep_start: usize) -> usize {
    if keep_start <= from || keep_start >= entries.len() {
        return keep_start;
    }
    let links = link_results(entries[from..].iter().map(|e| e.message));
    let mut keep_start = keep_start;
    loop {
        let split_call = (keep_start..entries.len())
            .filter_map(|pos| links[pos - from])
            .map(|(call, _)| call + from)
            .filter(|&call| call < keep_start)
            .min();
        let Some(call) = split_call else {
            return keep_start;
        };
        // A user message after `from` only: one at `from` would leave nothing to cover.
        keep_start = (from + 1..=call)
            .rev()
            .find(|&pos| entries[pos].message.role == Role::User)
            .unwrap_or(call);
    }
}
