//! The agent conversation and policy the pipeline benches and `examples/turn_cost.rs` measure,
//! shared so that the criterion times and the instruction counts are of the same workload.

use ctxproxy::context::Policy;
use serde_json::{Value, json};

const STATUS: [&str; 3] = ["paid", "refunded", "pending"];

/// A 500-message agent conversation: system, then 100 rounds of question, tool call, a large
/// tool result, reply, and a follow-up note (the last round ends with the current question).
pub fn conversation() -> Vec<Value> {
    let mut v =
        vec![json!({"role": "system", "content": "You are an operations agent. ".repeat(20)})];
    for r in 0..100 {
        v.push(json!({"role": "user", "content": format!("Round {r}: check the orders of customer {} and summarise anything unusual in the last week, please.", r * 7919 % 10007)}));
        v.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{r}"), "type": "function",
            "function": {"name": "query_orders", "arguments": json!({"customer": r * 7919 % 10007, "days": 7, "fields": ["id", "total", "status"]}).to_string()}}]}));
        let rows: Vec<Value> = (0..40)
            .map(|i| json!({"id": format!("ord-{r}-{i}"), "total": (r * 31 + i * 17) % 1000, "status": STATUS[i % 3],
                "note": format!("customer asked about delivery window {i} and invoice {r}-{i}")}))
            .collect();
        v.push(json!({"role": "tool", "tool_call_id": format!("call_{r}"), "content": json!({"orders": rows, "count": 40}).to_string()}));
        v.push(json!({"role": "assistant", "content": format!("Customer {} placed 40 orders; {} were refunded, which is higher than usual. The pending ones are recent. ", r * 7919 % 10007, 13).repeat(3)}));
        if r < 99 {
            v.push(json!({"role": "user", "content": "Thanks, noted."}));
        }
    }
    v.truncate(500);
    v
}

pub fn policy() -> Policy {
    serde_json::from_value(json!({
        "tool_call_window": {"max": 10},
        "compress_tool_output": {"max_tokens": 300},
        "token_budget": {"target_ratio": 0.6}
    }))
    .unwrap_or_default()
}
