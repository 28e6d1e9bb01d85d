//! Test harness: a real ctxproxy server on a random port (in-process, over real HTTP), with its
//! own config folder and SQLite file, in front of the in-process mock upstream.

#![allow(dead_code)]

pub mod pg;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ctxproxy::app::{AppState, Server, load_config};
use ctxproxy::mock_upstream::{self, MockHandle};
use tokio::sync::oneshot;

/// The admin token every test proxy accepts.
pub const ADMIN_TOKEN: &str = "test-admin-token";

/// A running proxy and the folder holding its configuration.
pub struct Proxy {
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    pub state: Arc<AppState>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// What to start a proxy with.
#[derive(Clone)]
pub struct ProxyOptions {
    /// (tenant name, tenant YAML); `{upstream}` is replaced by the mock's base URL.
    pub tenants: Vec<(String, String)>,
    /// Extra top-level YAML for the server file (e.g. `models:` or `defaults:`).
    pub server_extra: String,
    pub max_body_bytes: usize,
    /// `None`: a fresh SQLite file in the temp folder.
    pub database_url: Option<String>,
    pub shutdown_grace_s: u64,
    /// `None`: the server's default.
    pub header_read_timeout: Option<std::time::Duration>,
}

impl Default for ProxyOptions {
    fn default() -> Self {
        ProxyOptions {
            tenants: vec![(
                "default".into(),
                "keys: any\nupstream:\n  base_url: {upstream}\n".into(),
            )],
            server_extra: String::new(),
            max_body_bytes: 32 * 1024 * 1024,
            database_url: None,
            shutdown_grace_s: 5,
            header_read_timeout: None,
        }
    }
}

impl ProxyOptions {
    pub fn tenant(mut self, name: &str, yaml: &str) -> Self {
        self.tenants.retain(|(n, _)| n != name);
        self.tenants.push((name.into(), yaml.into()));
        self
    }

    pub fn only_tenant(mut self, name: &str, yaml: &str) -> Self {
        self.tenants.clear();
        self.tenants.push((name.into(), yaml.into()));
        self
    }
}

/// Writes a config folder for `opts` pointing tenants at `upstream`; returns the server file.
pub fn write_config(dir: &Path, opts: &ProxyOptions, upstream: &str) -> PathBuf {
    let tenants = dir.join("tenants");
    std::fs::create_dir_all(&tenants).unwrap();
    for (name, yaml) in &opts.tenants {
        std::fs::write(
            tenants.join(format!("{name}.yaml")),
            yaml.replace("{upstream}", upstream),
        )
        .unwrap();
    }
    let db = opts
        .database_url
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}?mode=rwc", dir.join("ctxproxy.db").display()));
    let server = format!(
        "server:\n  listen: 127.0.0.1:0\n  max_body_bytes: {}\n  shutdown_grace_s: {}\ndatabase:\n  url: \"{}\"\n  max_connections: 8\ntenants_dir: {}\n{}\n",
        opts.max_body_bytes,
        opts.shutdown_grace_s,
        db,
        tenants.display(),
        opts.server_extra
    );
    let path = dir.join("ctxproxy.yaml");
    std::fs::write(&path, server).unwrap();
    path
}

impl Proxy {
    /// The proxy's `/metrics` text.
    pub async fn metrics_text(&self) -> String {
        client()
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The proxy's store, once every reply it already answered with is written (non-streamed
    /// replies are written after their answer goes out; the admin API waits the same way).
    pub async fn store(&self) -> Arc<dyn ctxproxy::store::Store> {
        self.state.pending.settle_all().await;
        self.state.store.clone()
    }

    /// Starts a proxy with `opts` in front of `upstream` (a base URL such as the mock's).
    pub async fn start(opts: ProxyOptions, upstream: &str) -> Proxy {
        ctxproxy::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let path = write_config(dir.path(), &opts, upstream);
        let mut config = load_config(&path).expect("test config loads");
        // Set directly rather than through the environment, which tests share.
        config.admin_token = Some(ADMIN_TOKEN.to_string());
        let mut server = Server::bind(config, None).await.expect("proxy binds");
        if let Some(timeout) = opts.header_read_timeout {
            server = server.with_header_read_timeout(timeout);
        }
        let addr = server.local_addr().unwrap();
        let state = server.state();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = server
                .run(async {
                    let _ = stopped.await;
                })
                .await;
        });
        Proxy {
            addr,
            dir,
            state,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// `http://addr/v1`, what a client uses as its base URL.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// GET an admin route (`/ctxproxy/v1/...`) with the admin token; returns status and JSON.
    pub async fn admin_get(&self, path: &str) -> (u16, serde_json::Value) {
        admin_get(&self.url(path)).await
    }

    /// The value of `ctxproxy_store_errors_total` now.
    pub async fn store_errors_total(&self) -> f64 {
        self.metrics_text()
            .await
            .lines()
            .find_map(|l| l.strip_prefix("ctxproxy_store_errors_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// The stored messages of a session's head branch, via the admin API.
    pub async fn stored_messages(&self, tenant: &str, session: &str) -> Vec<serde_json::Value> {
        let (status, v) = self
            .admin_get(&format!(
                "/ctxproxy/v1/sessions/{tenant}/{session}/messages"
            ))
            .await;
        assert_eq!(status, 200, "{v}");
        v.as_array().cloned().unwrap_or_default()
    }

    /// The request records of a session, via the admin API.
    pub async fn request_records(&self, tenant: &str, session: &str) -> Vec<serde_json::Value> {
        let (status, v) = self
            .admin_get(&format!(
                "/ctxproxy/v1/sessions/{tenant}/{session}/requests"
            ))
            .await;
        assert_eq!(status, 200, "{v}");
        v.as_array().cloned().unwrap_or_default()
    }

    /// Waits (bounded) until the session has `n` request records: streamed replies are stored
    /// after the client has read the last byte.
    pub async fn wait_for_records(&self, tenant: &str, session: &str, n: usize) {
        for _ in 0..200 {
            let (status, v) = self
                .admin_get(&format!(
                    "/ctxproxy/v1/sessions/{tenant}/{session}/requests"
                ))
                .await;
            if status == 200 && v.as_array().is_some_and(|a| a.len() >= n) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("session {session} never reached {n} request records");
    }

    /// Stops the server and waits for it (in-flight requests get the grace period).
    pub async fn shutdown(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

/// GET an admin route's full URL with the admin token; returns status and JSON.
pub async fn admin_get(url: &str) -> (u16, serde_json::Value) {
    let resp = client()
        .get(url)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(serde_json::Value::Null))
}

/// A mock upstream plus a proxy in front of it.
pub async fn proxy_and_mock(opts: ProxyOptions) -> (Proxy, MockHandle) {
    let mock = mock_upstream::spawn(std::time::Duration::ZERO).await;
    let proxy = Proxy::start(opts, &mock.base_url()).await;
    (proxy, mock)
}

/// A plain HTTP client for tests.
pub fn client() -> reqwest::Client {
    ctxproxy::install_crypto_provider();
    // As a plain client: no `Accept-Encoding` it did not choose (reqwest's gzip feature is on
    // for the proxy's own reading client).
    reqwest::Client::builder().gzip(false).build().unwrap()
}

/// The `data:` payloads of an SSE body, in order.
pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|ev| {
            ev.lines()
                .find_map(|l| l.strip_prefix("data: ").map(str::to_string))
        })
        .collect()
}

/// The text of a chat stream: every `delta.content` joined.
pub fn chat_stream_text(body: &str) -> String {
    sse_data(body)
        .iter()
        .filter(|d| d.as_str() != "[DONE]")
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .filter_map(|v| {
            v.pointer("/choices/0/delta/content")
                .and_then(|c| c.as_str())
                .map(str::to_string)
        })
        .collect()
}

/// Asserts an OpenAI-shaped error body and returns it.
pub fn assert_openai_error(body: &serde_json::Value) -> &serde_json::Value {
    let err = body.get("error").expect("an `error` object");
    assert!(
        err.get("message").and_then(|m| m.as_str()).is_some(),
        "{body}"
    );
    assert!(err.get("type").and_then(|m| m.as_str()).is_some(), "{body}");
    assert!(err.get("param").is_some(), "{body}");
    assert!(err.get("code").is_some(), "{body}");
    err
}

/// A free local port (bound, read, released: a tiny race a test can live with).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free local port")
}

/// The real `ctxproxy` binary (`serve --config`) as a child process, with its own config folder
/// written by [`write_config`]; killed when dropped. Its output goes to `ctxproxy.log` in that
/// folder.
pub struct BinaryProxy {
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    config: PathBuf,
    env: Vec<(String, String)>,
    child: tokio::process::Child,
}

impl BinaryProxy {
    /// Starts the binary with `opts` in front of `upstream` and waits (bounded) for `/readyz`.
    pub async fn start(opts: &ProxyOptions, upstream: &str) -> BinaryProxy {
        BinaryProxy::start_with(opts, upstream, &[]).await
    }

    /// Like [`BinaryProxy::start`], with extra environment variables (they win over the
    /// defaults: `CTXPROXY_ADMIN_TOKEN`, `CTXPROXY_LOG=warn`).
    pub async fn start_with(
        opts: &ProxyOptions,
        upstream: &str,
        env: &[(&str, &str)],
    ) -> BinaryProxy {
        let dir = tempfile::tempdir().unwrap();
        let config = write_config(dir.path(), opts, upstream);
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let (addr, child) = spawn_ready(dir.path(), &config, &env).await;
        BinaryProxy {
            addr,
            dir,
            config,
            env,
            child,
        }
    }

    /// Kills the process outright (SIGKILL: no shutdown, as in a crash) and starts a new one
    /// on the same config folder and database, on a new port.
    pub async fn kill_and_restart(&mut self) {
        self.child.kill().await.unwrap();
        let (addr, child) = spawn_ready(self.dir.path(), &self.config, &self.env).await;
        self.addr = addr;
        self.child = child;
    }

    /// `http://addr/v1`, what a client uses as its base URL.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// `http://addr` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// GET an admin route (`/ctxproxy/v1/...`) with the admin token; returns status and JSON.
    pub async fn admin_get(&self, path: &str) -> (u16, serde_json::Value) {
        admin_get(&self.url(path)).await
    }

    /// Everything the process (and earlier ones on this folder) wrote.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("ctxproxy.log")).unwrap_or_default()
    }

    /// Stops the process as a service manager does (SIGTERM) and waits (bounded) for it to
    /// exit; returns whether it exited successfully.
    pub async fn terminate(&mut self) -> bool {
        let pid = self.child.id().expect("the process is running");
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        let exited = tokio::time::timeout(std::time::Duration::from_secs(30), self.child.wait())
            .await
            .expect("the process exits after SIGTERM")
            .unwrap();
        exited.success()
    }

    /// Stops the child (it is ours: started by this helper).
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Starts `ctxproxy serve --config config` on a free port, output appended to `dir/ctxproxy.log`,
/// and waits (bounded) until `/readyz` answers 200.
async fn spawn_ready(
    dir: &Path,
    config: &Path,
    env: &[(String, String)],
) -> (SocketAddr, tokio::process::Child) {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let log_path = dir.join("ctxproxy.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .unwrap();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ctxproxy"))
        .arg("serve")
        .arg("--config")
        .arg(config)
        .env("CTXPROXY_LISTEN", addr.to_string())
        .env("CTXPROXY_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("CTXPROXY_LOG", "warn")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the ctxproxy binary");
    let http = client();
    for _ in 0..300 {
        if let Ok(r) = http.get(format!("http://{addr}/readyz")).send().await
            && r.status() == 200
        {
            return (addr, child);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    panic!("the ctxproxy binary never became ready on {addr}; its log:\n{log}");
}

/// The venv's python for the SDK tests (`CTXPROXY_TEST_PYTHON`, made by `.ci/run`), or `None`
/// (skip) outside CI; under CI=true its absence is a failure.
pub fn python() -> Option<String> {
    match std::env::var("CTXPROXY_TEST_PYTHON") {
        Ok(p) if !p.is_empty() => Some(p),
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("CI=true but CTXPROXY_TEST_PYTHON is unset: .ci/run creates the venv")
        }
        _ => {
            eprintln!("skipping: CTXPROXY_TEST_PYTHON unset (run .ci/run to create the venv)");
            None
        }
    }
}
