//! A long conversation's settled start, remembered from one turn to the next, so that a turn
//! costs what is new in it and not what the whole conversation holds (#4).
//!
//! Turn N+1 of a conversation is turn N's messages and a few more. The start of it is settled
//! when the pipeline must treat it on every later turn as it did on this one. That holds for
//! the messages before a history `user` message at `end` when:
//! - no result at or after `end` answers a call before it (results belong to the nearest call
//!   before them with their id, so later messages never change that);
//! - the tool-call window (if any) has cut after `end`: every history call before `end` was
//!   removed by it, and a later turn's window, which must find its `max` calls after `end`
//!   again (checked), removes them too; with no call before `end`, there is nothing to cut;
//! - the budget (if any) drops with `unanswered_calls: drop` and either kept everything (a
//!   later turn checks that it keeps everything again, with the start's tokens remembered) or
//!   stopped at a segment after `end`, dropping all of the start but its instructions (a later
//!   turn checks that it stops before reaching into the start again: what comes after `end`,
//!   the start's instructions counted, leaves no room for the start's newest segment);
//! - no summary is in the policy.
//!
//! Every other step decides per message or per call, and repair only looks at a call and its
//! results, so the start comes out the same. A later turn then runs the pipeline over the
//! messages from `end` on only, checks the conditions above on what it finds there, and joins
//! the remembered outcome of the start (the runs of it sent, its part of the report, its
//! tokens) in front;
//! when a check fails, it runs over the whole conversation instead. Property tests compare the
//! two runs (`tests/pipeline_settled.rs`).
//!
//! The key is the conversation's last message's chained id, with the spelling and form of
//! every message (see `tokens::spelling`: what the id leaves out but the rewrite passes on or
//! decides by) and everything else the start's outcome depends on (the policy, the tools the
//! role may use, how the wire sends text and calls): a later turn finds it among its last few
//! ids, as the token counter finds a conversation's counts. A start holds no message, only
//! positions into the conversation each turn sends, so nothing of one request reaches another.

use std::borrow::Cow;
use std::hash::{BuildHasher, Hash, Hasher};
use std::ops::Range;
use std::sync::Arc;

use crate::conversation::{Message, MessageId, Role};
use crate::tokens::{Encoding, Spellings, TokenCounter};

use super::PipelineInput;
use super::report::{CallChange, Compressed, Removed, Repaired, Report};
use super::tool_window::WindowCut;
use super::work::Item;

/// Shorter conversations are run whole: there is little to spare.
const MIN_MESSAGES: usize = 16;

/// A start shorter than this is not remembered: it would spare less than the remembering
/// costs.
const MIN_START: usize = 16;

/// How many of its last ids a conversation looks up for an earlier turn's settled start (a
/// turn adds a handful of messages).
const PROBES: usize = 16;

/// The remembered outcome for the start `..end` of a conversation.
#[derive(Debug)]
pub struct Settled {
    /// Length of the conversation it was remembered for (its last message is the key).
    turn_len: usize,
    /// The start is the messages before this index, a history `user` message.
    end: usize,
    /// The start's plan and report, oldest first: shared with the earlier turns' starts this
    /// one grew from, then what was added since (copied from turn to turn, so kept short).
    shared: Arc<Outcome>,
    recent: Outcome,
    placeholders: u64,
    /// Tokens of the start as given.
    tokens_in: u64,
    /// Tokens of what the budget left of the start (all of it after steps 1–4, or its
    /// instructions when `budget_cut`).
    budget_tokens: u64,
    /// Tokens of the start as sent.
    tokens_out: u64,
    /// Whether the first segment the budget may drop starts with a `user` message, when that
    /// segment is in the start.
    first_droppable: Option<bool>,
    /// Whether the window removed calls of the start: a later turn's window must then find
    /// its calls after `end`.
    window_calls: bool,
    /// Whether the budget dropped all of the start but its instructions (the budget did not
    /// reach it: it stopped at a segment after it). A later turn's budget must then stop after
    /// the start again, with `budget_tokens` (the instructions) counted as kept. Otherwise it
    /// kept everything, and must keep everything again.
    budget_cut: bool,
    /// With `budget_cut`: the cost of the start's newest segment the budget may drop (`None`:
    /// there is none), which a later turn's budget must find too large again.
    newest_droppable: Option<u64>,
}

/// What the pipeline made of some messages of a start: the runs of them it sends (as given:
/// a start holds no message the pipeline changed, so nothing of an earlier turn's messages is
/// kept, only positions) and its report's entries, in order.
#[derive(Debug, Clone, Default)]
struct Outcome {
    parts: Vec<Range<usize>>,
    removed: Vec<Removed>,
    compressed: Vec<Compressed>,
    repaired: Vec<Repaired>,
    calls: Vec<CallChange>,
}

/// Past this weight, the recent part of a start is folded into its shared part.
const RECENT_MAX: usize = 64;

impl Outcome {
    fn weight(&self) -> usize {
        self.parts.len() + self.removed.len() + self.repaired.len() + self.calls.len()
    }

    /// Appends `later`, the outcome of the messages right after these.
    fn append(&mut self, later: Outcome) {
        for part in later.parts {
            push_part(&mut self.parts, part);
        }
        self.removed.extend(later.removed);
        self.compressed.extend(later.compressed);
        self.repaired.extend(later.repaired);
        self.calls.extend(later.calls);
    }
}

/// Pushes the run `part`, joining it to the one before it when they meet.
fn push_part(parts: &mut Vec<Range<usize>>, part: Range<usize>) {
    match parts.last_mut() {
        Some(last) if last.end == part.start => last.end = part.end,
        _ => parts.push(part),
    }
}

impl Settled {
    /// The weight of an entry in the bounded memo: what it holds.
    pub fn weight(&self) -> usize {
        1 + self.shared.weight() + self.recent.weight()
    }

    pub(crate) fn end(&self) -> usize {
        self.end
    }

    pub(crate) fn tokens_in(&self) -> u64 {
        self.tokens_in
    }

    pub(crate) fn tokens_out(&self) -> u64 {
        self.tokens_out
    }

    pub(crate) fn window_calls(&self) -> bool {
        self.window_calls
    }

    pub(crate) fn budget_cut(&self) -> bool {
        self.budget_cut
    }

    /// The start as the budget of a later turn sees it, when `budget_cut`.
    pub(crate) fn before(&self) -> super::budget::Before {
        super::budget::Before {
            fixed: self.budget_tokens,
            newest_droppable: self.newest_droppable,
        }
    }

    pub(crate) fn parts(&self) -> impl Iterator<Item = &Range<usize>> {
        self.shared.parts.iter().chain(&self.recent.parts)
    }

    /// Whether the budget keeps every message of a conversation made of this start and
    /// `rest` (the working copy from `end` on), as `budget::keeps_all` would over the whole.
    pub(crate) fn budget_keeps_all(&self, rest: &[Item<'_>], limit: u64, fixed: u64) -> bool {
        let total: u64 = rest.iter().map(|i| i.tokens).sum();
        fixed + self.budget_tokens + total <= limit
            && self.first_droppable.unwrap_or_else(|| {
                super::budget::first_droppable(rest).is_none_or(|(_, user)| user)
            })
    }

    /// Puts the start's part of the report in front of `report` and `calls` (the rest's, whose
    /// indices all come after the start's).
    pub(crate) fn prepend_report(&self, report: &mut Report, calls: &mut Vec<CallChange>) {
        let (old, new) = (&*self.shared, &self.recent);
        in_front(&mut report.removed, &old.removed, &new.removed);
        in_front(&mut report.compressed, &old.compressed, &new.compressed);
        in_front(&mut report.repaired, &old.repaired, &new.repaired);
        in_front(calls, &old.calls, &new.calls);
        report.placeholders += self.placeholders;
    }
}

/// What a run needs to find and remember settled starts.
#[derive(Debug)]
pub(crate) struct Memory<'a> {
    /// Key variant of this conversation's last message: its spelling chain and a hash of
    /// everything else the outcome depends on.
    variant: u64,
    /// The earlier turn's start this run goes on from, if found.
    pub resumed: Option<Arc<Settled>>,
    /// The spellings of the conversation's messages (for the token counter too): the
    /// caller's, or made here.
    pub spellings: Cow<'a, Spellings>,
}

impl<'a> Memory<'a> {
    /// The memory of a run over `input`, with the settled start of an earlier turn when one is
    /// remembered; `None` when the input cannot have one (no ids, too short, a summary policy,
    /// a budget with placeholders).
    pub fn of(input: &PipelineInput<'a>, counter: &TokenCounter) -> Option<Memory<'a>> {
        let ids = input.ids?;
        let policy = input.policy;
        let placeholders = policy.repair().unanswered_calls != super::policy::UnansweredCalls::Drop;
        if input.messages.len() < MIN_MESSAGES
            || ids.len() != input.messages.len()
            || policy.summary.is_some()
            || input.summary.is_some()
            || (policy.token_budget.is_some() && placeholders)
        {
            return None;
        }
        let fingerprint = fingerprint(input);
        // (`begin` has set aside spellings not parallel to the messages.)
        let spellings = match input.spellings {
            Some(given) => Cow::Borrowed(given),
            None => Cow::Owned(Spellings::of(input.messages)),
        };
        let chain = &spellings.chained;
        let encoding = input.model.encoding;
        let n = ids.len();
        let resumed = (n.saturating_sub(PROBES)..n).rev().find_map(|k| {
            counter
                .settled()
                .get_variant(encoding, &ids[k], variant(fingerprint, chain[k]))
                .filter(|s| s.turn_len == k + 1)
        });
        Some(Memory {
            variant: variant(fingerprint, chain[n - 1]),
            resumed,
            spellings,
        })
    }

    /// This memory without the earlier start (the run goes over the whole conversation).
    pub fn whole(self) -> Memory<'a> {
        Memory {
            resumed: None,
            ..self
        }
    }

    /// Where the run starts: the end of the resumed start, or 0.
    pub fn start(&self) -> usize {
        self.resumed.as_ref().map_or(0, |s| s.end)
    }

    /// Remembers `settled` as the start of the conversation whose last id is `last`.
    pub fn remember(
        &self,
        counter: &TokenCounter,
        encoding: Encoding,
        last: &MessageId,
        settled: Settled,
    ) {
        counter
            .settled()
            .insert_variant(encoding, last, self.variant, Arc::new(settled));
    }
}

/// A hash of what a start's outcome depends on besides its messages.
fn fingerprint(input: &PipelineInput<'_>) -> u64 {
    let mut h = foldhash::quality::FixedState::with_seed(SEED).build_hasher();
    input.policy.fingerprint(&mut h);
    input.text_apart_from_calls.hash(&mut h);
    if let Some(access) = input.tool_access {
        access.scrub_history.hash(&mut h);
        let mut offered: Vec<&String> = access.offered.iter().collect();
        offered.sort_unstable();
        offered.hash(&mut h);
    }
    h.finish()
}

/// Any fixed seed: keys only live in this process's memory.
const SEED: u64 = 0x5e77_1ed5;

fn variant(fingerprint: u64, spelling: u64) -> u64 {
    foldhash::quality::FixedState::with_seed(SEED).hash_one((fingerprint, spelling))
}

/// The latest history `user` message from `start` on that can end a settled start: nothing at
/// or after it answers a call before it, it is not after the window's floor (see
/// [`WindowCut`]) nor after `budget_floor` (where the kept history starts when the budget cut),
/// it is in the history and at least [`MIN_START`] messages in. `links` are [`link_results`](super::segments::link_results) over the
/// messages from `start` on, positions relative to `start`.
pub(crate) fn choose_end(
    given: &[Message],
    start: usize,
    history_end: usize,
    window: Option<WindowCut>,
    links: &[Option<(usize, usize)>],
    budget_floor: usize,
) -> Option<usize> {
    let floor = window.map_or(usize::MAX, |w| w.floor).min(budget_floor);
    let mut oldest_answered = usize::MAX;
    for q in (start..given.len()).rev() {
        if let Some(Some((owner, _))) = links.get(q - start) {
            oldest_answered = oldest_answered.min(start + owner);
        }
        if q < MIN_START {
            return None; // not worth remembering, nor any earlier one
        }
        if q < history_end && q <= floor && oldest_answered >= q && given[q].role == Role::User {
            return Some(q);
        }
    }
    None
}

/// What the run over the messages from `start` on adds to a start that now ends at `end`.
pub(crate) struct Extension<'w, 'a> {
    /// The working copy after repair (from `start` on).
    pub items: &'w [Item<'a>],
    /// Its report, settled (indices from `start` on), and call changes.
    pub report: &'w Report,
    pub calls: &'w [CallChange],
    /// Tokens of the messages from `start` on as given.
    pub given_tokens: &'w [u64],
    /// Tokens the budget saw of the messages in `start..end`.
    pub budget_tokens: u64,
    /// The budget's first droppable segment in this run.
    pub first_droppable: Option<(usize, bool)>,
    /// Whether the window removed calls in this run.
    pub window_cut: bool,
    /// Whether the budget stopped after the start in this run, dropping all of it but its
    /// instructions.
    pub budget_cut: bool,
    /// Then: the cost of the newest segment it dropped in `start..end`, if any.
    pub newest_droppable: Option<u64>,
}

/// The settled start `..end` of a conversation of `turn_len` messages: `earlier` (if the run
/// went on from one) followed by what the run over the rest did to `start..end`. `None` when
/// the working copy does not split cleanly at `end` (it always should, by the choice of
/// `end`; the check keeps a surprise from being remembered), or when the pipeline changed or
/// made a message before `end` (repair may, after `end` was chosen).
pub(crate) fn extend(
    earlier: Option<&Settled>,
    start: usize,
    end: usize,
    turn_len: usize,
    run: Extension<'_, '_>,
) -> Option<Settled> {
    let split = run
        .items
        .iter()
        .position(|i| i.index.is_some_and(|x| x >= end))
        .unwrap_or(run.items.len());
    if run.items[split..]
        .iter()
        .any(|i| i.index.is_some_and(|x| x < end))
    {
        return None;
    }
    let head = &run.items[..split];
    let mut fresh = Outcome::default();
    for item in head {
        // A message the pipeline changed or made is not remembered (see `Outcome`).
        let (true, Some(p)) = (item.msg.is_borrowed(), item.index) else {
            return None;
        };
        push_part(&mut fresh.parts, p..p + 1);
    }
    let report = run.report;
    fresh.removed = before(&report.removed, |r| r.index, end);
    fresh.compressed = before(&report.compressed, |c| c.index, end);
    fresh.repaired = before(&report.repaired, |r| r.index, end);
    fresh.calls = before(run.calls, |c| c.index, end);
    let (shared, recent) = match earlier {
        None => (Arc::new(fresh), Outcome::default()),
        Some(e) => {
            let mut recent = e.recent.clone();
            recent.append(fresh);
            if recent.weight() <= RECENT_MAX {
                (e.shared.clone(), recent)
            } else {
                let mut all = (*e.shared).clone();
                all.append(recent);
                (Arc::new(all), Outcome::default())
            }
        }
    };
    let given_tokens: u64 = run.given_tokens[..end - start].iter().sum();
    Some(Settled {
        turn_len,
        end,
        shared,
        recent,
        placeholders: earlier.map_or(0, |e| e.placeholders)
            + head.iter().map(|i| u64::from(i.placeholders)).sum::<u64>(),
        tokens_in: earlier.map_or(0, |e| e.tokens_in) + given_tokens,
        budget_tokens: earlier.map_or(0, |e| e.budget_tokens) + run.budget_tokens,
        tokens_out: earlier.map_or(0, |e| e.tokens_out)
            + head.iter().map(|i| i.tokens).sum::<u64>(),
        first_droppable: earlier.and_then(|e| e.first_droppable).or(run
            .first_droppable
            .filter(|&(index, _)| index < end)
            .map(|(_, user)| user)),
        window_calls: earlier.is_some_and(|e| e.window_calls) || run.window_cut,
        budget_cut: run.budget_cut,
        newest_droppable: run
            .newest_droppable
            .or(earlier.and_then(|e| e.newest_droppable)),
    })
}

/// The entries of `list` about messages before `end`.
fn before<T: Clone>(list: &[T], index: impl Fn(&T) -> usize, end: usize) -> Vec<T> {
    list.iter().filter(|x| index(x) < end).cloned().collect()
}

/// Puts `old` then `new` in front of `list`.
fn in_front<T: Clone>(list: &mut Vec<T>, old: &[T], new: &[T]) {
    let mut joined = Vec::with_capacity(old.len() + new.len() + list.len());
    joined.extend_from_slice(old);
    joined.extend_from_slice(new);
    joined.append(list);
    *list = joined;
}
