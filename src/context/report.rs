//! The report of one pipeline run (SPEC 5.3): what went in, what went out, and every change,
//! with indices into the conversation as given (before rewriting). Preview returns it and every
//! request record stores it, so it round-trips through JSON.

use serde::{Deserialize, Serialize};

use crate::conversation::Role;

/// What the pipeline did to one request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Tokens of the request as given (every message, tools, overhead).
    pub tokens_in: u64,
    /// Tokens of the request as rewritten, the one sent upstream.
    pub tokens_out: u64,
    /// Messages taken out, and why.
    pub removed: Vec<Removed>,
    /// Tool results shortened by `compress_tool_output`.
    pub compressed: Vec<Compressed>,
    /// Placeholder text the pipeline inserted: `[tool call omitted: NAME]` lines (tool_filter)
    /// and `[no result recorded]` results (repair with `unanswered_calls: placeholder`).
    pub placeholders: u64,
    /// Repairs made so the provider accepts the request.
    pub repaired: Vec<Repaired>,
    /// Whether a stored summary replaced older history.
    pub summary: SummaryUse,
}

/// One message removed from the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Removed {
    /// Index in the conversation as given.
    pub index: usize,
    pub role: Role,
    pub reason: RemoveReason,
}

/// Which step removed a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RemoveReason {
    ToolAccess,
    ToolFilter,
    ToolCallWindow,
    TokenBudget,
    Summary,
}

/// One tool result shortened. Token figures are of the result's content text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Compressed {
    pub index: usize,
    pub tokens_before: u64,
    pub tokens_after: u64,
}

/// One repair. `index` is the message repaired: the dropped or moved tool result, the dropped
/// assistant message, or the assistant message whose call was unanswered or duplicated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Repaired {
    pub index: usize,
    pub kind: RepairKind,
}

/// What repair fixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RepairKind {
    /// A tool result with no matching call before it: dropped.
    OrphanResult,
    /// A tool result separated from its call: moved back to it.
    MovedResult,
    /// A second call or result with an id already seen: dropped.
    DuplicateId,
    /// A call nobody answered: dropped, or answered with `[no result recorded]`.
    UnansweredCall,
    /// An assistant message with neither content nor tool calls: dropped.
    EmptyAssistant,
}

/// The summary part of the report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SummaryUse {
    pub used: bool,
    /// The position the applied summary covers up to (as the caller gave it), if one was used.
    pub covers_until: Option<u64>,
}

impl Report {
    /// Tokens saved by the rewrite.
    pub fn tokens_saved(&self) -> u64 {
        self.tokens_in.saturating_sub(self.tokens_out)
    }
}

/// A change to one tool call of a message, beside the report: a call taken out of an assistant
/// message (the message itself may stay, so `removed` does not name it), or a call repair
/// found unanswered or duplicated. Chat reports name the message only; the Responses mapping,
/// where every call is an item of its own, needs to know which call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallChange {
    /// The assistant message, by its index in the conversation as given.
    pub index: usize,
    /// The call, by its position in that message's `tool_calls` as given.
    pub call: usize,
    pub change: Change,
}

/// What happened to a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Taken out by a history step.
    Removed(RemoveReason),
    /// Repaired (`unanswered_call`, `duplicate_id`); `dropped` when it is no longer sent.
    Repaired { kind: RepairKind, dropped: bool },
}
