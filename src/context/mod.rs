//! The context pipeline: a pure function from a conversation and a policy to the conversation
//! sent upstream and a report of what changed. No I/O, no clock, no database.
//!
//! Steps, in SPEC 5's fixed order (each off unless configured, except repair):
//! 1. [`tool_access`]: history calls to tools this request does not offer (with `scrub_history`)
//! 2. [`tool_filter`]: history calls by function name
//! 3. [`tool_window`]: only the N most recent history tool calls
//! 4. [`compress`]: history tool results over `max_tokens` shortened
//! 5. [`summary`]: a stored summary replaces the history it covers
//! 6. [`budget`]: history newest first, in whole segments, while the request fits
//! 7. [`repair`]: the request made one the provider accepts, on everything
//!
//! Steps 2–6 change only the **history**, the messages before the last `user` message; the
//! **current turn** (that message and all after it) is untouched by them. That goes by position:
//! a late result of a history call that sits in the current turn is not compressed (repair moves
//! it back to its call afterwards). The one exception is a removed call's result, which goes with
//! its call wherever it sits (see `removal.rs`).
//!
//! A run can stop after step 4 ([`begin`]) and be finished later with a summary
//! ([`Early::finish`]): a new summary is planned over and made from what steps 1–4 leave, by the
//! caller, who does the I/O that takes.
//!
//! The pipeline works on the shared [`Message`] model. The Responses API reuses it by mapping its
//! items to messages (keeping the original item in `extra`) and back; nothing here is specific to
//! chat completions.

pub mod budget;
pub mod compress;
pub mod policy;
pub mod repair;
pub mod report;
pub mod segments;
pub mod settled;
pub mod summary;
pub mod tool_access;
pub mod tool_filter;
pub mod tool_window;

mod removal;
mod work;

use std::collections::HashSet;
use std::ops::Range;

use serde_json::Value;

use crate::conversation::messages::{self, Messages, Part};
use crate::conversation::{Message, MessageId, Role};
use crate::error::{Error, Result};
use crate::tokens::{ModelFacts, REQUEST_OVERHEAD, Spellings, TokenCounter};

pub use policy::Policy;
pub use report::{
    CallChange, Change, Compressed, RemoveReason, Removed, RepairKind, Repaired, Report, SummaryUse,
};
pub use summary::{Entry, StoredSummary, SummaryPlan, plan_summary};
pub use tool_access::{builtin_tool_of, offered_tool_names, offers_any, tool_name, tools_called};

use budget::Budgeted;
use settled::Memory;
use tool_window::WindowCut;
use work::{Item, Msg, Work, current_turn_start};

/// The per-role tool access of this request (SPEC 6), as far as the history is concerned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolAccess {
    /// Names of the tools this request offers, after the role's cut
    /// (see [`offered_tool_names`]).
    pub offered: HashSet<String>,
    /// `tools.scrub_history`: remove history calls to tools not offered.
    pub scrub_history: bool,
}

/// Everything one pipeline run reads.
#[derive(Debug, Clone, Copy)]
pub struct PipelineInput<'a> {
    /// The conversation to send: system + stored history + new messages.
    pub messages: &'a [Message],
    /// The chained ids of `messages` ([`chain_ids`](crate::conversation::chain_ids)), parallel
    /// to them. With ids, unchanged messages are counted from the cache; without, every message
    /// is tokenised.
    pub ids: Option<&'a [MessageId]>,
    /// The spellings of `messages` ([`Spellings`]), parallel to them: what the ids leave out
    /// but the count and the rewrite depend on. Made where the ids are, by a caller that reads
    /// every message anyway; without them (or with ones not parallel to `messages`), the
    /// pipeline makes them itself where it needs them.
    pub spellings: Option<&'a Spellings>,
    /// The request's `tools` array as sent upstream (counted into the request's tokens).
    pub tools: Option<&'a Value>,
    /// The `tools` array as the client sent it, when the role's cut changed it: `tokens_in`
    /// counts it (the request before rewriting, SPEC 3), `tokens_out` counts `tools`. `None`:
    /// both count `tools`.
    pub client_tools: Option<&'a Value>,
    /// Chat's deprecated `functions` array as sent upstream, counted as `tools` is.
    pub functions: Option<&'a Value>,
    /// The `functions` array as the client sent it, when the role's cut changed it (as
    /// `client_tools`).
    pub client_functions: Option<&'a Value>,
    /// The tenant's policy merged over the server defaults.
    pub policy: &'a Policy,
    /// Encoding and context window of the request's model.
    pub model: ModelFacts,
    /// The stored summary to apply (pass one only when the policy has `summary`). Its
    /// `covers_until` is an index into `messages`.
    pub summary: Option<&'a StoredSummary>,
    /// Tool access for the history scrub (step 1); `None` when the tenant has no `tools`.
    pub tool_access: Option<&'a ToolAccess>,
    /// Whether the wire sends an assistant message's text and its tool calls apart, each with a
    /// message's overhead (Responses input: a `message` item, then `function_call` items). A
    /// message a step leaves with both (a placeholder line beside kept calls) is then counted as
    /// the two it is sent as, so that `tokens_out` and the budget see what goes upstream.
    pub text_apart_from_calls: bool,
}

impl<'a> PipelineInput<'a> {
    /// An input with just messages, policy and model; set the other fields as needed.
    pub fn new(messages: &'a [Message], policy: &'a Policy, model: ModelFacts) -> Self {
        PipelineInput {
            messages,
            ids: None,
            spellings: None,
            tools: None,
            client_tools: None,
            functions: None,
            client_functions: None,
            policy,
            model,
            summary: None,
            tool_access: None,
            text_apart_from_calls: false,
        }
    }
}

/// The rewritten conversation and what was done to it.
#[derive(Debug, Clone, PartialEq)]
pub struct Rewritten<M = Vec<Message>> {
    /// The messages to send upstream: a list of them (messages no step changed are clones of
    /// the input, or moved out of it), or [`Messages`] read in place from the input.
    pub messages: M,
    pub report: Report,
    /// Changes to single calls, which the report names by their message only.
    pub calls: Vec<CallChange>,
}

/// The outcome of a run before it is turned into messages: which messages of the input go out
/// unchanged (by position) and which the pipeline changed or made. A caller that owns the
/// conversation sends it read in place ([`Plan::over`]) instead of a list of clones, so a turn
/// costs nothing per message of history kept; one that borrows it reads the messages in place
/// ([`Plan::messages`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    parts: Vec<Part>,
    pub report: Report,
    /// Changes to single calls, which the report names by their message only.
    pub calls: Vec<CallChange>,
}

impl Plan {
    /// The messages to send, read in place from `given` (the conversation the plan was made
    /// from).
    pub fn messages<'m>(&'m self, given: &'m [Message]) -> impl Iterator<Item = &'m Message> {
        messages::read(&self.parts, given)
    }

    /// How many messages are sent.
    pub fn len(&self) -> usize {
        self.parts.iter().map(Part::len).sum()
    }

    /// Whether nothing is left to send.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The rewritten conversation over `given` (the conversation the plan was made from),
    /// read in place: no kept message is moved or copied.
    pub fn over(self, given: Vec<Message>) -> Rewritten<Messages> {
        Rewritten {
            messages: Messages::rewritten(given, self.parts),
            report: self.report,
            calls: self.calls,
        }
    }

    /// The rewritten conversation, cloning the unchanged messages from `messages` (the
    /// conversation the plan was made from).
    pub fn cloned_from(self, messages: &[Message]) -> Rewritten {
        let mut sent = Vec::with_capacity(self.len());
        for part in self.parts {
            match part {
                Part::Kept(run) => sent.extend_from_slice(messages.get(run).unwrap_or_default()),
                Part::Made(m) => sent.push(*m),
            }
        }
        Rewritten {
            messages: sent,
            report: self.report,
            calls: self.calls,
        }
    }
}

/// Runs the pipeline over `input`, counting with `counter` (whose cache it reads and fills).
/// Messages no step changed are cloned into the result; [`plan`] spares those clones.
///
/// Fails with [`Error::ContextLengthExceeded`] when the rewritten request is still larger than
/// the model's context window (the upstream must then not be called), and with
/// [`Error::Internal`] when `ids` is not parallel to `messages`.
pub fn run<'a>(input: PipelineInput<'a>, counter: &'a TokenCounter) -> Result<Rewritten> {
    plan(input, counter).map(|plan| plan.cloned_from(input.messages))
}

/// Runs the pipeline over `input` like [`run`], returning the result as a [`Plan`] over
/// `input.messages`.
pub fn plan<'a>(input: PipelineInput<'a>, counter: &'a TokenCounter) -> Result<Plan> {
    begin(input, counter)?.finish(input.summary)
}

/// A run stopped after step 4 (see [`begin`]).
pub struct Early<'a> {
    work: Work<'a>,
    input: PipelineInput<'a>,
    counter: &'a TokenCounter,
    tools_tokens: u64,
    /// For remembering the conversation's settled start (and going on from an earlier one).
    memory: Option<Memory<'a>>,
    /// What a settled start is chosen from (with `memory` only).
    seen: Option<Seen>,
}

/// What steps 1–4 saw that choosing a settled start needs, from where the run started.
struct Seen {
    /// Tokens of each message as given.
    given_tokens: Vec<u64>,
    /// Each message's call ([`link_results`](segments::link_results)), relative positions.
    links: Vec<Option<(usize, usize)>>,
    window: Option<WindowCut>,
}

/// Runs steps 1–4 over `input`, stopping before the summary. A new summary is planned over and
/// made from what these steps leave ([`Early::entries`]), never from the conversation as given:
/// it must not read what they removed, nor be triggered by what they shortened. The caller then
/// finishes the run with the summary to apply ([`Early::finish`]); `input.summary` is not read.
///
/// A long conversation whose start an earlier turn settled (see [`settled`]) is run from there.
///
/// Fails with [`Error::Internal`] when `ids` is not parallel to `messages`.
pub fn begin<'a>(input: PipelineInput<'a>, counter: &'a TokenCounter) -> Result<Early<'a>> {
    if let Some(ids) = input.ids
        && ids.len() != input.messages.len()
    {
        return Err(Error::Internal(format!(
            "pipeline given {} message ids for {} messages",
            ids.len(),
            input.messages.len()
        )));
    }
    // Spellings not parallel to the messages are no spellings of them: made here instead.
    let input = PipelineInput {
        spellings: input.spellings.filter(|s| s.len() == input.messages.len()),
        ..input
    };
    let memory = Memory::of(&input, counter);
    let early = begin_at(input, counter, memory)?;
    if early.resumed_from().is_none() || early.resumed_fits() {
        return Ok(early);
    }
    // What the rest holds rules the earlier start out: the whole conversation, once more.
    let memory = early.memory.map(Memory::whole);
    begin_at(input, counter, memory)
}

/// Steps 1–4 over the messages from `memory`'s start on (all of them without one).
fn begin_at<'a>(
    input: PipelineInput<'a>,
    counter: &'a TokenCounter,
    memory: Option<Memory<'a>>,
) -> Result<Early<'a>> {
    let encoding = input.model.encoding;
    let resumed = memory.as_ref().and_then(|m| m.resumed.clone());
    let start = memory.as_ref().map_or(0, Memory::start);
    let given = &input.messages[start..];
    // `functions` is sent beside `tools` and counted the same way (its JSON).
    let json_tokens = |v: Option<&Value>| v.map_or(0, |t| counter.tools(encoding, t));
    let tools_tokens = json_tokens(input.tools) + json_tokens(input.functions);
    let history_end = current_turn_start(input.messages);
    // One batch: one cache lock for all the messages run over, new text tokenised together.
    let spellings = match &memory {
        Some(m) => Some(&*m.spellings),
        None => input.spellings,
    };
    let counts = match spellings {
        Some(s) => counter.messages_spelled(
            encoding,
            given,
            start,
            input
                .ids
                .map(|ids| (&ids[start..], &s.each[start..], &s.chained[start..])),
        ),
        None => counter.messages(encoding, given, input.ids),
    };
    let items: Vec<Item<'_>> = given
        .iter()
        .zip(&counts)
        .enumerate()
        .map(|(offset, (m, &tokens))| Item {
            msg: Msg::Borrowed(m),
            index: Some(start + offset),
            tokens,
            history: start + offset < history_end,
            placeholders: 0,
        })
        .collect();
    let mut work = Work {
        items,
        report: Report::default(),
        encoding,
        counter,
        ids: input.ids,
        given: input.messages,
        calls: Vec::new(),
        text_apart_from_calls: input.text_apart_from_calls,
    };
    let client_tools_tokens = json_tokens(input.client_tools.or(input.tools))
        + json_tokens(input.client_functions.or(input.functions));
    work.report.tokens_in = resumed.as_ref().map_or(0, |s| s.tokens_in())
        + work.messages_tokens()
        + REQUEST_OVERHEAD
        + client_tools_tokens;

    let policy = input.policy;
    if let Some(access) = input.tool_access.filter(|a| a.scrub_history) {
        tool_access::apply(&mut work, &access.offered);
    }
    if let Some(filter) = &policy.tool_filter {
        tool_filter::apply(&mut work, filter);
    }
    let window = policy
        .tool_call_window
        .as_ref()
        .map(|window| tool_window::apply(&mut work, window, policy.repair().unanswered_calls));
    if let Some(c) = &policy.compress_tool_output {
        compress::apply(&mut work, c);
    }
    let seen = memory.as_ref().map(|_| Seen {
        given_tokens: counts,
        links: segments::link_all(given),
        window,
    });
    Ok(Early {
        work,
        input,
        counter,
        tools_tokens,
        memory,
        seen,
    })
}

impl<'a> Early<'a> {
    /// The conversation as given to [`begin`].
    pub fn given(&self) -> &'a [Message] {
        self.input.messages
    }

    /// The conversation as steps 1–4 left it, in order, each message with its index in the
    /// conversation as given and its tokens (counted once, shared with the rest of the run).
    pub fn entries(&self) -> Vec<summary::Entry<'_>> {
        self.work
            .items
            .iter()
            .filter_map(|item| {
                Some(summary::Entry {
                    message: &item.msg,
                    index: item.index?,
                    tokens: item.tokens,
                })
            })
            .collect()
    }

    /// Whether this request may be given a stored summary that covers the conversation up to
    /// `covers_until` (an index into it) and folded in calls to `tools_seen` (`None`: not
    /// known). With `scrub_history` (SPEC 6), a summary that read the results of a tool this
    /// request's role may not use would carry them past the scrub; one whose tools are not
    /// known is judged by the history it covers (nothing scrubbed there).
    pub fn may_see_summary(&self, tools_seen: Option<&[String]>, covers_until: usize) -> bool {
        let Some(access) = self.input.tool_access.filter(|a| a.scrub_history) else {
            return true;
        };
        match tools_seen {
            Some(seen) => seen
                .iter()
                .all(|tool| tool_access::offers(&access.offered, tool)),
            None => !self
                .work
                .report
                .removed
                .iter()
                .any(|r| r.reason == RemoveReason::ToolAccess && r.index <= covers_until),
        }
    }

    /// Where this run took over from an earlier turn's settled start (see [`settled`]): the
    /// index of the first message it ran over; `None` when it runs over the whole conversation.
    pub fn resumed_from(&self) -> Option<usize> {
        self.memory.as_ref()?.resumed.as_ref().map(|s| s.end())
    }

    /// Whether a run that went on from an earlier turn's settled start may stand for a run
    /// over the whole conversation, as far as steps 1–4 tell (see [`settled`]): every result
    /// from the start on answers a call from there, and the window (if the start's calls
    /// reached it) cut after the start again.
    fn resumed_fits(&self) -> bool {
        let (Some(memory), Some(seen)) = (&self.memory, &self.seen) else {
            return false;
        };
        let Some(settled) = &memory.resumed else {
            return false;
        };
        let rest = &self.input.messages[settled.end()..];
        let linked = rest
            .iter()
            .zip(&seen.links)
            .all(|(m, link)| m.role != Role::Tool || link.is_some());
        let window_ok = !settled.window_calls() || seen.window.is_none_or(|w| w.found);
        linked && window_ok
    }

    /// Runs steps 5–7, applying `summary` (whose `covers_until` is an index into the
    /// conversation as given).
    ///
    /// Fails with [`Error::ContextLengthExceeded`] when the rewritten request is still larger
    /// than the model's context window (the upstream must then not be called).
    pub fn finish(self, summary: Option<&StoredSummary>) -> Result<Plan> {
        let resumed = self.memory.as_ref().and_then(|m| m.resumed.clone());
        if resumed.is_some() && summary.is_some() {
            return self.run_whole()?.finish(summary);
        }
        let Early {
            mut work,
            input,
            counter,
            tools_tokens,
            memory,
            seen,
        } = self;
        let policy = input.policy;
        if let Some(s) = summary {
            summary::apply(&mut work, s);
        }
        let repair = policy.repair();
        // What the budget did (`None`: there is none).
        let mut budgeted = None;
        if let Some(b) = &policy.token_budget {
            let window = input.model.context_window;
            let unanswered = repair.unanswered_calls;
            budgeted = match &resumed {
                // Over the whole, the budget keeps everything (`budget::keeps_all`) as it did
                // when the start was settled; otherwise the whole conversation is run after all.
                Some(settled) if !settled.budget_cut() => {
                    let fixed = REQUEST_OVERHEAD + tools_tokens;
                    let limit = b.limit(window);
                    settled
                        .budget_keeps_all(&work.items, limit, fixed)
                        .then_some(Budgeted::KeptAll)
                }
                // Over the whole, or from a start it dropped all but the instructions of: then
                // it must stop before it reaches into the start, as it did when the start was
                // settled.
                _ => {
                    let before = resumed.as_ref().map(|s| s.before()).unwrap_or_default();
                    let outcome =
                        budget::apply(&mut work, b, window, tools_tokens, unanswered, before);
                    Some(outcome).filter(|b| *b != Budgeted::ReachedBefore)
                }
            };
            if resumed.is_some() && budgeted.is_none() {
                let early = begin_at(input, counter, memory.map(Memory::whole))?;
                return early.finish(summary);
            }
        }
        // The start to remember, chosen before repair moves anything: where the budget left
        // all of it or all but its instructions.
        let start = resumed.as_ref().map_or(0, |s| s.end());
        let chosen = match &seen {
            Some(seen) if summary.is_none() => {
                settle_floor(budgeted.as_ref(), start, input, &work.items)
                    .and_then(|floor| settled_end(input.messages, start, seen, &work.items, floor))
            }
            _ => None,
        };
        repair::apply(&mut work, &repair);
        work.settle_report();
        if let (Some(memory), Some(seen), Some(end)) = (&memory, &seen, chosen) {
            let extension = settled::Extension {
                items: &work.items,
                report: &work.report,
                calls: &work.calls,
                given_tokens: &seen.given_tokens,
                budget_tokens: end.budget_tokens,
                first_droppable: end.first_droppable,
                window_cut: seen.window.is_some_and(|w| w.found),
                budget_cut: matches!(budgeted, Some(Budgeted::Cut { .. })),
                newest_droppable: budgeted
                    .as_ref()
                    .and_then(|b| b.newest_dropped_before(end.at)),
            };
            let turn_len = input.messages.len();
            let next = settled::extend(resumed.as_deref(), start, end.at, turn_len, extension);
            if let (Some(next), Some(last)) = (next, input.ids.and_then(<[MessageId]>::last)) {
                memory.remember(counter, input.model.encoding, last, next);
            }
        }

        let before = resumed.as_ref().map_or(0, |s| s.tokens_out());
        if let Some(settled) = &resumed {
            settled.prepend_report(&mut work.report, &mut work.calls);
        }
        let tokens_out = before + work.messages_tokens() + REQUEST_OVERHEAD + tools_tokens;
        work.report.tokens_out = tokens_out;
        if tokens_out > input.model.context_window {
            return Err(Error::ContextLengthExceeded {
                window: input.model.context_window,
                needed: tokens_out,
                param: crate::error::CONVERSATION_PARAM,
                report: Box::new(std::mem::take(&mut work.report)),
            });
        }
        let mut plan = work.into_plan();
        if let Some(settled) = &resumed {
            plan.put_in_front(settled.parts());
        }
        Ok(plan)
    }

    /// This run over the whole conversation (when it went on from a settled start that a
    /// later step cannot use).
    fn run_whole(self) -> Result<Early<'a>> {
        begin_at(self.input, self.counter, self.memory.map(Memory::whole))
    }

    /// Ends the run after steps 1–4, skipping summary, budget and repair: for a conversation
    /// that continues history only the upstream holds (a Responses `previous_response_id` the
    /// proxy does not know), where those steps would be blind (repair would drop the results of
    /// calls it cannot see) but a role's history scrub still applies to what the proxy sees.
    pub fn finish_without_history(self) -> Result<Plan> {
        if self.memory.as_ref().is_some_and(|m| m.resumed.is_some()) {
            return self.run_whole()?.finish_without_history();
        }
        let Early {
            mut work,
            tools_tokens,
            ..
        } = self;
        work.settle_report();
        work.report.tokens_out = work.messages_tokens() + REQUEST_OVERHEAD + tools_tokens;
        Ok(work.into_plan())
    }
}

/// How far a start settled after this run may reach, as far as the budget tells (`None`: not
/// at all). Everything, when it kept everything or there is none. When it cut, there must be
/// dropped history between the start and the kept history, as much as the next turn's cut may
/// move back: by what this current turn costs (once history, it may be shortened), the segment
/// the budget stopped at, and a sixteenth of the budget (for a call leaving the window). Short
/// of that much after `start`, the start stays where it is.
fn settle_floor(
    budgeted: Option<&Budgeted>,
    start: usize,
    input: PipelineInput<'_>,
    items: &[Item<'_>],
) -> Option<usize> {
    match budgeted {
        None | Some(Budgeted::KeptAll) => Some(usize::MAX),
        Some(cut @ Budgeted::Cut { .. }) => {
            let limit = input
                .policy
                .token_budget
                .map_or(0, |b| b.limit(input.model.context_window));
            let current: u64 = items.iter().filter(|i| !i.history).map(|i| i.tokens).sum();
            let stopped_at = cut.newest_dropped_before(usize::MAX).unwrap_or(0);
            Some(
                cut.dropped_beyond(current + stopped_at + limit / 16)
                    .unwrap_or(start),
            )
        }
        Some(Budgeted::Reached | Budgeted::ReachedBefore) => None,
    }
}

/// Where a run that started at `start` can end a settled start (see [`settled::choose_end`]),
/// with what the budget saw of it: chosen after the budget, before repair moves anything.
fn settled_end(
    messages: &[Message],
    start: usize,
    seen: &Seen,
    items: &[Item<'_>],
    budget_floor: usize,
) -> Option<SettledEnd> {
    let history_end = current_turn_start(messages);
    let links = &seen.links;
    // A start holds no changed message (see `settled.rs`): it ends at the first, if not before.
    let changed = items
        .iter()
        .filter(|i| !i.msg.is_borrowed())
        .filter_map(|i| i.index)
        .min()
        .unwrap_or(usize::MAX);
    let floor = budget_floor.min(changed);
    let at = settled::choose_end(messages, start, history_end, seen.window, links, floor)?;
    let budget_tokens = items
        .iter()
        .filter(|i| i.index.is_some_and(|x| x < at))
        .map(|i| i.tokens)
        .sum();
    Some(SettledEnd {
        at,
        budget_tokens,
        first_droppable: budget::first_droppable(items),
    })
}

/// The end of a start to settle, and what the budget saw (see [`settled::Extension`]).
struct SettledEnd {
    at: usize,
    budget_tokens: u64,
    first_droppable: Option<(usize, bool)>,
}

impl Plan {
    /// Puts a settled start's parts in front of this plan's (which begin after it).
    fn put_in_front<'s>(&mut self, front: impl Iterator<Item = &'s Range<usize>>) {
        let mut parts: Vec<Part> = Vec::with_capacity(front.size_hint().0 + self.parts.len());
        let rest = std::mem::take(&mut self.parts);
        let front = front.map(|run| Part::Kept(run.clone()));
        for part in front.chain(rest) {
            match (parts.last_mut(), part) {
                // One run across a join, as a run over the whole would have it.
                (Some(Part::Kept(last)), Part::Kept(run)) if run.start == last.end => {
                    last.end = run.end
                }
                (_, part) => parts.push(part),
            }
        }
        self.parts = parts;
    }
}

impl Work<'_> {
    /// The finished run as a [`Plan`] over the conversation as given.
    fn into_plan(self) -> Plan {
        let mut parts: Vec<Part> = Vec::new();
        for item in self.items {
            match (item.msg, item.index) {
                (Msg::Borrowed(_), Some(p)) => match parts.last_mut() {
                    Some(Part::Kept(run)) if run.end == p => run.end += 1,
                    _ => parts.push(Part::Kept(p..p + 1)),
                },
                (Msg::Borrowed(m), None) => parts.push(Part::Made(Box::new(m.clone()))),
                (Msg::Owned(m), _) => parts.push(Part::Made(m)),
            }
        }
        Plan {
            parts,
            report: self.report,
            calls: self.calls,
        }
    }
}
