//! The official `openai` Python SDK pointed at a running proxy (tests/python/test_sdk.py).
//! The venv comes from `.ci/run` (CTXPROXY_TEST_PYTHON); without it the test is skipped, except
//! under CI=true where that is a failure.

mod common;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_openai_sdk_talks_through_the_proxy() {
    let Some(python) = python() else { return };
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/test_sdk.py");
    let base = proxy.base_url();
    let output = tokio::process::Command::new(python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", script])
        .env("CTXPROXY_BASE_URL", &base)
        .output()
        .await
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "pytest failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("6 passed"), "{stdout}");
    assert!(mock.requests().len() >= 6);
}
