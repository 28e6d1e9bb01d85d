//! `mock-upstream`: the deterministic OpenAI-compatible fake provider (SPEC section 9) as a
//! command. All behaviour lives in `ctxproxy::mock_upstream`; this only parses flags and serves.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use ctxproxy::mock_upstream::{MockConfig, MockState, router};

/// A deterministic OpenAI-compatible fake provider for demos, tests and benchmarks.
#[derive(Debug, Parser)]
#[command(name = "mock-upstream", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9000")]
    listen: SocketAddr,
    /// Delay every answer by this many milliseconds (before the first byte).
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// Do not keep received requests (for load benchmarks).
    #[arg(long)]
    no_record: bool,
    /// How many of the most recent requests to keep for `GET /_mock/requests`.
    #[arg(long, default_value_t = 10_000)]
    record_limit: usize,
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let state = MockState::new(MockConfig {
        delay: Duration::from_millis(args.delay_ms),
        record: !args.no_record,
        record_limit: args.record_limit,
    });
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    tracing::info!(addr = %listener.local_addr()?, "mock-upstream listening");
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown_signal())
        .await
}

/// Ctrl-C or SIGTERM. SIGTERM matters in a container, where PID 1 ignores it unless handled and
/// `docker stop` would otherwise wait out its timeout.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut sig) => {
                sig.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
