//! End-to-end: operations (SPEC 2 reload, 8 metrics): `/metrics` after real traffic, config hot
//! reload while serving, and no secret in any log line.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

/// The value of the first sample whose line starts with `prefix` (name plus labels).
fn sample(metrics: &str, prefix: &str) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

async fn scrape(proxy: &Proxy) -> String {
    proxy.metrics_text().await
}

/// The metrics once `ready` holds for them (a record written as a relayed body ends), bounded
/// so that a regression fails instead of hanging.
async fn scrape_until(proxy: &Proxy, ready: impl Fn(&str) -> bool) -> String {
    for _ in 0..200 {
        let m = scrape(proxy).await;
        if ready(&m) {
            return m;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("metrics never got there:\n{}", scrape(proxy).await);
}

/// A pass-through body the upstream breaks off (here: stalls past the tenant's timeout after
/// its first chunk) is recorded with the error's status once it ends, not as the 200 its
/// headers said; its duration covers the whole body.
#[tokio::test]
async fn a_passthrough_body_broken_off_is_recorded_with_its_error() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = upstream.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut conn, _) = upstream.accept().await.unwrap();
        let mut buf = [0u8; 4096];
        let _ = conn.read(&mut buf).await;
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n";
        conn.write_all(head.as_bytes()).await.unwrap();
        // Then nothing, past the tenant's timeout of 1 s.
        tokio::time::sleep(std::time::Duration::from_secs(30)).await;
    });
    let tenant = format!("keys: any\nupstream:\n  base_url: http://{addr}/v1\n  timeout_s: 1\n");
    let (proxy, _mock) = proxy_and_mock(ProxyOptions::default().only_tenant("slow", &tenant)).await;
    let resp = client()
        .get(format!("{}/files/f/content", proxy.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.bytes().await.is_err(), "the body was cut");
    let failed = "ctxproxy_requests_total{tenant=\"slow\",endpoint=\"passthrough\",status=\"504\"}";
    let m = scrape_until(&proxy, |m| sample(m, failed).is_some()).await;
    assert_eq!(sample(&m, failed), Some(1.0), "{m}");
    let duration = sample(
        &m,
        "ctxproxy_request_duration_seconds_sum{endpoint=\"passthrough\"}",
    )
    .unwrap();
    assert!(duration >= 1.0, "the whole body's time: {duration}");
}

/// Every family of SPEC 8 but `ctxproxy_requests_total`, whose status label has no fixed set to
/// start from (it appears with the first request).
const FAMILIES_FROM_THE_START: [&str; 11] = [
    "ctxproxy_request_duration_seconds",
    "ctxproxy_overhead_seconds",
    "ctxproxy_upstream_duration_seconds",
    "ctxproxy_tokens_in_total",
    "ctxproxy_tokens_out_total",
    "ctxproxy_rewrites_total",
    "ctxproxy_repairs_total",
    "ctxproxy_summaries_total",
    "ctxproxy_store_duration_seconds",
    "ctxproxy_store_errors_total",
    "ctxproxy_config_reloads_total",
];

/// A dashboard or alert sees every family of SPEC 8 from the start, histograms included (their
/// buckets at zero), not only after the first request that records into them.
#[tokio::test]
async fn every_family_is_rendered_before_any_request() {
    let (proxy, _mock) = proxy_and_mock(ProxyOptions::default()).await;
    let m = scrape(&proxy).await;
    for family in FAMILIES_FROM_THE_START {
        assert!(
            m.contains(&format!("# TYPE {family} ")),
            "{family} missing before any request:\n{m}"
        );
    }
    let chat = "ctxproxy_request_duration_seconds_count{endpoint=\"chat.completions\"}";
    assert_eq!(sample(&m, chat), Some(0.0), "{m}");
    let open = "ctxproxy_store_duration_seconds_count{op=\"open_turn\"}";
    assert_eq!(sample(&m, open), Some(0.0), "{m}");
}

#[tokio::test]
async fn metrics_show_every_family_with_sane_values() {
    let (proxy, _mock) = proxy_and_mock(ProxyOptions::default()).await;
    let http = client();
    for i in 0..3 {
        let resp = http
            .post(format!("{}/chat/completions", proxy.base_url()))
            .json(&json!({"model": "gpt-4o", "messages": [{"role": "user", "content": format!("hello {i}")}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    let streamed = http
        .post(format!("{}/chat/completions", proxy.base_url()))
        .json(&json!({"model": "gpt-4o", "stream": true, "messages": [{"role": "user", "content": "s"}]}))
        .send()
        .await
        .unwrap();
    let session = streamed.headers()["x-ctxproxy-session"]
        .to_str()
        .unwrap()
        .to_string();
    streamed.text().await.unwrap();
    proxy.wait_for_records("default", &session, 1).await;
    http.get(format!("{}/models", proxy.base_url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // A pass-through request is recorded once its body has been relayed.
    let passthrough =
        "ctxproxy_requests_total{tenant=\"default\",endpoint=\"passthrough\",status=\"200\"}";
    scrape_until(&proxy, |m| sample(m, passthrough).is_some()).await;

    let m = scrape(&proxy).await;
    let requests = sample(
        &m,
        "ctxproxy_requests_total{tenant=\"default\",endpoint=\"chat.completions\",status=\"200\"}",
    );
    assert_eq!(requests, Some(4.0), "{m}");
    assert_eq!(
        sample(
            &m,
            "ctxproxy_requests_total{tenant=\"default\",endpoint=\"passthrough\",status=\"200\"}"
        ),
        Some(1.0)
    );
    let duration_sum = sample(
        &m,
        "ctxproxy_request_duration_seconds_sum{endpoint=\"chat.completions\"}",
    )
    .unwrap();
    let overhead_sum = sample(
        &m,
        "ctxproxy_overhead_seconds_sum{endpoint=\"chat.completions\"}",
    )
    .unwrap();
    assert_eq!(
        sample(
            &m,
            "ctxproxy_overhead_seconds_count{endpoint=\"chat.completions\"}"
        ),
        Some(4.0)
    );
    assert!(
        overhead_sum < duration_sum,
        "overhead {overhead_sum} < duration {duration_sum}"
    );
    // Forwarded routes too: the overhead leaves out the time the upstream took.
    let passthrough_overhead = sample(
        &m,
        "ctxproxy_overhead_seconds_sum{endpoint=\"passthrough\"}",
    )
    .unwrap();
    let passthrough_duration = sample(
        &m,
        "ctxproxy_request_duration_seconds_sum{endpoint=\"passthrough\"}",
    )
    .unwrap();
    assert!(
        passthrough_overhead < passthrough_duration,
        "overhead {passthrough_overhead} < duration {passthrough_duration}"
    );
    assert!(sample(&m, "ctxproxy_upstream_duration_seconds_count").unwrap() >= 5.0);
    let tokens_in = sample(&m, "ctxproxy_tokens_in_total{tenant=\"default\"}").unwrap();
    let tokens_out = sample(&m, "ctxproxy_tokens_out_total{tenant=\"default\"}").unwrap();
    assert!(
        tokens_in > 0.0 && tokens_in >= tokens_out,
        "{tokens_in} >= {tokens_out}"
    );
    for family in FAMILIES_FROM_THE_START {
        assert!(m.contains(family), "{family} missing from:\n{m}");
    }
    assert!(
        sample(
            &m,
            "ctxproxy_store_duration_seconds_count{op=\"close_turn\"}"
        )
        .unwrap()
            >= 4.0
    );
}

/// Sends one 3-tool-call conversation and returns how many tool messages reached the upstream.
async fn tool_results_sent(
    proxy: &Proxy,
    mock: &ctxproxy::mock_upstream::MockHandle,
    key: &str,
) -> (u16, usize) {
    let mut messages = vec![json!({"role": "system", "content": "agent"})];
    for i in 0..3 {
        let id = format!("c{i}");
        messages.push(json!({"role": "user", "content": format!("q{i}")}));
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "f", "arguments": "{}"}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": "r"}));
        messages.push(json!({"role": "assistant", "content": "done"}));
    }
    messages.push(json!({"role": "user", "content": "next"}));
    mock.clear_requests();
    let resp = client()
        .post(format!("{}/chat/completions", proxy.base_url()))
        .bearer_auth(key)
        .json(&json!({"model": "m", "messages": messages}))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let tools = mock
        .requests()
        .first()
        .and_then(|r| r.body_json())
        .map(|b| {
            b["messages"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["role"] == "tool")
                .count()
        })
        .unwrap_or(0);
    (status, tools)
}

fn window_tenant(max: usize) -> String {
    format!(
        "keys: any\nupstream:\n  base_url: {{upstream}}\npolicy:\n  tool_call_window:\n    max: {max}\n"
    )
}

/// Waits (bounded) until a request with `key` gets `expected` from [`tool_results_sent`]:
/// a reload is picked up within a poll of the files.
async fn wait_until_sent(
    proxy: &Proxy,
    mock: &ctxproxy::mock_upstream::MockHandle,
    key: &str,
    expected: (u16, usize),
) -> bool {
    for _ in 0..100 {
        if tool_results_sent(proxy, mock, key).await == expected {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn tenant_files_reload_while_serving() {
    let opts = ProxyOptions::default().only_tenant("default", &window_tenant(2));
    let (proxy, mock) = proxy_and_mock(opts).await;
    let tenants = proxy.dir.path().join("tenants");
    assert_eq!(tool_results_sent(&proxy, &mock, "k").await, (200, 2));

    // A changed window takes effect without a restart.
    std::fs::write(
        tenants.join("default.yaml"),
        window_tenant(1).replace("{upstream}", &mock.base_url()),
    )
    .unwrap();
    assert!(
        wait_until_sent(&proxy, &mock, "k", (200, 1)).await,
        "the new tool_call_window.max was never used"
    );

    // A broken file keeps the last good configuration and counts an error.
    let errors_before = sample(
        &scrape(&proxy).await,
        "ctxproxy_config_reloads_total{outcome=\"error\"}",
    )
    .unwrap();
    std::fs::write(
        tenants.join("default.yaml"),
        "keys: any\npolicy: [this is: not valid\n",
    )
    .unwrap();
    let mut counted = false;
    for _ in 0..100 {
        let now = sample(
            &scrape(&proxy).await,
            "ctxproxy_config_reloads_total{outcome=\"error\"}",
        )
        .unwrap();
        if now > errors_before {
            counted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(counted, "the failed reload was not counted");
    assert_eq!(
        tool_results_sent(&proxy, &mock, "k").await,
        (200, 1),
        "still the last good policy"
    );

    // A new tenant file with a new key: that key works at once after the reload, although
    // another tenant's file is still broken (the audit's case: a typo in one file must not
    // hold back another's change), and that one keeps its last good version.
    use sha2::Digest;
    let hash = hex::encode(sha2::Sha256::digest(b"sk-new-tenant"));
    std::fs::write(
        tenants.join("newco.yaml"),
        format!("keys:\n  - sha256: {hash}\nupstream:\n  base_url: {}\n  api_key_env: HOME\npolicy:\n  tool_call_window:\n    max: 0\n", mock.base_url()),
    )
    .unwrap();
    assert!(
        wait_until_sent(&proxy, &mock, "sk-new-tenant", (200, 0)).await,
        "the new tenant's key never selected it"
    );
    assert_eq!(
        tool_results_sent(&proxy, &mock, "k").await,
        (200, 1),
        "the broken file's tenant: still its last good policy"
    );

    // Fixed, it is reloaded like any other.
    std::fs::write(
        tenants.join("default.yaml"),
        window_tenant(3).replace("{upstream}", &mock.base_url()),
    )
    .unwrap();
    assert!(
        wait_until_sent(&proxy, &mock, "k", (200, 3)).await,
        "the fixed file was never reloaded"
    );
}

/// Kubernetes mounts a ConfigMap as `acme.yaml -> ..data/acme.yaml` and updates it by swapping
/// the `..data` symlink; and a tenants folder may be deleted and made again. Both are reloads.
#[tokio::test]
async fn tenant_files_reload_after_a_symlink_swap_and_a_recreated_folder() {
    use std::os::unix::fs::symlink;

    let opts = ProxyOptions::default().only_tenant("default", &window_tenant(3));
    let (proxy, mock) = proxy_and_mock(opts).await;
    let tenants = proxy.dir.path().join("tenants");
    let tenant = |max| window_tenant(max).replace("{upstream}", &mock.base_url());
    assert_eq!(tool_results_sent(&proxy, &mock, "k").await, (200, 3));

    // The ConfigMap layout, then an update of it the way the kubelet does one.
    for (version, max) in [("..v1", 1), ("..v2", 0)] {
        std::fs::create_dir(tenants.join(version)).unwrap();
        std::fs::write(tenants.join(version).join("default.yaml"), tenant(max)).unwrap();
        symlink(version, tenants.join("..data_tmp")).unwrap();
        std::fs::rename(tenants.join("..data_tmp"), tenants.join("..data")).unwrap();
        if version == "..v1" {
            std::fs::remove_file(tenants.join("default.yaml")).unwrap();
            symlink("..data/default.yaml", tenants.join("default.yaml")).unwrap();
        }
        assert!(
            wait_until_sent(&proxy, &mock, "k", (200, max)).await,
            "the swap to {version} was never picked up"
        );
    }

    // The folder deleted and made again: the change is seen, and so are later ones.
    std::fs::remove_dir_all(&tenants).unwrap();
    std::fs::create_dir(&tenants).unwrap();
    std::fs::write(tenants.join("default.yaml"), tenant(1)).unwrap();
    assert!(
        wait_until_sent(&proxy, &mock, "k", (200, 1)).await,
        "the recreated folder was never read"
    );
    std::fs::write(tenants.join("default.yaml"), tenant(2)).unwrap();
    assert!(
        wait_until_sent(&proxy, &mock, "k", (200, 2)).await,
        "an edit after the folder was recreated was never picked up"
    );
}

/// The config audit's cases (SPEC 2 reload): a tenants folder deleted (the reload fails, the
/// last good tenants stay) and made again empty is reloaded, to no tenants; and `tenants_dir`
/// changed in the server file takes effect only after a restart, as README says, rather than
/// switching to a folder nobody watches.
#[tokio::test]
async fn a_tenants_folder_made_again_empty_is_reloaded_and_a_new_tenants_dir_waits_for_restart() {
    let opts = ProxyOptions::default().only_tenant("default", &window_tenant(3));
    let (proxy, mock) = proxy_and_mock(opts).await;
    let tenants = proxy.dir.path().join("tenants");
    assert_eq!(tool_results_sent(&proxy, &mock, "k").await, (200, 3));

    // Another folder named in the server file: still the old one's tenants, and a later edit
    // there is still seen.
    let other = proxy.dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(
        other.join("elsewhere.yaml"),
        "keys: any\nupstream:\n  base_url: http://127.0.0.1:9/v1\n",
    )
    .unwrap();
    let server_file = proxy.dir.path().join("ctxproxy.yaml");
    let server = std::fs::read_to_string(&server_file).unwrap();
    std::fs::write(
        &server_file,
        server.replace(
            &format!("tenants_dir: {}", tenants.display()),
            &format!("tenants_dir: {}", other.display()),
        ),
    )
    .unwrap();
    let tenant = |max| window_tenant(max).replace("{upstream}", &mock.base_url());
    std::fs::write(tenants.join("default.yaml"), tenant(2)).unwrap();
    assert!(
        wait_until_sent(&proxy, &mock, "k", (200, 2)).await,
        "the started-with folder is no longer read"
    );

    let errors_before = sample(
        &scrape(&proxy).await,
        "ctxproxy_config_reloads_total{outcome=\"error\"}",
    )
    .unwrap();
    std::fs::remove_dir_all(&tenants).unwrap();
    scrape_until(&proxy, |m| {
        sample(m, "ctxproxy_config_reloads_total{outcome=\"error\"}").unwrap() > errors_before
    })
    .await;
    assert_eq!(
        tool_results_sent(&proxy, &mock, "k").await,
        (200, 2),
        "a missing folder keeps the last good tenants"
    );
    std::fs::create_dir(&tenants).unwrap();
    let mut refused = false;
    for _ in 0..100 {
        if tool_results_sent(&proxy, &mock, "k").await.0 == 401 {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(refused, "the folder made again empty was never read");
}

#[tokio::test]
async fn no_key_or_authorization_value_appears_in_logs() {
    let mock = ctxproxy::mock_upstream::spawn(Duration::ZERO).await;
    use sha2::Digest;
    let client_key = "sk-proxy-CLIENTSECRET-1234567890";
    let upstream_key = "sk-upstream-UPSTREAMSECRET-0987654321";
    let hash = hex::encode(sha2::Sha256::digest(client_key.as_bytes()));
    let opts = ProxyOptions::default()
        .only_tenant(
            "keyed",
            &format!("keys:\n  - sha256: {hash}\nupstream:\n  base_url: {{upstream}}\n  api_key_env: CTXPROXY_LOGTEST_UPSTREAM_KEY\n"),
        )
        .tenant("open", "keys: any\nupstream:\n  base_url: {upstream}\n");
    let proxy = BinaryProxy::start_with(
        &opts,
        &mock.base_url(),
        &[
            ("CTXPROXY_LOG", "trace"),
            ("CTXPROXY_LOGTEST_UPSTREAM_KEY", upstream_key),
            ("CTXPROXY_ADMIN_TOKEN", "admin-SECRET-token-555"),
        ],
    )
    .await;
    let base = format!("http://{}", proxy.addr);
    let http = client();
    let any_key = "sk-any-ANYSECRET-777";
    for (key, stream) in [
        (client_key, false),
        (client_key, true),
        (any_key, false),
        ("sk-wrong-WRONGSECRET-1", false),
    ] {
        let resp = http
            .post(format!("{base}/v1/chat/completions"))
            .bearer_auth(key)
            .json(&json!({"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap();
        resp.text().await.unwrap();
        http.get(format!("{base}/v1/models"))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
    }
    http.get(format!("{base}/ctxproxy/v1/sessions"))
        .bearer_auth("admin-SECRET-token-555")
        .send()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let logs = proxy.log();
    proxy.stop().await;
    assert!(logs.contains("request"), "logs were captured: {logs}");
    // Written to a file, not a terminal: plain text, no colour escapes.
    assert!(!logs.contains('\u{1b}'), "ANSI escapes in a log file");
    for secret in [
        "CLIENTSECRET",
        "UPSTREAMSECRET",
        "ANYSECRET",
        "WRONGSECRET",
        "admin-SECRET",
    ] {
        assert!(!logs.contains(secret), "{secret} leaked into the logs");
    }
    assert!(
        !logs.to_ascii_lowercase().contains("bearer "),
        "an Authorization value leaked"
    );
}

/// A proxy killed (SIGKILL) while it holds a session's lease leaves the lease in the SQLite
/// file; the next process to open the file is the only one, so it clears it and the session
/// goes on at once. Without that, the lease blocks the session until it expires (30 s), longer
/// than this tenant lets a request wait for it (`timeout_s: 3`): the turn would be a 409.
#[tokio::test]
async fn a_session_held_by_a_killed_proxy_goes_on_after_a_restart() {
    let mock = ctxproxy::mock_upstream::spawn(Duration::ZERO).await;
    let opts = ProxyOptions::default().only_tenant(
        "default",
        "keys: any\nupstream:\n  base_url: {upstream}\n  timeout_s: 3\n",
    );
    let mut proxy = BinaryProxy::start(&opts, &mock.base_url()).await;
    let http = client();
    // The mock sends one event and holds the stream open: the lease is held while it lasts.
    let mut held = http
        .post(format!("{}/chat/completions", proxy.base_url()))
        .header("x-session-id", "s-killed")
        .header("x-mock-hold-ms", "60000")
        .json(&json!({"model": "m", "stream": true,
            "messages": [{"role": "user", "content": "first"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(held.status(), 200);
    held.chunk().await.unwrap().expect("the first event");
    proxy.kill_and_restart().await;
    drop(held);

    let resp = http
        .post(format!("{}/chat/completions", proxy.base_url()))
        .header("x-session-id", "s-killed")
        .json(&json!({"model": "m", "messages": [
            {"role": "user", "content": "first"},
            {"role": "user", "content": "second"}]}))
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let body = resp.text().await.unwrap();
    assert_eq!(status, 200, "{body}");
    // What the killed process had committed is still there, and the new turn went on from it.
    let (_, stored) = proxy
        .admin_get("/ctxproxy/v1/sessions/default/s-killed/messages")
        .await;
    let contents: Vec<&str> = stored
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert_eq!(contents, ["first", "second", "ok: 2 messages"], "{stored}");
}

/// `serve` stopped by SIGTERM closes its store: SQLite's write-ahead log is emptied into the
/// database file and removed, so the file alone (copied, backed up) holds every turn.
#[tokio::test]
async fn a_stopped_proxy_leaves_its_database_whole_in_one_file() {
    let mock = ctxproxy::mock_upstream::spawn(Duration::ZERO).await;
    let opts = ProxyOptions::default();
    let mut proxy = BinaryProxy::start(&opts, &mock.base_url()).await;
    for n in 0..10 {
        let resp = client()
            .post(format!("{}/chat/completions", proxy.base_url()))
            .header("x-session-id", format!("s-stopped-{n}"))
            .json(&json!({"model": "m", "messages": [{"role": "user", "content": "kept"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    assert!(proxy.terminate().await, "{}", proxy.log());
    let db = proxy.dir.path().join("ctxproxy.db");
    let wal = proxy.dir.path().join("ctxproxy.db-wal");
    assert!(!wal.exists(), "the write-ahead log is left: {wal:?}");
    // The file on its own, copied away from anything beside it.
    let copy = proxy.dir.path().join("copy.db");
    std::fs::copy(&db, &copy).unwrap();
    let conn = rusqlite::Connection::open(&copy).unwrap();
    let stored: i64 = conn
        .query_row(
            "SELECT count(*) FROM messages WHERE session_id LIKE 's-stopped-%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(stored, 20, "each question and its reply");
}

/// A log filter or format that does not parse is not silently ignored: the proxy starts with
/// the defaults and says so.
#[tokio::test]
async fn a_bad_log_format_or_filter_is_a_warning() {
    let mock = ctxproxy::mock_upstream::spawn(Duration::ZERO).await;
    let proxy = BinaryProxy::start_with(
        &ProxyOptions::default(),
        &mock.base_url(),
        &[("CTXPROXY_LOG_FORMAT", "xml"), ("CTXPROXY_LOG", "warn,[[")],
    )
    .await;
    let log = proxy.log();
    proxy.stop().await;
    assert!(
        log.contains("CTXPROXY_LOG_FORMAT: expected `text` or `json`, not `xml`"),
        "{log}"
    );
    assert!(log.contains("CTXPROXY_LOG: not a log filter"), "{log}");
}

/// `server.max_body_bytes` is read per request, so a change to it is reloaded like the
/// tenant files (the keys that need a restart are named in a warning instead).
#[tokio::test]
async fn a_new_body_limit_is_reloaded() {
    let (proxy, _mock) = proxy_and_mock(ProxyOptions::default()).await;
    // Serving means the watcher has read the files as they were (it starts before the server).
    let ok = client().get(proxy.url("/healthz")).send().await.unwrap();
    assert_eq!(ok.status(), 200);
    let server_file = proxy.dir.path().join("ctxproxy.yaml");
    let text = std::fs::read_to_string(&server_file).unwrap();
    assert!(text.contains("max_body_bytes: 33554432"), "{text}");
    std::fs::write(
        &server_file,
        text.replace("max_body_bytes: 33554432", "max_body_bytes: 1000"),
    )
    .unwrap();
    let big = json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(5000)}]});
    let mut refused = false;
    for _ in 0..100 {
        let resp = client()
            .post(format!("{}/chat/completions", proxy.base_url()))
            .json(&big)
            .send()
            .await
            .unwrap();
        if resp.status() == 413 {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(refused, "the new max_body_bytes was never used");
}

/// A PostgreSQL server that goes away without a word (its address refuses connections, so the
/// pool keeps retrying until its acquire timeout) makes `/readyz` a prompt 503, not a probe
/// left without an answer for the pool's 10 s. The database is reached through a forwarder
/// that the test shuts.
#[tokio::test]
async fn readyz_answers_503_promptly_when_the_database_is_gone() {
    let Some(db) = common::pg::PgTestDb::create().await else {
        return;
    };
    let pg_addr = {
        let after_at = db.url.rsplit_once('@').map_or(db.url.as_str(), |(_, h)| h);
        let host = after_at.split('/').next().unwrap();
        tokio::net::lookup_host(host).await.unwrap().next().unwrap()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let forward_addr = listener.local_addr().unwrap();
    let forwarder = tokio::spawn(async move {
        let mut links = tokio::task::JoinSet::new();
        loop {
            let (mut client, _) = listener.accept().await.unwrap();
            links.spawn(async move {
                let mut server = tokio::net::TcpStream::connect(pg_addr).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    });
    let (scheme, rest) = db.url.split_once("://").unwrap();
    let (user, after_at) = rest.rsplit_once('@').unwrap();
    let path = after_at.split_once('/').map_or("", |(_, p)| p);
    let url = format!("{scheme}://{user}@{forward_addr}/{path}");
    let opts = ProxyOptions {
        database_url: Some(url),
        ..ProxyOptions::default()
    };
    let (proxy, _mock) = proxy_and_mock(opts).await;
    let ready = client().get(proxy.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);

    // The forwarder's listener and every link through it go: connections are refused.
    forwarder.abort();
    let _ = forwarder.await;
    let probe = reqwest::Client::builder()
        .gzip(false)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let gone = probe
        .get(proxy.url("/readyz"))
        .send()
        .await
        .expect("an answer well before the pool's 10 s");
    assert_eq!(gone.status(), 503);
    let health = client().get(proxy.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200, "the process still serves");
}
