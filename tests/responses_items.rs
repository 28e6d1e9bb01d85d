//! Responses items ⇄ pipeline messages (SPEC 7): the mapping round trip keeps every item and
//! field, and each pipeline step's change comes back as the right items, on the fixtures in
//! tests/fixtures/responses/.

mod items_support;

use ctxproxy::context::{Policy, RemoveReason, RepairKind, Report, Rewritten, run};
use ctxproxy::conversation::responses_items::{ORIGINAL_KEY, to_items};
use ctxproxy::conversation::{ItemMessages, Role, chain_ids};
use ctxproxy::tokens::{Encoding, ModelFacts, TokenCounter};
use items_support::*;
use serde_json::{Value, json};

const MODEL: ModelFacts = ModelFacts {
    context_window: 128_000,
    encoding: Encoding::O200kBase,
};

fn input(v: &Value) -> Vec<Value> {
    v["input"].as_array().unwrap().clone()
}

fn rewrite(conv: &ItemMessages, policy: Value) -> Rewritten {
    let policy: Policy = serde_json::from_value(policy).unwrap();
    run(conv.pipeline_input(&policy, MODEL), &TokenCounter::new()).unwrap()
}

#[test]
fn mapping_round_trip_keeps_every_item_verbatim() {
    for name in [
        "mixed_items.json",
        "agent_history.json",
        "broken_pairs.json",
    ] {
        let f = fixture(name);
        let items = input(&f);
        let conv = ItemMessages::new(f.get("instructions"), &items);
        assert_eq!(to_items(&conv.messages), items, "{name}");
    }
}

#[test]
fn items_map_to_chat_shaped_messages() {
    let f = fixture("mixed_items.json");
    let conv = ItemMessages::new(f.get("instructions"), &input(&f));
    let roles: Vec<&str> = conv.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(
        roles,
        [
            "system",
            "developer",
            "user",
            "assistant",
            "tool",
            "tool",
            "item:web_search_call",
            "assistant",
            "item:image_generation_call",
            "item:file_search_call",
            "item:item_reference",
            "item:some_future_item",
            "user",
        ]
    );
    assert_eq!(conv.messages[0].text_content(), "You are a careful agent.");
    // Two consecutive calls (with the reasoning among them) are one assistant turn.
    let turn = &conv.messages[3];
    let ids: Vec<&str> = turn.tool_calls().iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["call_a", "call_b"]);
    assert_eq!(turn.tool_calls()[1].name(), "get_weather");
    assert_eq!(turn.extra[ORIGINAL_KEY].as_array().unwrap().len(), 4);
    assert_eq!(conv.messages[4].tool_call_id.as_deref(), Some("call_a"));
    assert_eq!(
        conv.messages[2].text_content(),
        "What is the weather in Tokyo and Paris?"
    );
    // The report names a message by its item: the turn by its first call.
    assert_eq!(conv.item_index[0], None);
    assert_eq!(conv.item_index[3], Some(3));
}

#[test]
fn ids_name_each_message_by_its_last_item() {
    let f = fixture("mixed_items.json");
    let items = input(&f);
    let item_ids = chain_ids(&items);
    let conv = ItemMessages::new(f.get("instructions"), &items);
    let ids = conv.ids(&item_ids).unwrap();
    assert_eq!(ids.len(), conv.messages.len());
    assert_eq!(ids[3], item_ids[5], "the call turn ends at its second call");
    assert_eq!(ids.last(), item_ids.last());
    assert!(conv.ids(&item_ids[1..]).is_none());
}

#[test]
fn valid_conversation_passes_the_pipeline_unchanged() {
    let f = fixture("mixed_items.json");
    let items = input(&f);
    let conv = ItemMessages::new(f.get("instructions"), &items);
    let out = rewrite(&conv, json!({}));
    assert!(out.report.repaired.is_empty(), "{:?}", out.report);
    assert_eq!(to_items(&out.messages), items);
    assert!(out.report.tokens_in > 0);
}

#[test]
fn window_drops_old_turn_with_its_reasoning() {
    let f = fixture("agent_history.json");
    let items = input(&f);
    let conv = ItemMessages::new(None, &items);
    let out = rewrite(&conv, json!({"tool_call_window": {"max": 1}}));
    let sent = to_items(&out.messages);
    check_items(&sent).unwrap();
    assert_eq!(call_ids(&sent), ["c3"]);
    assert!(
        !sent.iter().any(|i| i["id"] == "rs_1"),
        "rs_1 went with its turn"
    );
    let rs2 = sent.iter().position(|i| i["id"] == "rs_2").unwrap();
    assert_eq!(
        sent[rs2 + 1]["call_id"],
        "c3",
        "reasoning still leads its call"
    );
    // Everything else is sent as received.
    let kept: Vec<&Value> = items
        .iter()
        .filter(|i| !["rs_1", "fc_1", "fc_2"].contains(&i["id"].as_str().unwrap_or("")))
        .filter(|i| !["c1", "c2"].contains(&i["call_id"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(sent.iter().collect::<Vec<_>>(), kept);
    let report = conv.report_in_items(out.report, &out.calls);
    let removed: Vec<(usize, RemoveReason)> =
        report.removed.iter().map(|r| (r.index, r.reason)).collect();
    let w = RemoveReason::ToolCallWindow;
    assert_eq!(
        removed,
        [(1, w), (2, w), (3, w), (4, w), (5, w)],
        "every dropped item by its own index, the reasoning too"
    );
}

#[test]
fn reasoning_moves_to_the_next_kept_call_of_its_turn() {
    let f = fixture("agent_history.json");
    let conv = ItemMessages::new(None, &input(&f));
    // History calls c1 c2 c3: a window of two drops c1 only, whose reasoning led the turn.
    let out = rewrite(&conv, json!({"tool_call_window": {"max": 2}}));
    let sent = to_items(&out.messages);
    check_items(&sent).unwrap();
    assert_eq!(call_ids(&sent), ["c2", "c3"]);
    let rs1 = sent.iter().position(|i| i["id"] == "rs_1").unwrap();
    assert_eq!(sent[rs1 + 1]["call_id"], "c2");
}

/// Calls each led by a reasoning item of its own, in one turn: the reasoning of a call that
/// goes goes with it (SPEC 7), and does not move on to a later call that has its own.
#[test]
fn reasoning_of_a_dropped_call_goes_with_it_when_the_next_call_has_its_own() {
    let items = vec![
        json!({"role": "user", "content": "q1"}),
        json!({"type": "reasoning", "id": "rs_a", "summary": [{"type": "summary_text", "text": "a"}]}),
        json!({"type": "function_call", "call_id": "a", "name": "debug", "arguments": "{}"}),
        json!({"type": "reasoning", "id": "rs_b", "summary": [{"type": "summary_text", "text": "b"}]}),
        json!({"type": "function_call", "call_id": "b", "name": "search", "arguments": "{}"}),
        json!({"type": "function_call_output", "call_id": "a", "output": "A"}),
        json!({"type": "function_call_output", "call_id": "b", "output": "B"}),
        json!({"role": "user", "content": "now"}),
    ];
    let conv = ItemMessages::new(None, &items);
    for (policy, reason) in [
        (
            json!({"tool_filter": {"exclude": ["debug"]}}),
            RemoveReason::ToolFilter,
        ),
        (
            json!({"tool_call_window": {"max": 1}}),
            RemoveReason::ToolCallWindow,
        ),
    ] {
        let out = rewrite(&conv, policy);
        let sent = to_items(&out.messages);
        check_items(&sent).unwrap();
        let expected: Vec<Value> = [0, 3, 4, 6, 7].map(|k| items[k].clone()).into();
        assert_eq!(sent, expected, "{reason:?}");
        let report = item_report(&conv, &items, &out);
        assert_eq!(
            removed(&report),
            expect(&[(1, "assistant"), (2, "assistant"), (5, "tool")], reason)
        );
    }
}

#[test]
fn compressed_output_keeps_the_item_and_its_fields() {
    let big = (0..400)
        .map(|i| format!("line {i} of a long log"))
        .collect::<Vec<_>>()
        .join("\n");
    let items = vec![
        json!({"role": "user", "content": "run it"}),
        json!({"type": "function_call", "call_id": "c1", "name": "run", "arguments": "{}"}),
        json!({"type": "function_call_output", "call_id": "c1", "output": big, "x_keep": 1}),
        json!({"role": "user", "content": "summarise"}),
    ];
    let conv = ItemMessages::new(None, &items);
    let out = rewrite(&conv, json!({"compress_tool_output": {"max_tokens": 50}}));
    let sent = to_items(&out.messages);
    assert_eq!(sent.len(), 4);
    let output = &sent[2];
    assert_eq!(output["x_keep"], 1);
    assert_eq!(output["call_id"], "c1");
    let text = output["output"].as_str().unwrap();
    assert!(
        text.len() < big.len() && text.contains("tokens omitted"),
        "{text}"
    );
    assert_eq!(
        conv.report_in_items(out.report, &out.calls).compressed[0].index,
        2
    );
}

/// The audit's case: a message item with a role the Responses API does not have (a chat `tool`
/// message sent here) is not a tool result for repair to drop as an orphan: it goes upstream
/// untouched, for the provider to judge, as any item the pipeline cannot read.
#[test]
fn a_message_with_a_role_outside_the_api_is_left_to_the_upstream() {
    let items = vec![
        json!({"role": "tool", "content": "x"}),
        json!({"role": "user", "content": "q"}),
    ];
    let conv = ItemMessages::new(None, &items);
    let out = rewrite(&conv, json!({}));
    assert_eq!(to_items(&out.messages), items);
    assert!(out.report.repaired.is_empty(), "{:?}", out.report);
    assert!(out.report.removed.is_empty(), "{:?}", out.report);
}

#[test]
fn repair_restores_the_items_invariant() {
    let f = fixture("broken_pairs.json");
    let items = input(&f);
    check_items(&items).unwrap_err();
    let conv = ItemMessages::new(None, &items);
    let drop = to_items(&rewrite(&conv, json!({})).messages);
    check_items(&drop).unwrap();
    assert_eq!(call_ids(&drop), ["c1"]);
    assert!(!drop.iter().any(|i| i["call_id"] == "ghost"));

    let out = rewrite(
        &conv,
        json!({"repair": {"unanswered_calls": "placeholder"}}),
    );
    let placeholder = to_items(&out.messages);
    check_items(&placeholder).unwrap();
    assert_eq!(call_ids(&placeholder), ["c1", "c2"]);
    let made = placeholder
        .iter()
        .find(|i| i["call_id"] == "c2" && i["type"] == "function_call_output");
    assert_eq!(made.unwrap()["output"], "[no result recorded]");
}

#[test]
fn filter_placeholder_becomes_an_assistant_message() {
    let f = fixture("agent_history.json");
    let conv = ItemMessages::new(None, &input(&f));
    let out = rewrite(
        &conv,
        json!({"tool_filter": {"exclude": ["search_hotels"], "placeholder": true}}),
    );
    let sent = to_items(&out.messages);
    check_items(&sent).unwrap();
    assert_eq!(call_ids(&sent), ["c1", "c3"]);
    let note = sent
        .iter()
        .position(|i| i["content"] == "[tool call omitted: search_hotels]")
        .unwrap();
    assert_eq!(sent[note]["role"], "assistant");
    assert_eq!(sent[note + 1]["id"], "rs_1");
}

/// Two calls of one turn share a `call_id`; the filter takes out the first. The call sent is the
/// one the pipeline kept (by position in the turn, not the first with its id).
#[test]
fn a_turn_with_a_repeated_call_id_sends_the_call_that_was_kept() {
    let items = vec![
        json!({"role": "user", "content": "look it up"}),
        json!({"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "debug_tool", "arguments": "{}"}),
        json!({"type": "function_call", "id": "fc_2", "call_id": "c1", "name": "search", "arguments": "{\"q\":1}"}),
        json!({"type": "function_call_output", "call_id": "c1", "output": "found"}),
        json!({"type": "message", "role": "assistant", "content": "Found it."}),
        json!({"role": "user", "content": "thanks"}),
    ];
    let conv = ItemMessages::new(None, &items);
    let out = rewrite(
        &conv,
        json!({
            "tool_filter": {"exclude": ["debug_tool"], "placeholder": true},
            "repair": {"unanswered_calls": "placeholder"}
        }),
    );
    let sent = to_items(&out.messages);
    check_items(&sent).unwrap();
    let calls: Vec<&Value> = sent
        .iter()
        .filter(|i| i["type"] == "function_call")
        .collect();
    assert_eq!(calls, [&items[2]], "{sent:?}");
    let report = item_report(&conv, &items, &out);
    assert_eq!(report.removed[0].index, 1);
}

/// The placeholder line of a turn that keeps calls is sent as an assistant `message` item of its
/// own: the report counts it as that, and a budget of the reported count keeps what it kept when
/// the items sent come back on the next pass.
#[test]
fn placeholder_line_is_counted_as_the_item_it_is_sent_as() {
    let items = input(&fixture("agent_history.json"));
    let conv = ItemMessages::new(None, &items);
    let filter = json!({"exclude": ["search_hotels"], "placeholder": true});
    let out = rewrite(&conv, json!({"tool_filter": filter}));
    let sent = to_items(&out.messages);
    let resent = ItemMessages::new(None, &sent);
    let counter = TokenCounter::new();
    let sent_tokens = counter.request(MODEL.encoding, &resent.messages, None, None);
    assert_eq!(out.report.tokens_out, sent_tokens);

    let budget = json!({"max_tokens": out.report.tokens_out});
    let policy = json!({"tool_filter": filter, "token_budget": budget});
    let first = to_items(&rewrite(&conv, policy.clone()).messages);
    assert_eq!(first, sent);
    let second = rewrite(&ItemMessages::new(None, &first), policy);
    assert_eq!(to_items(&second.messages), first, "{:?}", second.report);
}

#[test]
fn unknown_items_are_never_the_current_turn_or_removed_by_history_steps() {
    let f = fixture("mixed_items.json");
    let items = input(&f);
    let conv = ItemMessages::new(f.get("instructions"), &items);
    let out = rewrite(
        &conv,
        json!({"tool_call_window": {"max": 0}, "tool_filter": {"include": []}}),
    );
    let sent = to_items(&out.messages);
    check_items(&sent).unwrap();
    assert!(call_ids(&sent).is_empty());
    for t in [
        "web_search_call",
        "image_generation_call",
        "file_search_call",
        "item_reference",
        "some_future_item",
    ] {
        let original = items.iter().find(|i| i["type"] == t).unwrap();
        assert!(sent.contains(original), "{t} kept verbatim");
    }
    assert!(!types(&sent).contains(&"reasoning".to_string()));
    assert!(out.messages.iter().all(|m| m.role != Role::Tool));
}

/// The report of `out` in items, after checking that it accounts for every item of `items`
/// that `out` does not send: once, in `removed` or (dropped by repair) in `repaired`.
fn item_report(conv: &ItemMessages, items: &[Value], out: &Rewritten) -> Report {
    let report = conv.report_in_items(out.report.clone(), &out.calls);
    let sent = to_items(&out.messages);
    let unsent: Vec<usize> = (0..items.len())
        .filter(|&k| !sent.contains(&items[k]))
        .collect();
    let mut named: Vec<usize> = report.removed.iter().map(|r| r.index).collect();
    named.extend(
        report
            .repaired
            .iter()
            .filter(|r| sent.iter().all(|i| *i != items[r.index]))
            .map(|r| r.index),
    );
    named.sort_unstable();
    assert_eq!(
        named, unsent,
        "every item not sent is named once: {report:?}"
    );
    report
}

/// `(index, role, reason)` of each removed entry.
fn removed(report: &Report) -> Vec<(usize, String, RemoveReason)> {
    report
        .removed
        .iter()
        .map(|r| (r.index, r.role.as_str().to_string(), r.reason))
        .collect()
}

fn expect(rows: &[(usize, &str)], reason: RemoveReason) -> Vec<(usize, String, RemoveReason)> {
    rows.iter()
        .map(|&(i, role)| (i, role.to_string(), reason))
        .collect()
}

#[test]
fn window_reports_each_call_and_reasoning_of_a_dropped_parallel_turn() {
    let f = fixture("parallel_turns.json");
    let items = input(&f);
    let conv = ItemMessages::new(None, &items);
    let out = rewrite(
        &conv,
        json!({"tool_call_window": {"max": 1, "unit": "call"}}),
    );
    let report = item_report(&conv, &items, &out);
    assert_eq!(
        removed(&report),
        expect(
            &[
                (2, "assistant"),
                (3, "assistant"),
                (4, "assistant"),
                (5, "tool"),
                (6, "tool")
            ],
            RemoveReason::ToolCallWindow
        )
    );
}

#[test]
fn filter_reports_the_reasoning_that_went_with_its_call() {
    let f = fixture("parallel_turns.json");
    let items = input(&f);
    let conv = ItemMessages::new(None, &items);
    let out = rewrite(&conv, json!({"tool_filter": {"include": ["search"]}}));
    let report = item_report(&conv, &items, &out);
    assert_eq!(
        removed(&report),
        expect(
            &[(7, "assistant"), (8, "assistant"), (9, "tool")],
            RemoveReason::ToolFilter
        )
    );
}

#[test]
fn a_call_taken_out_of_a_turn_that_stays_is_reported() {
    let f = fixture("parallel_turns.json");
    let items = input(&f);
    let conv = ItemMessages::new(None, &items);
    // c1 goes, c2 and c3 stay: rs_1 moves on to c2 and is still sent.
    let out = rewrite(&conv, json!({"tool_call_window": {"max": 2}}));
    assert!(to_items(&out.messages).iter().any(|i| i["id"] == "rs_1"));
    let report = item_report(&conv, &items, &out);
    assert_eq!(
        removed(&report),
        expect(
            &[(3, "assistant"), (5, "tool")],
            RemoveReason::ToolCallWindow
        )
    );
}

#[test]
fn filter_placeholder_reports_the_calls_it_replaced_and_their_reasoning() {
    let f = fixture("parallel_turns.json");
    let items = input(&f);
    let conv = ItemMessages::new(None, &items);
    let out = rewrite(
        &conv,
        json!({"tool_filter": {"exclude": ["search"], "placeholder": true}}),
    );
    let report = item_report(&conv, &items, &out);
    assert_eq!(report.placeholders, 2);
    assert_eq!(
        removed(&report),
        expect(
            &[
                (2, "assistant"),
                (3, "assistant"),
                (4, "assistant"),
                (5, "tool"),
                (6, "tool")
            ],
            RemoveReason::ToolFilter
        )
    );
}

#[test]
fn budget_reports_every_item_of_the_history_it_drops() {
    let f = fixture("parallel_turns.json");
    let items = input(&f);
    let conv = ItemMessages::new(None, &items);
    let out = rewrite(&conv, json!({"token_budget": {"max_tokens": 1}}));
    let report = item_report(&conv, &items, &out);
    assert_eq!(
        removed(&report),
        expect(
            &[
                (1, "user"),
                (2, "assistant"),
                (3, "assistant"),
                (4, "assistant"),
                (5, "tool"),
                (6, "tool"),
                (7, "assistant"),
                (8, "assistant"),
                (9, "tool"),
                (10, "assistant")
            ],
            RemoveReason::TokenBudget
        ),
        "the developer message is kept"
    );
}

fn repaired(report: &Report) -> Vec<(usize, RepairKind)> {
    report.repaired.iter().map(|r| (r.index, r.kind)).collect()
}

#[test]
fn repair_names_the_unanswered_call_not_its_turn() {
    let f = fixture("unanswered_in_turn.json");
    let items = input(&f);
    let conv = ItemMessages::new(None, &items);
    let unanswered = RepairKind::UnansweredCall;
    for policy in ["drop", "placeholder"] {
        let out = rewrite(&conv, json!({"repair": {"unanswered_calls": policy}}));
        let report = item_report(&conv, &items, &out);
        assert_eq!(repaired(&report), [(4, unanswered)], "{policy}");
        assert!(report.removed.is_empty(), "{policy}");
    }

    let f = fixture("broken_pairs.json");
    let items = input(&f);
    let conv = ItemMessages::new(None, &items);
    let report = item_report(&conv, &items, &rewrite(&conv, json!({})));
    assert_eq!(
        repaired(&report),
        [(1, RepairKind::OrphanResult), (3, unanswered)]
    );
}

#[test]
fn reasoning_leading_an_unanswered_call_is_repaired_with_it() {
    let items = vec![
        json!({"role": "user", "content": "go"}),
        json!({"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}),
        json!({"type": "reasoning", "id": "rs_x", "summary": []}),
        json!({"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"}),
        json!({"type": "function_call_output", "call_id": "c1", "output": "1"}),
        json!({"role": "user", "content": "next"}),
    ];
    let conv = ItemMessages::new(None, &items);
    let out = rewrite(&conv, json!({}));
    let sent = to_items(&out.messages);
    check_items(&sent).unwrap();
    assert!(!sent.iter().any(|i| i["id"] == "rs_x"));
    let report = item_report(&conv, &items, &out);
    let unanswered = RepairKind::UnansweredCall;
    assert_eq!(repaired(&report), [(2, unanswered), (3, unanswered)]);
}

/// A custom tool's history: `custom_tool_call` calls for `apply_patch`, answered by
/// `custom_tool_call_output`, beside a function call.
fn custom_tool_history() -> Vec<Value> {
    vec![
        json!({"role": "user", "content": "fix the bug"}),
        json!({"type": "custom_tool_call", "id": "ctc_1", "call_id": "p1", "name": "apply_patch", "input": "*** Begin Patch\n-a\n+b\n*** End Patch", "status": "completed"}),
        json!({"type": "custom_tool_call_output", "call_id": "p1", "output": "patched"}),
        json!({"type": "function_call", "call_id": "f1", "name": "run_tests", "arguments": "{}"}),
        json!({"type": "function_call_output", "call_id": "f1", "output": "ok"}),
        json!({"type": "message", "role": "assistant", "content": "Fixed."}),
        json!({"role": "user", "content": "thanks, what next?"}),
    ]
}

/// Custom tools' calls are calls: the filter removes one by its name, with its output.
#[test]
fn a_custom_tool_call_is_filtered_by_its_name_with_its_output() {
    let items = custom_tool_history();
    let conv = ItemMessages::new(None, &items);
    assert_eq!(conv.messages[1].tool_calls()[0].name(), "apply_patch");
    assert_eq!(conv.messages[2].tool_call_id.as_deref(), Some("p1"));
    let out = rewrite(&conv, json!({"tool_filter": {"exclude": ["apply_patch"]}}));
    let sent = to_items(&out.messages);
    check_items(&sent).unwrap();
    assert!(!sent.iter().any(|i| i["call_id"] == "p1"), "{sent:?}");
    assert_eq!(call_ids(&sent), ["f1"]);
    assert_eq!(
        removed(&item_report(&conv, &items, &out)),
        expect(&[(1, "assistant"), (2, "tool")], RemoveReason::ToolFilter)
    );
    // Left alone, the items go as they came.
    assert_eq!(to_items(&rewrite(&conv, json!({})).messages), items);
}

/// The window counts a custom call like any other: with room for one call, the older one goes.
#[test]
fn the_window_counts_custom_tool_calls() {
    let items = custom_tool_history();
    let conv = ItemMessages::new(None, &items);
    let out = rewrite(&conv, json!({"tool_call_window": {"max": 1}}));
    let sent = to_items(&out.messages);
    check_items(&sent).unwrap();
    assert_eq!(
        types(&sent)[..3],
        ["message", "function_call", "function_call_output"]
    );
}

/// An unanswered custom call is answered with the custom tool's own output item, which is what
/// the provider accepts for it.
#[test]
fn an_unanswered_custom_call_gets_a_custom_output_placeholder() {
    let mut items = custom_tool_history();
    items.remove(2);
    let conv = ItemMessages::new(None, &items);
    let out = rewrite(
        &conv,
        json!({"repair": {"unanswered_calls": "placeholder"}}),
    );
    let sent = to_items(&out.messages);
    check_items(&sent).unwrap();
    assert_eq!(sent[1], items[1]);
    let made = sent
        .iter()
        .find(|i| i["call_id"] == "p1" && i["type"] != "custom_tool_call");
    assert_eq!(
        made,
        Some(
            &json!({"type": "custom_tool_call_output", "call_id": "p1", "output": "[no result recorded]"})
        )
    );
    let dropped = to_items(&rewrite(&conv, json!({})).messages);
    check_items(&dropped).unwrap();
    assert!(!dropped.iter().any(|i| i["call_id"] == "p1"));
}

/// An item the proxy does not model is counted by the text it sends the model (SPEC 5.1), not
/// as an empty message: a long web search query or MCP output weighs in the tokens, the budget
/// and the context window check. Its ids, status and encrypted content do not count, and the
/// items still go out exactly as received.
#[test]
fn an_unmodelled_item_is_counted_by_the_text_it_carries() {
    let query = "kyoto temples open late in november ".repeat(40);
    let items = |query: &str| {
        vec![
            json!({"role": "user", "content": "find temples"}),
            json!({"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": query}}),
            json!({"type": "mcp_call", "id": "mcp_1", "name": "lookup", "arguments": "{\"q\":1}", "output": "three temples", "server_label": "maps"}),
            json!({"type": "reasoning", "id": "rs_9", "summary": [], "encrypted_content": "gAAAA".repeat(50)}),
            json!({"role": "assistant", "content": "three are open late"}),
            json!({"role": "user", "content": "which one?"}),
        ]
    };
    let long = items(&query);
    let conv = ItemMessages::new(None, &long);
    let search = conv.messages[1].text_content();
    assert!(search.contains("kyoto temples"), "{search}");
    assert!(
        !search.contains("ws_1") && !search.contains("completed"),
        "{search}"
    );
    assert_eq!(
        conv.messages[2].text_content(),
        "lookup\n{\"q\":1}\nthree temples\nmaps"
    );
    assert!(
        conv.messages
            .iter()
            .all(|m| !m.text_content().contains("gAAAA")),
        "reasoning's encrypted content is not text"
    );
    let out = rewrite(&conv, json!({}));
    assert_eq!(to_items(&out.messages), long);

    let short = items("kyoto");
    let short_tokens = rewrite(&ItemMessages::new(None, &short), json!({}))
        .report
        .tokens_in;
    assert!(
        out.report.tokens_in > short_tokens + 200,
        "{} vs {short_tokens}",
        out.report.tokens_in
    );
}

/// A history `function_call_output` whose output is `parts`, then the current turn.
fn output_of_parts(parts: Value) -> Vec<Value> {
    vec![
        json!({"role": "user", "content": "look"}),
        json!({"type": "function_call", "call_id": "c1", "name": "snap", "arguments": "{}"}),
        json!({"type": "function_call_output", "call_id": "c1", "output": parts}),
        json!({"role": "user", "content": "and?"}),
    ]
}

/// SPEC 5 step 4 on an output of parts: parts stay parts (text shortened in place), each image
/// costs its flat 765, and one that does not fit becomes a text part saying so, never dropped
/// silently; the result is at most N tokens and the report says what it costs.
#[test]
fn compressed_output_of_parts_keeps_its_parts_and_names_what_it_omits() {
    let image = json!({"type": "input_image", "image_url": "data:image/png;base64,AAAA"});
    let long = json!([{"type": "input_text", "text": "word ".repeat(300)}, image]);
    let caption = json!([{"type": "input_text", "text": "a cat"}, image]);
    for (parts, max) in [(&long, 50), (&caption, 50), (&long, 900)] {
        let items = output_of_parts(parts.clone());
        let conv = ItemMessages::new(None, &items);
        let policy = json!({"compress_tool_output": {"max_tokens": max}});
        let out = rewrite(&conv, policy);
        let sent = to_items(&out.messages);
        let output = sent[2]["output"].as_array().expect("still parts").clone();
        let text = output[0]["text"].as_str().unwrap();
        assert_eq!(output[0]["type"], "input_text", "{max}: {output:?}");
        if max < 765 {
            assert_eq!(
                output[1],
                json!({"type": "input_text", "text": "[image omitted]"})
            );
        } else {
            assert_eq!(output[1], image, "an image that fits is kept");
        }
        if parts == &caption {
            assert_eq!(text, "a cat");
        } else {
            assert!(text.contains("tokens omitted"), "{text}");
        }
        let tokens =
            ctxproxy::tokens::content_tokens(Encoding::O200kBase, Some(&Value::Array(output)));
        assert!(tokens <= max, "{max}: {tokens}");
        let report = conv.report_in_items(out.report, &out.calls);
        assert_eq!(report.compressed.len(), 1);
        let c = &report.compressed[0];
        assert_eq!((c.index, c.tokens_after), (2, tokens));
        let before = ctxproxy::tokens::content_tokens(Encoding::O200kBase, Some(parts));
        assert_eq!(c.tokens_before, before);
        // What the report says is what the request's count lost.
        assert_eq!(
            report.tokens_in - report.tokens_out,
            before - tokens,
            "{max}"
        );
    }
}

/// The label `item:<type>` the mapping gives an unmodelled item is not sent: such an item
/// costs 3 plus its text, and a trailing reasoning item 3.
#[test]
fn an_unmodelled_item_costs_no_role() {
    let items = vec![
        json!({"role": "user", "content": "find"}),
        json!({"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "kyoto"}}),
        json!({"type": "reasoning", "id": "rs_9", "summary": []}),
    ];
    let conv = ItemMessages::new(None, &items);
    let e = Encoding::O200kBase;
    let search = ctxproxy::tokens::message_tokens(e, &conv.messages[1]);
    assert_eq!(search, 3 + e.count(&conv.messages[1].text_content()));
    assert_eq!(ctxproxy::tokens::message_tokens(e, &conv.messages[2]), 3);
}

/// A computer-use screenshot (a data URL), an image part in a tool's output or an image
/// generation's base64 result costs what an image costs (SPEC 5.1: a flat 765), never its base64
/// read as text: a computer-use loop sends one per turn, all in the current turn, and counted as
/// text they made every request "over the context window".
#[test]
fn images_in_unmodelled_items_cost_what_an_image_costs() {
    let base64 = format!("data:image/png;base64,{}", "iVBORw0KGgo".repeat(20_000));
    let items = vec![
        json!({"role": "user", "content": "open the settings"}),
        json!({"type": "computer_call", "id": "cu_1", "call_id": "cc1", "action": {"type": "screenshot"}, "pending_safety_checks": [], "status": "completed"}),
        json!({"type": "computer_call_output", "call_id": "cc1", "output": {"type": "computer_screenshot", "image_url": base64}}),
        json!({"type": "image_generation_call", "id": "ig_1", "status": "completed", "result": "iVBORw0KGgo".repeat(20_000)}),
        json!({"type": "mcp_call", "id": "mcp_1", "name": "snap", "arguments": "{}", "output": base64, "server_label": "s"}),
    ];
    let conv = ItemMessages::new(None, &items);
    let out = rewrite(&conv, json!({}));
    assert_eq!(to_items(&out.messages), items, "sent as received");
    // Five messages: 3 each; the user's text; the call's action; three images; the MCP call's
    // name, arguments and label: far below the base64's ~100k tokens.
    let tokens = out.report.tokens_in;
    assert!((3 * 765..3 * 765 + 100).contains(&tokens), "{tokens}");
    let screenshot = &conv.messages[2];
    assert_eq!(screenshot.content, Some(json!([{"type": "input_image"}])));
    // Text that merely begins with `data:` is text.
    for text in [
        "data: event 0 payload",
        "data: GDP 2024",
        "data:text/plain,hello",
    ] {
        let item =
            json!({"type": "mcp_call", "id": "m", "name": "n", "arguments": "{}", "output": text});
        let conv = ItemMessages::new(None, &[item]);
        assert!(conv.messages[0].text_content().contains(text), "{text}");
    }
}

/// A reply that is reasoning alone (a reasoning model cut off by `max_output_tokens`), then the
/// client's next item: the reasoning leads nothing of its reply, which OpenAI refuses, so repair
/// drops it and names it; reasoning before an item of its reply (an assistant message, a
/// built-in tool's call) stays. The mapping still gives back every item, and the output is a
/// fixed point of the pipeline.
#[test]
fn reasoning_that_leads_nothing_of_its_reply_is_repaired_away() {
    let rs = |id: &str| json!({"type": "reasoning", "id": id, "summary": []});
    let user = |t: &str| json!({"role": "user", "content": t});
    let call = json!({"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"});
    let answer = json!({"type": "message", "role": "assistant",
        "content": [{"type": "output_text", "text": "ok", "annotations": []}]});
    let search = json!({"type": "web_search_call", "id": "ws_1", "status": "completed"});
    let empty = RepairKind::EmptyAssistant;
    // The items, and what repair reports.
    type Case = (Vec<Value>, Vec<(usize, RepairKind)>);
    let cases: Vec<Case> = vec![
        // Followed by the next user message (history), or by nothing at all (the current turn).
        (
            vec![user("hard"), rs("rs_1"), user("second")],
            vec![(1, empty)],
        ),
        (
            vec![user("hard"), rs("rs_1"), rs("rs_2")],
            vec![(1, empty), (2, empty)],
        ),
        // Before a call's output (its call gone), and after a call turn whose outputs follow.
        (
            vec![
                user("q"),
                call.clone(),
                rs("rs_1"),
                json!({"type": "function_call_output", "call_id": "c1", "output": "1"}),
                user("next"),
            ],
            vec![(2, empty)],
        ),
        // Before items of its reply: kept.
        (
            vec![user("q"), rs("rs_1"), answer.clone(), user("next")],
            vec![],
        ),
        (
            vec![
                user("q"),
                rs("rs_1"),
                search.clone(),
                rs("rs_2"),
                answer,
                user("next"),
            ],
            vec![],
        ),
    ];
    for (items, want) in cases {
        let conv = ItemMessages::new(None, &items);
        assert_eq!(to_items(&conv.messages), items, "mapped back verbatim");
        let out = rewrite(&conv, json!({}));
        let sent = to_items(&out.messages);
        check_items(&sent).unwrap_or_else(|e| panic!("{e}: {sent:?}"));
        let report = item_report(&conv, &items, &out);
        assert_eq!(repaired(&report), want, "{items:?}");
        let kept: Vec<Value> = (0..items.len())
            .filter(|k| !want.iter().any(|(i, _)| i == k))
            .map(|k| items[k].clone())
            .collect();
        assert_eq!(sent, kept, "only the lone reasoning goes");
        let again = rewrite(&ItemMessages::new(None, &sent), json!({}));
        assert_eq!(to_items(&again.messages), sent, "a fixed point");
        assert!(again.report.repaired.is_empty());
    }
}
