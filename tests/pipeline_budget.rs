//! Token budget, stored summaries (applying and planning), the context-window check, the token
//! cache and the report's JSON shape.

mod support;

use ctxproxy::Error;
use ctxproxy::context::{
    Entry, PipelineInput, Policy, RemoveReason, Report, StoredSummary, plan_summary, run,
};
use ctxproxy::conversation::{Message, Role, chain_ids};
use ctxproxy::tokens::{Encoding, ModelFacts, TokenCounter};
use serde_json::{Value, json};
use support::*;

fn weather() -> Vec<Message> {
    messages(&fixture("weather_walkthrough.json"))
}

fn run_with(
    msgs: &[Message],
    policy: &Policy,
    summary: Option<&StoredSummary>,
) -> ctxproxy::context::Rewritten {
    let mut input = PipelineInput::new(msgs, policy, O200K);
    input.summary = summary;
    run(input, &TokenCounter::new()).unwrap()
}

/// Original indices of the history messages (non-instruction, before the current turn) kept.
fn kept_history(msgs: &[Message], out: &[Message]) -> Vec<usize> {
    let start = current_turn_start(msgs);
    out.iter()
        .filter_map(|m| msgs[..start].iter().position(|x| x == m))
        .filter(|&i| !msgs[i].role.is_instruction())
        .collect()
}

#[test]
fn budget_keeps_newest_whole_history_from_a_user_message() {
    let msgs = weather();
    let full = rewrite(&msgs, &policy(json!({}))).report.tokens_out;
    for budget in [60, 150, 200, 260, 330, full - 1, full] {
        let out = rewrite(
            &msgs,
            &policy(json!({"token_budget": {"max_tokens": budget}})),
        );
        let kept = kept_history(&msgs, &out.messages);
        let history_end = current_turn_start(&msgs);
        if let Some(&first) = kept.first() {
            assert!(
                out.report.tokens_out <= budget,
                "budget {budget}: {}",
                out.report.tokens_out
            );
            assert_eq!(msgs[first].role, Role::User, "budget {budget}");
            // contiguous up to the current turn
            assert_eq!(
                kept,
                (first..history_end).collect::<Vec<_>>(),
                "budget {budget}"
            );
        }
        assert_eq!(
            &out.messages[..1],
            &msgs[..1],
            "the developer message stays"
        );
        assert_eq!(
            out.messages[out.messages.len() - 4..],
            msgs[msgs.len() - 4..]
        );
        assert!(
            out.report
                .removed
                .iter()
                .all(|r| r.reason == RemoveReason::TokenBudget)
        );
        check_valid(&out.messages).unwrap();
    }
    let all = rewrite(
        &msgs,
        &policy(json!({"token_budget": {"max_tokens": full}})),
    );
    assert_eq!(all.messages, msgs);
}

#[test]
fn budget_that_fits_still_starts_kept_history_at_a_user_message() {
    // Everything fits, but the history opens with an assistant message: it goes all the same.
    let msgs = messages(&json!({"messages": [
        {"role": "system", "content": "be brief"},
        {"role": "assistant", "content": "left over from an earlier session"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "and now?"}
    ]}));
    let out = rewrite(
        &msgs,
        &policy(json!({"token_budget": {"max_tokens": 100_000}})),
    );
    assert_eq!(out.messages, [&msgs[..1], &msgs[2..]].concat());
    assert_eq!(out.report.removed.len(), 1);
    assert_eq!(out.report.removed[0].index, 1);
    assert_eq!(out.report.removed[0].reason, RemoveReason::TokenBudget);
}

#[test]
fn budget_ratio_is_a_share_of_the_context_window() {
    let msgs = weather();
    let p = policy(json!({"token_budget": {"target_ratio": 0.5}}));
    let model = ModelFacts {
        context_window: 500,
        encoding: Encoding::O200kBase,
    };
    let out = run(PipelineInput::new(&msgs, &p, model), &TokenCounter::new()).unwrap();
    assert!(out.report.tokens_out <= 250);
    assert!(out.report.tokens_in > 250);
}

#[test]
fn over_the_context_window_after_every_rewrite_is_an_error() {
    let msgs = weather();
    let p = policy(json!({"token_budget": {"max_tokens": 10}}));
    let model = ModelFacts {
        context_window: 60,
        encoding: Encoding::O200kBase,
    };
    match run(PipelineInput::new(&msgs, &p, model), &TokenCounter::new()) {
        Err(Error::ContextLengthExceeded {
            window: 60, needed, ..
        }) => assert!(needed > 60),
        other => panic!("{other:?}"),
    }
    // the same conversation fits once the budget has cut it
    let model = ModelFacts {
        context_window: 200,
        encoding: Encoding::O200kBase,
    };
    assert!(run(PipelineInput::new(&msgs, &p, model), &TokenCounter::new()).is_ok());
}

#[test]
fn summary_replaces_covered_history_after_the_leading_instructions() {
    let msgs = weather();
    let s = StoredSummary {
        text: "Tokyo was sunny, Delhi windy.".into(),
        covers_until: 8,
    };
    let out = run_with(&msgs, &policy(json!({})), Some(&s));
    assert_eq!(out.messages[0], msgs[0]);
    assert_eq!(out.messages[1].role, Role::System);
    assert_eq!(
        out.messages[1].text_content(),
        "Summary of the earlier conversation:\nTokyo was sunny, Delhi windy."
    );
    assert_eq!(&out.messages[2..], &msgs[9..]);
    let removed: Vec<usize> = out.report.removed.iter().map(|r| r.index).collect();
    assert_eq!(removed, (1..=8).collect::<Vec<_>>());
    assert!(
        out.report
            .removed
            .iter()
            .all(|r| r.reason == RemoveReason::Summary)
    );
    assert!(out.report.summary.used);
    assert_eq!(out.report.summary.covers_until, Some(8));
}

#[test]
fn summary_cut_never_splits_a_call_from_its_result() {
    let msgs = weather();
    // index 6 is run 2's call, 7 its result: the cut falls back to the call
    let s = StoredSummary {
        text: "t".into(),
        covers_until: 6,
    };
    let out = run_with(&msgs, &policy(json!({})), Some(&s));
    assert_eq!(&out.messages[2..], &msgs[6..]);
    check_valid(&out.messages).unwrap();
}

/// A tool result that step 4 shortened and the summary then covers is not sent at all: the
/// report names it as removed only, not also as compressed (nor counts it as a compression).
#[test]
fn a_covered_result_is_reported_removed_not_compressed() {
    let msgs = weather();
    let p = policy(json!({"compress_tool_output": {"max_tokens": 3}}));
    let all = run_with(&msgs, &p, None).report.compressed;
    assert!(all.iter().any(|c| c.index <= 8), "{all:?}");
    assert!(all.iter().any(|c| c.index > 8), "{all:?}");
    let s = StoredSummary {
        text: "t".into(),
        covers_until: 8,
    };
    let out = run_with(&msgs, &p, Some(&s));
    let removed: Vec<usize> = out.report.removed.iter().map(|r| r.index).collect();
    let compressed: Vec<usize> = out.report.compressed.iter().map(|c| c.index).collect();
    assert_eq!(removed, (1..=8).collect::<Vec<_>>());
    let uncovered: Vec<usize> = all.iter().map(|c| c.index).filter(|&i| i > 8).collect();
    assert_eq!(compressed, uncovered);
}

/// Entries made by different steps come out in one order, by index, and a result shortened
/// by step 4 that the budget then drops is reported as removed only.
#[test]
fn report_lists_are_in_index_order_and_name_a_message_once() {
    let msgs = weather();
    let steps = json!({"tool_call_window": {"max": 3}, "compress_tool_output": {"max_tokens": 3}});
    let unbudgeted = rewrite(&msgs, &policy(steps.clone()));
    let full = unbudgeted.report.tokens_out;
    let mut p = steps;
    p["token_budget"] = json!({"max_tokens": full * 2 / 3});
    let out = rewrite(&msgs, &policy(p));
    let reasons: Vec<RemoveReason> = out.report.removed.iter().map(|r| r.reason).collect();
    assert!(
        reasons.contains(&RemoveReason::ToolCallWindow),
        "{reasons:?}"
    );
    assert!(reasons.contains(&RemoveReason::TokenBudget), "{reasons:?}");
    let removed: Vec<usize> = out.report.removed.iter().map(|r| r.index).collect();
    assert!(removed.is_sorted(), "{removed:?}");
    let compressed: Vec<usize> = out.report.compressed.iter().map(|c| c.index).collect();
    let shortened_then_dropped: Vec<usize> = unbudgeted
        .report
        .compressed
        .iter()
        .map(|c| c.index)
        .filter(|i| removed.contains(i))
        .collect();
    assert!(!shortened_then_dropped.is_empty(), "{removed:?}");
    assert!(!compressed.is_empty());
    assert!(
        compressed.iter().all(|i| !removed.contains(i)),
        "{compressed:?} {removed:?}"
    );
    assert!(compressed.is_sorted(), "{compressed:?}");
}

#[test]
fn summary_is_kept_by_the_budget() {
    let msgs = weather();
    let s = StoredSummary {
        text: "earlier: weather in four cities".into(),
        covers_until: 16,
    };
    let out = run_with(
        &msgs,
        &policy(json!({"token_budget": {"max_tokens": 120}})),
        Some(&s),
    );
    assert!(
        out.messages[1]
            .text_content()
            .starts_with("Summary of the earlier conversation:")
    );
    // the current turn is run 8: question, call, result, reply
    assert_eq!(out.messages[2..], msgs[msgs.len() - 4..]);
}

fn counts(msgs: &[Message]) -> Vec<u64> {
    let c = TokenCounter::new();
    msgs.iter()
        .map(|m| c.message(Encoding::O200kBase, m))
        .collect()
}

fn summary_policy(
    trigger: u64,
    target: u64,
    min: usize,
) -> ctxproxy::context::policy::SummaryPolicy {
    serde_json::from_value(json!({"model": "gpt-4o-mini", "trigger_tokens": trigger,
        "target_tokens": target, "min_messages": min}))
    .unwrap()
}

#[test]
fn summary_is_planned_over_the_oldest_history_once_over_the_trigger() {
    let msgs = weather();
    let tokens = counts(&msgs);
    let entries = Entry::given(&msgs, &tokens);
    let history_end = current_turn_start(&msgs);
    let history: u64 = tokens[1..history_end].iter().sum();
    assert!(plan_summary(&summary_policy(history, 100, 4), &entries, None, 0).is_none());
    assert!(plan_summary(&summary_policy(10, 100, 100), &entries, None, 0).is_none());
    let plan = plan_summary(&summary_policy(history - 1, 100, 4), &entries, None, 0).unwrap();
    assert_eq!(plan.from, 1);
    assert_eq!(plan.history_tokens, history);
    // The kept history is the newest that fits the target and begins at a user message (as the
    // budget's does): from the user message before it, it would not fit.
    let rest: u64 = tokens[plan.until + 1..history_end].iter().sum();
    assert_eq!(msgs[plan.until + 1].role, Role::User, "{plan:?}");
    let earlier_user = msgs[..=plan.until]
        .iter()
        .rposition(|m| m.role == Role::User)
        .unwrap();
    let from_earlier: u64 = tokens[earlier_user..history_end].iter().sum();
    assert!(rest <= 100 && from_earlier > 100, "{plan:?}");
    // a rolling summary starts after what the previous one covers
    let prev = StoredSummary {
        text: "x".into(),
        covers_until: 8,
    };
    let plan = plan_summary(&summary_policy(100, 100, 4), &entries, Some(&prev), 20).unwrap();
    assert_eq!(plan.from, 9);
    assert!(msgs[plan.until + 1].role != Role::Tool);
}

/// An agent's run: one question, many calls, an answer, then the next question. No user
/// message is left in the newest history that fits the target, so the newest segments are kept
/// as they are (the answer the user replies to among them) rather than summarising everything.
#[test]
fn an_agent_run_keeps_its_newest_segments_after_a_summary() {
    let mut wire = vec![
        json!({"role": "system", "content": "You are an agent."}),
        json!({"role": "user", "content": "Check the weather in eight cities."}),
    ];
    for i in 0..8 {
        let id = format!("call_{i}");
        wire.push(
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": id,
            "type": "function", "function": {"name": "get_weather",
            "arguments": format!("{{\"city\": \"city number {i}\"}}")}}]}),
        );
        wire.push(json!({"role": "tool", "tool_call_id": id,
            "content": format!("{{\"temp_c\": {i}, \"sky\": \"clear and bright all day\"}}")}));
    }
    wire.push(json!({"role": "assistant", "content": "All eight are clear."}));
    wire.push(json!({"role": "user", "content": "Thanks, and tomorrow?"}));
    let msgs = messages(&json!({"messages": wire}));
    let tokens = counts(&msgs);
    let entries = Entry::given(&msgs, &tokens);
    let history_end = current_turn_start(&msgs);
    let answer = history_end - 1;
    let target = tokens[answer - 2..history_end].iter().sum::<u64>() + 1;
    let plan = plan_summary(&summary_policy(50, target, 4), &entries, None, 0).unwrap();
    assert_eq!(plan.until, answer - 3, "{plan:?}");
}

/// A tool result that comes late (after a later user message) is linked to its call only by
/// id. A summary that covered the call but not the result left the result an orphan, which
/// repair dropped: neither the summariser nor the model read it. The plan keeps the call (from
/// the user message before it) instead.
#[test]
fn a_summary_never_covers_a_call_whose_result_comes_late() {
    let long = "x".repeat(720);
    let wire = vec![
        json!({"role": "system", "content": "s"}),
        json!({"role": "user", "content": format!("u1 {long}")}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "f", "arguments": "{}"}}]}),
        json!({"role": "user", "content": format!("u2 {long}")}),
        json!({"role": "assistant", "content": "a2"}),
        json!({"role": "user", "content": "u3 small"}),
        json!({"role": "tool", "tool_call_id": "c1", "content": "LATE RESULT 42"}),
        json!({"role": "assistant", "content": "a3"}),
        json!({"role": "user", "content": "u4 now"}),
    ];
    let msgs = messages(&json!({"messages": wire}));
    let tokens = counts(&msgs);
    let entries = Entry::given(&msgs, &tokens);
    // Without the late result, the plan would keep u3.. only (until = 4, covering the call).
    let target = tokens[5..8].iter().sum::<u64>() + 1;
    let plan = plan_summary(&summary_policy(50, target, 2), &entries, None, 0).unwrap();
    assert_eq!(plan.from, 1);
    // No user message between the first one and the call: the kept history starts at the
    // call itself, and only u1 is summarised.
    assert_eq!(plan.until, 1, "the call at 2 is not covered: {plan:?}");

    // Through the pipeline with that summary: nothing is orphaned, the late result is moved
    // back to its call by repair and reaches the model.
    let summary = StoredSummary {
        text: "u1 asked".into(),
        covers_until: plan.until,
    };
    let no_policy = Policy::default();
    let mut input = PipelineInput::new(&msgs, &no_policy, O200K);
    input.summary = Some(&summary);
    let out = run(input, &TokenCounter::new()).unwrap();
    let sent: Vec<Value> = out
        .messages
        .iter()
        .map(|m| serde_json::to_value(m).unwrap())
        .collect();
    assert!(
        sent.iter().any(|m| m["content"] == "LATE RESULT 42"),
        "{sent:#?}"
    );
    assert!(
        out.report
            .repaired
            .iter()
            .all(|r| r.kind != ctxproxy::context::RepairKind::OrphanResult),
        "{:?}",
        out.report
    );
}

#[test]
fn cached_counts_equal_fresh_counts_and_fill_the_cache() {
    let msgs = weather();
    let values: Vec<Value> = wire(&msgs);
    let ids = chain_ids(&values);
    let counter = TokenCounter::new();
    let p = policy(json!({"tool_call_window": {"max": 2}}));
    let mut input = PipelineInput::new(&msgs, &p, O200K);
    input.ids = Some(&ids);
    let a = run(input, &counter).unwrap();
    assert_eq!(counter.cache().len(), msgs.len());
    let b = run(input, &counter).unwrap();
    assert_eq!(a, b);
    assert_eq!(a, rewrite(&msgs, &p));
    input.ids = Some(&ids[1..]);
    assert!(matches!(run(input, &counter), Err(Error::Internal(_))));
}

#[test]
fn report_has_the_spec_shape_and_round_trips() {
    let msgs = messages(&fixture("broken_pairs.json"));
    let out = rewrite(&msgs, &policy(json!({"tool_call_window": {"max": 0}})));
    let v = serde_json::to_value(&out.report).unwrap();
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    // In SPEC 5.3's order, which is the struct's (serde_json keeps it).
    let want = [
        "tokens_in",
        "tokens_out",
        "removed",
        "compressed",
        "placeholders",
        "repaired",
        "summary",
    ];
    assert_eq!(keys, want);
    let removed = v["removed"].as_array().unwrap();
    assert!(removed.contains(&json!({"index": 4, "role": "tool", "reason": "tool_call_window"})));
    assert!(
        v["repaired"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == &json!({"index": 2, "kind": "orphan_result"}))
    );
    assert_eq!(v["summary"], json!({"used": false, "covers_until": null}));
    let back: Report = serde_json::from_value(v).unwrap();
    assert_eq!(back, out.report);
}

#[test]
fn remembered_compression_equals_fresh_compression() {
    let msgs = messages(&fixture("compress.json"));
    let ids = chain_ids(&wire(&msgs));
    let counter = TokenCounter::new();
    let p = policy(json!({"compress_tool_output": {"max_tokens": 100}}));
    let mut input = PipelineInput::new(&msgs, &p, O200K);
    input.ids = Some(&ids);
    let first = run(input, &counter).unwrap();
    assert!(
        counter
            .compressed()
            .get_variant(Encoding::O200kBase, &ids[3], 100)
            .is_some()
    );
    let second = run(input, &counter).unwrap();
    assert_eq!(first, second);
    assert_eq!(first, rewrite(&msgs, &p));
}

/// SPEC 5 step 6: a segment is a call together with all its results, also one that comes late
/// (after another message): at every budget the late result is kept or dropped with its call
/// (reported `token_budget`), never left an orphan for repair to drop.
#[test]
fn a_late_history_result_is_kept_or_dropped_with_its_call() {
    let call = |id: &str, name: &str| json!({"id": id, "type": "function", "function": {"name": name, "arguments": "{}"}});
    let msgs = messages(&json!({"messages": [
        {"role": "user", "content": "q1 ".repeat(10)},
        {"role": "assistant", "content": null, "tool_calls": [call("c1", "f"), call("c2", "g")]},
        {"role": "tool", "tool_call_id": "c1", "content": "r1 ".repeat(10)},
        {"role": "user", "content": "interject"},
        {"role": "tool", "tool_call_id": "c2", "content": "late r2"},
        {"role": "assistant", "content": "x"},
        {"role": "user", "content": "cur"}
    ]}));
    let full = rewrite(&msgs, &policy(json!({}))).report.tokens_out;
    let mut dropped_the_call = false;
    for budget in 10..=full + 1 {
        for unanswered in ["drop", "placeholder"] {
            let p = policy(json!({
                "token_budget": {"max_tokens": budget},
                "repair": {"unanswered_calls": unanswered}
            }));
            let out = rewrite(&msgs, &p);
            let removed: Vec<usize> = out.report.removed.iter().map(|r| r.index).collect();
            let context = format!("budget {budget}, {unanswered}: {:?}", out.report);
            assert!(
                out.report
                    .removed
                    .iter()
                    .all(|r| r.reason == RemoveReason::TokenBudget),
                "{context}"
            );
            assert_eq!(
                removed.contains(&1),
                removed.contains(&4),
                "the late result goes with its call: {context}"
            );
            assert!(
                out.report
                    .repaired
                    .iter()
                    .all(|r| r.kind != ctxproxy::context::RepairKind::OrphanResult),
                "{context}"
            );
            check_valid(&out.messages).unwrap();
            if removed.len() < msgs.len() - 1 && out.report.tokens_out > budget {
                panic!("over the budget with history kept: {context}");
            }
            dropped_the_call |= removed.contains(&1) && !removed.contains(&3);
        }
    }
    assert!(dropped_the_call, "some budget keeps the newer history only");
}
