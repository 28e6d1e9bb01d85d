//! Where a managed chat request's own CPU goes before and after the pipeline, step by step, on
//! turn N+1 of the bench conversation (`benches/workload`) resent in full by the client: parse
//! the body, take the conversation out as wire JSON, chain the ids, hand the turn to the store
//! (what `client_turn` builds), plan the rewrite (warm count cache), encode the body to send.
//!
//! ```text
//! cargo run --release --example request_cost -- 500 200     # N messages, repetitions
//! ```
//!
//! Wall-clock means on a shared machine: read the split between the steps, not the absolute
//! figures (instruction counts: run it under `valgrind --tool=callgrind`).

use std::hint::black_box;
use std::time::{Duration, Instant};

use ctxproxy::context::{PipelineInput, plan};
use ctxproxy::conversation::chain_ids;
use ctxproxy::http::call::Call;
use ctxproxy::http::managed::Endpoint;
use ctxproxy::session::history::{Incoming, client_turn};
use ctxproxy::tokens::{Encoding, ModelTable, TokenCounter};
use serde_json::json;

#[path = "../benches/workload/mod.rs"]
mod workload;

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let (Some(Ok(n)), Some(Ok(reps))) = (args.next(), args.next()) else {
        eprintln!("usage: request_cost N REPS (N in 1..=500)");
        std::process::exit(2);
    };
    let values = workload::conversation();
    let n = n.clamp(1, values.len());
    let body = serde_json::to_vec(&json!({"model": "gpt-4o", "messages": values[..n]}))
        .expect("bench body");
    let policy = workload::policy();
    let facts = ModelTable::built_in().lookup("gpt-4o");
    Encoding::O200kBase.warm_up();
    let counter = TokenCounter::new();

    let steps = ["parse", "take", "chain ids", "store job", "plan", "encode"];
    let mut spent = [Duration::ZERO; 6];
    for _ in 0..reps {
        let t = Instant::now();
        let mut call = Call::parse(Endpoint::Chat, &body).expect("parse");
        let t1 = Instant::now();
        let taken = call.take_conversation().expect("take");
        let t2 = Instant::now();
        let ids = chain_ids(&taken.wire);
        let t3 = Instant::now();
        let (append, assembled) = client_turn(
            Incoming {
                messages: taken.wire,
                ids: Some(ids),
                stored_prefix: 0,
            },
            false,
        );
        black_box(append);
        let t4 = Instant::now();
        let typed = taken.typed.expect("chat is typed");
        let mut input = PipelineInput::new(&typed.messages, &policy, facts);
        input.ids = Some(&assembled.ids);
        input.spellings = Some(&typed.spellings);
        let rewritten = plan(input, &counter).expect("plan").over(typed.messages);
        let t5 = Instant::now();
        call.put_chat_messages(rewritten.messages);
        black_box(call.to_body().expect("encode"));
        let t6 = Instant::now();
        for (s, (a, b)) in
            spent
                .iter_mut()
                .zip([(t, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5), (t5, t6)])
        {
            *s += b - a;
        }
    }
    let total: Duration = spent.iter().sum();
    println!(
        "N = {n}, {} bytes, mean of {reps}: {:.1} µs",
        body.len(),
        total.as_secs_f64() * 1e6 / reps as f64
    );
    for (name, s) in steps.iter().zip(spent) {
        println!(
            "  {name:10} {:8.1} µs  {:4.1} %",
            s.as_secs_f64() * 1e6 / reps as f64,
            100.0 * s.as_secs_f64() / total.as_secs_f64()
        );
    }
}
