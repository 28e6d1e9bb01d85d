//! Token counting as SPEC 5.1 defines it: a per-message formula over the model's encoding, a
//! request total, and a process-wide cache of per-message counts so a long conversation is not
//! re-tokenised on every turn.
//!
//! The formula for one message:
//!
//! ```text
//! 3 + tokens(role) + tokens(text of content) + 765 × non-text parts + tokens(refusal)
//!   + (name ? 1 + tokens(name) : 0)
//!   + Σ tool_calls and a legacy function_call (3 + tokens(name) + tokens(arguments))
//!   + (tool_call_id ? tokens(tool_call_id) : 0)
//! ```
//!
//! A request is the sum plus 3, plus the tokens of the `tools` JSON (and of chat's deprecated
//! `functions`) when given. Everything that goes upstream is counted: the budget and the context
//! window check see only what is counted.
//!
//! Besides the per-message counts, the counter remembers the counts of a whole conversation by
//! the chained id of its last message: turn N+1 then copies the first N counts in one piece and
//! looks up only the new messages, so a warm turn's counting does not grow with N.
//!
//! Counts must be exact for what is sent, but a message id deliberately names some messages
//! alike whose tokens differ: it hashes call arguments that are JSON normalised (so a client
//! that re-serialises them continues its conversation). The cache is shared by every tenant,
//! so its key adds a fast hash of those raw strings ([`spelling`]): whichever spelling comes
//! first cannot set the count of the others.

pub mod bpe;
pub mod cache;
pub mod encoding;
pub mod models;
pub mod pretokenize;
pub mod vocab;

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Arc, LazyLock};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::conversation::{Message, MessageId, Role, ToolCall};

pub use cache::{CountCache, Memo};
pub use encoding::Encoding;
pub use models::{ModelEntry, ModelFacts, ModelOverrides, ModelTable};

/// The flat cost of one non-text content part (image, audio, file).
pub const NON_TEXT_PART_TOKENS: u64 = 765;
/// The per-message overhead of the chat format.
pub const MESSAGE_OVERHEAD: u64 = 3;
/// The per-request overhead (the primed assistant reply).
pub const REQUEST_OVERHEAD: u64 = 3;
/// The per-call overhead of a tool call.
pub const TOOL_CALL_OVERHEAD: u64 = 3;

const DEFAULT_CAPACITY: usize = 200_000;

/// Conversations shorter than this are looked up message by message only: their whole counts
/// are not worth remembering.
const PREFIX_MIN_MESSAGES: usize = 16;

/// How many of a conversation's last messages may end the one counted on an earlier turn: a
/// turn adds a reply (with any tool calls and results) and a new message, rarely more.
const PREFIX_PROBES: usize = 16;

/// Counts tokens and remembers per-message counts. One per process, shared by every request
/// (it is `Sync`); cheap to call from many threads.
pub struct TokenCounter {
    cache: CountCache,
    compressed: Memo<Arc<Compressed>>,
    /// The counts of conversations (or of their messages from some index on, the first
    /// element), by the id of their last message; weighed by length.
    prefixes: Memo<(usize, Arc<[u64]>)>,
    /// The pipeline's settled starts of conversations, by the id of their last message (see
    /// `context::settled`); weighed by what they hold.
    settled: Memo<Arc<crate::context::settled::Settled>>,
}

/// A tool result as `compress_tool_output` shortened it, remembered per (encoding, message id,
/// limit) so a long conversation's old results are not compressed again on every turn.
///
/// One id names a string content and a content of text parts with the same text alike, so
/// this holds nothing of the content's shape: the shortened content is made from the message's
/// own content and this (see `context::compress`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compressed {
    /// The text of the content (a string, or its text parts joined) shortened; `None` when the
    /// content has no text part.
    pub text: Option<String>,
    /// How many of the content's non-text parts are kept, from the first; the others are
    /// replaced by a text part naming what was omitted.
    pub kept_non_text: usize,
    /// Tokens of the original content.
    pub tokens_before: u64,
    /// Tokens of the shortened content.
    pub tokens_after: u64,
}

impl Default for TokenCounter {
    fn default() -> Self {
        Self::new()
    }
}

impl TokenCounter {
    /// A counter whose cache holds about 200 000 message counts (a few MB).
    pub fn new() -> Self {
        Self::with_capacity(DEFAULT_CAPACITY)
    }

    /// A counter whose cache keeps at least `capacity` recent message counts.
    pub fn with_capacity(capacity: usize) -> Self {
        TokenCounter {
            cache: CountCache::new(capacity),
            // Compressed results are larger than counts and rarer; a tenth of the entries.
            compressed: Memo::new(capacity / 10),
            // As many counts as the per-message cache (8 bytes each, a few MB at most).
            prefixes: Memo::weighted(capacity, |(_, counts)| counts.len()),
            settled: Memo::weighted(capacity, |s| s.weight()),
        }
    }

    /// Remembered settled starts of conversations (see `context::settled`).
    pub(crate) fn settled(&self) -> &Memo<Arc<crate::context::settled::Settled>> {
        &self.settled
    }

    /// Remembered compression results of tool messages.
    pub fn compressed(&self) -> &Memo<Arc<Compressed>> {
        &self.compressed
    }

    /// The cache, for inspection and for benchmarks that need it cold.
    pub fn cache(&self) -> &CountCache {
        &self.cache
    }

    /// Tokens of a plain string.
    pub fn text(&self, encoding: Encoding, text: &str) -> u64 {
        encoding.count(text)
    }

    /// Tokens of one message by the SPEC 5.1 formula, tokenising it now (no cache).
    pub fn message(&self, encoding: Encoding, message: &Message) -> u64 {
        message_tokens(encoding, message)
    }

    /// Tokens of one message whose chained id is `id`, from the cache when known.
    pub fn message_with_id(&self, encoding: Encoding, message: &Message, id: &MessageId) -> u64 {
        let variant = spelling(message);
        if let Some(n) = self.cache.get_variant(encoding, id, variant) {
            return n;
        }
        // Tokenise outside any lock; two threads racing on one key both store the same number.
        let n = message_tokens(encoding, message);
        self.cache.insert_variant(encoding, id, variant, n);
        n
    }

    /// Tokens of the request's `tools` JSON, written as Python's `json.dumps` writes it by
    /// default (SPEC 5.1 "the tokens of its JSON"). Cached by content, since a client sends the
    /// same tools array on every turn.
    pub fn tools(&self, encoding: Encoding, tools: &Value) -> u64 {
        let json = crate::conversation::dumps::python_dumps_ascii(tools);
        let mut h = Sha256::new();
        h.update(b"ctxproxy tools\0");
        h.update(json.as_bytes());
        let key = MessageId(h.finalize().into());
        if let Some(n) = self.cache.get(encoding, &key) {
            return n;
        }
        let n = encoding.count(&json);
        self.cache.insert(encoding, &key, n);
        n
    }

    /// Tokens of each message of a conversation, parallel to `messages`. With `ids` (parallel to
    /// `messages`), known messages come from the cache in one batch and only the others are
    /// tokenised (then remembered); without, every message is tokenised. A large amount of new
    /// text is tokenised on several threads.
    pub fn messages(
        &self,
        encoding: Encoding,
        messages: &[Message],
        ids: Option<&[MessageId]>,
    ) -> Vec<u64> {
        let ids = ids.filter(|ids| ids.len() == messages.len());
        // Each message's key is its id and its spelling; a prefix's, its last id and the
        // spellings of all its messages chained.
        let spelled = ids.map(|_| Spellings::of(messages));
        let keys = ids
            .zip(spelled.as_ref())
            .map(|(ids, s)| (ids, &s.each[..], &s.chained[..]));
        self.messages_spelled(encoding, messages, 0, keys)
    }

    /// [`messages`](Self::messages) with the spellings already made, for the messages of a
    /// conversation from index `from` on: `keys` holds, parallel to `messages`, their ids,
    /// their spellings and the conversation's spellings chained (see [`Spellings`]).
    pub fn messages_spelled(
        &self,
        encoding: Encoding,
        messages: &[Message],
        from: usize,
        keys: Option<(&[MessageId], &[u64], &[u64])>,
    ) -> Vec<u64> {
        let n = messages.len();
        let keys = keys
            .filter(|(ids, each, chained)| ids.len() == n && each.len() == n && chained.len() == n);
        let ids = keys.map(|(ids, _, _)| ids);
        let (spellings, chained): (&[u64], &[u64]) = match keys {
            Some((_, each, chained)) => (each, chained),
            None => (&[], &[]),
        };
        // The counts of an earlier turn of this conversation, in one piece.
        let mut counts: Vec<u64> = Vec::with_capacity(messages.len());
        if let Some((at, known)) =
            ids.and_then(|ids| self.known_prefix(encoding, ids, chained, from))
        {
            counts.extend_from_slice(&known[at..]);
        }
        let start = counts.len();
        if start == messages.len() {
            return counts; // the same conversation again
        }
        let cached = match ids {
            Some(ids) => self
                .cache
                .get_many(encoding, &ids[start..], &spellings[start..]),
            None => vec![None; messages.len()],
        };
        let missing: Vec<usize> = (start..messages.len())
            .filter(|&p| cached[p - start].is_none())
            .collect();
        let fresh = count_many(encoding, messages, &missing);
        if let Some(ids) = ids {
            self.cache.insert_many(
                encoding,
                missing
                    .iter()
                    .zip(&fresh)
                    .map(|(&p, &n)| (ids[p], spellings[p], n)),
            );
        }
        counts.extend(cached.into_iter().map(|c| c.unwrap_or(0)));
        for (&p, n) in missing.iter().zip(fresh) {
            counts[p] = n;
        }
        if let Some((last, &variant)) = ids
            .filter(|ids| ids.len() >= PREFIX_MIN_MESSAGES)
            .and_then(<[_]>::last)
            .zip(chained.last())
        {
            self.prefixes.insert_variant(
                encoding,
                last,
                variant,
                (from, Arc::from(counts.as_slice())),
            );
        }
        counts
    }

    /// The remembered counts of the longest earlier conversation that `ids` continues (it ends
    /// at one of the last [`PREFIX_PROBES`] ids, with the same spellings up to there), if any,
    /// with where in them the messages from `from` start. A chained id fixes every message
    /// before it (up to the spelling of its arguments, which `chained` fixes), so those counts
    /// are this conversation's too; remembered from an index at or before `from`, they cover
    /// the messages from `from` on.
    fn known_prefix(
        &self,
        encoding: Encoding,
        ids: &[MessageId],
        chained: &[u64],
        from: usize,
    ) -> Option<(usize, Arc<[u64]>)> {
        if ids.len() < PREFIX_MIN_MESSAGES {
            return None;
        }
        let oldest = ids.len().saturating_sub(PREFIX_PROBES);
        (oldest..ids.len()).rev().find_map(|end| {
            let (start, counts) = self
                .prefixes
                .get_variant(encoding, &ids[end], chained[end])?;
            (start <= from && start + counts.len() == from + end + 1)
                .then(|| (from - start, counts))
        })
    }

    pub fn request(
        &self,
        encoding: Encoding,
        messages: &[Message],
        ids: Option<&[MessageId]>,
        tools: Option<&Value>,
    ) -> u64 {
        let messages_total: u64 = self.messages(encoding, messages, ids).iter().sum();
        messages_total + REQUEST_OVERHEAD + tools.map_or(0, |t| self.tools(encoding, t))
    }
}

/// Below this much new text, tokenising on one thread beats handing work to the pool.
const PARALLEL_MIN_BYTES: usize = 64 * 1024;

/// The SPEC 5.1 counts of `messages[p]` for each `p` in `positions`, in that order.
fn count_many(encoding: Encoding, messages: &[Message], positions: &[usize]) -> Vec<u64> {
    let bytes: usize = positions.iter().map(|&p| text_bytes(&messages[p])).sum();
    if bytes < PARALLEL_MIN_BYTES || rayon::current_num_threads() < 2 {
        return positions
            .iter()
            .map(|&p| message_tokens(encoding, &messages[p]))
            .collect();
    }
    use rayon::prelude::*;
    positions
        .par_iter()
        .map(|&p| message_tokens(encoding, &messages[p]))
        .collect()
}

/// About how many bytes of text counting `m` tokenises (content strings and call arguments),
/// to decide whether a batch is worth spreading over threads.
fn text_bytes(m: &Message) -> usize {
    let content = match &m.content {
        Some(Value::String(s)) => s.len(),
        Some(Value::Array(parts)) => parts.iter().filter_map(part_text).map(str::len).sum(),
        _ => 0,
    };
    content + call_arguments(m).map(str::len).sum::<usize>() + refusal(m).map_or(0, str::len)
}

/// The SPEC 5.1 cost of one message, tokenised now.
pub fn message_tokens(encoding: Encoding, m: &Message) -> u64 {
    let mut n = MESSAGE_OVERHEAD;
    // An item the Responses mapping does not model is sent as it is, not as a message of a
    // role: its label is no text the model reads.
    if !m.role.is_item() {
        n += encoding.count(m.role.as_str());
    }
    n += content_tokens(encoding, m.content.as_ref());
    if let Some(text) = refusal(m) {
        n += encoding.count(text);
    }
    // An empty name is no name (and the message id, which ignores empty fields, agrees).
    if let Some(name) = m.name.as_deref().filter(|n| !n.is_empty()) {
        n += 1 + encoding.count(name);
    }
    for call in m.tool_calls() {
        n += TOOL_CALL_OVERHEAD + encoding.count(call.name()) + encoding.count(call.arguments());
    }
    if let Some((name, arguments)) = legacy_function_call(m) {
        n += TOOL_CALL_OVERHEAD + encoding.count(name) + encoding.count(arguments);
    }
    if let Some(id) = &m.tool_call_id {
        n += encoding.count(id);
    }
    n
}

/// The name and arguments of an assistant message's deprecated `function_call` (chat's one
/// call before `tool_calls`), kept in `extra`; a missing part is empty.
pub fn legacy_function_call(m: &Message) -> Option<(&str, &str)> {
    let call = m.extra.get("function_call")?.as_object()?;
    let text = |key: &str| call.get(key).and_then(Value::as_str).unwrap_or_default();
    Some((text("name"), text("arguments")))
}

/// An assistant message's `refusal` text, kept in `extra`.
fn refusal(m: &Message) -> Option<&str> {
    m.extra.get("refusal").and_then(Value::as_str)
}

/// The arguments of every call of `m`, its legacy `function_call` last.
fn call_arguments(m: &Message) -> impl Iterator<Item = &str> {
    m.tool_calls()
        .iter()
        .map(ToolCall::arguments)
        .chain(legacy_function_call(m).map(|(_, arguments)| arguments))
}

/// The process's seed for [`spelling`]: random, so that no one can make up two spellings that
/// collide.
static SPELLING_SEED: LazyLock<foldhash::fast::RandomState> = LazyLock::new(Default::default);

/// A fast hash of what a message's count and its rewrite depend on that its id leaves out, 0
/// when nothing: an assistant's `name`, the raw arguments of its calls (the id hashes JSON
/// arguments compacted, keys sorted, `\u` escapes decoded, `35.0` as `35`), the text of a
/// content that is neither a string nor parts (counted as serialised; the id hashes it with
/// sorted keys) or of an item the Responses mapping does not model (made from its fields in
/// their order; the id sorts them), and the message's form: how its content is cut into parts
/// and what those parts carry besides text, a null or empty `tool_calls`, what its calls carry
/// besides id, name and arguments, and its other fields (provider extras, `audio`, an item kept
/// whole). Everything else the count reads the id hashes as it is. Costs a pass over the
/// arguments and the small fields, not over the text.
#[inline]
pub fn spelling(m: &Message) -> u64 {
    // Most messages (user, tool, plain assistant text) have none of it: told from plain
    // fields first, since every message of a long conversation is asked on every turn.
    let plain_content = matches!(m.content, None | Some(Value::Null | Value::String(_)));
    if m.tool_calls.is_none()
        && m.name.is_none()
        && m.extra.is_empty()
        && plain_content
        && !matches!(m.role, Role::Other(_))
    {
        return 0;
    }
    spelling_of(m)
}

/// [`spelling`] of a message that may have something the id leaves out.
#[inline(never)]
fn spelling_of(m: &Message) -> u64 {
    let mut h = SPELLING_SEED.build_hasher();
    // The usual case left: an assistant message with calls and nothing else to it.
    if let Some(Some(calls)) = &m.tool_calls
        && !calls.is_empty()
        && m.name.is_none()
        && m.extra.is_empty()
        && m.role == Role::Assistant
        && matches!(m.content, None | Some(Value::Null | Value::String(_)))
        && calls.iter().all(plain_call)
    {
        for call in calls {
            call.arguments().hash(&mut h);
        }
        m.content.as_ref().map(std::mem::discriminant).hash(&mut h);
        return h.finish();
    }
    let loose = match &m.content {
        Some(Value::String(s)) if m.role.is_item() => Some(std::borrow::Cow::Borrowed(s.as_str())),
        // An item with media: its text part (the media parts are a count the id fixes).
        Some(Value::Array(parts)) if m.role.is_item() => parts
            .first()
            .and_then(|p| p.get("text"))
            .and_then(Value::as_str)
            .map(std::borrow::Cow::Borrowed),
        None | Some(Value::Null | Value::String(_) | Value::Array(_)) => None,
        Some(other) => Some(std::borrow::Cow::Owned(other.to_string())),
    };
    call_arguments(m).for_each(|a| a.hash(&mut h));
    loose.hash(&mut h);
    // The id leaves out an assistant's `name` (a framework's label on a resent reply); the
    // count does not.
    m.name.hash(&mut h);
    // The form: what the id leaves out or reads loosely (text parts joined, null and empty
    // fields dropped, provider extras, the fields of an item kept whole) but the rewrite
    // passes on or decides by (a `tool_calls: []` repair takes out, an `audio` that keeps a
    // message whose calls went). The text of the content is not read again: the id holds it.
    m.content.as_ref().map(std::mem::discriminant).hash(&mut h);
    if let Some(Value::Array(parts)) = &m.content {
        for part in parts {
            match part {
                Value::Object(fields) => {
                    for (key, value) in fields.iter().filter(|(k, _)| k.as_str() != "text") {
                        key.hash(&mut h);
                        hash_json(value, &mut h);
                    }
                    fields
                        .get("text")
                        .and_then(Value::as_str)
                        .map(str::len)
                        .hash(&mut h);
                }
                other => hash_json(other, &mut h),
            }
        }
    }
    match &m.tool_calls {
        None => 0u8.hash(&mut h),
        Some(None) => 1u8.hash(&mut h),
        Some(Some(calls)) => {
            2u8.hash(&mut h);
            calls.len().hash(&mut h);
            for call in calls.iter().filter(|c| !plain_call(c)) {
                call.kind.hash(&mut h);
                call.custom.is_some().hash(&mut h);
                for extra in [
                    Some(&call.extra),
                    call.function.as_ref().map(|f| &f.extra),
                    call.custom.as_ref().map(|c| &c.extra),
                ]
                .into_iter()
                .flatten()
                {
                    hash_map(extra, &mut h);
                }
            }
        }
    }
    hash_map(&m.extra, &mut h);
    match h.finish() {
        0 => 1, // 0 means "nothing": a message with something never spells 0
        v => v,
    }
}

/// Whether a call is a function call with nothing but its id, type `function`, name and
/// arguments (what the id reads of it and the arguments' spelling).
fn plain_call(call: &ToolCall) -> bool {
    call.extra.is_empty()
        && call.custom.is_none()
        && call.kind.as_deref().is_none_or(|k| k == "function")
        && call.function.as_ref().is_some_and(|f| f.extra.is_empty())
}

/// Hashes a JSON map's keys and values in their order.
fn hash_map(map: &serde_json::Map<String, Value>, h: &mut impl Hasher) {
    map.len().hash(h);
    for (key, value) in map {
        key.hash(h);
        hash_json(value, h);
    }
}

/// Hashes a JSON value as it would be written.
fn hash_json(value: &Value, h: &mut impl Hasher) {
    struct Into<'h, H>(&'h mut H);
    impl<H: Hasher> std::io::Write for Into<'_, H> {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.write(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    // Writing to a hasher cannot fail.
    let _ = serde_json::to_writer(Into(h), value);
    h.write_u8(0xff);
}

/// The spellings of a conversation's messages ([`spelling`]), each and chained: the chained
/// value at `p` fixes the spelling of every message up to `p`.
#[derive(Debug, Clone, Default)]
pub struct Spellings {
    pub each: Vec<u64>,
    pub chained: Vec<u64>,
}

impl Spellings {
    pub fn of(messages: &[Message]) -> Spellings {
        let mut spellings = Spellings::with_capacity(messages.len());
        for m in messages {
            spellings.push(m);
        }
        spellings
    }

    /// Room for `n` messages' spellings.
    pub fn with_capacity(n: usize) -> Spellings {
        Spellings {
            each: Vec::with_capacity(n),
            chained: Vec::with_capacity(n),
        }
    }

    /// Adds the spelling of the message after the last: for a caller that reads each message
    /// anyway (to make its wire JSON and id), so that the spellings come with the ids.
    pub fn push(&mut self, m: &Message) {
        let s = spelling(m);
        let before = self.chained.last().copied().unwrap_or(0);
        self.chained.push(chain_step(before, self.each.len(), s));
        self.each.push(s);
    }

    /// How many messages' spellings this holds.
    pub fn len(&self) -> usize {
        self.each.len()
    }

    pub fn is_empty(&self) -> bool {
        self.each.is_empty()
    }
}

/// One step of the spellings' chain: its value at `p`, from the one before it and the spelling
/// `s` of message `p`. The value at `p` fixes the spellings of every message up to `p`: each
/// spelling that is not 0 is mixed in with its position, and a 0 leaves the value as it was, so
/// that the many messages without calls cost nothing here (which positions hold a 0 is part of
/// what the value fixes, since each other position is mixed in). 0 as long as they are all 0: a
/// conversation without calls keys as it always did.
#[inline]
fn chain_step(before: u64, p: usize, s: u64) -> u64 {
    if s == 0 {
        before
    } else {
        SPELLING_SEED.hash_one((before, p, s))
    }
}

/// Tokens of a `content` value: the text of its text parts, plus a flat cost per other part.
pub fn content_tokens(encoding: Encoding, content: Option<&Value>) -> u64 {
    match content {
        None | Some(Value::Null) => 0,
        Some(Value::String(s)) => encoding.count(s),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            let mut non_text = 0u64;
            for p in parts {
                match part_text(p) {
                    Some(t) => text.push_str(t),
                    None => non_text += 1,
                }
            }
            encoding.count(&text) + non_text * NON_TEXT_PART_TOKENS
        }
        // Not a shape OpenAI accepts, but count what would be sent rather than nothing.
        Some(other) => encoding.count(&other.to_string()),
    }
}

/// The text of a text-like content part (`text`, `input_text`, `output_text`, `refusal`, or an
/// untyped part with a `text` string); `None` for images, audio, files and the like. A typed
/// text part without a text string is empty text, not an image (and the id takes it so).
pub fn part_text(part: &Value) -> Option<&str> {
    match part.get("type").and_then(Value::as_str) {
        Some("text" | "input_text" | "output_text") => {
            Some(part.get("text").and_then(Value::as_str).unwrap_or_default())
        }
        None => part.get("text").and_then(Value::as_str),
        Some("refusal") => part.get("refusal").and_then(Value::as_str),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::Role;
    use serde_json::json;

    fn msg(v: Value) -> Message {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn formula_adds_every_field() {
        let e = Encoding::Approximate;
        // role "assistant" = 3, args "{}" = 1, name "f" = 1, id "call_1" = 2
        let m = msg(json!({"role":"assistant","content":null,
            "tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]}));
        assert_eq!(message_tokens(e, &m), 3 + 3 + (3 + 1 + 1));
        let t = msg(json!({"role":"tool","tool_call_id":"call_1","content":"abcdefgh"}));
        assert_eq!(message_tokens(e, &t), 3 + 1 + 2 + 2);
        let u = msg(
            json!({"role":"user","name":"bob","content":[{"type":"text","text":"abcd"},
            {"type":"image_url","image_url":{"url":"x"}}]}),
        );
        assert_eq!(message_tokens(e, &u), 3 + 1 + 1 + 765 + (1 + 1));
    }

    #[test]
    fn request_adds_overhead_and_tools() {
        let c = TokenCounter::new();
        let e = Encoding::Approximate;
        let m = Message::text(Role::User, "abcd");
        let tools = json!([{"type":"function"}]);
        // SPEC 5.1 "the tokens of its JSON", as Python's `json.dumps(tools)` writes it.
        let json_len = r#"[{"type": "function"}]"#.chars().count() as u64;
        assert_eq!(
            c.request(e, std::slice::from_ref(&m), None, Some(&tools)),
            message_tokens(e, &m) + 3 + json_len.div_ceil(4)
        );
    }

    /// Python's `json.dumps(tools)` escapes what is not ASCII, and those escapes are what the
    /// tools cost.
    #[test]
    fn tools_cost_their_json_as_python_writes_it() {
        let c = TokenCounter::new();
        let e = Encoding::O200kBase;
        let tools =
            json!([{"type": "function", "function": {"name": "météo", "description": "東京"}}]);
        let python = r#"[{"type": "function", "function": {"name": "m\u00e9t\u00e9o", "description": "\u6771\u4eac"}}]"#;
        assert_eq!(c.tools(e, &tools), e.count(python));
        assert_ne!(e.count(python), e.count(&tools.to_string()));
    }

    #[test]
    fn next_turn_reuses_the_counts_of_the_last() {
        let c = TokenCounter::new();
        let e = Encoding::O200kBase;
        let values: Vec<Value> = (0..40)
            .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("message {i}")}))
            .collect();
        let messages: Vec<Message> = values
            .iter()
            .map(|v| serde_json::from_value(v.clone()).unwrap())
            .collect();
        let ids = crate::conversation::chain_ids(&values);
        let expected: Vec<u64> = messages.iter().map(|m| message_tokens(e, m)).collect();
        assert_eq!(
            c.messages(e, &messages[..30], Some(&ids[..30])),
            expected[..30]
        );
        // Forget the per-message counts: the next turn must find the first 30 in one piece.
        c.cache().clear();
        assert_eq!(c.messages(e, &messages, Some(&ids)), expected);
        assert_eq!(c.cache().len(), 10);
        // A different conversation with the same length is not taken for it.
        let mut other = messages.clone();
        other[5] = Message::text(Role::User, "edited");
        let other_values: Vec<Value> = other
            .iter()
            .map(|m| serde_json::to_value(m).unwrap())
            .collect();
        let other_ids = crate::conversation::chain_ids(&other_values);
        assert_eq!(
            c.messages(e, &other, Some(&other_ids))[5],
            message_tokens(e, &other[5])
        );
    }

    /// An assistant message calling `f` with `args`, as wire JSON.
    fn call_with(args: &str) -> Value {
        json!({"role":"assistant","content":null,"tool_calls":[
            {"id":"call_1","type":"function","function":{"name":"f","arguments":args}}]})
    }

    #[test]
    fn an_assistant_named_by_its_framework_is_counted_with_its_name() {
        let e = Encoding::O200kBase;
        let reply = json!({"role":"assistant","content":"It is sunny."});
        let named = json!({"role":"assistant","content":"It is sunny.","name":"weather_agent"});
        let id = crate::conversation::message_id(None, &reply);
        assert_eq!(
            id,
            crate::conversation::message_id(None, &named),
            "one message"
        );
        let c = TokenCounter::new();
        for v in [&reply, &named, &reply, &named] {
            let m = msg(v.clone());
            assert_eq!(c.message_with_id(e, &m, &id), message_tokens(e, &m));
        }
        assert!(message_tokens(e, &msg(named)) > message_tokens(e, &msg(reply)));
    }

    #[test]
    fn re_spelled_arguments_are_counted_as_spelled() {
        let e = Encoding::O200kBase;
        let compact = r#"{"city":"Tokyo","n":35}"#;
        let spaced = r#"{  "n" :  35.0 , "city" : "Tokyo" }"#;
        // A short conversation (counts per message) and a long one (counts per prefix too).
        for len in [3, 2 * PREFIX_MIN_MESSAGES] {
            let c = TokenCounter::new();
            let conversation = |args: &str| -> Vec<Value> {
                let mut v: Vec<Value> = (0..len - 2)
                    .map(|i| json!({"role":"user","content":format!("m{i}")}))
                    .collect();
                v.push(call_with(args));
                v.push(json!({"role":"tool","tool_call_id":"call_1","content":"sunny"}));
                v
            };
            let (a, b) = (conversation(compact), conversation(spaced));
            let ids = crate::conversation::chain_ids(&a);
            assert_eq!(ids, crate::conversation::chain_ids(&b), "one conversation");
            for wire in [&a, &b, &a, &b] {
                let messages: Vec<Message> = wire
                    .iter()
                    .map(|v| serde_json::from_value(v.clone()).unwrap())
                    .collect();
                let want: Vec<u64> = messages.iter().map(|m| message_tokens(e, m)).collect();
                assert_eq!(c.messages(e, &messages, Some(&ids)), want, "{len}");
                // The next turn, its prefix found in one piece.
                let mut longer = messages.clone();
                longer.push(Message::text(crate::conversation::Role::User, "next"));
                let mut longer_ids = ids.clone();
                longer_ids.push(MessageId([9; 32]));
                let counted = c.messages(e, &longer, Some(&longer_ids));
                assert_eq!(counted[..want.len()], want, "{len}");
            }
        }
        let (a, b) = (msg(call_with(compact)), msg(call_with(spaced)));
        assert!(message_tokens(e, &b) > message_tokens(e, &a));
        let c = TokenCounter::new();
        let id = crate::conversation::message_id(None, &call_with(compact));
        assert_eq!(c.message_with_id(e, &a, &id), message_tokens(e, &a));
        assert_eq!(c.message_with_id(e, &b, &id), message_tokens(e, &b));
    }

    #[test]
    fn legacy_calls_refusals_and_empty_names_count_as_sent() {
        let e = Encoding::Approximate;
        // role "assistant" = 3; name "f" = 1; arguments "{\"a\":1}" (7 chars) = 2.
        let legacy = msg(json!({"role":"assistant","content":null,
            "function_call":{"name":"f","arguments":"{\"a\":1}"}}));
        assert_eq!(message_tokens(e, &legacy), 3 + 3 + (3 + 1 + 2));
        // A refusal is text: "I can't." (8 chars) = 2.
        let refusal = msg(json!({"role":"assistant","content":null,"refusal":"I can't."}));
        assert_eq!(message_tokens(e, &refusal), 3 + 3 + 2);
        // An empty name is no name.
        let unnamed = msg(json!({"role":"user","name":"","content":"abcd"}));
        assert_eq!(message_tokens(e, &unnamed), 3 + 1 + 1);
        // An item the Responses mapping does not model: its text, no role.
        let mut item = Message::text(
            crate::conversation::Role::Other("item:web_search_call".into()),
            "abcd",
        );
        assert_eq!(message_tokens(e, &item), 3 + 1);
        item.content = None;
        assert_eq!(message_tokens(e, &item), 3);
    }

    #[test]
    fn re_spelled_legacy_calls_and_item_text_are_counted_as_spelled() {
        let e = Encoding::O200kBase;
        let c = TokenCounter::new();
        let legacy = |args: &str| {
            json!({"role":"assistant","content":null,
            "function_call":{"name":"f","arguments":args}})
        };
        let (a, b) = (legacy(r#"{"a":1}"#), legacy(r#"{ "a" : 1.0 }"#));
        let id = crate::conversation::message_id(None, &a);
        assert_eq!(id, crate::conversation::message_id(None, &b));
        for v in [a, b] {
            let m = msg(v);
            assert_eq!(c.message_with_id(e, &m, &id), message_tokens(e, &m));
        }
        // The text of an unmodelled item comes in its fields' order, which its id sorts.
        let id = MessageId([3; 32]);
        for text in ["rust\nlang", "lang\nrust and more"] {
            let m = Message::text(
                crate::conversation::Role::Other("item:web_search_call".into()),
                text,
            );
            assert_eq!(c.message_with_id(e, &m, &id), message_tokens(e, &m));
        }
    }

    #[test]
    fn cached_count_is_reused() {
        let c = TokenCounter::new();
        let m = Message::text(Role::User, "hello world");
        let id = MessageId([7; 32]);
        c.cache().insert(Encoding::O200kBase, &id, 999);
        assert_eq!(c.message_with_id(Encoding::O200kBase, &m, &id), 999);
        let other = MessageId([8; 32]);
        let n = c.message_with_id(Encoding::O200kBase, &m, &other);
        assert_eq!(n, c.message(Encoding::O200kBase, &m));
        assert_eq!(c.cache().get(Encoding::O200kBase, &other), Some(n));
    }
}
