//! Relaying upstream bodies to the client as they arrive. Managed streams are a tee: a spawned
//! task reads the upstream, feeds every chunk to the reply accumulator and passes on at once
//! every event it completes (the part of an event still to come waits for the rest of it, so a
//! stream that breaks inside an event never leaves the client half an event: see
//! `PartialEvent`), except the chunk that completes the stream's last event (a chat stream's `[DONE]`, a
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
    // Boxed: the relay's future holds the request's completion and is kilobytes large, and
    // spawning moves a future by value through several frames.
    tokio::spawn(Box::pin(async move {
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
        // An event not yet whole (the bytes after the last blank line), passed on once its end
        // comes: a stream that breaks inside an event must not leave the client half of it,
        // which every SDK fails to parse (a JSON error, not the error event that follows).
        let mut partial = PartialEvent::default();
        // Whether the upstream ended its body (rather than the transport breaking or stalling).
        let mut ended = false;
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
                    // reads (`data: [DO` + `NE]\n\n`). Its parsing is linear and cheap; a
                    // chat chunk's JSON is read once the chunk has gone on (`digest`).
                    acc.feed(&chunk);
                    if announced.is_none()
                        && let Some(id) = acc.response_id()
                    {
                        announced = Some(pending.announce_response(id));
                    }
                    if acc.saw_done() {
                        // Only from where the last event begins: what came before it is the
                        // answer's and goes on now.
                        let (before, last) = partial.split_off_last(chunk, acc.done_at());
                        if !before.is_empty() && !client_gone && tx.send(Ok(before)).await.is_err()
                        {
                            client_gone = true;
                        }
                        // The answer is whole: it is stored now, whatever the upstream
                        // does with the rest of its body (see `relay_the_rest`).
                        held = Some(last);
                        break;
                    } else if let Some(whole) = partial.push(chunk, acc.whole_until())
                        && !client_gone
                        && tx.send(Ok(whole)).await.is_err()
                    {
                        client_gone = true;
                    }
                    acc.digest();
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
                Ok(None) => {
                    ended = true;
                    break;
                }
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
        // The bytes after the last blank line. Part of an event the stream broke in goes
        // nowhere (an SSE reader discards it too); anything else the upstream sent goes on: a
        // last event of a body that ended without its blank line, or a body that was no event
        // stream at all (an HTML page).
        let rest = partial.take();
        let pass_on = !rest.is_empty() && (!is_event_fragment(&rest) || (ended && !failed));
        if pass_on && !client_gone && tx.send(Ok(rest)).await.is_err() {
            client_gone = true;
        }
        if let Some(err) = &error
            && !reported
            && !client_gone
        {
            // What the client has ends at an event boundary (an event the break cut is never
            // passed on), unless the body was no event stream at all (an HTML page, passed on
            // past `PartialEvent::MAX`): then a blank line first, so that this event is read as
            // one of its own.
            let lead = if partial.client_at_boundary() && !pass_on {
                ""
            } else {
                "\n\n"
            };
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
    }));
    let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    Body::from_stream(stream)
}

/// The bytes of an event stream after its last blank line: an event not yet whole, held until
/// its end comes (the only bytes of a stream the relay holds; a chunk that ends an event goes
/// on as it is, without a copy).
#[derive(Default)]
struct PartialEvent {
    bytes: bytes::BytesMut,
    /// Where `bytes` begins in the stream.
    start: u64,
    /// Whether what went to the client ends at an event boundary.
    flushed_mid_event: bool,
}

impl PartialEvent {
    /// The most held: past it the body is no event stream the relay could cut into whole
    /// events (or one event larger than any answer), and it goes on as it comes.
    const MAX: usize = 16 * 1024 * 1024;

    /// Takes the next chunk, whose bytes form whole events up to `whole_until` (from the
    /// stream's start: what the accumulator's parser, fed the chunk already, says); returns
    /// what is now whole, to pass on.
    fn push(&mut self, chunk: Bytes, whole_until: u64) -> Option<Bytes> {
        let end = usize::try_from(whole_until.saturating_sub(self.start)).unwrap_or(usize::MAX);
        let whole = if self.bytes.is_empty() {
            let end = end.min(chunk.len());
            self.bytes.extend_from_slice(&chunk[end..]);
            chunk.slice(..end)
        } else {
            self.bytes.extend_from_slice(&chunk);
            let end = end.min(self.bytes.len());
            self.bytes.split_to(end).freeze()
        };
        self.start += whole.len() as u64;
        if self.bytes.len() > Self::MAX {
            self.flushed_mid_event = true;
            self.start += self.bytes.len() as u64;
            let all = self.bytes.split().freeze();
            return Some(if whole.is_empty() {
                all
            } else {
                [whole, all].concat().into()
            });
        }
        if !whole.is_empty() {
            self.flushed_mid_event = false;
        }
        (!whole.is_empty()).then_some(whole)
    }

    /// With the chunk in which the stream's last event became whole: what comes before that
    /// event (`done_at`, from the stream's start), and the event itself with what follows it.
    fn split_off_last(&mut self, chunk: Bytes, done_at: Option<u64>) -> (Bytes, Bytes) {
        let all: Bytes = if self.bytes.is_empty() {
            chunk
        } else {
            self.bytes.extend_from_slice(&chunk);
            self.bytes.split().freeze()
        };
        let from = done_at.map_or(0, |at| at.saturating_sub(self.start));
        let from = usize::try_from(from).unwrap_or(0).min(all.len());
        self.start += from as u64;
        (all.slice(..from), all.slice(from..))
    }

    /// What is held, handed over (the stream ended).
    fn take(&mut self) -> Bytes {
        self.start += self.bytes.len() as u64;
        self.bytes.split().freeze()
    }

    /// Whether what the client has so far ends at an event boundary.
    fn client_at_boundary(&self) -> bool {
        !self.flushed_mid_event
    }
}

/// Whether `bytes` (what follows a stream's last blank line) begin an SSE event: a line of one
/// of its fields, or a comment.
fn is_event_fragment(bytes: &[u8]) -> bool {
    // (A line end left over from a blank line split between two reads, `\r` | `\n`, first.)
    let start = bytes.iter().position(|b| !matches!(b, b'\r' | b'\n'));
    let line = start.map_or(&[][..], |at| &bytes[at..]);
    [&b"data:"[..], b"event:", b"id:", b"retry:", b":"]
        .iter()
        .any(|field| line.starts_with(field))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `chunk` to a parser standing for the accumulator, then to `p`.
    fn push(
        p: &mut PartialEvent,
        parser: &mut crate::upstream::sse::SseParser,
        chunk: &'static [u8],
    ) -> Option<Bytes> {
        parser.feed(chunk);
        p.push(Bytes::from_static(chunk), parser.whole_until())
    }

    #[test]
    fn blank_lines_end_events_whatever_their_line_ends() {
        for (stream, whole) in [
            (&b"data: 1\n\ndata: 2"[..], 9),
            (b"data: 1\r\n\r\n", 11),
            (b"data: 1\r\rdata", 9),
            // A blank line ended by a bare CR at the end of what came (the final re-check's
            // break case) ends the event, as a CR alone is a line end.
            (b"data: 1\r\n\r", 10),
            (b"data: 1\ndata: 2\n", 0),
            (b"\n", 1),
        ] {
            let mut p = PartialEvent::default();
            let mut parser = crate::upstream::sse::SseParser::default();
            parser.feed(stream);
            let sent = p.push(Bytes::copy_from_slice(stream), parser.whole_until());
            assert_eq!(sent.map_or(0, |b| b.len()), whole, "{stream:?}");
        }
    }

    #[test]
    fn only_what_is_whole_goes_on_and_a_split_blank_line_is_found() {
        let mut p = PartialEvent::default();
        let mut parser = crate::upstream::sse::SseParser::default();
        assert_eq!(
            push(&mut p, &mut parser, b"data: 1\n\ndata: 2\n"),
            Some(Bytes::from_static(b"data: 1\n\n"))
        );
        assert_eq!(
            push(&mut p, &mut parser, b"\ndata: 3"),
            Some(Bytes::from_static(b"data: 2\n\n"))
        );
        assert!(is_event_fragment(&p.take()));
        assert!(p.client_at_boundary());
        assert!(!is_event_fragment(b"<html>"));
        assert!(is_event_fragment(b"\n: ping"));
    }
}
