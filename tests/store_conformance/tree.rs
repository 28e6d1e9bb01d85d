//! Conformance: the message tree (appends, branches, bodies) and auto session matching.

use ctxproxy::conversation::chain_ids;
use ctxproxy::store::{NewMessage, Origin, Scope};
use serde_json::{Value, json};

use super::{Fixture, msg, scope, send};

pub async fn append_is_idempotent_and_keeps_order(fx: &Fixture) {
    let s = fx.store.as_ref();
    s.get_or_create_session("t", "s1", &scope()).await.unwrap();
    let first = NewMessage::chain(
        None,
        &[msg("system", "sys"), msg("user", "hi")],
        Origin::Client,
    );
    let out = s.append_messages("t", "s1", None, &first).await.unwrap();
    assert!(out.iter().all(|a| a.new));
    assert_eq!(out.iter().map(|a| a.seq).collect::<Vec<_>>(), vec![0, 1]);

    // Resending the same chain stores nothing; extending it stores only the new tail.
    let again = s.append_messages("t", "s1", None, &first).await.unwrap();
    assert!(again.iter().all(|a| !a.new));
    let mut longer = first.clone();
    longer.extend(NewMessage::chain(
        Some(&first[1].id),
        &[msg("assistant", "hello")],
        Origin::Reply,
    ));
    let out = s.append_messages("t", "s1", None, &longer).await.unwrap();
    assert_eq!(
        out.iter().map(|a| a.new).collect::<Vec<_>>(),
        vec![false, false, true]
    );

    // Appending under a parent continues its seq.
    let tail = NewMessage::chain(Some(&longer[2].id), &[msg("user", "more")], Origin::Client);
    let out = s
        .append_messages("t", "s1", Some(longer[2].id), &tail)
        .await
        .unwrap();
    assert_eq!((out[0].seq, out[0].new), (3, true));

    let head = s.head_branch("t", "s1").await.unwrap();
    let texts: Vec<&str> = head
        .iter()
        .map(|m| m.body["content"].as_str().unwrap())
        .collect();
    assert_eq!(texts, vec!["sys", "hi", "hello", "more"]);
    assert_eq!(
        head.iter().map(|m| m.seq).collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    assert_eq!(head[2].origin, Origin::Reply);
    assert_eq!(head[1].parent, Some(head[0].id));
    let session = s.get_session("t", "s1").await.unwrap().unwrap();
    assert_eq!(session.message_count, 4);
    assert_eq!(session.head, Some(tail[0].id));

    // A parent that is not stored is refused.
    let stray = NewMessage::chain(None, &[msg("user", "x")], Origin::Client);
    let err = s
        .append_messages("t", "s1", Some(stray[0].id), &stray)
        .await;
    assert!(matches!(err, Err(ctxproxy::Error::NotFound(_))));
}

/// Builds a conversation of `turns` tool-using turns: user, assistant calling a tool, tool
/// result, assistant answer.
fn tool_conversation(turns: usize) -> Vec<Value> {
    let mut conv = vec![msg("system", "You are a weather bot.")];
    for k in 0..turns {
        conv.push(msg("user", &format!("weather in city {k}?")));
        conv.push(
            json!({"role": "assistant", "content": null, "tool_calls": [{
            "id": format!("call_{k}"), "type": "function",
            "function": {"name": "get_weather", "arguments": format!("{{\"city\":\"c{k}\"}}")}}]}),
        );
        conv.push(json!({"role": "tool", "tool_call_id": format!("call_{k}"),
            "content": format!("{{\"temp\": {k}}}")}));
        conv.push(msg("assistant", &format!("It is {k} degrees.")));
    }
    conv
}

pub async fn ten_tool_turns_are_stored_once_in_order(fx: &Fixture) {
    let s = fx.store.as_ref();
    s.get_or_create_session("t", "tools", &scope())
        .await
        .unwrap();
    let conv = tool_conversation(10);
    // Each turn the client resends everything so far (history mode `client`).
    for end in (5..=conv.len()).step_by(4) {
        send(s, "t", "tools", &conv[..end]).await;
        send(s, "t", "tools", &conv[..end]).await;
    }
    let head = s.head_branch("t", "tools").await.unwrap();
    assert_eq!(head.len(), conv.len());
    for (i, (stored, sent)) in head.iter().zip(&conv).enumerate() {
        assert_eq!(stored.seq, i as i64);
        assert_eq!(&stored.body, sent);
    }
    let session = s.get_session("t", "tools").await.unwrap().unwrap();
    assert_eq!(session.message_count, conv.len() as i64);
    assert_eq!(s.list_branches("t", "tools").await.unwrap().len(), 1);
}

pub async fn divergence_starts_a_branch_and_head_is_last_written(fx: &Fixture) {
    let s = fx.store.as_ref();
    s.get_or_create_session("t", "b", &scope()).await.unwrap();
    let base = vec![
        msg("system", "sys"),
        msg("user", "u1"),
        msg("assistant", "a1"),
    ];
    let mut first = base.clone();
    first.extend([msg("user", "u2"), msg("assistant", "a2")]);
    send(s, "t", "b", &first).await;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    // The client edits u2: a new branch from a1.
    let mut second = base.clone();
    second.extend([msg("user", "u2 edited"), msg("assistant", "a2'")]);
    send(s, "t", "b", &second).await;

    let first_ids = chain_ids(&first);
    let second_ids = chain_ids(&second);
    let branches = s.list_branches("t", "b").await.unwrap();
    assert_eq!(branches.len(), 2);
    assert_eq!(branches[0].id, second_ids[4], "most recent first");
    assert!(branches[0].head && !branches[1].head);
    assert_eq!(
        branches.iter().map(|b| b.messages).collect::<Vec<_>>(),
        vec![5, 5]
    );

    let head = s.head_branch("t", "b").await.unwrap();
    assert_eq!(
        head.iter().map(|m| m.body.clone()).collect::<Vec<_>>(),
        second
    );
    let other = s.load_path("t", "b", first_ids[4]).await.unwrap();
    assert_eq!(
        other.iter().map(|m| m.body.clone()).collect::<Vec<_>>(),
        first
    );
    let inner = s.load_path("t", "b", first_ids[2]).await.unwrap();
    assert_eq!(inner.len(), 3);
    assert_eq!(
        s.get_session("t", "b")
            .await
            .unwrap()
            .unwrap()
            .message_count,
        7
    );

    // Resending the first branch unchanged makes it the head again; extending it too.
    send(s, "t", "b", &first).await;
    assert_eq!(
        s.get_session("t", "b").await.unwrap().unwrap().head,
        Some(first_ids[4])
    );
    let mut third = first.clone();
    third.push(msg("user", "u3"));
    send(s, "t", "b", &third).await;
    let head = s.head_branch("t", "b").await.unwrap();
    assert_eq!(head.len(), 6);
    let branches = s.list_branches("t", "b").await.unwrap();
    assert_eq!(branches.len(), 2);
    assert!(branches.iter().any(|b| b.head && b.messages == 6));

    // A second root is a branch of its own.
    send(s, "t", "b", &[msg("system", "other root")]).await;
    assert_eq!(s.list_branches("t", "b").await.unwrap().len(), 3);
    assert_eq!(s.head_branch("t", "b").await.unwrap().len(), 1);
}

pub async fn unknown_fields_round_trip_by_value(fx: &Fixture) {
    let s = fx.store.as_ref();
    let text = include_str!("../fixtures/store/unusual_messages.json");
    let conv: Vec<Value> = serde_json::from_str(text).unwrap();
    s.get_or_create_session("t", "odd", &scope()).await.unwrap();
    send(s, "t", "odd", &conv).await;
    let head = s.head_branch("t", "odd").await.unwrap();
    assert_eq!(head.len(), conv.len());
    for (stored, sent) in head.iter().zip(&conv) {
        assert_eq!(&stored.body, sent);
        assert_eq!(
            serde_json::to_string(&stored.body).unwrap(),
            serde_json::to_string(sent).unwrap()
        );
    }
}

pub async fn auto_match_finds_longest_prefix_with_a_reply(fx: &Fixture) {
    let s = fx.store.as_ref();
    let sc = scope();
    let conv = [
        msg("system", "sys"),
        msg("user", "q"),
        msg("assistant", "a"),
        msg("user", "q2"),
        msg("assistant", "a2"),
        msg("user", "q3"),
    ];
    let ids = chain_ids(&conv);
    // Only client messages stored: a shared system prompt + question is not a match.
    s.get_or_create_session("t", "a", &sc).await.unwrap();
    let client_only = NewMessage::chain(None, &conv[..2], Origin::Client);
    s.append_messages("t", "a", None, &client_only)
        .await
        .unwrap();
    assert_eq!(
        s.find_session_by_prefix("t", &sc, &ids).await.unwrap(),
        None
    );
    // Even an assistant message the client sent itself does not count: it is not a reply.
    let client_assistant = NewMessage::chain(Some(&ids[1]), &conv[2..3], Origin::Client);
    s.append_messages("t", "a", Some(ids[1]), &client_assistant)
        .await
        .unwrap();
    assert_eq!(
        s.find_session_by_prefix("t", &sc, &ids).await.unwrap(),
        None
    );

    // Session b holds the conversation up to a2, with stored replies.
    s.get_or_create_session("t", "b", &sc).await.unwrap();
    send(s, "t", "b", &conv[..5]).await;
    let m = s
        .find_session_by_prefix("t", &sc, &ids)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((m.session_id.as_str(), m.matched_len), ("b", 5));

    // Session c holds a shorter prefix with a reply; b still wins as the longest.
    s.get_or_create_session("t", "c", &sc).await.unwrap();
    send(s, "t", "c", &conv[..3]).await;
    let m = s
        .find_session_by_prefix("t", &sc, &ids)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((m.session_id.as_str(), m.matched_len), ("b", 5));

    // Equal matches: the most recently updated session wins.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let fork = [
        conv[0].clone(),
        conv[1].clone(),
        conv[2].clone(),
        msg("user", "other"),
    ];
    let fork_ids = chain_ids(&fork);
    send(s, "t", "c", &fork[..3]).await; // nothing new: c is not touched
    send(
        s,
        "t",
        "c",
        &[
            fork[0].clone(),
            fork[1].clone(),
            fork[2].clone(),
            msg("user", "x"),
        ],
    )
    .await;
    let m = s
        .find_session_by_prefix("t", &sc, &fork_ids)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((m.session_id.as_str(), m.matched_len), ("c", 3));

    assert_eq!(s.find_session_by_prefix("t", &sc, &[]).await.unwrap(), None);
}

pub async fn auto_match_is_isolated_by_tenant_and_scope(fx: &Fixture) {
    let s = fx.store.as_ref();
    let conv = [msg("user", "q"), msg("assistant", "a"), msg("user", "q2")];
    let ids = chain_ids(&conv);
    let sc = Scope {
        key_hash: Some("key-a".into()),
        user: Some("alice".into()),
    };
    s.get_or_create_session("t1", "s", &sc).await.unwrap();
    send(s, "t1", "s", &conv[..2]).await;
    assert!(
        s.find_session_by_prefix("t1", &sc, &ids)
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(
        s.find_session_by_prefix("t2", &sc, &ids).await.unwrap(),
        None
    );
    for other in [
        Scope {
            key_hash: Some("key-b".into()),
            user: Some("alice".into()),
        },
        Scope {
            key_hash: Some("key-a".into()),
            user: Some("bob".into()),
        },
        Scope {
            key_hash: Some("key-a".into()),
            user: None,
        },
        Scope {
            key_hash: None,
            user: Some("alice".into()),
        },
        Scope::default(),
    ] {
        assert_eq!(
            s.find_session_by_prefix("t1", &other, &ids).await.unwrap(),
            None,
            "{other:?}"
        );
    }
    // An unscoped session matches unscoped requests only.
    s.get_or_create_session("t1", "open", &Scope::default())
        .await
        .unwrap();
    send(s, "t1", "open", &conv[..2]).await;
    let m = s
        .find_session_by_prefix("t1", &Scope::default(), &ids)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m.session_id, "open");
}

pub async fn auto_match_handles_long_conversations(fx: &Fixture) {
    let s = fx.store.as_ref();
    let conv: Vec<Value> = (0..600)
        .map(|i| {
            msg(
                if i % 2 == 0 { "user" } else { "assistant" },
                &format!("m{i}"),
            )
        })
        .collect();
    s.get_or_create_session("t", "long", &scope())
        .await
        .unwrap();
    send(s, "t", "long", &conv).await;
    let mut incoming = conv.clone();
    incoming.push(msg("user", "next"));
    let ids = chain_ids(&incoming);
    let started = std::time::Instant::now();
    let m = s
        .find_session_by_prefix("t", &scope(), &ids)
        .await
        .unwrap()
        .unwrap();
    eprintln!(
        "{}: prefix lookup of 601 ids took {:?}",
        s.backend(),
        started.elapsed()
    );
    assert_eq!((m.session_id.as_str(), m.matched_len), ("long", 600));
    assert_eq!(s.head_branch("t", "long").await.unwrap().len(), 600);

    // The stored part ends well before the incoming one (many new messages at once) and, for
    // the second, before the last 500 ids: still the longest stored prefix, whichever part of
    // the incoming ids it lies in.
    for extra in [30, 520] {
        let mut incoming = conv.clone();
        incoming.extend((0..extra).map(|i| msg("user", &format!("new {i}"))));
        let m = s
            .find_session_by_prefix("t", &scope(), &chain_ids(&incoming))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((m.session_id.as_str(), m.matched_len), ("long", 600));
    }
    // A prefix that ends on a client message still matches up to it.
    let m = s
        .find_session_by_prefix("t", &scope(), &chain_ids(&conv[..41]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((m.session_id.as_str(), m.matched_len), ("long", 41));
}
