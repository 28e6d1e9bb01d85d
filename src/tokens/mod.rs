//! Token counting as SPEC 5.1 defines it: a per-message formula over the model's encoding, a
//! request total, and a process-wide cache of per-message counts so a long conversation is not
//! re-tokenised on every turn.
//!
//! The formula for one message:
//! `3 + tokens(role) + tokens(text of content) + 765 × non-text parts
//!  + (name ? 1 + tokens(name) : 0)
//!  + Σ tool_calls (3 + tokens(function.name) + tokens(function.arguments))
//!  + (tool_call_id ? tokens(tool_call_id) : 0)`;
//! a request is the sum plus 3, plus the tokens of the `tools` JSON when given.
//!
//! Besides the per-message counts, the counter remembers the counts of a whole conversation by
//! the chained id of its last message: turn N+1 then copies the first N counts in one piece and
//! looks up only the new messages, so a warm turn's counting does not grow with N.

pub mod bpe;
pub mod cache;
pub mod encoding;
pub mod models;
pub mod pretokenize;
pub mod vocab;

use std::sync::Arc;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::conversation::{Message, MessageId};

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
    /// The counts of whole conversations, by the id of their last message; weighed by length.
    prefixes: Memo<Arc<[u64]>>,
}

/// A tool result as `compress_tool_output` shortened it, remembered per (encoding, message id,
/// limit) so a long conversation's old results are not compressed again on every turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compressed {
    pub text: String,
    /// Tokens of the original content text.
    pub tokens_before: u64,
    /// Tokens of `text`.
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
            prefixes: Memo::weighted(capacity, |counts| counts.len()),
        }
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
        if let Some(n) = self.cache.get(encoding, id) {
            return n;
        }
        // Tokenise outside any lock; two threads racing on one id both store the same number.
        let n = message_tokens(encoding, message);
        self.cache.insert(encoding, id, n);
        n
    }

    /// Tokens of the request's `tools` JSON (compact serialisation). Cached by content, since a
    /// client sends the same tools array on every turn.
    pub fn tools(&self, encoding: Encoding, tools: &Value) -> u64 {
        let json = serde_json::to_string(tools).unwrap_or_default();
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
        // The counts of an earlier turn of this conversation, in one piece.
        let mut counts: Vec<u64> = Vec::with_capacity(messages.len());
        if let Some(known) = ids.and_then(|ids| self.known_prefix(encoding, ids)) {
            counts.extend_from_slice(&known);
        }
        let start = counts.len();
        if start == messages.len() {
            return counts; // the same conversation again
        }
        let cached = match ids {
            Some(ids) => self.cache.get_many(encoding, &ids[start..]),
            None => vec![None; messages.len()],
        };
        let missing: Vec<usize> = (start..messages.len())
            .filter(|&p| cached[p - start].is_none())
            .collect();
        let fresh = count_many(encoding, messages, &missing);
        if let Some(ids) = ids {
            self.cache.insert_many(
                encoding,
                missing.iter().zip(&fresh).map(|(&p, &n)| (ids[p], n)),
            );
        }
        counts.extend(cached.into_iter().map(|c| c.unwrap_or(0)));
        for (&p, n) in missing.iter().zip(fresh) {
            counts[p] = n;
        }
        if let Some(last) = ids
            .filter(|ids| ids.len() >= PREFIX_MIN_MESSAGES)
            .and_then(<[_]>::last)
        {
            self.prefixes
                .insert(encoding, last, Arc::from(counts.as_slice()));
        }
        counts
    }

    /// The remembered counts of the longest earlier conversation that `ids` continues (it ends
    /// at one of the last [`PREFIX_PROBES`] ids), if any. A chained id fixes every message
    /// before it, so those counts are this conversation's too.
    fn known_prefix(&self, encoding: Encoding, ids: &[MessageId]) -> Option<Arc<[u64]>> {
        if ids.len() < PREFIX_MIN_MESSAGES {
            return None;
        }
        let oldest = ids.len().saturating_sub(PREFIX_PROBES);
        (oldest..ids.len()).rev().find_map(|end| {
            self.prefixes
                .get(encoding, &ids[end])
                .filter(|counts| counts.len() == end + 1)
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
    content
        + m.tool_calls()
            .iter()
            .map(|c| c.arguments().len())
            .sum::<usize>()
}

/// The SPEC 5.1 cost of one message, tokenised now.
pub fn message_tokens(encoding: Encoding, m: &Message) -> u64 {
    let mut n = MESSAGE_OVERHEAD + encoding.count(m.role.as_str());
    n += content_tokens(encoding, m.content.as_ref());
    if let Some(name) = &m.name {
        n += 1 + encoding.count(name);
    }
    for call in m.tool_calls() {
        n += TOOL_CALL_OVERHEAD + encoding.count(call.name()) + encoding.count(call.arguments());
    }
    if let Some(id) = &m.tool_call_id {
        n += encoding.count(id);
    }
    n
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
/// untyped part with a `text` string); `None` for images, audio, files and the like.
pub fn part_text(part: &Value) -> Option<&str> {
    match part.get("type").and_then(Value::as_str) {
        Some("text" | "input_text" | "output_text") | None => {
            part.get("text").and_then(Value::as_str)
        }
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
        let json_len = tools.to_string().chars().count() as u64;
        assert_eq!(
            c.request(e, std::slice::from_ref(&m), None, Some(&tools)),
            message_tokens(e, &m) + 3 + json_len.div_ceil(4)
        );
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
