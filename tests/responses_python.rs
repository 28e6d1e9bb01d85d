//! The official `openai` Python SDK holding a Responses conversation through the proxy
//! (tests/python/test_responses.py): three turns chained by `previous_response_id`, with a
//! function call and its output, plain and streamed. Python checks what the mock received;
//! this side checks the store. The venv comes from `.ci/run` (CTXPROXY_TEST_PYTHON); without
//! it the test is skipped, except under CI=true where that is a failure.

mod common;

use common::*;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_sdk_chains_responses_through_the_proxy() {
    let Some(python) = python() else { return };
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/test_responses.py"
    );
    let sessions_out = proxy.dir.path().join("sessions.jsonl");
    let output = tokio::process::Command::new(python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", script])
        .env("CTXPROXY_BASE_URL", proxy.base_url())
        .env("CTXPROXY_MOCK_URL", mock.url())
        .env("CTXPROXY_SESSIONS_OUT", &sessions_out)
        .output()
        .await
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "pytest failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("2 passed"), "{stdout}");

    // Each conversation is stored whole: user, call, output, reply, user, reply.
    let lines = std::fs::read_to_string(&sessions_out).unwrap();
    let conversations: Vec<Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(conversations.len(), 2);
    for c in conversations {
        let session = c["session"].as_str().unwrap();
        let stored = proxy
            .store()
            .await
            .head_branch("default", session)
            .await
            .unwrap();
        let types: Vec<&str> = stored
            .iter()
            .map(|m| m.body["type"].as_str().unwrap_or("message"))
            .collect();
        assert_eq!(
            types,
            [
                "message",
                "function_call",
                "function_call_output",
                "message",
                "message",
                "message"
            ],
            "{session}"
        );
        assert_eq!(stored[1].body["call_id"], c["call_id"]);
        assert_eq!(stored[2].body["call_id"], c["call_id"]);
        assert_eq!(stored[4].body["content"], "thanks");
        let reply = c["reply"].as_str().unwrap();
        let found = proxy
            .store()
            .await
            .find_response("default", reply)
            .await
            .unwrap()
            .expect("the last response id is recorded");
        assert_eq!(found.session, session);
        assert_eq!(Some(found.message), stored.last().map(|m| m.id));
    }
}
