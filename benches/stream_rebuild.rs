//! The reply's rebuild from a chat stream (`StreamAccumulator`), what the relay does to every
//! chunk of a streamed answer: an OpenAI-shaped chat stream of 500 text chunks, one of a tool
//! call whose arguments come in 500 fragments, and a Responses stream of 500 text deltas, fed
//! one event at a time as they arrive.
//!
//! ```text
//! cargo bench --bench stream_rebuild
//! ```

use criterion::{Criterion, Throughput, black_box, criterion_group, criterion_main};
use ctxproxy::upstream::reply::{ApiKind, StreamAccumulator};
use serde_json::{Value, json};

const CHUNKS: usize = 500;

/// The events of one streamed answer whose deltas are `deltas`, as OpenAI sends them.
fn stream(deltas: impl Iterator<Item = Value>) -> Vec<String> {
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-Bx1", "object": "chat.completion.chunk", "created": 1764000000,
            "model": "gpt-4o-2024-08-06", "service_tier": "default",
            "system_fingerprint": "fp_07871e2ad8",
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
            "obfuscation": "Xq3"})
    };
    let mut events = vec![chunk(
        json!({"role": "assistant", "content": "", "refusal": null}),
        Value::Null,
    )];
    events.extend(deltas.map(|d| chunk(d, Value::Null)));
    events.push(chunk(json!({}), json!("stop")));
    events
        .iter()
        .map(|e| format!("data: {e}\n\n"))
        .chain(std::iter::once("data: [DONE]\n\n".to_string()))
        .collect()
}

fn bench(c: &mut Criterion) {
    let words = [
        "The",
        " quick",
        " brown",
        " fox",
        "\n\n",
        " \"jumps\"",
        " over",
        " the",
        " lazy",
        " dog.",
    ];
    let text = stream((0..CHUNKS).map(|i| json!({"content": words[i % words.len()]})));
    let call = stream(std::iter::once(json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": ""}}]}))
    .chain((0..CHUNKS).map(|i| json!({"tool_calls": [{"index": 0, "function": {"arguments": words[i % words.len()]}}]}))));
    let responses: Vec<String> =
        std::iter::once(json!({"type": "response.created", "sequence_number": 0,
        "response": {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}}))
        .chain((0..CHUNKS).map(|i| {
            json!({"type": "response.output_text.delta", "sequence_number": i + 1,
        "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": words[i % words.len()],
        "logprobs": [], "obfuscation": "Xq3"})
        }))
        .chain(std::iter::once(
            json!({"type": "response.completed", "sequence_number": CHUNKS + 1,
        "response": {"id": "resp_1", "object": "response", "status": "completed", "output": []}}),
        ))
        .map(|e| {
            format!(
                "event: {}\ndata: {e}\n\n",
                e["type"].as_str().unwrap_or_default()
            )
        })
        .collect();
    let mut g = c.benchmark_group("stream_rebuild");
    g.throughput(Throughput::Elements(CHUNKS as u64));
    for (name, kind, events) in [
        ("text_500_chunks", ApiKind::Chat, &text),
        ("call_500_fragments", ApiKind::Chat, &call),
        ("responses_500_text_deltas", ApiKind::Responses, &responses),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut acc = StreamAccumulator::new(kind);
                for e in events {
                    acc.feed(black_box(e.as_bytes()));
                    acc.digest();
                }
                black_box(acc.finish())
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
