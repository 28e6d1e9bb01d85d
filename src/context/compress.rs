//! Step 4, `compress_tool_output`: a history tool result over `max_tokens` is shortened to at
//! most `max_tokens`. JSON keeps its shape (scalars kept, long strings cut with `…`, long arrays
//! keep their ends around `"… (K more items)"`, deep containers collapse to `"…"`, and
//! `"_compressed": true` marks a top-level object); other text keeps its head and tail around
//! `\n…[K tokens omitted]…\n`. The JSON limits tighten level by level until the result fits;
//! top-level scalars are the last thing given up. The summariser reduces tool results with the
//! same function ([`compress`]).

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::policy::CompressToolOutput;
use super::report::Compressed;
use super::work::{Item, Work};
use crate::conversation::Message;
use crate::conversation::dumps::python_dumps;
use crate::tokens::{
    Compressed as CompressedText, Encoding, NON_TEXT_PART_TOKENS, content_tokens, message_tokens,
    part_text,
};

/// How hard one level squeezes JSON.
#[derive(Clone, Copy)]
struct Limits {
    /// Strings longer than this many chars are cut.
    string_chars: usize,
    /// Arrays longer than `2 * ends` keep this many items at each end.
    ends: usize,
    /// Containers deeper than this (top level = 1) collapse to `"…"`.
    depth: usize,
}

const LEVELS: &[Limits] = &[
    Limits {
        string_chars: 100,
        ends: 2,
        depth: 3,
    },
    Limits {
        string_chars: 60,
        ends: 2,
        depth: 3,
    },
    Limits {
        string_chars: 40,
        ends: 1,
        depth: 3,
    },
    Limits {
        string_chars: 40,
        ends: 1,
        depth: 2,
    },
    Limits {
        string_chars: 20,
        ends: 1,
        depth: 2,
    },
    Limits {
        string_chars: 20,
        ends: 0,
        depth: 2,
    },
    Limits {
        string_chars: 20,
        ends: 0,
        depth: 1,
    },
    Limits {
        string_chars: 8,
        ends: 0,
        depth: 1,
    },
];

/// `text` shortened to at most `max_tokens`, or `None` when it already fits.
pub fn compress(encoding: Encoding, text: &str, max_tokens: u64) -> Option<String> {
    compress_counted(encoding, text, encoding.count(text), max_tokens)
}

/// [`compress`] for a text whose token count is already known.
fn compress_counted(
    encoding: Encoding,
    text: &str,
    tokens: u64,
    max_tokens: u64,
) -> Option<String> {
    if tokens <= max_tokens {
        return None;
    }
    let trimmed = text.trim_start();
    if (trimmed.starts_with('{') || trimmed.starts_with('['))
        && let Ok(value) = serde_json::from_str::<Value>(text)
        && let Some(out) = compress_json(encoding, &value, max_tokens)
    {
        return Some(out);
    }
    if trimmed.starts_with('"')
        && let Ok(Value::String(inner)) = serde_json::from_str::<Value>(text)
        && let Some(out) = compress_json_string(encoding, &inner, max_tokens)
    {
        return Some(out);
    }
    Some(compress_plain(encoding, text, tokens, max_tokens))
}

/// A top-level JSON string shortened as text inside its quotes, so that it stays a JSON string
/// (JSON keeps its shape); `None` when not even `"…"` fits.
fn compress_json_string(encoding: Encoding, inner: &str, max_tokens: u64) -> Option<String> {
    let tokens = encoding.count(inner);
    // The quotes (and any escapes) cost a little: start from what they leave and shrink.
    let mut budget = max_tokens.saturating_sub(2);
    loop {
        let short = match compress_counted(encoding, inner, tokens, budget) {
            Some(short) => short,
            None => inner.to_string(),
        };
        let out = Value::String(short).to_string();
        if fits(encoding, &out, max_tokens) {
            return Some(out);
        }
        if budget == 0 {
            return None;
        }
        budget -= (budget / 10).max(1);
    }
}

fn fits(encoding: Encoding, text: &str, max_tokens: u64) -> bool {
    // Most of a huge document's tries are too long by far: say so without tokenising them.
    encoding.fewest_tokens(text) <= max_tokens && encoding.count(text) <= max_tokens
}

fn compress_json(encoding: Encoding, value: &Value, max_tokens: u64) -> Option<String> {
    for limits in LEVELS {
        let out = mark(shrink(value, limits, 1));
        let text = python_dumps(&out);
        if fits(encoding, &text, max_tokens) {
            return Some(text);
        }
    }
    // Last resort: give up top-level entries until it fits: containers (already collapsed to
    // `"…"` or their ends) first, top-level scalars last (SPEC 5 step 4), each from the end.
    let last = LEVELS[LEVELS.len() - 1];
    match (shrink(value, &last, 1), value) {
        (Value::Object(map), Value::Object(original)) => {
            let order = give_up_order(&map, original);
            // The result without the first `gone` keys of `order`. The entries left keep their
            // order. No marker of its own: `_compressed` says the result is not whole, and a
            // count of what went would cost tokens that a scalar should have (SPEC: scalars go
            // last).
            let without = |gone: usize| -> String {
                let gone: HashSet<&str> = order[..gone].iter().map(String::as_str).collect();
                let kept: Map<String, Value> = map
                    .iter()
                    .filter(|(k, _)| !gone.contains(k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                python_dumps(&mark(Value::Object(kept)))
            };
            // The fewest entries to give up, found by halving: fewer entries never take more
            // tokens, and trying one count after another is quadratic in the entries (a result
            // of 10,000 keys took seconds and held a worker).
            let all = order.len();
            if all == 0 || !fits(encoding, &without(all), max_tokens) {
                return bare_shape(encoding, value, max_tokens);
            }
            // Every entry kept costs at least a token, so no more than `max_tokens` stay: search
            // among results of that size, not the whole document's. Should that ever be wrong
            // (one more entry fits), search them all.
            let at_most_kept = usize::try_from(max_tokens).unwrap_or(usize::MAX);
            let mut low = all.saturating_sub(at_most_kept).max(1);
            if low > 1 && fits(encoding, &without(low - 1), max_tokens) {
                low = 1;
            }
            let mut high = all;
            while low < high {
                let mid = low + (high - low) / 2;
                if fits(encoding, &without(mid), max_tokens) {
                    high = mid;
                } else {
                    low = mid + 1;
                }
            }
            Some(without(low))
        }
        _ => bare_shape(encoding, value, max_tokens),
    }
}

/// The keys of a top-level object in the order they are given up: containers first, then
/// strings the last level cut (their text is mostly gone already), then the scalars still
/// whole; each group from the end.
fn give_up_order(shrunk: &Map<String, Value>, original: &Map<String, Value>) -> Vec<String> {
    let cut_below = LEVELS[LEVELS.len() - 1].string_chars;
    let loss = |k: &String| match original.get(k) {
        Some(Value::Array(_) | Value::Object(_)) => 0,
        Some(Value::String(s)) if s.chars().nth(cut_below).is_some() => 1,
        _ => 2,
    };
    let mut order: Vec<String> = shrunk.keys().rev().cloned().collect();
    order.sort_by_key(loss); // stable: each group stays end-first
    order
}

/// The least of the document's shape, for a limit too small for its marked skeleton: still
/// JSON (a client parses a tool result it wrote as JSON), an array with its omission mark where
/// that fits. `None` for a scalar, or when not even `{}` or `[]` fits.
fn bare_shape(encoding: Encoding, value: &Value, max_tokens: u64) -> Option<String> {
    let tries: &[&str] = match value {
        Value::Array(_) => &["[\"…\"]", "[]"],
        Value::Object(_) => &["{}"],
        _ => &[],
    };
    tries
        .iter()
        .find(|t| fits(encoding, t, max_tokens))
        .map(|t| (*t).to_string())
}

/// Adds the `_compressed` marker to a top-level object (an array has nowhere to carry it; its
/// `"… (K more items)"` entries say enough).
fn mark(value: Value) -> Value {
    match value {
        Value::Object(mut map) => {
            // Last, also where the result had a `_compressed` of its own.
            map.shift_remove("_compressed");
            map.insert("_compressed".into(), Value::Bool(true));
            Value::Object(map)
        }
        other => other,
    }
}

fn shrink(value: &Value, limits: &Limits, depth: usize) -> Value {
    match value {
        Value::String(s) => Value::String(cut_string(s, limits.string_chars)),
        Value::Array(_) | Value::Object(_) if depth > limits.depth => Value::String("…".into()),
        Value::Array(items) => {
            let n = items.len();
            let keep = |it: &Value| shrink(it, limits, depth + 1);
            if n > 2 * limits.ends && n > 0 {
                let mut out: Vec<Value> = items[..limits.ends].iter().map(keep).collect();
                let k = n - 2 * limits.ends;
                out.push(Value::String(format!("… ({k} more items)")));
                out.extend(items[n - limits.ends..].iter().map(keep));
                Value::Array(out)
            } else {
                Value::Array(items.iter().map(keep).collect())
            }
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), shrink(v, limits, depth + 1)))
                .collect::<Map<_, _>>(),
        ),
        scalar => scalar.clone(),
    }
}

fn cut_string(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        Some((byte, _)) => format!("{}…", &s[..byte]),
        None => s.to_string(),
    }
}

/// Head and tail of `text` around an omission marker, shrinking until it fits.
fn compress_plain(encoding: Encoding, text: &str, tokens: u64, max_tokens: u64) -> String {
    let chars = text.chars().count() as u64;
    // The marker costs about a dozen tokens; start from what is left and shrink by a tenth.
    let mut keep_tokens = max_tokens.saturating_sub(12);
    loop {
        let keep_chars = (keep_tokens.saturating_mul(chars) / tokens.max(1)) as usize;
        let head_chars = keep_chars.div_ceil(2);
        let tail_chars = keep_chars - head_chars;
        let head = prefix(text, head_chars);
        let tail = suffix(text, chars as usize, tail_chars);
        let omitted = tokens.saturating_sub(encoding.count(head) + encoding.count(tail));
        let out = format!("{head}\n…[{omitted} tokens omitted]…\n{tail}");
        if fits(encoding, &out, max_tokens) {
            return out;
        }
        if keep_chars == 0 {
            break;
        }
        keep_tokens = keep_tokens.saturating_sub((keep_tokens / 10).max(1));
    }
    // Not even the marker fits: the smallest honest thing left.
    if fits(encoding, "…", max_tokens) {
        "…".into()
    } else {
        String::new()
    }
}

fn prefix(text: &str, n: usize) -> &str {
    match text.char_indices().nth(n) {
        Some((byte, _)) => &text[..byte],
        None => text,
    }
}

fn suffix(text: &str, total_chars: usize, n: usize) -> &str {
    if n >= total_chars {
        return text;
    }
    match text.char_indices().nth(total_chars - n) {
        Some((byte, _)) => &text[byte..],
        None => "",
    }
}

pub(crate) fn apply(work: &mut Work<'_>, policy: &CompressToolOutput) {
    let encoding = work.encoding;
    let counter = work.counter;
    let ids = work.ids;
    let max = policy.max_tokens;
    let mut done = Vec::new();
    for item in work.items.iter_mut().filter(|i| i.is_history_tool()) {
        // Cheap bound first: the whole message costs more than its content, so a message
        // within the limit needs no content count.
        if item.tokens <= max {
            continue;
        }
        // An unchanged message with an id may have been compressed on an earlier turn. What is
        // remembered holds nothing of the content's shape (see `tokens::Compressed`), so a
        // string and text parts that share an id share it rightly.
        let key = item
            .index
            .filter(|_| item.msg.is_borrowed())
            .and_then(|index| ids.and_then(|ids| ids.get(index)).copied());
        let result = match key.and_then(|id| counter.compressed().get_variant(encoding, &id, max)) {
            Some(hit) => Some(hit),
            None => {
                let fresh = compress_item(encoding, item, max).map(Arc::new);
                if let (Some(id), Some(r)) = (key, &fresh) {
                    counter
                        .compressed()
                        .insert_variant(encoding, &id, max, r.clone());
                }
                fresh
            }
        };
        let Some(result) = result else { continue };
        let content = shortened(item.msg.content.as_ref(), &result);
        item.msg.set_content(Some(content));
        // The other fields cost `item.tokens - tokens_before` (see `compress_item`), so the
        // shortened message costs that plus the new content, without tokenising it again.
        item.tokens = item.tokens.saturating_sub(result.tokens_before) + result.tokens_after;
        if let Some(index) = item.index {
            done.push(Compressed {
                index,
                tokens_before: result.tokens_before,
                tokens_after: result.tokens_after,
            });
        }
    }
    work.report.compressed.extend(done);
}

/// Compresses one tool message's content, or `None` when it is within the limit.
///
/// A content of parts keeps its shape: its text (the text parts joined, shortened as one text so
/// that JSON keeps its shape) goes in its first text part, and its non-text parts (765 tokens
/// each) are kept while they fit, from the first; each of the others is replaced by a text part
/// naming what was omitted (`[image omitted]`), never dropped silently. The text gets what the
/// kept parts and the markers leave of the limit.
fn compress_item(encoding: Encoding, item: &Item<'_>, max: u64) -> Option<CompressedText> {
    // The content's count is the message's less the other fields', which are short: this
    // spares tokenising a large result a second time.
    let mut bare = Message {
        content: None,
        ..Message::text(item.msg.role.clone(), "")
    };
    bare.tool_call_id = item.msg.tool_call_id.clone();
    bare.name = item.msg.name.clone();
    bare.tool_calls = item.msg.tool_calls.clone();
    // What the count reads of `extra` (not the Responses mapping's copy of the items, which
    // holds the whole result again).
    bare.extra = ["refusal", "function_call"]
        .into_iter()
        .filter_map(|k| Some((k.to_string(), item.msg.extra.get(k)?.clone())))
        .collect();
    let before = item.tokens.saturating_sub(message_tokens(encoding, &bare));
    if before <= max {
        return None;
    }
    let content = item.msg.content.as_ref();
    let (text, non_text): (Option<Cow<'_, str>>, Vec<&Value>) = match content {
        Some(Value::String(s)) => (Some(Cow::Borrowed(s)), Vec::new()),
        Some(Value::Array(parts)) => {
            let texts: Vec<&str> = parts.iter().filter_map(part_text).collect();
            let text = (!texts.is_empty()).then(|| Cow::Owned(texts.concat()));
            (
                text,
                parts.iter().filter(|p| part_text(p).is_none()).collect(),
            )
        }
        // Not a shape OpenAI accepts for a result: left as it is.
        _ => return None,
    };
    // Repair's made-up result is not tool output; shortening it would only make a second run
    // differ from the first (repair adds it after this step).
    if text.as_deref() == Some(super::budget::NO_RESULT) {
        return None;
    }
    let text_tokens = match (content, &text) {
        (Some(Value::String(_)), _) => before,
        (_, Some(t)) => encoding.count(t),
        (_, None) => 0,
    };
    // Non-text parts first, as many as fit beside the markers of the others.
    let marker_tokens = |from: usize| -> u64 {
        non_text[from..]
            .iter()
            .map(|p| encoding.count(&omitted(p)))
            .sum()
    };
    let mut kept = non_text.len();
    while kept > 0 && kept as u64 * NON_TEXT_PART_TOKENS + marker_tokens(kept) > max {
        kept -= 1;
    }
    let mut budget = max
        .saturating_sub(kept as u64 * NON_TEXT_PART_TOKENS)
        .saturating_sub(marker_tokens(kept));
    loop {
        let short = match &text {
            Some(t) if text_tokens > budget => compress_counted(encoding, t, text_tokens, budget),
            _ => None,
        }
        .or_else(|| text.as_deref().map(str::to_string));
        let result = CompressedText {
            text: short,
            kept_non_text: kept,
            tokens_before: before,
            tokens_after: 0,
        };
        // Counted as sent: joined with the markers, the text may not cost what it did alone.
        let after = content_tokens(encoding, Some(&shortened(content, &result)));
        // Within the limit, or as small as it honestly gets (markers alone over a tiny limit).
        if after <= max || budget == 0 || text.is_none() {
            return Some(CompressedText {
                tokens_after: after,
                ..result
            });
        }
        budget -= (budget / 10).max(1);
    }
}

/// `content` shortened as `result` says (see [`compress_item`]).
fn shortened(content: Option<&Value>, result: &CompressedText) -> Value {
    let Some(Value::Array(parts)) = content else {
        return Value::String(result.text.clone().unwrap_or_default());
    };
    let mut out = Vec::with_capacity(parts.len());
    let mut text_placed = false;
    let mut non_text = 0;
    for part in parts {
        if part_text(part).is_none() {
            out.push(if non_text < result.kept_non_text {
                part.clone()
            } else {
                marker_part(part)
            });
            non_text += 1;
        } else if !text_placed {
            text_placed = true;
            if let Some(text) = &result.text {
                out.push(with_text(part, text));
            }
        }
    }
    Value::Array(out)
}

/// A text part like `part` (its type and other fields) holding `text`, without copying the text
/// it held.
fn with_text(part: &Value, text: &str) -> Value {
    let key = match part.get("type").and_then(Value::as_str) {
        Some("refusal") => "refusal",
        _ => "text",
    };
    let Value::Object(fields) = part else {
        return Value::String(text.into());
    };
    let mut out: Map<String, Value> = fields
        .iter()
        .filter(|(k, _)| k.as_str() != key)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.insert(key.into(), Value::String(text.into()));
    Value::Object(out)
}

/// The text part put in place of a non-text part that does not fit.
fn marker_part(part: &Value) -> Value {
    let kind = part.get("type").and_then(Value::as_str).unwrap_or_default();
    // A Responses part (`input_image`) is replaced by a Responses text part, a chat part by
    // a chat one.
    let text_type = if kind.starts_with("input_") {
        "input_text"
    } else {
        "text"
    };
    json!({"type": text_type, "text": omitted(part)})
}

/// What [`marker_part`] says of `part`: `[image omitted]`, `[audio omitted]`, `[file omitted]`,
/// or the part's own type.
fn omitted(part: &Value) -> String {
    let kind = part.get("type").and_then(Value::as_str).unwrap_or("part");
    let what = match kind {
        "image_url" | "input_image" | "image" => "image",
        "input_audio" | "audio" => "audio",
        "input_file" | "file" => "file",
        other => other,
    };
    format!("[{what} omitted]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_cut_on_char_boundaries() {
        assert_eq!(cut_string("東京東京", 2), "東京…");
        assert_eq!(cut_string("ab", 5), "ab");
    }

    #[test]
    fn tiny_limits_still_fit() {
        let text = "word ".repeat(500);
        for max in [0, 1, 3, 10, 20] {
            let out = compress(Encoding::O200kBase, &text, max).unwrap();
            assert!(Encoding::O200kBase.count(&out) <= max, "{max}: {out}");
        }
        let json = serde_json::json!({"a": "x".repeat(500), "b": [1,2,3,4,5,6,7,8]}).to_string();
        for max in [5, 10, 20, 40] {
            let out = compress(Encoding::O200kBase, &json, max).unwrap();
            assert!(Encoding::O200kBase.count(&out) <= max, "{max}: {out}");
        }
    }

    #[test]
    fn json_stays_json_at_any_limit_it_can() {
        let enc = Encoding::O200kBase;
        let docs = [
            serde_json::json!({"a": "x".repeat(500), "b": [1, 2, 3, 4, 5, 6, 7, 8]}),
            serde_json::json!([{"k": "v".repeat(300)}, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]),
            serde_json::json!(["word ".repeat(200)]),
        ];
        for doc in &docs {
            let text = doc.to_string();
            for max in 1..=30 {
                let out = compress(enc, &text, max).unwrap();
                assert!(enc.count(&out) <= max, "{max}: {out}");
                let back: Value = serde_json::from_str(&out)
                    .unwrap_or_else(|e| panic!("{max}: not JSON ({e}): {out}"));
                assert_eq!(back.is_array(), doc.is_array(), "{max}: shape kept: {out}");
            }
        }
        // Nothing at all fits in no tokens.
        assert_eq!(compress(enc, &docs[0].to_string(), 0).as_deref(), Some(""));
    }

    #[test]
    fn a_cut_string_goes_before_a_whole_scalar() {
        let enc = Encoding::O200kBase;
        let text = serde_json::json!({"s": "long text ".repeat(50), "n": 5}).to_string();
        let out = compress(enc, &text, 12).unwrap();
        assert!(enc.count(&out) <= 12, "{out}");
        let back: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(back["n"], 5, "{out}");
        assert_eq!(back["_compressed"], true, "{out}");
    }

    #[test]
    fn top_level_scalars_are_given_up_last() {
        let mut doc = serde_json::Map::new();
        for k in 0..12 {
            doc.insert(
                format!("a_list_{k:02}"),
                serde_json::json!([{"x": [1, 2, 3]}, 2, 3]),
            );
        }
        doc.insert("id".into(), serde_json::json!(4242));
        doc.insert("status".into(), serde_json::json!("ok"));
        doc.insert("z_nested".into(), serde_json::json!({"deep": {"er": 1}}));
        let text = Value::Object(doc).to_string();
        let out = compress(Encoding::O200kBase, &text, 40).unwrap();
        assert!(Encoding::O200kBase.count(&out) <= 40, "{out}");
        let v: Value = serde_json::from_str(&out).expect("still JSON");
        assert_eq!(v["id"], 4242, "{out}");
        assert_eq!(v["status"], "ok", "{out}");
        assert_eq!(v["_compressed"], true, "{out}");
        assert!(v.get("z_nested").is_none(), "a container went first: {out}");
    }

    #[test]
    fn compressed_json_is_written_as_spec_5_writes_its_marker() {
        let text = serde_json::json!({"items": (0..100).collect::<Vec<_>>()}).to_string();
        let out = compress(Encoding::O200kBase, &text, 60).unwrap();
        assert!(out.ends_with(r#", "_compressed": true}"#), "{out}");
        assert!(out.contains(r#""… (96 more items)""#), "{out}");
        // A result with a `_compressed` key of its own gets the marker last all the same.
        let own = serde_json::json!({"_compressed": false, "items": (0..100).collect::<Vec<_>>()});
        let out = compress(Encoding::O200kBase, &own.to_string(), 60).unwrap();
        assert!(out.ends_with(r#", "_compressed": true}"#), "{out}");
    }

    #[test]
    fn giving_up_entries_keeps_the_order_of_the_others() {
        let text = r#"{"z_first":1,"list_a":[[1],[2],[3],[4],[5]],"m_mid":2,"list_b":[[1],[2],[3],[4],[5]],"a_last":3}"#;
        let out = compress(Encoding::O200kBase, text, 35).unwrap();
        let v: Value = serde_json::from_str(&out).expect("still JSON");
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            ["z_first", "list_a", "m_mid", "a_last", "_compressed"],
            "{out}"
        );
    }

    /// SPEC 5 step 4: top-level scalars are the last thing given up. Every scalar that fits
    /// stays once the containers are gone (a marker counting the dropped keys used to cost the
    /// tokens of one: `{"id": 7, "_omitted_keys": 2, ...}` for a limit `{"id": 7, "ok": true}` fits).
    #[test]
    fn top_level_scalars_stay_when_they_fit() {
        let rows: Vec<Value> = (0..6)
            .map(|_| serde_json::json!({"x": "y".repeat(30)}))
            .collect();
        let text = serde_json::json!({"data": rows, "id": 7, "ok": true}).to_string();
        let out = compress(Encoding::O200kBase, &text, 20).unwrap();
        assert_eq!(out, r#"{"id": 7, "ok": true, "_compressed": true}"#);
        let text =
            serde_json::json!({"id": 7, "status": "ok", "note": "n".repeat(150)}).to_string();
        let out = compress(Encoding::O200kBase, &text, 20).unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["id"], 7, "{out}");
        assert_eq!(v["status"], "ok", "{out}");
    }

    /// Giving up entries one after another, as the halving search replaced: the fewest that
    /// make the result fit.
    fn one_by_one(value: &Value, max_tokens: u64) -> Option<String> {
        let last = LEVELS[LEVELS.len() - 1];
        let (Value::Object(mut map), Value::Object(original)) = (shrink(value, &last, 1), value)
        else {
            return None;
        };
        for key in give_up_order(&map, original) {
            map.shift_remove(&key);
            let text = python_dumps(&mark(Value::Object(map.clone())));
            if fits(Encoding::O200kBase, &text, max_tokens) {
                return Some(text);
            }
        }
        bare_shape(Encoding::O200kBase, value, max_tokens)
    }

    #[test]
    fn entries_given_up_are_the_fewest_that_fit() {
        for keys in [1, 2, 7, 40, 300] {
            let mut doc = serde_json::Map::new();
            for k in 0..keys {
                let v = match k % 3 {
                    0 => serde_json::json!(k),
                    1 => serde_json::json!(format!("value number {k}")),
                    _ => serde_json::json!([k, {"n": k}]),
                };
                doc.insert(format!("key_{k}"), v);
            }
            let doc = Value::Object(doc);
            for max in [1, 5, 12, 30, 100, 400] {
                let text = python_dumps(&mark(shrink(&doc, &LEVELS[LEVELS.len() - 1], 1)));
                if fits(Encoding::O200kBase, &text, max) {
                    continue; // the levels are enough: no entry is given up
                }
                assert_eq!(
                    compress_json(Encoding::O200kBase, &doc, max),
                    one_by_one(&doc, max),
                    "{keys} keys, max {max}"
                );
            }
        }
    }
}
