//! The running proxy: shared state, the middleware order and serving with graceful shutdown.
//!
//! Layers, outermost first: the router (`http::router`) dispatches to handlers; handlers take one
//! config snapshot, select the tenant, and run managed work on a spawned task so that a client
//! hanging up never cancels an upstream read or a store write.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::store::Store;
use crate::upstream::Upstream;

/// Everything handlers share.
pub struct AppState {
    /// The configuration in force; swapped whole on reload.
    pub config: ArcSwap<Config>,
    pub upstream: Upstream,
    /// Allowed tool sets per (tenant, role, tools array); cleared on reload.
    pub tool_access: crate::access::ToolAccess,
    /// Where conversations are kept.
    pub store: Arc<dyn Store>,
    /// Token counts per message, shared by every request so a turn only counts what is new.
    pub tokens: crate::tokens::TokenCounter,
    /// Summary jobs running in this process, and the backoff of sessions whose last one failed.
    pub summaries: Arc<crate::summarize::Jobs>,
    /// Replies written after their answer went out, which session resolution waits for.
    pub pending: Arc<crate::session::PendingReplies>,
    /// Work that outlives its request (reply writes); shutdown waits for it.
    pub background: tokio_util::task::TaskTracker,
    /// Cancelled when shutdown's grace period is over: requests still waiting on the upstream
    /// end there (streams with an error event), record how they ended and free their session,
    /// instead of being dropped with their lease still held.
    pub abort: tokio_util::sync::CancellationToken,
    /// Whether a non-streamed reply is written after its answer went out. Only on SQLite: the
    /// waits that make this safe (`pending`) are in-process, and several processes sharing a
    /// PostgreSQL database could otherwise miss a reply another one is still writing.
    pub write_replies_after_answer: bool,
}

impl AppState {
    pub fn new(config: Config, store: Arc<dyn Store>) -> Arc<Self> {
        crate::metrics::handle();
        for tenant in &config.tenants {
            crate::metrics::register_tenant(&tenant.name);
        }
        let upstream = Upstream::default();
        // Building a client loads TLS roots (~100 ms): do it now, not on a user's request.
        for tenant in &config.tenants {
            let connect = Duration::from_secs(tenant.file.upstream.connect_timeout_s);
            if let Err(e) = upstream
                .client(connect)
                .and(upstream.reading_client(connect))
            {
                tracing::warn!(error = %e, "could not prepare the upstream client");
            }
        }
        Arc::new(AppState {
            config: ArcSwap::from_pointee(config),
            upstream,
            tool_access: Default::default(),
            tokens: crate::tokens::TokenCounter::new(),
            summaries: Default::default(),
            pending: Arc::new(crate::session::PendingReplies::hurrying({
                // Whoever waits for a reply write wants it committed now, not batched later.
                let store = store.clone();
                move || store.hurry()
            })),
            background: Default::default(),
            abort: Default::default(),
            write_replies_after_answer: store.backend() == "sqlite",
            store,
        })
    }
}

impl AppState {
    /// Reloads the configuration from disk. A file that fails to load leaves its last good
    /// configuration in force: a tenant file its last good version of that tenant, the server
    /// file (or a problem between tenants) the whole last good configuration. Requests in
    /// flight keep the snapshot they started with. `true` when every file loaded.
    pub fn reload(&self) -> bool {
        let current = self.config.load_full();
        match Config::reload_over(&current.path, &current) {
            Ok(loaded) => {
                let mut fresh = loaded.config;
                for w in &loaded.warnings {
                    tracing::warn!(problem = %w, "configuration warning");
                }
                for p in &loaded.held_back {
                    tracing::error!(problem = %p, "tenant file not reloaded; its last good version stays in force (a new file is not served) until it is fixed");
                }
                // The socket, the shutdown timer, the pool and the admin token are set up once:
                // changing them needs a restart. The body limit is read per request.
                let (was, now) = (&current.server, &fresh.server);
                let restart_only = [
                    ("server.listen", was.server.listen != now.server.listen),
                    (
                        "server.shutdown_grace_s",
                        was.server.shutdown_grace_s != now.server.shutdown_grace_s,
                    ),
                    ("database.url", was.database.url != now.database.url),
                    (
                        "database.max_connections",
                        was.database.max_connections != now.database.max_connections,
                    ),
                    (
                        "admin.token_env",
                        was.admin.token_env != now.admin.token_env,
                    ),
                ];
                let changed: Vec<&str> = restart_only
                    .iter()
                    .filter(|(_, changed)| *changed)
                    .map(|(key, _)| *key)
                    .collect();
                if !changed.is_empty() {
                    tracing::warn!(
                        keys = %changed.join(", "),
                        "these server keys changed; they take effect after a restart"
                    );
                }
                fresh.server.server.listen = current.server.server.listen.clone();
                fresh.server.server.shutdown_grace_s = current.server.server.shutdown_grace_s;
                fresh.server.database = current.server.database.clone();
                fresh.server.admin = current.server.admin.clone();
                // The environment does not change while we run; keep what start-up resolved.
                fresh.admin_token = current.admin_token.clone();
                for tenant in &fresh.tenants {
                    crate::metrics::register_tenant(&tenant.name);
                }
                tracing::info!(tenants = fresh.tenants.len(), "configuration reloaded");
                self.config.store(Arc::new(fresh));
                self.tool_access.clear();
                let whole = loaded.held_back.is_empty();
                crate::metrics::config_reload(whole);
                whole
            }
            Err(failed) => {
                for p in &failed.problems {
                    tracing::error!(problem = %p, "configuration reload failed; keeping the last good configuration");
                }
                for w in &failed.warnings {
                    tracing::warn!(problem = %w, "configuration warning");
                }
                crate::metrics::config_reload(false);
                false
            }
        }
    }
}

/// Starts watching the configuration files; the guard must live as long as the server.
pub fn watch_config(state: &Arc<AppState>) -> Option<crate::config::watch::WatchGuard> {
    let config = state.config.load();
    let weak = Arc::downgrade(state);
    let result = crate::config::watch::watch(&config.path, &config.server.tenants_dir, move || {
        if let Some(state) = weak.upgrade() {
            state.reload();
        }
    });
    match result {
        Ok(guard) => Some(guard),
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch configuration files; reload needs a restart");
            None
        }
    }
}

/// Loads the configuration, logging warnings; every problem is returned as one error.
pub fn load_config(path: &Path) -> Result<Config> {
    match Config::load(path) {
        Ok(loaded) => {
            for w in &loaded.warnings {
                tracing::warn!(problem = %w, "configuration warning");
            }
            Ok(loaded.config)
        }
        Err(failed) => {
            for w in &failed.warnings {
                tracing::warn!(problem = %w, "configuration warning");
            }
            Err(Error::Config(
                failed
                    .problems
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("\n"),
            ))
        }
    }
}

/// How long requests ended at the end of the grace period get to write how they ended.
const ABORT_WAIT: Duration = Duration::from_secs(2);

/// A proxy bound to its listening socket, ready to serve.
pub struct Server {
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    grace: Duration,
    header_read_timeout: Duration,
}

impl Server {
    /// The store the server uses (for its owner to close once `run` is over).
    pub fn store(&self) -> Arc<dyn Store> {
        self.state.store.clone()
    }

    /// Binds the configured (or given) address.
    pub async fn bind(config: Config, listen: Option<SocketAddr>) -> Result<Server> {
        let addr = match listen {
            Some(a) => a,
            None => config
                .server
                .server
                .listen
                .parse()
                .map_err(|e| Error::Config(format!("server.listen: invalid address: {e}")))?,
        };
        let grace = Duration::from_secs(config.server.server.shutdown_grace_s);
        warm_up_tokenizer();
        let store = open_store(&config).await?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| Error::Config(format!("cannot listen on {addr}: {e}")))?;
        Ok(Server {
            listener,
            state: AppState::new(config, store),
            grace,
            header_read_timeout: crate::http::serve::HEADER_READ_TIMEOUT,
        })
    }

    /// How long a client may take to send a request's headers before it is disconnected
    /// (default [`crate::http::serve::HEADER_READ_TIMEOUT`]).
    pub fn with_header_read_timeout(mut self, timeout: Duration) -> Server {
        self.header_read_timeout = timeout;
        self
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener
            .local_addr()
            .map_err(|e| Error::Internal(e.to_string()))
    }

    pub fn state(&self) -> Arc<AppState> {
        self.state.clone()
    }

    /// Serves until `shutdown` resolves, then lets in-flight requests (streams included)
    /// finish for at most the grace period.
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        let router = crate::http::router(self.state.clone());
        let _watch = watch_config(&self.state);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = crate::http::serve::serve(
            self.listener,
            router,
            self.header_read_timeout,
            async move {
                let _ = stop_rx.await;
            },
        );
        let mut handle = tokio::spawn(server);
        tokio::select! {
            res = &mut handle => {
                return res.map_err(|e| Error::Internal(e.to_string()));
            }
            () = shutdown => {}
        }
        tracing::info!(
            grace_s = self.grace.as_secs(),
            "shutting down; letting in-flight requests finish"
        );
        let _ = stop_tx.send(());
        let background = self.state.background.clone();
        background.close();
        let finished = async move {
            let _ = handle.await;
            background.wait().await;
        };
        tokio::pin!(finished);
        if tokio::time::timeout(self.grace, &mut finished)
            .await
            .is_ok()
        {
            tracing::info!("all requests finished");
            return Ok(());
        }
        tracing::warn!("grace period over; ending the requests still in flight");
        self.state.abort.cancel();
        if tokio::time::timeout(ABORT_WAIT, &mut finished)
            .await
            .is_err()
        {
            tracing::warn!("requests still in flight after they were ended; dropping them");
        }
        Ok(())
    }
}

/// Builds o200k_base's tokenizer (~20 ms) on a thread of its own, beside the store's opening:
/// otherwise the first request for a current OpenAI model builds it, and every request queued
/// behind that one on its worker waits too. cl100k_base (older models) is built on first use,
/// so that a deployment that never sees one does not hold it.
fn warm_up_tokenizer() {
    let spawned = std::thread::Builder::new()
        .name("ctxproxy-warm-up".into())
        .spawn(|| crate::tokens::Encoding::O200kBase.warm_up());
    if let Err(e) = spawned {
        // Only a start a little slower for the first request: said, not fatal.
        tracing::warn!(error = %e, "cannot start the tokenizer warm-up thread; built on first use");
    }
}

/// Connects to the configured database and applies pending migrations.
pub async fn open_store(config: &Config) -> Result<Arc<dyn Store>> {
    open_database(&config.server.database).await
}

/// Connects to a database and applies pending migrations.
pub async fn open_database(db: &crate::config::server::DatabaseSection) -> Result<Arc<dyn Store>> {
    let store = crate::store::connect(&db.url, db.max_connections).await?;
    store.migrate().await?;
    Ok(store)
}

/// Resolves the config path: the flag, else `CTXPROXY_CONFIG`, else the default. An empty
/// `CTXPROXY_CONFIG` is unset, as every other override is when empty.
pub fn config_path(flag: Option<PathBuf>) -> PathBuf {
    let from_env = std::env::var_os(crate::config::env::CONFIG).filter(|v| !v.is_empty());
    flag.or_else(|| from_env.map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(crate::config::DEFAULT_CONFIG_PATH))
}

/// Waits for Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
