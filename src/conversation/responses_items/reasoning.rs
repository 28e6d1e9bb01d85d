//! Reasoning that outlives the item it was mapped with. The mapping gives a run of `reasoning`
//! items to the one message that follows it, but the model's reply goes on past that item: a
//! reasoning run leads every item of its reply up to the next reasoning or the client's next
//! item (a built-in tool call, then a function call, then a message). When a step drops the
//! first of them and keeps a later one, the provider still wants the reasoning before what is
//! sent (it refuses a reply item "provided without its required reasoning item"). This puts it
//! back, before the first item of its reply that is sent.

use std::collections::HashSet;

use serde_json::Value;

use super::{Kind, kind, reasoning_leads};

/// Puts each run of `input`'s reasoning items that `sent` lost back before the first item of
/// its reply that `sent` kept; returns the input indexes of the reasoning items put back.
/// Reasoning is recognised by its `id`: a run with an item without one, or with an item sent,
/// is left as the pipeline left it.
pub fn keep_reasoning_of_sent_items(input: &[Value], sent: &mut Vec<Value>) -> Vec<usize> {
    let sent_keys: HashSet<(String, String)> = sent.iter().filter_map(key).collect();
    let lost = |item: &Value| key(item).is_some_and(|k| !sent_keys.contains(&k));
    // The usual case, nothing to do, costs one pass.
    if !input
        .iter()
        .any(|item| kind(item) == Kind::Reasoning && lost(item))
    {
        return Vec::new();
    }
    let at = positions_in(input, sent);
    let mut inserts: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
    let mut i = 0;
    while i < input.len() {
        if kind(&input[i]) != Kind::Reasoning {
            i += 1;
            continue;
        }
        let run_start = i;
        while i < input.len() && kind(&input[i]) == Kind::Reasoning {
            i += 1;
        }
        let run = run_start..i;
        if !run.clone().all(|r| lost(&input[r])) {
            continue;
        }
        let reply_end = (i..input.len())
            .find(|&k| {
                kind(&input[k]) == Kind::Reasoning || !reasoning_leads(kind(&input[k]), &input[k])
            })
            .unwrap_or(input.len());
        if let Some(first_kept) = (i..reply_end).find_map(|k| at[k]) {
            inserts.push((first_kept, run));
        }
    }
    let mut restored = Vec::new();
    // From the last, so that the positions of the earlier ones still hold.
    for (position, run) in inserts.into_iter().rev() {
        sent.splice(position..position, input[run.clone()].iter().cloned());
        restored.extend(run);
    }
    restored.sort_unstable();
    restored
}

/// Where each item of `input` is in `sent` (`None`: not sent), reading both in order: what is
/// sent keeps the input's order, with items the pipeline made (placeholders) in between. An
/// item is found by its key, or, without one (a short-form assistant message), by its value.
fn positions_in(input: &[Value], sent: &[Value]) -> Vec<Option<usize>> {
    let sent_keys: Vec<Option<(String, String)>> = sent.iter().map(key).collect();
    let mut at = vec![None; input.len()];
    let mut cursor = 0;
    for (k, item) in input.iter().enumerate() {
        let wanted = key(item);
        let found = (cursor..sent.len()).find(|&p| match (&wanted, &sent_keys[p]) {
            (Some(a), Some(b)) => a == b,
            (None, None) => sent[p] == *item,
            _ => false,
        });
        if let Some(p) = found {
            at[k] = Some(p);
            cursor = p + 1;
        }
    }
    at
}

/// How an item is recognised in what is sent: its type and `id`, or a call's `call_id`.
fn key(item: &Value) -> Option<(String, String)> {
    let field = |name: &str| item.get(name).and_then(Value::as_str);
    let kind = field("type").unwrap_or("message").to_string();
    field("id")
        .map(|id| (kind.clone(), id.to_string()))
        .or_else(|| field("call_id").map(|c| (kind, format!("call_id:{c}"))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ids(items: &[Value]) -> Vec<&str> {
        items
            .iter()
            .map(|i| i["id"].as_str().or(i["role"].as_str()).unwrap_or("?"))
            .collect()
    }

    #[test]
    fn reasoning_moves_to_the_first_sent_item_of_its_reply() {
        let input = vec![
            json!({"role": "user", "content": "q"}),
            json!({"type": "reasoning", "id": "rs_1", "summary": []}),
            json!({"type": "web_search_call", "id": "ws_1", "status": "completed"}),
            json!({"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}"}),
            json!({"type": "function_call_output", "call_id": "c1", "output": "x"}),
            json!({"role": "user", "content": "q2"}),
        ];
        // The web search went with its reasoning; the function call stayed.
        let mut sent = vec![
            input[0].clone(),
            input[3].clone(),
            input[4].clone(),
            input[5].clone(),
        ];
        assert_eq!(keep_reasoning_of_sent_items(&input, &mut sent), [1]);
        assert_eq!(ids(&sent), ["user", "rs_1", "fc_1", "?", "user"]);
        // Idempotent: nothing more to do on what is now sent.
        let before = sent.clone();
        assert!(keep_reasoning_of_sent_items(&input, &mut sent).is_empty());
        assert_eq!(sent, before);
    }

    #[test]
    fn reasoning_of_a_reply_that_is_gone_stays_gone() {
        let input = vec![
            json!({"role": "user", "content": "q"}),
            json!({"type": "reasoning", "id": "rs_1", "summary": []}),
            json!({"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}"}),
            json!({"type": "function_call_output", "call_id": "c1", "output": "x"}),
            // The client's next item ends the reply: what follows is another's.
            json!({"type": "web_search_call", "id": "ws_2", "status": "completed"}),
            json!({"role": "user", "content": "q2"}),
        ];
        let mut sent = vec![input[0].clone(), input[4].clone(), input[5].clone()];
        assert!(keep_reasoning_of_sent_items(&input, &mut sent).is_empty());
        assert_eq!(ids(&sent), ["user", "ws_2", "user"]);
    }

    #[test]
    fn a_run_of_reasoning_moves_whole_and_a_later_run_is_its_own() {
        let input = vec![
            json!({"role": "user", "content": "q"}),
            json!({"type": "reasoning", "id": "rs_1", "summary": []}),
            json!({"type": "reasoning", "id": "rs_2", "summary": []}),
            json!({"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}"}),
            json!({"type": "mcp_call", "id": "mcp_1"}),
            json!({"type": "reasoning", "id": "rs_3", "summary": []}),
            json!({"type": "function_call", "id": "fc_2", "call_id": "c2", "name": "g", "arguments": "{}"}),
        ];
        // fc_1 (with rs_1, rs_2) and fc_2 (with rs_3) went; mcp_1 stayed.
        let mut sent = vec![input[0].clone(), input[4].clone()];
        assert_eq!(keep_reasoning_of_sent_items(&input, &mut sent), [1, 2]);
        assert_eq!(ids(&sent), ["user", "rs_1", "rs_2", "mcp_1"]);
    }

    #[test]
    fn an_assistant_message_without_an_id_is_found_by_its_value() {
        let input = vec![
            json!({"role": "user", "content": "hi"}),
            json!({"role": "assistant", "content": "answer"}),
            json!({"role": "user", "content": "again"}),
            json!({"type": "reasoning", "id": "rs_1", "summary": []}),
            json!({"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}"}),
            json!({"role": "assistant", "content": "answer"}),
            json!({"role": "user", "content": "next"}),
        ];
        // The unanswered call went, with its reasoning; the answer after it stayed. The same
        // answer earlier is another reply's.
        let mut sent = vec![
            input[0].clone(),
            input[1].clone(),
            input[2].clone(),
            input[5].clone(),
            input[6].clone(),
        ];
        assert_eq!(keep_reasoning_of_sent_items(&input, &mut sent), [3]);
        assert_eq!(sent[3], input[3]);
        assert_eq!(sent[4], input[5]);
        assert_eq!(sent.len(), 6);
    }
}
