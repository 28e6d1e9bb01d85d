//! The pipeline's working copy of the conversation. Each entry borrows the caller's message until
//! a step changes it (copy on write), so untouched messages go out exactly as they came in and
//! cost one clone at the end. Every entry carries its token count, computed once per version of
//! the message: a message is tokenised again only after a step has changed it.
//!
//! An entry is kept small (a changed message lives in a box) because the steps move entries
//! around: on a long conversation moving fat entries was the largest per-message cost of a turn.

use std::ops::Deref;

use serde_json::Value;

use crate::conversation::{Message, MessageId, Role};
use crate::tokens::{Encoding, MESSAGE_OVERHEAD, TokenCounter, message_tokens};

use super::report::{CallChange, Change, RemoveReason, Removed, RepairKind, Report};

/// A message of the working copy: the caller's, or one a step changed or made.
#[derive(Debug, Clone)]
pub(crate) enum Msg<'a> {
    Borrowed(&'a Message),
    Owned(Box<Message>),
}

impl<'a> Msg<'a> {
    /// A message the pipeline made.
    pub fn owned(msg: Message) -> Self {
        Msg::Owned(Box::new(msg))
    }

    /// The message for changing, copied first if it is still the caller's.
    pub fn to_mut(&mut self) -> &mut Message {
        if let Msg::Borrowed(m) = *self {
            *self = Msg::Owned(Box::new(m.clone()));
        }
        match self {
            Msg::Owned(m) => m,
            Msg::Borrowed(_) => unreachable!("just replaced by an owned copy"),
        }
    }

    /// Replaces the content, copying the rest of the message if it is still the caller's (but
    /// not the old content: a long tool result is not copied only to be thrown away).
    pub fn set_content(&mut self, content: Option<Value>) {
        match self {
            Msg::Owned(m) => m.content = content,
            Msg::Borrowed(m) => {
                *self = Msg::owned(Message {
                    role: m.role.clone(),
                    content,
                    name: m.name.clone(),
                    tool_calls: m.tool_calls.clone(),
                    tool_call_id: m.tool_call_id.clone(),
                    extra: m.extra.clone(),
                })
            }
        }
    }

    /// Whether this is still the caller's message, unchanged.
    pub fn is_borrowed(&self) -> bool {
        matches!(self, Msg::Borrowed(_))
    }
}

impl Deref for Msg<'_> {
    type Target = Message;

    fn deref(&self) -> &Message {
        match self {
            Msg::Borrowed(m) => m,
            Msg::Owned(m) => m,
        }
    }
}

/// One message of the working copy.
#[derive(Debug, Clone)]
pub(crate) struct Item<'a> {
    pub msg: Msg<'a>,
    /// Position in the conversation as given; `None` for messages the pipeline made.
    pub index: Option<usize>,
    pub tokens: u64,
    /// Before the last `user` message (steps 2–6 may change it). By position only: a late
    /// result of a history call that sits in the current turn is not history.
    pub history: bool,
    /// Placeholder texts the pipeline put in this message: taken off the report's
    /// `placeholders` when the message is removed, so that it counts what is sent.
    pub placeholders: u32,
}

impl Item<'_> {
    /// Whether a history-only step may change this message.
    pub fn is_history_tool(&self) -> bool {
        self.history && self.msg.role == Role::Tool
    }
}

/// The conversation being rewritten, plus the report so far.
pub(crate) struct Work<'a> {
    pub items: Vec<Item<'a>>,
    pub report: Report,
    pub encoding: Encoding,
    pub counter: &'a TokenCounter,
    /// The chained ids of the conversation as given, when the caller passed them.
    pub ids: Option<&'a [MessageId]>,
    /// The conversation as given.
    pub given: &'a [Message],
    /// Changes to single calls, beside the report (see [`CallChange`]).
    pub calls: Vec<CallChange>,
    /// See [`PipelineInput::text_apart_from_calls`](super::PipelineInput).
    pub text_apart_from_calls: bool,
}

impl<'a> Work<'a> {
    /// Counts a message made or changed by the pipeline, as it is sent.
    pub fn count(&self, m: &Message) -> u64 {
        sent_tokens(self.encoding, self.text_apart_from_calls, m)
    }

    /// Tokens of all messages (without the request overhead and tools).
    pub fn messages_tokens(&self) -> u64 {
        self.items.iter().map(|i| i.tokens).sum()
    }

    /// Drops the items for which `doomed(position, item)` is true, reporting each with `reason`.
    pub fn remove_where(
        &mut self,
        reason: RemoveReason,
        mut doomed: impl FnMut(usize, &Item) -> bool,
    ) {
        let marked: Vec<bool> = self
            .items
            .iter()
            .enumerate()
            .map(|(pos, item)| doomed(pos, item))
            .collect();
        self.remove_marked(reason, &marked);
    }

    /// Drops the items at the positions marked in `doomed`, reporting each with `reason`.
    pub fn remove_marked(&mut self, reason: RemoveReason, doomed: &[bool]) {
        // In place: kept items move only when something before them went, each once.
        let Some(first) = doomed.iter().position(|&d| d) else {
            return;
        };
        let gone = doomed[first..].iter().filter(|&&d| d).count();
        self.report.removed.reserve(gone);
        let mut write = first;
        for read in first..self.items.len() {
            if doomed.get(read).copied().unwrap_or(false) {
                let item = &self.items[read];
                self.report.placeholders -= u64::from(item.placeholders);
                if let Some(index) = item.index {
                    self.report.removed.push(Removed {
                        index,
                        role: item.msg.role.clone(),
                        reason,
                    });
                }
            } else {
                self.items.swap(write, read);
                write += 1;
            }
        }
        self.items.truncate(write);
    }

    /// Puts the report in the order a reader expects, whatever step made each entry: every list
    /// by index (stable, so an index two steps named keeps their order), and a result that was
    /// shortened and then taken out by a later step (summary, budget, repair) reported as
    /// removed only, since it is not sent at all.
    ///
    /// Costs what the lists hold, not what the conversation does (a long conversation's turn
    /// should not pay per message for it): each step reports in index order already, so the
    /// sorts merge a few runs.
    pub fn settle_report(&mut self) {
        let report = &mut self.report;
        report.removed.sort_by_key(|r| r.index);
        report.repaired.sort_by_key(|r| r.index);
        report.compressed.sort_by_key(|c| c.index);
        // By message and call, not by the step that made each: a run over a settled start and
        // the rest (`settled.rs`) then lists them as a run over the whole does.
        self.calls.sort_by_key(|c| (c.index, c.call));
        if report.compressed.is_empty() {
            return;
        }
        // Results not sent: removed, or dropped by repair (an orphan or a repeated id).
        let mut gone: Vec<usize> = report.removed.iter().map(|r| r.index).collect();
        gone.extend(
            report
                .repaired
                .iter()
                .filter(|r| matches!(r.kind, RepairKind::OrphanResult | RepairKind::DuplicateId))
                .map(|r| r.index),
        );
        if gone.is_empty() {
            return;
        }
        gone.sort_unstable();
        report
            .compressed
            .retain(|c| gone.binary_search(&c.index).is_err());
    }
}

/// Tokens of `m` as sent. With `text_apart_from_calls`, an assistant message with both text and
/// tool calls goes as a text message and a message of calls (as [`to_items`] emits it), which
/// costs one more message's overhead and role than the single message chat sends.
///
/// [`to_items`]: crate::conversation::responses_items::to_items
pub(crate) fn sent_tokens(encoding: Encoding, text_apart_from_calls: bool, m: &Message) -> u64 {
    let tokens = message_tokens(encoding, m);
    if text_apart_from_calls && m.has_content() && m.has_tool_calls() {
        tokens + MESSAGE_OVERHEAD + encoding.count(m.role.as_str())
    } else {
        tokens
    }
}

/// Records `change` for the calls at `positions` (in the item's current `tool_calls`) of `item`,
/// naming each by its position in the message as given. Nothing for messages the pipeline made.
pub(crate) fn record_calls(
    given: &[Message],
    item: &Item<'_>,
    positions: impl IntoIterator<Item = usize>,
    change: Change,
    out: &mut Vec<CallChange>,
) {
    let Some(index) = item.index else { return };
    let current = item.msg.tool_calls();
    let origin = |i: usize| -> Option<usize> {
        if item.msg.is_borrowed() {
            return Some(i);
        }
        // Steps only take calls out (never reorder, add or edit them), so the current calls are
        // a subsequence of the given ones: match them in order.
        let given = given.get(index)?.tool_calls();
        let mut g = 0;
        for (k, call) in current.iter().enumerate() {
            g += given.get(g..)?.iter().position(|c| c == call)?;
            if k == i {
                return Some(g);
            }
            g += 1;
        }
        None
    };
    for i in positions {
        if let Some(call) = origin(i) {
            out.push(CallChange {
                index,
                call,
                change,
            });
        }
    }
}

/// Position of the last `user` message: the current turn starts there.
pub(crate) fn current_turn_start(messages: &[Message]) -> usize {
    messages
        .iter()
        .rposition(|m| m.role == Role::User)
        .unwrap_or(0)
}
