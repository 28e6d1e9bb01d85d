//! The accept loop: what `axum::serve` does, plus a limit it does not let us set. A client that
//! has not sent its request headers within [`HEADER_READ_TIMEOUT`] (by default) is
//! disconnected: with no
//! limit, a connection that sent half a request line stayed open for ever (slowloris), and
//! each one held up shutdown for the whole grace period.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::ServiceExt;

/// How long a client may take to send a request's headers (the body is the routes' business).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// The pause after a failed accept (out of file descriptors, say) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Serves `router` on `listener` until `stop` resolves, then stops accepting and waits for the
/// open connections to finish their requests (idle ones are closed at once).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    header_read_timeout: Duration,
    stop: impl Future<Output = ()>,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    let graceful = GracefulShutdown::new();
    tokio::pin!(stop);
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        // Small SSE chunks must leave at once, not wait for Nagle.
        let _ = tcp.set_nodelay(true);
        // A clone of a `Router` shares its route table.
        let service = TowerToHyperService::new(
            router
                .clone()
                .map_request(|req: Request<Incoming>| req.map(Body::new)),
        );
        let conn = builder
            .serve_connection(TokioIo::new(tcp), service)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::trace!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
