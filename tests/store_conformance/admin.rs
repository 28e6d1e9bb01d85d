//! Conformance: tenants, the admin listing, deletion, request records, summaries, response ids.

use std::collections::HashSet;

use ctxproxy::conversation::chain_ids;
use ctxproxy::store::{NewRequestRecord, NewSummary, SessionQuery, Timestamp};
use serde_json::json;

use super::{Fixture, msg, scope, send};

pub async fn tenants_with_the_same_session_id_are_isolated(fx: &Fixture) {
    let s = fx.store.as_ref();
    s.get_or_create_session("acme", "shared", &scope())
        .await
        .unwrap();
    s.get_or_create_session("globex", "shared", &scope())
        .await
        .unwrap();
    send(s, "acme", "shared", &[msg("user", "acme secret")]).await;
    send(
        s,
        "globex",
        "shared",
        &[msg("user", "globex plan"), msg("assistant", "ok")],
    )
    .await;
    let a = s.head_branch("acme", "shared").await.unwrap();
    let g = s.head_branch("globex", "shared").await.unwrap();
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].body["content"], "acme secret");
    assert_eq!(g.len(), 2);
    // A message id of one tenant is no parent in the other.
    let acme_ids = chain_ids(&[msg("user", "acme secret")]);
    assert!(
        s.load_path("globex", "shared", acme_ids[0])
            .await
            .unwrap()
            .is_empty()
    );
    assert!(s.get_session("initech", "shared").await.unwrap().is_none());
    assert!(s.delete_session("acme", "shared").await.unwrap());
    assert_eq!(s.head_branch("globex", "shared").await.unwrap().len(), 2);
}

pub async fn session_list_is_keyset_paginated_newest_first(fx: &Fixture) {
    let s = fx.store.as_ref();
    for i in 0..7 {
        let tenant = if i % 2 == 0 { "even" } else { "odd" };
        s.get_or_create_session(tenant, &format!("s{i}"), &scope())
            .await
            .unwrap();
        send(s, tenant, &format!("s{i}"), &[msg("user", &format!("{i}"))]).await;
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = s
            .list_sessions(&SessionQuery {
                tenant: None,
                limit: 3,
                after: after.clone(),
            })
            .await
            .unwrap();
        assert!(page.sessions.len() <= 3);
        seen.extend(page.sessions.iter().map(|x| x.id.clone()));
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(seen, vec!["s6", "s5", "s4", "s3", "s2", "s1", "s0"]);

    // OpenAI-style: `after` may be the id of the last session seen instead of the cursor.
    let mut by_id = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = s
            .list_sessions(&SessionQuery {
                tenant: None,
                limit: 3,
                after: after.clone(),
            })
            .await
            .unwrap();
        by_id.extend(page.sessions.iter().map(|x| x.id.clone()));
        if page.next.is_none() {
            break;
        }
        after = page.sessions.last().map(|x| x.id.clone());
    }
    assert_eq!(by_id, seen);

    let odd = s
        .list_sessions(&SessionQuery {
            tenant: Some("odd".into()),
            limit: 10,
            after: None,
        })
        .await
        .unwrap();
    assert_eq!(
        odd.sessions
            .iter()
            .map(|x| x.id.as_str())
            .collect::<Vec<_>>(),
        vec!["s5", "s3", "s1"]
    );
    assert!(odd.next.is_none());
    assert_eq!(odd.sessions[0].message_count, 1);

    // Sessions created in the same millisecond are neither lost nor repeated across pages.
    for i in 0..5 {
        s.get_or_create_session("same", &format!("x{i}"), &scope())
            .await
            .unwrap();
    }
    let mut ids = HashSet::new();
    let mut after = None;
    loop {
        let page = s
            .list_sessions(&SessionQuery {
                tenant: Some("same".into()),
                limit: 2,
                after,
            })
            .await
            .unwrap();
        for x in &page.sessions {
            assert!(ids.insert(x.id.clone()), "repeated {}", x.id);
        }
        after = page.next;
        if after.is_none() {
            break;
        }
    }
    assert_eq!(ids.len(), 5);
    let bad = s
        .list_sessions(&SessionQuery {
            tenant: None,
            limit: 2,
            after: Some("zz".into()),
        })
        .await;
    assert!(matches!(bad, Err(ctxproxy::Error::InvalidRequest { .. })));
}

pub async fn delete_removes_the_session_and_everything_in_it(fx: &Fixture) {
    let s = fx.store.as_ref();
    s.get_or_create_session("t", "gone", &scope())
        .await
        .unwrap();
    let conv = [msg("user", "q"), msg("assistant", "a")];
    send(s, "t", "gone", &conv).await;
    let ids = chain_ids(&conv);
    s.insert_request(&NewRequestRecord {
        tenant: "t".into(),
        session: "gone".into(),
        endpoint: "chat".into(),
        status: 200,
        ..Default::default()
    })
    .await
    .unwrap();
    s.insert_summary(
        "t",
        "gone",
        &NewSummary {
            anchor: ids[1],
            covers_until: 1,
            text: "sum".into(),
            token_count: 1,
            model: None,
            tools_seen: None,
        },
    )
    .await
    .unwrap();
    s.record_response("t", "resp_1", "gone", ids[1], None, None)
        .await
        .unwrap();

    assert!(s.delete_session("t", "gone").await.unwrap());
    assert!(!s.delete_session("t", "gone").await.unwrap());
    assert!(s.get_session("t", "gone").await.unwrap().is_none());
    assert!(s.session_detail("t", "gone").await.unwrap().is_none());
    assert!(s.head_branch("t", "gone").await.unwrap().is_empty());
    assert!(s.list_requests("t", "gone").await.unwrap().is_empty());
    assert!(s.list_summaries("t", "gone").await.unwrap().is_empty());
    assert!(s.find_response("t", "resp_1").await.unwrap().is_none());
    // The id is free again, and nothing of the old session leaks into the new one.
    s.get_or_create_session("t", "gone", &scope())
        .await
        .unwrap();
    assert_eq!(
        s.get_session("t", "gone")
            .await
            .unwrap()
            .unwrap()
            .message_count,
        0
    );
    assert_eq!(
        s.find_session_by_prefix("t", &scope(), &ids).await.unwrap(),
        None
    );
}

pub async fn request_records_are_listed_oldest_first(fx: &Fixture) {
    let s = fx.store.as_ref();
    s.get_or_create_session("t", "r", &scope()).await.unwrap();
    let ids = chain_ids(&[msg("user", "q")]);
    for i in 0..3i64 {
        s.insert_request(&NewRequestRecord {
            tenant: "t".into(),
            session: "r".into(),
            head: Some(ids[0]),
            endpoint: "/v1/chat/completions".into(),
            model: Some("gpt-4o".into()),
            status: 200 + i as u16,
            tokens_in: Some(100 + i),
            tokens_out: Some(50),
            latency_ms: Some(12),
            upstream_latency_ms: Some(10),
            request_id: Some(format!("req_{i}")),
            report: Some(json!({"tokens_in": 100, "removed": [{"index": 1, "role": "tool", "reason": "tool_filter"}]})),
            choices: (i == 2).then(|| json!([{"index": 1, "message": {"role": "assistant", "content": "alt"}}])),
            usage: (i == 1).then(|| json!({"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9, "x_extra": {"kept": true}})),
            system: (i == 1).then(|| json!([{"role": "system", "content": "Be brief.\u{0}", "x_kept": 1}])),
            // A record's time is when its request arrived, where the caller knows it.
            arrived: (i == 0).then_some(Timestamp(1_700_000_000_123)),
        })
        .await
        .unwrap();
    }
    let list = s.list_requests("t", "r").await.unwrap();
    assert_eq!(
        list.iter()
            .map(|r| r.request_id.clone().unwrap())
            .collect::<Vec<_>>(),
        vec!["req_0", "req_1", "req_2"]
    );
    assert_eq!(list[0].time, Timestamp(1_700_000_000_123));
    assert!(list[1].time > list[0].time);
    assert_eq!(list[1].status, 201);
    assert_eq!(list[2].tokens_in, Some(102));
    assert_eq!(list[0].head, Some(ids[0]));
    assert_eq!(
        list[0].report.as_ref().unwrap()["removed"][0]["reason"],
        "tool_filter"
    );
    assert!(list[0].choices.is_none());
    assert!(list[0].usage.is_none());
    assert!(list[0].system.is_none());
    assert_eq!(
        list[1].system,
        Some(json!([{"role": "system", "content": "Be brief.\u{0}", "x_kept": 1}]))
    );
    assert_eq!(
        list[1].usage,
        Some(
            json!({"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9, "x_extra": {"kept": true}})
        )
    );
    assert_eq!(
        list[2].choices.as_ref().unwrap()[0]["message"]["content"],
        "alt"
    );
    assert!(s.list_requests("other", "r").await.unwrap().is_empty());
}

pub async fn summaries_keep_history_and_follow_the_branch(fx: &Fixture) {
    let s = fx.store.as_ref();
    s.get_or_create_session("t", "sum", &scope()).await.unwrap();
    let main: Vec<_> = (0..6)
        .map(|i| {
            msg(
                if i % 2 == 0 { "user" } else { "assistant" },
                &format!("m{i}"),
            )
        })
        .collect();
    send(s, "t", "sum", &main).await;
    let ids = chain_ids(&main);
    let new = |anchor, covers_until, text: &str| NewSummary {
        anchor,
        covers_until,
        text: text.into(),
        token_count: 7,
        model: Some("gpt-4o-mini".into()),
        // Recorded for the later one only: a summary made before they were has none.
        tools_seen: (text == "second").then(|| {
            vec![
                "get_weather".to_string(),
                "item:web_search_call".to_string(),
            ]
        }),
    };
    s.insert_summary("t", "sum", &new(ids[1], 1, "first"))
        .await
        .unwrap();
    s.insert_summary("t", "sum", &new(ids[3], 3, "second"))
        .await
        .unwrap();
    let latest = s.latest_summary("t", "sum", None).await.unwrap().unwrap();
    assert_eq!((latest.text.as_str(), latest.covers_until), ("second", 3));
    assert_eq!(
        latest.tools_seen.as_deref(),
        Some(
            &[
                "get_weather".to_string(),
                "item:web_search_call".to_string()
            ][..]
        )
    );
    let all = s.list_summaries("t", "sum").await.unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].tools_seen, None);

    // A branch that left the main line after m1 only sees the summary anchored on its path.
    let mut fork = main[..2].to_vec();
    fork.push(msg("user", "fork"));
    send(s, "t", "sum", &fork).await;
    let fork_ids = chain_ids(&fork);
    let on_fork = s
        .latest_summary("t", "sum", Some(fork_ids[2]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(on_fork.text, "first");
    assert_eq!(
        s.latest_summary("t", "sum", None)
            .await
            .unwrap()
            .unwrap()
            .text,
        "first"
    );
    let on_main = s
        .latest_summary("t", "sum", Some(ids[5]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(on_main.text, "second");
    let detail = s.session_detail("t", "sum").await.unwrap().unwrap();
    assert_eq!(detail.branches.len(), 2);
    assert_eq!(detail.summary.unwrap().text, "first");
    assert!(
        s.latest_summary("t", "nobody", None)
            .await
            .unwrap()
            .is_none()
    );
}

pub async fn response_ids_resolve_within_their_tenant(fx: &Fixture) {
    let s = fx.store.as_ref();
    s.get_or_create_session("t", "resp", &scope())
        .await
        .unwrap();
    let conv = [msg("user", "q"), msg("assistant", "a")];
    send(s, "t", "resp", &conv).await;
    let ids = chain_ids(&conv);
    s.record_response("t", "resp_abc", "resp", ids[1], None, None)
        .await
        .unwrap();
    let found = s.find_response("t", "resp_abc").await.unwrap().unwrap();
    assert_eq!((found.session.as_str(), found.message), ("resp", ids[1]));
    assert_eq!(found.upstream_root, None);
    assert!(
        s.find_response("other", "resp_abc")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        s.find_response("t", "resp_unknown")
            .await
            .unwrap()
            .is_none()
    );
    // Recording again is not an error, and replaces the whole record.
    s.record_response("t", "resp_abc", "resp", ids[0], Some("resp_upstream"), None)
        .await
        .unwrap();
    let found = s.find_response("t", "resp_abc").await.unwrap().unwrap();
    assert_eq!(found.message, ids[0]);
    assert_eq!(found.upstream_root.as_deref(), Some("resp_upstream"));
    s.record_response("t", "resp_abc", "resp", ids[1], None, None)
        .await
        .unwrap();
    let found = s.find_response("t", "resp_abc").await.unwrap().unwrap();
    assert_eq!((found.message, found.upstream_root), (ids[1], None));
}

pub async fn migrate_twice_is_a_no_op(fx: &Fixture) {
    fx.store.migrate().await.unwrap();
    let other = fx.second_store().await;
    other.migrate().await.unwrap();
    other.ping().await.unwrap();
    other.close().await;
}
