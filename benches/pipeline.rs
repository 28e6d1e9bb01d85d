//! The pipeline on a long agent conversation: 500 messages, ~150k tokens (o200k_base), with a
//! realistic policy (window, compression, budget at 60% of gpt-4o's window).
//!
//! - `cold`: an empty count cache, every message tokenised.
//! - `warm`: every message already counted (the same request again).
//! - `turn_N`: turn N+1 of a conversation whose first N messages were counted on earlier turns;
//!   only the new message is tokenised. Compares N = 50 and N = 500, twice: `next_turn_warm`
//!   with [`plan`] and [`Plan::over`] (the request is written from the caller's conversation
//!   where it is, as the proxy does: nothing per message of history is moved or allocated),
//!   and `next_turn_run` with [`run`] (the kept messages are cloned).
//!
//! The conversation each routine is given is built, and dropped, outside the timed part
//! (`iter_batched_ref`): dropping the caller's conversation is not the pipeline's cost.

use criterion::{BatchSize, Criterion, black_box, criterion_group, criterion_main};
use ctxproxy::context::{PipelineInput, Plan, Policy, plan, run};
use ctxproxy::conversation::{Message, MessageId, chain_ids, message_id};
use ctxproxy::tokens::{Encoding, ModelTable, Spellings, TokenCounter};
use serde_json::json;

mod workload;
use workload::{conversation, policy};

fn bench(c: &mut Criterion) {
    let values = conversation();
    let messages: Vec<Message> = values
        .iter()
        .map(|m| serde_json::from_value(m.clone()).unwrap())
        .collect();
    let ids = chain_ids(&values);
    let policy = policy();
    let facts = ModelTable::built_in().lookup("gpt-4o");
    Encoding::O200kBase.warm_up();
    let total = TokenCounter::new().request(facts.encoding, &messages, None, None);
    eprintln!("conversation: {} messages, {total} tokens", messages.len());

    let policy_s: &'static Policy = Box::leak(Box::new(policy.clone()));
    let input = |msgs: &'static [Message], ids: &'static [MessageId]| {
        let mut i = PipelineInput::new(msgs, policy_s, facts);
        i.ids = Some(ids);
        i
    };
    let msgs: &'static [Message] = Box::leak(messages.clone().into_boxed_slice());
    let ids_s: &'static [MessageId] = Box::leak(ids.clone().into_boxed_slice());

    let mut g = c.benchmark_group("pipeline_500");
    g.sample_size(20);
    g.bench_function("cold", |b| {
        b.iter_batched(
            TokenCounter::new,
            |counter| black_box(run(input(msgs, ids_s), &counter).unwrap()),
            BatchSize::PerIteration,
        )
    });
    let warm = TokenCounter::new();
    run(input(msgs, ids_s), &warm).unwrap();
    g.bench_function("warm", |b| {
        b.iter(|| black_box(run(input(msgs, ids_s), &warm).unwrap()))
    });
    g.finish();

    for (group, take) in [("next_turn_warm", true), ("next_turn_run", false)] {
        let mut g = c.benchmark_group(group);
        for n in [50usize, 500] {
            let prefix: &'static [Message] =
                Box::leak(messages[..n - 1].to_vec().into_boxed_slice());
            let prefix_ids = ids[..n - 1].to_vec();
            // Made with the ids, as the proxy makes both in its pass over the received messages
            // (`Call::take_conversation`).
            let prefix_spellings = Spellings::of(prefix);
            let counter = TokenCounter::new();
            let mut first = input(prefix, Box::leak(prefix_ids.clone().into_boxed_slice()));
            first.spellings = Some(&prefix_spellings);
            run(first, &counter).unwrap();
            let mut k = 0u64;
            g.bench_function(format!("turn_{n}"), |b| {
                b.iter_batched_ref(
                    || {
                        // a new question nobody has counted yet
                        k += 1;
                        let q = json!({"role": "user", "content": format!("New question number {k}: what changed since yesterday?")});
                        let mut m = prefix.to_vec();
                        m.push(serde_json::from_value(q.clone()).unwrap());
                        let mut i = prefix_ids.clone();
                        i.push(message_id(prefix_ids.last(), &q));
                        let mut s = prefix_spellings.clone();
                        s.push(m.last().unwrap());
                        (m, i, s)
                    },
                    |(m, i, s)| {
                        let mut inp = PipelineInput::new(m.as_slice(), &policy, facts);
                        inp.ids = Some(i.as_slice());
                        inp.spellings = Some(s);
                        // Either way dropped outside the timed part, as the conversation is.
                        if take {
                            let p: Plan = plan(inp, &counter).unwrap();
                            (Some(black_box(p.over(std::mem::take(m)))), None)
                        } else {
                            (None, Some(black_box(run(inp, &counter).unwrap())))
                        }
                    },
                    BatchSize::SmallInput,
                )
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
