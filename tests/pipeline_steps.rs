//! One behaviour per test for the history-rewriting steps (tool access, filter, window,
//! compression) and repair, on the JSON fixtures in tests/fixtures/pipeline/.

mod support;

use std::collections::HashSet;

use ctxproxy::context::{PipelineInput, RemoveReason, RepairKind, ToolAccess, run};
use ctxproxy::conversation::Role;
use ctxproxy::tokens::{Encoding, ModelFacts, TokenCounter};
use serde_json::{Value, json};
use support::*;

fn removed(r: &ctxproxy::context::Report) -> Vec<(usize, RemoveReason)> {
    let mut v: Vec<_> = r.removed.iter().map(|x| (x.index, x.reason)).collect();
    v.sort_by_key(|x| x.0);
    v
}

#[test]
fn window_keeps_part_of_a_parallel_call() {
    let msgs = messages(&fixture("tool_removal.json"));
    let out = rewrite(&msgs, &policy(json!({"tool_call_window": {"max": 4}})));
    // history calls: p1 p2 p3 s1 n1 s2; the newest four are p3 s1 n1 s2
    assert_eq!(result_ids(&out.messages), ["p3", "s1", "n1", "s2", "n2"]);
    let parallel = &out.messages[2];
    assert_eq!(parallel.tool_calls().len(), 1);
    assert_eq!(parallel.tool_calls()[0].id, "p3");
    let w = RemoveReason::ToolCallWindow;
    assert_eq!(removed(&out.report), [(3, w), (4, w)]);
    check_valid(&out.messages).unwrap();
}

#[test]
fn window_by_turn_counts_assistant_messages() {
    let msgs = messages(&fixture("tool_removal.json"));
    let out = rewrite(
        &msgs,
        &policy(json!({"tool_call_window": {"max": 1, "unit": "turn"}})),
    );
    assert_eq!(result_ids(&out.messages), ["s2", "n2"]);
    check_valid(&out.messages).unwrap();
}

/// A call without a result has no place in the window (SPEC: each tool result counts one):
/// repair drops it, so counting it would leave fewer calls than `max`.
#[test]
fn window_counts_results_not_unanswered_calls() {
    let msgs = messages(&fixture("unanswered_newest_call.json"));
    for unit in ["call", "turn"] {
        let p = policy(json!({"tool_call_window": {"max": 2, "unit": unit}}));
        let out = rewrite(&msgs, &p);
        assert_eq!(result_ids(&out.messages), ["c1", "c2"], "{unit}");
        assert!(
            out.report.removed.is_empty(),
            "{unit}: {:?}",
            out.report.removed
        );
        check_valid(&out.messages).unwrap();
    }
    // When repair answers it, it goes out with a result and counts like any other.
    let p = policy(json!({
        "tool_call_window": {"max": 2},
        "repair": {"unanswered_calls": "placeholder"}
    }));
    let out = rewrite(&msgs, &p);
    assert_eq!(result_ids(&out.messages), ["c2", "c3"]);
    let w = RemoveReason::ToolCallWindow;
    assert_eq!(removed(&out.report), [(1, w), (2, w)]);
}

#[test]
fn filter_keeps_text_of_emptied_assistant_and_drops_silent_one() {
    let msgs = messages(&fixture("tool_removal.json"));
    let out = rewrite(
        &msgs,
        &policy(json!({"tool_filter": {"exclude": ["search_web", "search_news"]}})),
    );
    let wire = wire(&out.messages);
    let searching = wire
        .iter()
        .find(|m| m["content"] == "Searching both.")
        .unwrap();
    assert!(searching.get("tool_calls").is_none(), "{searching}");
    // the assistant message with only the s2 call is gone, its result too
    assert!(!result_ids(&out.messages).contains(&"s2".to_string()));
    let f = RemoveReason::ToolFilter;
    assert_eq!(removed(&out.report), [(9, f), (10, f), (11, f), (12, f)]);
    // the current turn's own call to an excluded tool is untouched
    assert_eq!(&out.messages[out.messages.len() - 3..], &msgs[14..]);
    check_valid(&out.messages).unwrap();
}

#[test]
fn include_list_removes_everything_else() {
    let msgs = messages(&fixture("tool_removal.json"));
    let a = rewrite(
        &msgs,
        &policy(json!({"tool_filter": {"include": ["get_weather"]}})),
    );
    let b = rewrite(
        &msgs,
        &policy(json!({"tool_filter": {"exclude": ["search_web", "search_news"]}})),
    );
    assert_eq!(a.messages, b.messages);
}

#[test]
fn filter_placeholder_leaves_a_line_per_removed_call() {
    let msgs = messages(&fixture("tool_removal.json"));
    let out = rewrite(
        &msgs,
        &policy(
            json!({"tool_filter": {"exclude": ["search_web", "search_news"], "placeholder": true}}),
        ),
    );
    let texts: Vec<String> = out.messages.iter().map(|m| m.text_content()).collect();
    assert!(
        texts.contains(
            &"Searching both.\n[tool call omitted: search_web]\n[tool call omitted: search_news]"
                .into()
        )
    );
    assert!(texts.contains(&"[tool call omitted: search_web]".into()));
    assert_eq!(out.report.placeholders, 3);
    check_valid(&out.messages).unwrap();
}

/// Placeholders count what is sent: lines in a message the budget then drops are not.
#[test]
fn placeholders_in_messages_the_budget_drops_are_not_counted() {
    let msgs = messages(&fixture("tool_removal.json"));
    let filter = json!({"exclude": ["search_web"], "placeholder": true});
    let out = rewrite(&msgs, &policy(json!({"tool_filter": filter})));
    assert_eq!(out.report.placeholders, 2);
    let out = rewrite(
        &msgs,
        &policy(json!({"tool_filter": filter, "token_budget": {"max_tokens": 1}})),
    );
    let dropped: Vec<usize> = out.report.removed.iter().map(|r| r.index).collect();
    assert!(dropped.contains(&8) && dropped.contains(&11), "{dropped:?}");
    assert_eq!(out.report.placeholders, 0);
    assert!(
        !out.messages
            .iter()
            .any(|m| m.text_content().contains("omitted"))
    );
}

#[test]
fn tool_access_scrubs_history_calls_to_tools_not_offered() {
    let msgs = messages(&fixture("tool_removal.json"));
    let access = ToolAccess {
        offered: ["get_weather", "search_news"].map(String::from).into(),
        scrub_history: true,
    };
    let policy = policy(json!({}));
    let mut input = PipelineInput::new(&msgs, &policy, O200K);
    input.tool_access = Some(&access);
    let out = run(input, &TokenCounter::new()).unwrap();
    assert_eq!(result_ids(&out.messages), ["p1", "p2", "p3", "n1", "n2"]);
    assert!(
        out.report
            .removed
            .iter()
            .all(|r| r.reason == RemoveReason::ToolAccess)
    );
    // without scrub_history nothing changes
    let keep = ToolAccess {
        scrub_history: false,
        ..access.clone()
    };
    input.tool_access = Some(&keep);
    assert_eq!(run(input, &TokenCounter::new()).unwrap().messages, msgs);
}

/// Seed 000: with `tool_call_window: {max: 3}`, from the fifth question on the request holds the
/// three most recent history calls plus the current one.
#[test]
fn weather_walkthrough_keeps_three_history_calls() {
    let f = fixture("weather_walkthrough.json");
    let all = messages(&f);
    let policy = policy(json!({"tool_call_window": {"max": 3}}));
    for run_no in 1..=8usize {
        let msgs = &all[..1 + 4 * (run_no - 1) + 3];
        let mut input = PipelineInput::new(msgs, &policy, O200K);
        input.tools = Some(&f["tools"]);
        let out = run(input, &TokenCounter::new()).unwrap();
        let ids = result_ids(&out.messages);
        let want: Vec<String> = (run_no.saturating_sub(3).max(1)..=run_no)
            .map(|k| format!("call_{k}"))
            .collect();
        assert_eq!(ids, want, "run {run_no}");
        assert_eq!(ids.len(), (run_no - 1).min(3) + 1);
        // every question and every text reply stays
        let users = out.messages.iter().filter(|m| m.role == Role::User).count();
        assert_eq!(users, run_no);
        let replies = out
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant && !m.has_tool_calls())
            .count();
        assert_eq!(replies, run_no - 1);
        check_valid(&out.messages).unwrap();
        assert!(out.report.tokens_out <= out.report.tokens_in);
    }
}

fn compress_policy(max: u64) -> ctxproxy::context::Policy {
    policy(json!({"compress_tool_output": {"max_tokens": max}}))
}

#[test]
fn compression_fits_json_and_text_results_under_the_limit() {
    let msgs = messages(&fixture("compress.json"));
    let out = rewrite(&msgs, &compress_policy(200));
    let json_result = out.messages[3].text_content();
    let v: Value = serde_json::from_str(&json_result).expect("still valid JSON");
    assert_eq!(v["_compressed"], true);
    assert_eq!(v["success"], true);
    assert_eq!(v["total"], 20);
    assert!(json_result.contains(" more items)"), "{json_result}");
    let text_result = out.messages[4].text_content();
    assert!(text_result.contains(" tokens omitted]…\n"), "{text_result}");
    assert!(text_result.starts_with("2026-01-20T10:00:00Z INFO worker-0"));
    assert_eq!(out.messages[5], msgs[5], "a short result stays as it is");
    for c in &out.report.compressed {
        assert!(c.tokens_before > 200 && c.tokens_after <= 200, "{c:?}");
    }
    let indices: Vec<usize> = out.report.compressed.iter().map(|c| c.index).collect();
    assert_eq!(indices, [3, 4]);
    for m in &out.messages[3..5] {
        assert!(Encoding::O200kBase.count(&m.text_content()) <= 200);
    }
}

#[test]
fn compression_fits_any_limit_and_encoding() {
    let msgs = messages(&fixture("compress.json"));
    for encoding in [
        Encoding::O200kBase,
        Encoding::Cl100kBase,
        Encoding::Approximate,
    ] {
        for max in [1, 8, 20, 50, 120, 500, 2000] {
            let model = ModelFacts {
                context_window: 1_000_000,
                encoding,
            };
            let p = compress_policy(max);
            let out = run(PipelineInput::new(&msgs, &p, model), &TokenCounter::new()).unwrap();
            for m in &out.messages[3..5] {
                let text = m.text_content();
                assert!(encoding.count(&text) <= max, "{encoding} {max}: {text}");
            }
            let first = out.messages[3].text_content();
            if max >= 20 {
                serde_json::from_str::<Value>(&first)
                    .unwrap_or_else(|e| panic!("{encoding} {max}: {e}: {first}"));
            }
        }
    }
}

#[test]
fn compression_leaves_the_current_turn_alone() {
    let msgs = messages(&fixture("compress.json"));
    let current_turn_only = &msgs[..7]; // the last user message is index 1
    let out = rewrite(current_turn_only, &compress_policy(50));
    assert_eq!(out.messages, current_turn_only);
    assert!(out.report.compressed.is_empty());
}

fn repaired(r: &ctxproxy::context::Report) -> Vec<(usize, RepairKind)> {
    let mut v: Vec<_> = r.repaired.iter().map(|x| (x.index, x.kind)).collect();
    v.sort_by_key(|x| (x.0, x.1 as u8));
    v
}

#[test]
fn repair_fixes_every_kind_of_broken_pair() {
    let msgs = messages(&fixture("broken_pairs.json"));
    let out = rewrite(&msgs, &policy(json!({})));
    check_valid(&out.messages).unwrap();
    let roles: Vec<&str> = out.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(
        roles,
        [
            "system",
            "user",
            "assistant",
            "tool",
            "tool",
            "user",
            "assistant",
            "tool",
            "user"
        ]
    );
    assert_eq!(result_ids(&out.messages), ["a", "b", "c"]);
    assert_eq!(out.messages[4].text_content(), "B (late)");
    let calls: Vec<&str> = out.messages[6]
        .tool_calls()
        .iter()
        .map(|c| c.id.as_str())
        .collect();
    assert_eq!(calls, ["c"]);
    use RepairKind::*;
    assert_eq!(
        repaired(&out.report),
        [
            (2, OrphanResult),
            (5, EmptyAssistant),
            (6, MovedResult),
            (7, DuplicateId),
            (9, DuplicateId),
            (9, UnansweredCall)
        ]
    );
}

#[test]
fn repair_placeholder_answers_unanswered_calls() {
    let msgs = messages(&fixture("broken_pairs.json"));
    let out = rewrite(
        &msgs,
        &policy(json!({"repair": {"unanswered_calls": "placeholder"}})),
    );
    check_valid(&out.messages).unwrap();
    let last_tool = out
        .messages
        .iter()
        .rev()
        .find(|m| m.role == Role::Tool)
        .unwrap();
    assert_eq!(last_tool.tool_call_id.as_deref(), Some("d"));
    assert_eq!(last_tool.text_content(), "[no result recorded]");
    assert_eq!(out.report.placeholders, 1);
}

#[test]
fn valid_conversation_passes_through_unchanged() {
    let msgs = messages(&fixture("tool_removal.json"));
    let out = rewrite(&msgs, &policy(json!({})));
    assert_eq!(out.messages, msgs);
    assert_eq!(
        wire(&out.messages),
        fixture("tool_removal.json")["messages"]
            .as_array()
            .unwrap()
            .clone()
    );
    assert_eq!(out.report.tokens_in, out.report.tokens_out);
    let all: HashSet<_> = out.report.removed.iter().map(|r| r.index).collect();
    assert!(all.is_empty() && out.report.repaired.is_empty());
}

/// Older openai-node sent `"tool_calls": []`, which OpenAI refuses ("empty array").
#[test]
fn repair_drops_an_empty_tool_calls_key() {
    let msgs = messages(&json!({"messages": [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "hello", "tool_calls": []},
        {"role": "assistant", "content": null, "tool_calls": []},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "in the current turn too", "tool_calls": []}
    ]}));
    let out = rewrite(&msgs, &policy(json!({})));
    check_valid(&out.messages).unwrap();
    let sent = wire(&out.messages);
    assert_eq!(
        sent,
        [
            json!({"role": "user", "content": "q1"}),
            json!({"role": "assistant", "content": "hello"}),
            json!({"role": "user", "content": "q2"}),
            json!({"role": "assistant", "content": "in the current turn too"}),
        ]
    );
    // only the silent one is a repair; dropping the key removes nothing
    assert_eq!(repaired(&out.report), [(2, RepairKind::EmptyAssistant)]);
    assert!(out.report.removed.is_empty());
}

/// A result sent after the last user message is in the current turn, which compression never
/// touches, even when it answers a history call; repair still moves it back to that call.
#[test]
fn compression_leaves_a_late_result_in_the_current_turn_alone() {
    let long = "word ".repeat(300);
    let msgs = messages(&json!({"messages": [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
        ]},
        {"role": "user", "content": "q2"},
        {"role": "tool", "tool_call_id": "c1", "content": long}
    ]}));
    let out = rewrite(&msgs, &compress_policy(50));
    assert!(
        out.report.compressed.is_empty(),
        "{:?}",
        out.report.compressed
    );
    assert_eq!(
        out.messages,
        [&msgs[0], &msgs[1], &msgs[3], &msgs[2]].map(Clone::clone)
    );
    assert_eq!(repaired(&out.report), [(3, RepairKind::MovedResult)]);
}

/// A history tool result with `content`, answering a call, then the current turn.
fn result_of(content: Value) -> Vec<ctxproxy::conversation::Message> {
    messages(&json!({"messages": [
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "snap", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": content},
        {"role": "user", "content": "and?"}
    ]}))
}

/// Chat content parts keep their shape: text shortened in its part, an image that does not fit
/// replaced by a chat text part saying so, one that fits kept (at 765 tokens).
#[test]
fn compression_keeps_content_parts_and_names_an_omitted_image() {
    let image = json!({"type": "image_url", "image_url": {"url": "https://x/cat.png"}});
    let content = json!([{"type": "text", "text": "word ".repeat(400)}, image, {"type": "text", "text": " the end"}]);
    for (max, kept) in [(60, false), (1000, true)] {
        let out = rewrite(&result_of(content.clone()), &compress_policy(max));
        let parts = out.messages[2]
            .content
            .as_ref()
            .unwrap()
            .as_array()
            .unwrap();
        assert_eq!(parts.len(), 2, "{parts:?}");
        assert_eq!(parts[0]["type"], "text");
        assert!(parts[0]["text"].as_str().unwrap().ends_with(" the end"));
        if kept {
            assert_eq!(parts[1], image);
        } else {
            assert_eq!(parts[1], json!({"type": "text", "text": "[image omitted]"}));
        }
        let after =
            ctxproxy::tokens::content_tokens(Encoding::O200kBase, out.messages[2].content.as_ref());
        assert!(after <= max, "{max}: {after}");
        assert_eq!(out.report.compressed[0].tokens_after, after);
    }
}

/// A string and text parts with the same text are one message to the id, so one remembered
/// compression: each still goes out in its own shape.
#[test]
fn a_remembered_compression_takes_the_shape_of_the_content_at_hand() {
    let text = "word ".repeat(300);
    let as_string = result_of(json!(text));
    let as_parts = result_of(json!([{"type": "text", "text": text}]));
    let ids = ctxproxy::conversation::chain_ids(&wire(&as_string));
    assert_eq!(ids, ctxproxy::conversation::chain_ids(&wire(&as_parts)));
    let counter = TokenCounter::new();
    let p = compress_policy(50);
    for (msgs, parts) in [(&as_string, false), (&as_parts, true), (&as_string, false)] {
        let input = PipelineInput {
            ids: Some(&ids),
            ..PipelineInput::new(msgs, &p, O200K)
        };
        let out = run(input, &counter).unwrap();
        let content = out.messages[2].content.as_ref().unwrap();
        assert_eq!(content.is_array(), parts, "{content}");
        let after = ctxproxy::tokens::content_tokens(Encoding::O200kBase, Some(content));
        assert_eq!(out.report.compressed[0].tokens_after, after);
        assert!(after <= 50);
    }
}

/// A result that is a JSON string stays a JSON string (JSON keeps its shape).
#[test]
fn compression_keeps_a_json_string_a_json_string() {
    let long = serde_json::to_string(&"a very long string, ".repeat(200)).unwrap();
    let out = rewrite(&result_of(json!(long)), &compress_policy(40));
    let text = out.messages[2].text_content();
    let v: Value = serde_json::from_str(&text).expect("still JSON");
    assert!(v.as_str().unwrap().contains("tokens omitted"), "{text}");
    assert!(Encoding::O200kBase.count(&text) <= 40);
}

/// An assistant message whose content parts hold no text says nothing, as `""` says nothing:
/// left without calls it is dropped (with its step's reason), and repair drops one that never had
/// calls. A placeholder line is joined by `\n` only after text.
#[test]
fn empty_text_parts_are_no_text() {
    let call = |id: &str, name: &str| json!({"id": id, "type": "function", "function": {"name": name, "arguments": "{}"}});
    let empty = json!([{"type": "text", "text": ""}]);
    let msgs = messages(&json!({"messages": [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": empty, "tool_calls": [call("c1", "debug_tool")]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
        {"role": "assistant", "content": empty},
        {"role": "assistant", "content": "x"},
        {"role": "user", "content": "q2"}
    ]}));
    let out = rewrite(
        &msgs,
        &policy(json!({"tool_filter": {"exclude": ["debug_tool"]}})),
    );
    check_valid(&out.messages).unwrap();
    assert_eq!(
        wire(&out.messages),
        [
            json!({"role": "user", "content": "q1"}),
            json!({"role": "assistant", "content": "x"}),
            json!({"role": "user", "content": "q2"}),
        ]
    );
    let removed: Vec<_> = out
        .report
        .removed
        .iter()
        .map(|r| (r.index, r.reason))
        .collect();
    assert_eq!(
        removed,
        [(1, RemoveReason::ToolFilter), (2, RemoveReason::ToolFilter)]
    );
    assert_eq!(repaired(&out.report), [(3, RepairKind::EmptyAssistant)]);

    let out = rewrite(
        &msgs,
        &policy(json!({"tool_filter": {"exclude": ["debug_tool"], "placeholder": true}})),
    );
    assert_eq!(
        wire(&out.messages)[1],
        json!({"role": "assistant", "content": [
            {"type": "text", "text": ""},
            {"type": "text", "text": "[tool call omitted: debug_tool]"}
        ]})
    );
    // After text, the line is joined by `\n`; a refusal part is not text.
    let with = |content: Value| {
        let msgs = messages(&json!({"messages": [
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": content, "tool_calls": [call("c1", "debug_tool")]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"},
            {"role": "user", "content": "q2"}
        ]}));
        let p = policy(json!({"tool_filter": {"exclude": ["debug_tool"], "placeholder": true}}));
        wire(&rewrite(&msgs, &p).messages)[1]["content"].clone()
    };
    assert_eq!(
        with(json!([{"type": "text", "text": "Let me look."}]))[1]["text"],
        "\n[tool call omitted: debug_tool]"
    );
    assert_eq!(
        with(json!([{"type": "refusal", "refusal": "No."}]))[1]["text"],
        "[tool call omitted: debug_tool]"
    );
}

/// SPEC 6 and summaries: a request may be given a stored summary only if its role may use every
/// tool the summary read; a summary whose tools are not recorded (made before they were) is
/// judged by the history it covers, which must hold nothing the scrub removed.
#[test]
fn a_summary_is_for_roles_that_may_use_every_tool_it_read() {
    let msgs = messages(&json!({"messages": [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_salary", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "SECRET"},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "q3"}
    ]}));
    let policy = policy(json!({}));
    let counter = TokenCounter::new();
    let viewer = ToolAccess {
        offered: ["search_web", "web_search"].map(String::from).into(),
        scrub_history: true,
    };
    let mut input = PipelineInput::new(&msgs, &policy, O200K);
    input.tool_access = Some(&viewer);
    let early = ctxproxy::context::begin(input, &counter).unwrap();
    let seen = |tools: &[&str]| tools.iter().map(|t| t.to_string()).collect::<Vec<_>>();
    assert!(early.may_see_summary(Some(&seen(&["search_web"])), 5));
    assert!(early.may_see_summary(Some(&seen(&["item:web_search_call"])), 5));
    assert!(early.may_see_summary(Some(&[]), 5));
    assert!(!early.may_see_summary(Some(&seen(&["search_web", "get_salary"])), 5));
    assert!(!early.may_see_summary(Some(&seen(&["item:mcp_call"])), 5));
    // Not recorded: fine while it covers nothing scrubbed (indexes 0-2), not beyond.
    assert!(early.may_see_summary(None, 2));
    assert!(!early.may_see_summary(None, 3));
    assert!(!early.may_see_summary(None, 5));

    // Without scrub_history, or without roles, every summary is for everyone.
    let open = ToolAccess {
        scrub_history: false,
        ..viewer.clone()
    };
    for access in [Some(&open), None] {
        let mut input = PipelineInput::new(&msgs, &policy, O200K);
        input.tool_access = access;
        let early = ctxproxy::context::begin(input, &counter).unwrap();
        assert!(early.may_see_summary(Some(&seen(&["get_salary"])), 5));
        assert!(early.may_see_summary(None, 5));
    }
}
