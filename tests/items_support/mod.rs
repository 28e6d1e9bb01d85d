//! Helpers for the Responses item tests: fixtures from tests/fixtures/responses/ and the items
//! invariant the proxy promises after repair, as a checker.
#![allow(dead_code)]

use std::collections::HashSet;

use serde_json::Value;

pub fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/responses/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn call_id(item: &Value) -> String {
    item["call_id"].as_str().unwrap_or_default().to_string()
}

/// Whether a reasoning item may come right before `item`: an item of the model's reply (a call,
/// an assistant message, another output item or reasoning), not a message of another role or a
/// tool's output, which is what OpenAI refuses ("provided without its required following item").
fn reasoning_may_precede(item: &Value) -> bool {
    match item["type"].as_str() {
        None | Some("message") => item["role"] == "assistant",
        Some(t) => !t.ends_with("_output") && t != "mcp_approval_response",
    }
}

/// Every `reasoning` item is followed by an item of its reply; `Err` names the first that is not.
pub fn check_reasoning(items: &[Value]) -> Result<(), String> {
    for (i, item) in items.iter().enumerate() {
        if item["type"] == "reasoning" && !items.get(i + 1).is_some_and(reasoning_may_precede) {
            return Err(format!(
                "reasoning at {i} is not followed by an item it leads"
            ));
        }
    }
    Ok(())
}

/// Every `function_call_output` answers an earlier `function_call` with its `call_id`, exactly
/// once, and every call is answered (custom tools' `custom_tool_call` / `custom_tool_call_output`
/// alike); every `reasoning` item is followed by an item of its reply; `Err` says what is wrong
/// and where.
pub fn check_items(items: &[Value]) -> Result<(), String> {
    check_reasoning(items)?;
    let mut open: HashSet<String> = HashSet::new();
    let mut answered: HashSet<String> = HashSet::new();
    for (i, item) in items.iter().enumerate() {
        let id = call_id(item);
        match item["type"].as_str() {
            // The guard opens the call; it fails only for an id already seen.
            Some("function_call" | "custom_tool_call")
                if answered.contains(&id) || !open.insert(id.clone()) =>
            {
                return Err(format!("call {id} at {i} repeats an id"));
            }
            Some("function_call_output" | "custom_tool_call_output") => {
                if !open.remove(&id) {
                    return Err(format!("output {id} at {i} answers no earlier open call"));
                }
                answered.insert(id);
            }
            _ => {}
        }
    }
    match open.into_iter().next() {
        Some(id) => Err(format!("call {id} is never answered")),
        None => Ok(()),
    }
}

/// The `type` of each item (`message` for items that only have a role).
pub fn types(items: &[Value]) -> Vec<String> {
    items
        .iter()
        .map(|i| i["type"].as_str().unwrap_or("message").to_string())
        .collect()
}

/// The `call_id`s of the `function_call` items, in order.
pub fn call_ids(items: &[Value]) -> Vec<String> {
    items
        .iter()
        .filter(|i| i["type"] == "function_call")
        .map(call_id)
        .collect()
}
