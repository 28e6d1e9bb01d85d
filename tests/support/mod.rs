//! Helpers shared by the pipeline tests: fixtures, policies from JSON, and the repair invariant
//! (SPEC 5 step 7) as a checker.
#![allow(dead_code)]

use std::collections::HashSet;

use ctxproxy::context::{PipelineInput, Policy, Rewritten, run};
use ctxproxy::conversation::{Message, Role};
use ctxproxy::tokens::{Encoding, ModelFacts, TokenCounter};
use proptest::prelude::*;
use serde_json::{Value, json};

pub fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/pipeline/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

pub fn messages(v: &Value) -> Vec<Message> {
    serde_json::from_value(v["messages"].clone()).unwrap()
}

pub fn policy(v: Value) -> Policy {
    serde_json::from_value(v).unwrap()
}

pub const O200K: ModelFacts = ModelFacts {
    context_window: 128_000,
    encoding: Encoding::O200kBase,
};

pub fn rewrite(messages: &[Message], policy: &Policy) -> Rewritten {
    run(
        PipelineInput::new(messages, policy, O200K),
        &TokenCounter::new(),
    )
    .unwrap()
}

/// Messages as JSON values, which is what goes on the wire.
pub fn wire(messages: &[Message]) -> Vec<Value> {
    messages
        .iter()
        .map(|m| serde_json::to_value(m).unwrap())
        .collect()
}

fn has_payload(m: &Message) -> bool {
    m.has_content()
        || ["refusal", "audio", "function_call"]
            .iter()
            .any(|k| m.extra.get(*k).is_some_and(|v| !v.is_null()))
}

/// Checks what OpenAI requires of tool messages; `Err` says what is wrong and where.
pub fn check_valid(messages: &[Message]) -> Result<(), String> {
    let mut open: Option<(usize, Vec<String>, HashSet<String>)> = None; // (pos, ids, answered)
    let close = |open: &mut Option<(usize, Vec<String>, HashSet<String>)>| -> Result<(), String> {
        if let Some((pos, ids, answered)) = open.take() {
            for id in &ids {
                if !answered.contains(id) {
                    return Err(format!("call {id} of message {pos} is unanswered"));
                }
            }
        }
        Ok(())
    };
    for (i, m) in messages.iter().enumerate() {
        match m.role {
            Role::Tool => {
                let Some((_, ids, answered)) = open.as_mut() else {
                    return Err(format!("tool message {i} follows no tool calls"));
                };
                let id = m.tool_call_id.clone().unwrap_or_default();
                if !ids.contains(&id) {
                    return Err(format!("tool message {i} answers unknown id {id}"));
                }
                if !answered.insert(id.clone()) {
                    return Err(format!("id {id} answered twice (message {i})"));
                }
            }
            _ => {
                close(&mut open)?;
                if m.role == Role::Assistant {
                    if !m.has_tool_calls() && !has_payload(m) {
                        return Err(format!("assistant message {i} is empty"));
                    }
                    // OpenAI: "Invalid 'messages[i].tool_calls': empty array", text or not.
                    if matches!(m.tool_calls, Some(Some(ref c)) if c.is_empty()) {
                        return Err(format!("assistant message {i} has an empty tool_calls"));
                    }
                    if m.has_tool_calls() {
                        let ids: Vec<String> =
                            m.tool_calls().iter().map(|c| c.id.clone()).collect();
                        let unique: HashSet<&String> = ids.iter().collect();
                        if unique.len() != ids.len() {
                            return Err(format!("assistant message {i} repeats a call id"));
                        }
                        open = Some((i, ids, HashSet::new()));
                    }
                }
            }
        }
    }
    close(&mut open)
}

/// Index of the last user message (the current turn starts there), or 0.
pub fn current_turn_start(messages: &[Message]) -> usize {
    messages
        .iter()
        .rposition(|m| m.role == Role::User)
        .unwrap_or(0)
}

/// Call ids of every tool message, in order.
pub fn result_ids(messages: &[Message]) -> Vec<String> {
    messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .filter_map(|m| m.tool_call_id.clone())
        .collect()
}

/// Any policy of steps 2–7 (no summary, no tool access), for property tests: a tool filter on
/// one of `names`, a window, compression, a budget of `budget` tokens, repair's mode.
pub fn any_policy(
    names: &'static [&'static str],
    budget: impl Strategy<Value = u64>,
) -> impl Strategy<Value = Policy> {
    (
        prop::option::of((0..names.len(), any::<bool>(), any::<bool>())),
        prop::option::of((0..5usize, any::<bool>())),
        prop::option::of(1..80u64),
        prop::option::of(budget),
        any::<bool>(),
    )
        .prop_map(move |(filter, window, compress, budget, placeholder)| {
            let mut p = json!({"repair": {"unanswered_calls": if placeholder { "placeholder" } else { "drop" }}});
            if let Some((n, include, ph)) = filter {
                let key = if include { "include" } else { "exclude" };
                p["tool_filter"] = json!({key: [names[n]], "placeholder": ph});
            }
            if let Some((max, turn)) = window {
                p["tool_call_window"] = json!({"max": max, "unit": if turn { "turn" } else { "call" }});
            }
            if let Some(max) = compress {
                p["compress_tool_output"] = json!({"max_tokens": max});
            }
            if let Some(max) = budget {
                p["token_budget"] = json!({"max_tokens": max});
            }
            serde_json::from_value(p).unwrap()
        })
}

/// One agent turn done right, as wire messages: the question `q`, then each round's calls
/// (`call` makes one from its id and tool number; ids are `call_{round}_{i}_{tag}`) followed by
/// their results in order, then the reply if there is one and it is not empty.
pub fn agent_turn(
    q: String,
    rounds: Vec<Vec<(usize, String)>>,
    reply: Option<String>,
    tag: impl std::fmt::Display,
    call: impl Fn(&str, usize) -> Value,
) -> Vec<Value> {
    let mut out = vec![json!({"role": "user", "content": q})];
    for (r, calls) in rounds.into_iter().enumerate() {
        let ids: Vec<String> = (0..calls.len())
            .map(|i| format!("call_{r}_{i}_{tag}"))
            .collect();
        let tc: Vec<Value> = calls
            .iter()
            .zip(&ids)
            .map(|((n, _), id)| call(id, *n))
            .collect();
        out.push(json!({"role": "assistant", "content": null, "tool_calls": tc}));
        for ((_, t), id) in calls.iter().zip(&ids) {
            out.push(json!({"role": "tool", "tool_call_id": id, "content": t}));
        }
    }
    if let Some(reply) = reply.filter(|r| !r.is_empty()) {
        out.push(json!({"role": "assistant", "content": reply}));
    }
    out
}
