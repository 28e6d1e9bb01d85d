//! The accept loop: what `axum::serve` does, plus limits it does not let us set.
//!
//! - A connection's first request head must arrive within [`HEADER_READ_TIMEOUT`] (by
//!   default), whatever the protocol: with no limit, a connection that sent nothing, half a
//!   request line or only an HTTP/2 preface stayed open for ever (slowloris). This is watched
//!   here, since hyper sniffs the protocol (HTTP/1 or 2) before any timeout of its own applies.
//! - hyper's HTTP/1 header timeout also runs between the requests of a kept-alive connection,
//!   so it is set to [`IDLE_TIMEOUT`], far above the idle time of clients' connection pools
//!   (5 s for the Python SDK, 90 s for Go and reqwest): a server that closes a pooled
//!   connection just as a client reuses it fails that request, which clients do not retry for
//!   a POST. It still bounds how long an idle or stuck connection lives.
//! - On shutdown, a connection that has not sent its first request yet is closed at once
//!   instead of holding shutdown up.

use std::future::Future;
use std::sync::Arc;
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
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// How long a new connection may take to send its first request head (the body is the
/// routes' business).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a kept-alive HTTP/1 connection may sit between requests (or in a later request's
/// head) before it is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
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
        .header_read_timeout(IDLE_TIMEOUT.max(header_read_timeout));
    let graceful = GracefulShutdown::new();
    let stopping = CancellationToken::new();
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
        let first_request = Arc::new(Notify::new());
        let seen = first_request.clone();
        // A clone of a `Router` shares its route table.
        let service =
            TowerToHyperService::new(router.clone().map_request(move |req: Request<Incoming>| {
                seen.notify_one();
                req.map(Body::new)
            }));
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(tcp), service)
            .into_owned();
        let conn = graceful.watch(conn);
        let stopping = stopping.clone();
        tokio::spawn(async move {
            tokio::pin!(conn);
            // Until its first request head is in, a connection lives only so long, and not
            // past the start of shutdown; dropping it closes the socket.
            let first = tokio::select! {
                ended = &mut conn => Some(ended),
                () = stopping.cancelled() => return,
                waited = tokio::time::timeout(header_read_timeout, first_request.notified()) => {
                    if waited.is_err() {
                        return;
                    }
                    None
                }
            };
            let ended = match first {
                Some(ended) => ended,
                None => conn.await,
            };
            if let Err(e) = ended {
                tracing::trace!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    stopping.cancel();
    graceful.shutdown().await;
}
