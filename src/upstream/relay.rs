//! Relaying upstream bodies to the client as they arrive. Managed streams are a tee: a spawned
//! task reads the upstream, feeds every chunk to the reply accumulator and passes it on at once,
//! except the chunk that completes the stream's last event (a chat stream's `[DONE]`, a
//! Responses stream's `response.completed`), which waits until the reply is stored; it keeps
//! reading after the client hangs up so the full reply is still stored. A stream fails when the
//! transport does, when it stalls, when the upstream sends an error event of its own, or when it
//! stops before it finished (a chat stream without a finish reason, a Responses stream without
//! its terminal event; see `reply::StreamFailure`).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::reply::{ApiKind, Reply, StreamAccumulator, StreamFailure};
use crate::error::Error;
use crate::session::pending::PendingReplies;

/// How a relayed stream ended.
#[derive(Debug)]
pub struct StreamOutcome {
    /// The reply rebuilt from the events.
    pub reply: Reply,
    /// Set when the stream did not end as a whole answer: the upstream failed, stalled, sent
    /// an error event or stopped early.
    pub error: Option<Error>,
    /// When the upstream's last byte arrived.
    pub upstream_done: Instant,
    /// True when the client went away before the end.
    pub client_gone: bool,
}

/// Relays an SSE answer chunk by chunk, never collecting it. `idle` bounds the wait between
/// two chunks. When the stream has ended (or failed), `on_done` runs with the rebuilt reply.
/// `abort` ends the relay early (shutdown's grace period is over): the client gets an error
/// event and `on_done` still runs, so the request is recorded and its session freed.
/// `pending`: where a Responses stream's id is announced as soon as it is known, until
/// `on_done` has stored it.
pub fn tee_sse<F, Fut>(
    resp: reqwest::Response,
    idle: Duration,
    kind: ApiKind,
    abort: CancellationToken,
    pending: Arc<PendingReplies>,
    on_done: F,
) -> Body
where
    F: FnOnce(StreamOutcome) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    // A small buffer: the client reads at its pace, but a slow client never makes us hold a
    // whole answer in memory.
    let (tx, mut rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    tokio::spawn(async move {
        let mut stream = resp.bytes_stream();
        let mut acc = StreamAccumulator::new(kind);
        let mut client_gone = false;
        let mut error = None;
        // The chunk that completes the stream's last event (chat's `data: [DONE]`, Responses'
        // `response.completed`; see `StreamAccumulator::saw_done`) and any bytes after it, held
        // until the reply is stored: the SDKs stop reading there and may send the next turn at
        // once, which must find this reply (auto matching, a resent history, its
        // `previous_response_id`) rather than race its write.
        let mut held: Option<Bytes> = None;
        // Whether what the client has so far ends at an event boundary (a blank line).
        let mut at_boundary = true;
        // Bytes of the stream read so far (before the current chunk).
        let mut read: u64 = 0;
        // A client may continue from this response before its stream ends (it cancelled the
        // stream, or acts on an event): its `previous_response_id` waits for the write.
        let mut announced = None;
        loop {
            let next = tokio::select! {
                next = tokio::time::timeout(idle, stream.next()) => next,
                () = abort.cancelled() => {
                    error = Some(Error::ShuttingDown);
                    break;
                }
            };
            match next {
                Ok(Some(Ok(chunk))) => {
                    // The rebuild sees the chunk before the client does: only it can tell that
                    // this chunk completes the last event, which may arrive split across
                    // reads (`data: [DO` + `NE]\n\n`). Its parsing is linear and cheap.
                    acc.feed(&chunk);
                    if announced.is_none()
                        && let Some(id) = acc.response_id()
                    {
                        announced = Some(pending.announce_response(id));
                    }
                    let chunk_start = read;
                    read += chunk.len() as u64;
                    if acc.saw_done() {
                        // Only from where the last event begins: what came before it in the
                        // same read is the answer's and goes on now.
                        let from = acc.done_at().map_or(0, |at| at.saturating_sub(chunk_start));
                        let from = usize::try_from(from).unwrap_or(0).min(chunk.len());
                        if from > 0 && !client_gone {
                            let before = chunk.slice(..from);
                            at_boundary =
                                before.ends_with(b"\n\n") || before.ends_with(b"\r\n\r\n");
                            if tx.send(Ok(before)).await.is_err() {
                                client_gone = true;
                            }
                        }
                        // The answer is whole: it is stored now, whatever the upstream
                        // does with the rest of its body (see `relay_the_rest`).
                        held = Some(chunk.slice(from..));
                        break;
                    } else {
                        at_boundary = chunk.ends_with(b"\n\n") || chunk.ends_with(b"\r\n\r\n");
                        if !client_gone && tx.send(Ok(chunk)).await.is_err() {
                            client_gone = true;
                        }
                    }
                }
                // A connection that breaks (or stalls) after the whole answer came ends the
                // stream as an upstream that left out `[DONE]` does: the answer is kept, and
                // the client is not told of a failure that cost it nothing.
                Ok(Some(Err(e))) => {
                    if !acc.answered() {
                        error = Some(Error::UpstreamUnreachable(format!(
                            "upstream stream failed: {e}"
                        )));
                    }
                    break;
                }
                Ok(None) => break,
                Err(_) => {
                    if !acc.answered() {
                        error = Some(Error::UpstreamTimeout(idle));
                    }
                    break;
                }
            }
        }
        let upstream_done = Instant::now();
        let streamed = acc.finish();
        // The upstream's own error event has reached the client already; any other failure is
        // told with one of ours.
        let reported = matches!(streamed.failure, Some(StreamFailure::Reported(_)));
        let error = error.or_else(|| streamed.failure.map(failure_error));
        // A stream failed by the proxy's verdict ends with the proxy's error event (SPEC 3), not
        // with a last event held back after it (a `[DONE]` after half an answer). An error the
        // upstream reported itself may be that held event: it goes on.
        let failed = error.is_some() && !reported;
        if let Some(err) = &error
            && !reported
            && !client_gone
        {
            // After a body that stopped mid-line (or was no event stream at all, an HTML
            // page), a blank line first, so that this event is read as one of its own.
            let lead = if at_boundary { "" } else { "\n\n" };
            let event = format!("{lead}data: {}\n\n", err.body());
            let _ = tx.send(Ok(Bytes::from(event))).await;
        }
        // The body ends only once the reply is stored: a client that reads to the end and at
        // once continues the conversation (a `previous_response_id`, a resent history) must
        // find what this answer stored. Every byte has already been passed on.
        on_done(StreamOutcome {
            reply: streamed.reply,
            error,
            upstream_done,
            client_gone,
        })
        .await;
        drop(announced);
        if let Some(last) = held
            && !failed
            && !client_gone
            && tx.send(Ok(last)).await.is_ok()
        {
            relay_the_rest(&mut stream, &tx, AFTER_DONE.min(idle), &abort).await;
        }
        drop(tx);
    });
    let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    Body::from_stream(stream)
}

/// How long the upstream may keep a stream open after its last event, in all.
const AFTER_DONE: Duration = Duration::from_secs(1);
/// How many bytes after the last event are passed on (comments, keep-alive pings); the rest
/// is not.
const AFTER_DONE_BYTES: usize = 64 * 1024;

/// After the last event the upstream has nothing left to say; what it still sends (comments,
/// keep-alive pings) is passed on, up to [`AFTER_DONE_BYTES`] and for `linger` at most, so an
/// upstream that keeps the connection open does not keep the response open with it.
async fn relay_the_rest<S>(
    stream: &mut S,
    tx: &mpsc::Sender<Result<Bytes, std::io::Error>>,
    linger: Duration,
    abort: &CancellationToken,
) where
    S: futures_util::Stream<Item = reqwest::Result<Bytes>> + Unpin,
{
    let until = tokio::time::Instant::now() + linger;
    let mut relayed = 0usize;
    loop {
        let next = tokio::select! {
            next = tokio::time::timeout_at(until, stream.next()) => next,
            () = abort.cancelled() => return,
        };
        let Ok(Some(Ok(chunk))) = next else { return };
        relayed += chunk.len();
        if relayed > AFTER_DONE_BYTES || tx.send(Ok(chunk)).await.is_err() {
            return;
        }
    }
}

/// A stream that the transport delivered but that is not a whole answer, as the error its
/// request ends with (502, like a stream the transport broke).
fn failure_error(failure: StreamFailure) -> Error {
    let what = match failure {
        StreamFailure::Reported(message) => format!("the upstream sent an error event: {message}"),
        StreamFailure::CutShort => {
            "it ended before the answer did (a chat stream with a choice left without a \
             finish_reason and no [DONE], or a Responses stream with nothing finished or an \
             item left unfinished)"
                .to_string()
        }
    };
    Error::UpstreamUnreachable(format!("upstream stream failed: {what}"))
}

/// Relays any body unchanged (pass-through routes), failing it if the upstream stalls for
/// longer than `idle` between two chunks (an error of kind `TimedOut`).
pub fn passthrough(
    resp: reqwest::Response,
    idle: Duration,
) -> impl futures_util::Stream<Item = std::io::Result<Bytes>> + Send + 'static {
    let stream = resp.bytes_stream();
    futures_util::stream::unfold(Some(stream), move |state| async move {
        let mut stream = state?;
        match tokio::time::timeout(idle, stream.next()).await {
            Ok(Some(Ok(chunk))) => Some((Ok(chunk), Some(stream))),
            Ok(Some(Err(e))) => Some((Err(std::io::Error::other(e)), None)),
            Ok(None) => None,
            Err(_) => Some((
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "upstream stalled",
                )),
                None,
            )),
        }
    })
}
