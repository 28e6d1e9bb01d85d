//! The pipeline's working copy of the conversation. Each entry borrows the caller's message until
//! a step changes it (copy on write), so untouched messages go out exactly as they came in and
//! cost one clone at the end. Every entry carries its token count, computed once per version of
//! the message: a message is tokenised again only after a step has changed it.

use std::borrow::Cow;

use crate::conversation::{Message, MessageId, Role};
use crate::tokens::{Encoding, TokenCounter, message_tokens};

use super::report::{RemoveReason, Removed, Report};

/// One message of the working copy.
#[derive(Debug, Clone)]
pub(crate) struct Item<'a> {
    pub msg: Cow<'a, Message>,
    /// Position in the conversation as given; `None` for messages the pipeline made.
    pub index: Option<usize>,
    pub tokens: u64,
    /// The chained id of the message as given, when the caller passed ids; `None` for messages
    /// the pipeline made.
    pub id: Option<MessageId>,
    /// Before the last `user` message (steps 2–6 may change it), or the result of a call that is.
    pub history: bool,
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
}

impl<'a> Work<'a> {
    /// Counts a message made or changed by the pipeline.
    pub fn count(&self, m: &Message) -> u64 {
        message_tokens(self.encoding, m)
    }

    /// Tokens of all messages (without the request overhead and tools).
    pub fn messages_tokens(&self) -> u64 {
        self.items.iter().map(|i| i.tokens).sum()
    }

    /// Drops the items for which `keep` is false, reporting each with `reason`.
    pub fn remove_where(
        &mut self,
        reason: RemoveReason,
        mut doomed: impl FnMut(usize, &Item) -> bool,
    ) {
        // In place: no new vector, and kept items move only when something before them went.
        let report = &mut self.report;
        let mut pos = 0;
        self.items.retain(|item| {
            let gone = doomed(pos, item);
            pos += 1;
            if gone {
                if let Some(index) = item.index {
                    report.removed.push(Removed {
                        index,
                        role: item.msg.role.clone(),
                        reason,
                    });
                }
            }
            !gone
        });
    }
}

/// Position of the last `user` message: the current turn starts there.
pub(crate) fn current_turn_start(messages: &[Message]) -> usize {
    messages
        .iter()
        .rposition(|m| m.role == Role::User)
        .unwrap_or(0)
}
