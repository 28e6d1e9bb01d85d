//! Requests on one session are serialised across processes that share a PostgreSQL database
//! (SPEC 4.2): 50 concurrent server-mode turns through two proxies, one in-process and one the
//! real `ctxproxy` binary, leave 100 messages that strictly alternate user/assistant, each
//! reply having seen exactly the turns before it. PostgreSQL only: SQLite is one process's store.

use std::collections::BTreeSet;

use super::common::*;
use super::{Backend, chat, request, upstream_histories, user, without_seq};

const TURNS: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_turns_through_two_processes_never_interleave() {
    let Some(b) = Backend::postgres().await else {
        return;
    };
    let opts = b.options().only_tenant(
        "default",
        "keys: any\nupstream:\n  base_url: {upstream}\nsession:\n  history: server\n",
    );
    let mock = ctxproxy::mock_upstream::spawn(std::time::Duration::ZERO).await;
    // The first process applies the migrations; the binary then finds them applied.
    let inproc = Proxy::start(opts.clone(), &mock.base_url()).await;
    let binary = BinaryProxy::start(&opts, &mock.base_url()).await;

    let bases = [inproc.base_url(), binary.base_url()];
    let turns = (0..TURNS).map(|i| {
        let base = bases[i % 2].clone();
        async move {
            let a = chat(
                &base,
                "sk-a",
                &[("x-session-id", "busy")],
                &request(&[user(&format!("turn {i}"))]),
            )
            .await;
            assert_eq!(a.status, 200, "turn {i}: {}", a.body);
        }
    });
    futures_util::future::join_all(turns).await;
    inproc.wait_for_records("default", "busy", TURNS).await;

    let stored = without_seq(&inproc.stored_messages("default", "busy").await);
    assert_eq!(stored.len(), 2 * TURNS);
    let mut users = BTreeSet::new();
    for (k, pair) in stored.chunks(2).enumerate() {
        assert_eq!(pair[0]["role"], "user", "message {}: {}", 2 * k, pair[0]);
        assert_eq!(
            pair[1]["role"],
            "assistant",
            "message {}: {}",
            2 * k + 1,
            pair[1]
        );
        // Server mode sends the stored history: turn k saw its 2k predecessors plus itself.
        assert_eq!(
            pair[1]["content"],
            format!("ok: {} messages", 2 * k + 1),
            "turn {k} answered after exactly the turns before it"
        );
        assert!(users.insert(pair[0]["content"].as_str().unwrap().to_string()));
    }
    assert_eq!(users.len(), TURNS, "every user message stored once");

    let (status, detail) = inproc.admin_get("/ctxproxy/v1/sessions/default/busy").await;
    assert_eq!(status, 200, "{detail}");
    assert_eq!(detail["message_count"], 2 * TURNS, "{detail}");
    assert_eq!(detail["branches"].as_array().map(Vec::len), Some(1));

    let mut sizes: Vec<usize> = upstream_histories(&mock).iter().map(Vec::len).collect();
    sizes.sort_unstable();
    let expected: Vec<usize> = (0..TURNS).map(|k| 2 * k + 1).collect();
    assert_eq!(
        sizes, expected,
        "each upstream call saw a distinct, whole history"
    );

    binary.stop().await;
    inproc.shutdown().await;
}
