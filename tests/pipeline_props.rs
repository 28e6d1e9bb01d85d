//! Property tests over random conversations, valid and broken: whatever the policy, the output
//! satisfies the repair invariant, keeps the instructions and the current turn, is a fixed point
//! of the pipeline, and fits the token budget whenever what must be kept fits; likewise for
//! Responses items, reasoning among them.

mod items_support;
mod support;

use ctxproxy::context::{PipelineInput, Policy, plan, run};
use ctxproxy::conversation::responses_items::to_items;
use ctxproxy::conversation::{ItemMessages, Message, Role};
use ctxproxy::tokens::{Encoding, ModelFacts, TokenCounter};
use proptest::prelude::*;
use serde_json::{Value, json};
use support::{check_valid, current_turn_start};

const NAMES: [&str; 3] = ["get_weather", "search_web", "run_sql"];

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z ]{1,40}",
        "[a-z0-9 ,.]{40,300}",
        Just("東京の天気 🎉 ".repeat(12)),
        Just(json!({"rows": (0..30).collect::<Vec<_>>(), "note": "x".repeat(150)}).to_string()),
    ]
}

fn call(id: &str, name: usize) -> Value {
    json!({"id": id, "type": "function", "function": {"name": NAMES[name], "arguments": "{\"q\":1}"}})
}

/// One turn done right: a question, optional rounds of calls with all their results, a reply.
fn valid_turn() -> impl Strategy<Value = Vec<Value>> {
    (
        text(),
        prop::collection::vec(prop::collection::vec((0..3usize, text()), 1..4), 0..3),
        prop::option::of(text()),
    )
        .prop_map(|(q, rounds, reply)| {
            let tag = q.len();
            support::agent_turn(q, rounds, reply, tag, call)
        })
}

/// Anything at all, from a small pool of ids so orphans, duplicates and late results happen.
fn any_message() -> impl Strategy<Value = Value> {
    let id = || (0..5u8).prop_map(|i| format!("c{i}"));
    prop_oneof![
        3 => text().prop_map(|t| json!({"role": "user", "content": t})),
        2 => prop::option::of(text()).prop_map(|t| json!({"role": "assistant", "content": t})),
        3 => (prop::collection::vec((id(), 0..3usize), 0..4), prop::option::of(text()))
            .prop_map(|(calls, t)| {
                let tc: Vec<Value> = calls.into_iter().map(|(i, n)| call(&i, n)).collect();
                json!({"role": "assistant", "content": t, "tool_calls": tc})
            }),
        4 => (id(), text()).prop_map(|(i, t)| json!({"role": "tool", "tool_call_id": i, "content": t})),
        1 => text().prop_map(|t| json!({"role": "system", "content": t})),
    ]
}

fn conversation() -> impl Strategy<Value = (Vec<Message>, bool)> {
    let system = json!({"role": "system", "content": "You are a careful agent."});
    let valid = prop::collection::vec(valid_turn(), 1..8).prop_map({
        let system = system.clone();
        move |turns| {
            let mut v = vec![system.clone()];
            v.extend(turns.into_iter().flatten());
            (v, true)
        }
    });
    let broken = prop::collection::vec(any_message(), 0..25).prop_map(move |msgs| {
        let mut v = vec![system.clone()];
        v.extend(msgs);
        (v, false)
    });
    prop_oneof![valid, broken].prop_map(|(v, ok)| {
        (
            v.into_iter()
                .map(|m| serde_json::from_value(m).unwrap())
                .collect(),
            ok,
        )
    })
}

fn policy() -> impl Strategy<Value = Policy> {
    support::any_policy(&NAMES, 20..1500u64)
}

/// Whether the current turn holds a result for a call made before it (repair moves it there).
fn has_late_history_result(msgs: &[Message]) -> bool {
    let start = current_turn_start(msgs);
    msgs[start..].iter().any(|m| {
        m.role == Role::Tool
            && msgs[..start].iter().any(|a| {
                a.tool_calls()
                    .iter()
                    .any(|c| Some(c.id.as_str()) == m.tool_call_id.as_deref())
            })
    })
}

fn model(o200k: bool) -> ModelFacts {
    ModelFacts {
        context_window: 1_000_000,
        encoding: if o200k {
            Encoding::O200kBase
        } else {
            Encoding::Approximate
        },
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn pipeline_output_is_valid_stable_and_within_budget(
        (msgs, valid) in conversation(),
        policy in policy(),
        o200k in any::<bool>(),
    ) {
        let counter = TokenCounter::new();
        let facts = model(o200k);
        let out = run(PipelineInput::new(&msgs, &policy, facts), &counter).unwrap();

        // the request written from the conversation where it is sends what the list holds
        let planned = plan(PipelineInput::new(&msgs, &policy, facts), &counter).unwrap();
        prop_assert_eq!(planned.len(), out.messages.len());
        let in_place = planned.over(msgs.clone());
        prop_assert_eq!(in_place.messages.len(), out.messages.len());
        prop_assert!(in_place.messages.iter().eq(&out.messages));
        prop_assert_eq!(
            serde_json::to_string(&in_place.messages).unwrap(),
            serde_json::to_string(&out.messages).unwrap()
        );
        prop_assert_eq!(&in_place.report, &out.report);
        prop_assert_eq!(in_place.messages.into_vec(), out.messages.clone());

        // the repair invariant
        if let Err(e) = check_valid(&out.messages) {
            return Err(TestCaseError::fail(format!("{e}\nin: {msgs:?}\nout: {:?}", out.messages)));
        }
        // the system message is kept
        prop_assert_eq!(&out.messages[0], &msgs[0]);
        // the current turn is kept: whole when it was valid, its user message always
        let start = current_turn_start(&msgs);
        if msgs[start].role == Role::User {
            prop_assert!(out.messages.contains(&msgs[start]));
            if valid {
                let out_start = current_turn_start(&out.messages);
                prop_assert_eq!(&out.messages[out_start..], &msgs[start..]);
            }
        }
        // nothing in the current turn is compressed, not even a late result of a history call
        prop_assert!(out.report.compressed.iter().all(|c| c.index < start));
        // the budget holds unless even the kept-by-rule part is over it (then no history is left)
        if let Some(b) = &policy.token_budget {
            let limit = b.limit(facts.context_window);
            let out_start = current_turn_start(&out.messages);
            let history_left = out.messages[..out_start].iter().any(|m| !m.role.is_instruction());
            prop_assert!(
                out.report.tokens_out <= limit || !history_left,
                "tokens_out {} over budget {} with history left", out.report.tokens_out, limit
            );
        }
        // the report's count is the request as sent
        prop_assert_eq!(
            out.report.tokens_out,
            counter.request(facts.encoding, &out.messages, None, None)
        );
        // running the pipeline on its own output changes nothing; except that a late result of a
        // history call, left as it is in the current turn (SPEC 5) and moved back to its call by
        // repair, is history on the next run, which may compress it; then nothing changes
        let again = run(PipelineInput::new(&out.messages, &policy, facts), &counter).unwrap();
        let out = if policy.compress_tool_output.is_some() && has_late_history_result(&msgs) {
            again
        } else {
            out
        };
        let again = run(PipelineInput::new(&out.messages, &policy, facts), &counter).unwrap();
        prop_assert_eq!(&again.messages, &out.messages);
        prop_assert_eq!(again.report.tokens_out, out.report.tokens_out);
    }
}

/// Any Responses item, from a small pool of call ids, reasoning often: lone, before a call, an
/// answer or the client's next message.
fn any_item() -> impl Strategy<Value = Value> {
    let id = || (0..4u8).prop_map(|i| format!("c{i}"));
    prop_oneof![
        3 => text().prop_map(|t| json!({"role": "user", "content": t})),
        2 => text().prop_map(|t| json!({"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": t, "annotations": []}]})),
        3 => (id(), 0..3usize).prop_map(|(i, n)| json!({"type": "function_call", "call_id": i,
            "name": NAMES[n], "arguments": "{}"})),
        3 => (id(), text()).prop_map(|(i, t)| json!({"type": "function_call_output",
            "call_id": i, "output": t})),
        3 => (0..3u8).prop_map(|i| json!({"type": "reasoning", "id": format!("rs_{i}"),
            "summary": []})),
        1 => Just(json!({"type": "web_search_call", "id": "ws_1", "status": "completed"})),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Whatever the items and the policy, what is sent satisfies the repair invariant and
    /// every reasoning item in it leads an item of its reply (which the provider wants), and it
    /// is a fixed point: rewriting it again sends the same items (but for a late result moved
    /// back to its history call, compressed on the next run, as above).
    #[test]
    fn responses_items_out_are_accepted_and_stable(
        items in prop::collection::vec(any_item(), 0..20),
        policy in policy(),
    ) {
        let counter = TokenCounter::new();
        let facts = model(false);
        let send = |items: &[Value]| {
            let conv = ItemMessages::new(None, items);
            let out = run(conv.pipeline_input(&policy, facts), &counter).unwrap();
            // the items made from the messages read in place are the same
            let planned = plan(conv.pipeline_input(&policy, facts), &counter).unwrap();
            let in_place = to_items(planned.messages(&conv.messages));
            let sent = to_items(&out.messages);
            assert_eq!(in_place, sent, "items from the plan read in place");
            (sent, out.messages)
        };
        let (sent, messages) = send(&items);
        let valid = check_valid(&messages).and_then(|()| items_support::check_reasoning(&sent));
        if let Err(e) = valid {
            return Err(TestCaseError::fail(format!("{e}\nin: {items:?}\nout: {sent:?}")));
        }
        let given = ItemMessages::new(None, &items).messages;
        let sent = if policy.compress_tool_output.is_some() && has_late_history_result(&given) {
            send(&sent).0
        } else {
            sent
        };
        prop_assert_eq!(send(&sent).0, sent);
    }
}
