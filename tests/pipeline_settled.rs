//! A conversation's settled start (`context::settled`) changes nothing: turn after turn of a
//! random conversation, a run that may go on from an earlier turn's start gives exactly what a
//! run over the whole conversation with no memory gives (messages, report, call changes, or the
//! same error).

mod support;

use ctxproxy::context::{PipelineInput, Policy, Rewritten, ToolAccess, begin};
use ctxproxy::conversation::{Message, chain_ids};
use ctxproxy::tokens::{Encoding, ModelFacts, Spellings, TokenCounter};
use proptest::prelude::*;
use serde_json::{Value, json};

const NAMES: [&str; 3] = ["get_weather", "search_web", "run_sql"];

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z ]{1,40}",
        "[a-z0-9 ,.]{40,300}",
        Just(json!({"rows": (0..30).collect::<Vec<_>>(), "note": "x".repeat(150)}).to_string()),
    ]
}

fn call(id: &str, name: usize, spaced: bool) -> Value {
    let arguments = if spaced { "{ \"q\": 1 }" } else { "{\"q\":1}" };
    json!({"id": id, "type": "function", "function": {"name": NAMES[name], "arguments": arguments}})
}

/// A piece of conversation: a turn done right (question, rounds of calls with their results,
/// a reply), or one stray message from a small pool of ids (orphans, duplicates, late results).
fn piece() -> impl Strategy<Value = Vec<Value>> {
    let turn = (
        text(),
        prop::collection::vec(prop::collection::vec((0..3usize, text()), 1..3), 0..3),
        prop::option::of(text()),
        any::<u16>(),
    )
        .prop_map(|(q, rounds, reply, salt)| {
            support::agent_turn(q, rounds, reply, salt % 7, |id, n| call(id, n, false))
        });
    let id = || (0..4u8).prop_map(|i| format!("call_0_{i}_0"));
    let stray = prop_oneof![
        (id(), text()).prop_map(|(i, t)| json!({"role": "tool", "tool_call_id": i, "content": t})),
        (
            prop::collection::vec((id(), 0..3usize), 0..3),
            prop::option::of(text()),
            any::<bool>()
        )
            .prop_map(|(calls, t, spaced)| {
                let tc: Vec<Value> = calls.iter().map(|(i, n)| call(i, *n, spaced)).collect();
                json!({"role": "assistant", "content": t, "tool_calls": tc})
            }),
        prop::option::of(text()).prop_map(|t| json!({"role": "assistant", "content": t})),
        text().prop_map(|t| json!({"role": "system", "content": t})),
    ];
    prop_oneof![6 => turn, 1 => stray.prop_map(|m| vec![m])]
}

fn conversation() -> impl Strategy<Value = Vec<Value>> {
    prop::collection::vec(piece(), 6..22).prop_map(|pieces| {
        let mut v = vec![json!({"role": "system", "content": "You are a careful agent."})];
        v.extend(pieces.into_iter().flatten());
        v
    })
}

fn policy() -> impl Strategy<Value = Policy> {
    support::any_policy(&NAMES, prop_oneof![20..1500u64, 1500..200_000u64])
}

/// One run of the pipeline the way the proxy runs it (`begin`, then `finish` with no summary),
/// as its output or its error's text and report; with `spelled`, given the messages'
/// spellings as a chat request gives them (made with the ids), else making them itself.
fn run(
    messages: &[Message],
    ids: &[ctxproxy::conversation::MessageId],
    policy: &Policy,
    model: ModelFacts,
    access: Option<&ToolAccess>,
    counter: &TokenCounter,
    spelled: bool,
) -> Result<Rewritten, String> {
    let spellings = spelled.then(|| spelled_one_by_one(messages));
    let mut input = PipelineInput::new(messages, policy, model);
    input.ids = Some(ids);
    input.spellings = spellings.as_ref();
    input.tool_access = access;
    begin(input, counter)
        .and_then(|early| early.finish(None))
        .map(|plan| plan.cloned_from(messages))
        .map_err(|e| format!("{e:?}"))
}

/// The spellings of `messages` made one at a time, as `Call::take_conversation` makes them.
fn spelled_one_by_one(messages: &[Message]) -> Spellings {
    let mut spellings = Spellings::with_capacity(messages.len());
    for m in messages {
        spellings.push(m);
    }
    assert_eq!(spellings.chained, Spellings::of(messages).chained);
    spellings
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn a_turn_that_goes_on_from_a_settled_start_equals_a_run_over_the_whole(
        values in conversation(),
        policy in policy(),
        scrub in prop::option::of(0..3usize),
        window in prop_oneof![Just(1_000_000u64), 200..5000u64],
        step in 1..4usize,
        spelled in any::<bool>(),
    ) {
        let messages: Vec<Message> =
            values.iter().map(|v| serde_json::from_value(v.clone()).unwrap()).collect();
        let ids = chain_ids(&values);
        let model = ModelFacts { context_window: window, encoding: Encoding::Approximate };
        let access = scrub.map(|n| ToolAccess {
            offered: [NAMES[n].to_string()].into_iter().collect(),
            scrub_history: true,
        });
        // One counter for the whole conversation, turn after turn, as in the proxy.
        let shared = TokenCounter::new();
        for len in (1..=messages.len()).step_by(step) {
            let turn = &messages[..len];
            let ids = &ids[..len];
            let remembered = run(turn, ids, &policy, model, access.as_ref(), &shared, spelled);
            let fresh = TokenCounter::new();
            let whole = run(turn, ids, &policy, model, access.as_ref(), &fresh, false);
            prop_assert_eq!(remembered, whole, "turn of {} messages", len);
        }
    }
}

/// The same message in another form its id does not tell apart (see `conversation::identity`):
/// a string content as a text part, provider extras, an `audio` (which keeps a message whose
/// calls go), an empty `tool_calls`, a private field.
fn reform(message: &Value, how: u8) -> Value {
    let mut m = message.clone();
    let Some(fields) = m.as_object_mut() else {
        return m;
    };
    let assistant = fields.get("role") == Some(&json!("assistant"));
    match how % 6 {
        0 => {
            if let Some(Value::String(text)) = fields.get("content").cloned() {
                fields.insert("content".into(), json!([{"type": "text", "text": text}]));
            }
        }
        1 if assistant => {
            fields.insert("refusal".into(), Value::Null);
            fields.insert("annotations".into(), json!([]));
        }
        2 if assistant => {
            fields.insert("audio".into(), json!({"id": "audio_1"}));
        }
        3 if assistant && !fields.contains_key("tool_calls") => {
            fields.insert("tool_calls".into(), json!([]));
        }
        _ => {
            fields.insert("x_private".into(), json!(format!("form {how}")));
        }
    }
    m
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// A client may resend its history in another form from one turn to the next (what its
    /// SDK adds or drops): a turn going on from a start settled on the old form still sends
    /// what a run over the whole sends, the new form as it came.
    #[test]
    fn a_history_resent_in_another_form_is_rewritten_as_the_whole_would_be(
        values in conversation(),
        policy in policy(),
        reforms in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        every in 2..5usize,
        spelled in any::<bool>(),
    ) {
        let model = ModelFacts { context_window: 1_000_000, encoding: Encoding::Approximate };
        let shared = TokenCounter::new();
        let mut current = values.clone();
        for len in 1..=values.len() {
            // Now and then, earlier messages come back in another form, and stay so.
            if len % every == 0 {
                for (at, how) in &reforms {
                    let p = at.index(len);
                    current[p] = reform(&values[p], *how);
                }
            }
            let turn_values = &current[..len];
            let messages: Vec<Message> = turn_values
                .iter()
                .map(|v| serde_json::from_value(v.clone()).unwrap())
                .collect();
            let ids = chain_ids(turn_values);
            let remembered = run(&messages, &ids, &policy, model, None, &shared, spelled);
            let whole = run(&messages, &ids, &policy, model, None, &TokenCounter::new(), false);
            prop_assert_eq!(remembered, whole, "turn of {} messages", len);
        }
    }
}

/// The bench's agent conversation (rounds of a question, a call, its long result, a reply):
/// from the window's first cut on, turns go on from a settled start, and what they send is what
/// a run over the whole sends; with a budget that keeps everything, and with one that cuts.
#[test]
fn a_long_agent_conversation_goes_on_from_its_settled_start() {
    let mut values = vec![json!({"role": "system", "content": "You are an agent."})];
    for r in 0..40 {
        values.push(json!({"role": "user", "content": format!("Round {r}: check the orders.")}));
        values.push(json!({"role": "assistant", "content": null, "tool_calls": [call(&format!("call_{r}"), r % 3, false)]}));
        values.push(json!({"role": "tool", "tool_call_id": format!("call_{r}"), "content": "row ".repeat(300)}));
        values.push(json!({"role": "assistant", "content": format!("Round {r} looks fine.")}));
    }
    let messages: Vec<Message> = values
        .iter()
        .map(|v| serde_json::from_value(v.clone()).unwrap())
        .collect();
    let ids = chain_ids(&values);
    let model = ModelFacts {
        context_window: 128_000,
        encoding: Encoding::O200kBase,
    };
    for (budget, cuts) in [
        (json!({"target_ratio": 0.6}), false),
        (json!({"max_tokens": 600}), true),
    ] {
        let policy: Policy = serde_json::from_value(json!({
            "tool_call_window": {"max": 3},
            "compress_tool_output": {"max_tokens": 50},
            "token_budget": budget
        }))
        .unwrap();
        let shared = TokenCounter::new();
        let (mut resumed, mut budget_removed) = (0, 0);
        // Each turn ends with the next question, as a client sends it.
        for len in (5..=messages.len()).step_by(4).map(|l| l + 1) {
            let turn = &messages[..len.min(messages.len())];
            let turn_ids = &ids[..turn.len()];
            let spellings = spelled_one_by_one(turn);
            let mut input = PipelineInput::new(turn, &policy, model);
            input.ids = Some(turn_ids);
            input.spellings = Some(&spellings);
            let early = begin(input, &shared).unwrap();
            if early.resumed_from().is_some() {
                resumed += 1;
            }
            let remembered = early.finish(None).unwrap().cloned_from(turn);
            let fresh = TokenCounter::new();
            let whole = run(turn, turn_ids, &policy, model, None, &fresh, false).unwrap();
            assert_eq!(remembered, whole, "turn of {} messages", turn.len());
            budget_removed = remembered
                .report
                .removed
                .iter()
                .filter(|r| r.reason == ctxproxy::context::RemoveReason::TokenBudget)
                .count();
        }
        assert_eq!(budget_removed > 0, cuts, "the budget cuts: {cuts}");
        // Turns of 16 messages and more may remember; from the window's first cut (3 calls
        // kept) later turns go on from a start (with a budget that cuts, once the start can
        // trail the kept history by what the next turn's cut may move back).
        let expected = if cuts { 20 } else { 30 };
        assert!(
            resumed >= expected,
            "only {resumed} turns went on from a settled start"
        );
    }
}
