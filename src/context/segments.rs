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

/// The call the message at `pos` answers when that is cheap to tell: `Some(link)` when `pos` is
/// not a tool message or `last_caller` (the nearest assistant message with tool calls before
/// `pos`) has a call with its id, which is how results normally sit; `None` when only the whole
/// map of [`link_results`] can say. Agrees with [`link_results`] wherever it answers.
pub fn link_near<'m>(
    messages: impl Fn(usize) -> &'m Message,
    pos: usize,
    last_caller: Option<usize>,
) -> Option<Option<(usize, usize)>> {
    let m = messages(pos);
    if m.role != Role::Tool {
        return Some(None);
    }
    // No id, or no call before it at all: certainly unlinked.
    let (Some(id), Some(owner)) = (m.tool_call_id.as_deref(), last_caller) else {
        return Some(None);
    };
    let call = messages(owner)
        .tool_calls()
        .iter()
        .position(|c| c.id == id)?;
    Some(Some((owner, call)))
}

/// [`link_results`] of `messages`, each result linked near its call where it sits there (see
/// [`link_near`]), the whole map made only when one does not: a hash per call spared on a
/// conversation whose results follow their calls.
pub fn link_all(messages: &[Message]) -> Vec<Option<(usize, usize)>> {
    let mut links = Vec::with_capacity(messages.len());
    let mut last_caller = None;
    for (pos, m) in messages.iter().enumerate() {
        match link_near(|p| &messages[p], pos, last_caller) {
            Some(link) => links.push(link),
            None => return link_results(messages.iter()),
        }
        if m.role == Role::Assistant && m.has_tool_calls() {
            last_caller = Some(pos);
        }
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
    fn link_near_agrees_with_the_full_map_where_it_answers() {
        let m = conv(json!([
            {"role":"tool","tool_call_id":"a","content":"orphan before any call"},
            {"role":"assistant","tool_calls":[{"id":"a","function":{"name":"f","arguments":"{}"}},
                                              {"id":"b","function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"b","content":"1"},
            {"role":"tool","tool_call_id":"a","content":"2"},
            {"role":"assistant","content":"no calls"},
            {"role":"tool","tool_call_id":"a","content":"late, same owner"},
            {"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"a","content":"late, older owner"},
            {"role":"tool","content":"no id"}
        ]));
        let full = link_results(m.iter());
        let mut last_caller = None;
        let mut answered = Vec::new();
        for pos in 0..m.len() {
            answered.push(link_near(|p| &m[p], pos, last_caller));
            if m[pos].has_tool_calls() {
                last_caller = Some(pos);
            }
        }
        for (pos, near) in answered.iter().enumerate() {
            if let Some(link) = near {
                assert_eq!(*link, full[pos], "position {pos}");
            }
        }
        // Only the result whose call is not in the nearest caller needs the full map.
        assert_eq!(answered[7], None);
        assert_eq!(answered.iter().filter(|a| a.is_none()).count(), 1);
    }

    #[test]
    fn link_all_is_link_results() {
        let m = conv(json!([
            {"role":"tool","tool_call_id":"a","content":"orphan before any call"},
            {"role":"assistant","tool_calls":[{"id":"a","function":{"name":"f","arguments":"{}"}},
                                              {"id":"a","function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"a","content":"1"},
            {"role":"user","content":"q","tool_calls":[{"id":"b","function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"b","content":"no assistant called b"},
            {"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"a","content":"late"}
        ]));
        assert_eq!(link_all(&m), link_results(m.iter()));
        assert_eq!(link_all(&m[..5]), link_results(m[..5].iter()));
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
