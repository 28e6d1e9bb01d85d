//! Runs turn N+1 of the bench conversation (`benches/workload`) a fixed number of times, for
//! counting instructions under callgrind: unlike criterion's `--profile-time`, the number of
//! turns is known, so the count per turn is exact and does not depend on the machine's load.
//!
//! ```text
//! cargo build --release --example turn_cost
//! valgrind --tool=callgrind --toggle-collect='ctxproxy::context::plan*' \
//!   --toggle-collect='*Plan::over*' target/release/examples/turn_cost 500 {10,20}
//! ```
//!
//! (turns 10 and 20, so that one-off costs of the first turns cancel out of the difference).
//!
//! The warm-up turn is run over the whole conversation and remembers its settled start (see
//! `context::settled`); each measured turn goes on from there, as turn N+1 of a conversation
//! does after turn N. Each turn's ids and spellings are made outside the count, as the proxy
//! makes them in its pass over the received messages (`Call::take_conversation`, `chain_ids`).

use ctxproxy::context::{PipelineInput, plan, run};
use ctxproxy::conversation::{Message, chain_ids, message_id};
use ctxproxy::tokens::{Encoding, ModelTable, Spellings, TokenCounter};
use serde_json::json;
use std::hint::black_box;

#[path = "../benches/workload/mod.rs"]
mod workload;

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let (Some(Ok(n)), Some(Ok(turns))) = (args.next(), args.next()) else {
        eprintln!("usage: turn_cost N TURNS [BUDGET] (N in 1..=500; BUDGET: a token_budget");
        eprintln!(
            "       of max_tokens BUDGET in place of the workload's, which keeps everything)"
        );
        std::process::exit(2);
    };
    let budget = args.next().and_then(Result::ok);
    let values = workload::conversation();
    let n = n.clamp(1, values.len());
    let prefix: Vec<Message> = values[..n - 1]
        .iter()
        .map(|m| serde_json::from_value(m.clone()).expect("bench message"))
        .collect();
    let prefix_ids = chain_ids(&values[..n - 1]);
    // Made with the ids, as the proxy makes both in its one pass over the received messages.
    let prefix_spellings = Spellings::of(&prefix);
    let mut policy = workload::policy();
    if let Some(max) = budget {
        policy.token_budget = Some(ctxproxy::context::policy::TokenBudget {
            max_tokens: Some(max as u64),
            target_ratio: None,
        });
    }
    let facts = ModelTable::built_in().lookup("gpt-4o");
    Encoding::O200kBase.warm_up();
    // Earlier turns: the history is counted (and its results compressed) once.
    let counter = TokenCounter::new();
    let mut warm = PipelineInput::new(&prefix, &policy, facts);
    warm.ids = Some(&prefix_ids);
    warm.spellings = Some(&prefix_spellings);
    run(warm, &counter).expect("warm-up turn");

    for k in 0..turns {
        // A new question nobody has counted yet, as in `next_turn_warm`.
        let q = json!({"role": "user", "content": format!("New question number {k}: what changed since yesterday?")});
        let mut messages = prefix.clone();
        messages.push(serde_json::from_value(q.clone()).expect("question"));
        let mut ids = prefix_ids.clone();
        ids.push(message_id(prefix_ids.last(), &q));
        let mut spellings = prefix_spellings.clone();
        spellings.push(messages.last().expect("the question"));
        let mut input = PipelineInput::new(&messages, &policy, facts);
        input.ids = Some(&ids);
        input.spellings = Some(&spellings);
        let p = plan(input, &counter).expect("turn");
        // The request is written from the caller's messages where they are.
        black_box(p.over(messages));
    }
}
