//! How tool calls and their results belong together. A result belongs to the nearest preceding
//! assistant message that has a call with its id (ids are only unique per turn: some providers
//! and our mock restart numbering). A segment is an assistant message with tool calls together
//! with the results directly after it, or any other single message: the unit the budget and the
//! summary cut on, so a call is never separated from its results.

use std::ops::Range;

use foldhash::HashMap;

use crate::conversation::{Message, Role};

/// For each message, the call it answers: `Some((assistant position, call index))` for a tool
/// message whose id a preceding assistant message calls, `None` otherwise.
pub fn link_results<'m>(
    messages: impl Iterator<Item = &'m Message>,
) -> Vec<Option<(usize, usize)>> {
    let mut owner: HashMap<&str, (usize, usize)> = HashMap::default();
    let mut links = Vec::with_capacity(messages.size_hint().0);
    for (pos, m) in messages.enumerate() {
        let mut link = None;
        match m.role {
            Role::Assistant => {
                for (i, call) in m.tool_calls().iter().enumerate().rev() {
                    // Iterating backwards leaves the first of duplicate ids as the owner.
                    owner.insert(call.id.as_str(), (pos, i));
                }
            }
            Role::Tool => {
                link = m
                    .tool_call_id
                    .as_deref()
                    .and_then(|id| owner.get(id).copied());
            }
            _ => {}
        }
        links.push(link);
    }
    links
}

/// Splits `messages[range]` into segments (absolute positions), oldest first.
pub fn segments<'m>(
    messages: impl Fn(usize) -> &'m Message,
    range: Range<usize>,
) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut pos = range.start;
    while pos < range.end {
        let start = pos;
        pos += 1;
        if messages(start).has_tool_calls() {
            while pos < range.end && messages(pos).role == Role::Tool {
                pos += 1;
            }
        }
        out.push(start..pos);
    }
    out
}

/// Segments of a message slice, oldest first.
pub fn segments_of(messages: &[Message]) -> Vec<Range<usize>> {
    segments(|i| &messages[i], 0..messages.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conv(v: serde_json::Value) -> Vec<Message> {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn results_link_to_nearest_call_with_their_id() {
        let m = conv(json!([
            {"role":"assistant","tool_calls":[{"id":"a","function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"a","content":"1"},
            {"role":"user","content":"again"},
            {"role":"assistant","tool_calls":[{"id":"a","function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"a","content":"2"},
            {"role":"tool","tool_call_id":"zz","content":"orphan"}
        ]));
        let links = link_results(m.iter());
        assert_eq!(
            links,
            vec![None, Some((0, 0)), None, None, Some((3, 0)), None]
        );
    }

    #[test]
    fn segment_groups_call_with_following_results() {
        let m = conv(json!([
            {"role":"user","content":"q"},
            {"role":"assistant","tool_calls":[{"id":"a","function":{"name":"f","arguments":"{}"}},
                                              {"id":"b","function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"a","content":"1"},
            {"role":"tool","tool_call_id":"b","content":"2"},
            {"role":"assistant","content":"done"}
        ]));
        assert_eq!(segments_of(&m), vec![0..1, 1..4, 4..5]);
    }
}
