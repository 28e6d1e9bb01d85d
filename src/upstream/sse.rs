//! An incremental Server-Sent Events parser. It sits beside the byte relay (never in its way):
//! chunks are fed as they pass to the client, complete events come out.
//!
//! Framing follows the SSE spec (WHATWG HTML, "event stream" parsing): a line ends in CRLF, LF
//! or CR alone (a CRLF split across two chunks is one line end), and one U+FEFF BOM at the very
//! start of the stream is dropped. Parsing is linear in the input however large one event is:
//! the search for the end of the current line resumes where the previous chunk's search stopped,
//! so every byte is looked at once by the search and moved at most once when a partial line is
//! kept for the next chunk.

/// The UTF-8 byte order mark.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// One SSE event: its `event:` name (if any) and its `data:` lines joined by `\n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

/// Accumulates bytes until a blank line ends an event.
#[derive(Debug, Default)]
pub struct SseParser {
    /// The bytes of the current, unfinished line (nothing of an earlier line is kept).
    buf: Vec<u8>,
    /// `buf[..scanned]` holds no line end: the next search starts there.
    scanned: usize,
    /// The last line ended in a CR at the very end of a chunk: a LF opening the next chunk is
    /// the rest of that CRLF, not an empty line.
    after_cr: bool,
    /// Past the start of the stream (where a BOM may be).
    started: bool,
    event: Option<String>,
    /// The `data:` lines of the current event, joined by `\n` as they come.
    data: String,
    has_data: bool,
    /// Bytes the parser has looked at or moved, for tests of its linearity.
    examined: u64,
    /// Where `buf[0]` is in the stream (bytes from its start).
    base: u64,
    /// Where the current event began in the stream: just after the blank line that ended the
    /// one before.
    event_start: u64,
    /// Where each event the last `feed` (or `finish`) returned began, in order.
    starts: Vec<u64>,
}

impl SseParser {
    /// Feeds a chunk and returns the events it completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        let mut out = Vec::new();
        self.starts.clear();
        let mut buf = std::mem::take(&mut self.buf);
        buf.extend_from_slice(chunk);
        if !self.started {
            if buf.len() < BOM.len() && BOM.starts_with(&buf) {
                // Too early to tell whether a BOM opens the stream.
                self.buf = buf;
                return out;
            }
            self.started = true;
            if buf.starts_with(BOM) {
                buf.drain(..BOM.len());
                self.base += BOM.len() as u64;
            }
            self.examined += BOM.len() as u64;
        }
        let mut start = 0;
        if self.after_cr && !buf.is_empty() {
            self.after_cr = false;
            if buf[0] == b'\n' {
                start = 1;
            }
        }
        let mut pos = self.scanned.max(start);
        while let Some(i) = memchr::memchr2(b'\n', b'\r', &buf[pos..]) {
            let end = pos + i;
            self.examined += i as u64 + 1;
            let mut next = end + 1;
            if buf[end] == b'\r' {
                match buf.get(next) {
                    Some(b'\n') => next += 1,
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
            let emitted = out.len();
            self.line(&buf[start..end], &mut out);
            if out.len() > emitted {
                self.starts.push(self.event_start);
            }
            if start == end {
                // A blank line: whatever comes next is the next event's.
                self.event_start = self.base + next as u64;
            }
            start = next;
            pos = next;
        }
        self.examined += (buf.len() - pos) as u64;
        if start > 0 {
            // Only the unfinished line stays; its bytes all came after the last line end, so
            // none of them is moved twice.
            buf.drain(..start);
            self.base += start as u64;
            self.examined += buf.len() as u64;
        }
        self.scanned = buf.len();
        self.buf = buf;
        out
    }

    /// Flushes an event left unterminated when the stream ends.
    pub fn finish(&mut self) -> Vec<SseEvent> {
        let mut out = Vec::new();
        self.starts.clear();
        let rest = std::mem::take(&mut self.buf);
        self.scanned = 0;
        let partial_bom = !self.started && BOM.starts_with(&rest);
        if !rest.is_empty() && !partial_bom {
            self.line(&rest, &mut out);
        }
        self.line(b"", &mut out);
        self.starts.resize(out.len(), self.event_start);
        out
    }

    /// Where the bytes fed so far stop forming whole events (bytes from the stream's start, a
    /// BOM included): just after the last blank line, where the event under way began.
    pub fn whole_until(&self) -> u64 {
        self.event_start
    }

    /// Where each event the last `feed` or `finish` returned began in the stream (bytes from
    /// its start, a BOM included), in the order returned.
    pub fn starts(&self) -> &[u64] {
        &self.starts
    }

    /// How many bytes the parser has looked at or moved so far: a bounded multiple of the bytes
    /// fed, whatever the chunking (tests check that parsing stays linear).
    pub fn bytes_examined(&self) -> u64 {
        self.examined
    }

    fn line(&mut self, line: &[u8], out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            if self.has_data || self.event.is_some() {
                self.has_data = false;
                out.push(SseEvent {
                    event: self.event.take(),
                    data: std::mem::take(&mut self.data),
                });
            }
            return;
        }
        if line[0] == b':' {
            return;
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.has_data = true;
                self.data.push_str(&String::from_utf8_lossy(value));
            }
            b"event" => self.event = Some(String::from_utf8_lossy(value).into_owned()),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_chunks_are_reassembled() {
        let mut p = SseParser::default();
        assert!(p.feed(b"event: a\nda").is_empty());
        let ev = p.feed(b"ta: {\"x\":1}\r\n\r\ndata: [DONE]\n\n");
        assert_eq!(
            ev,
            vec![
                SseEvent {
                    event: Some("a".into()),
                    data: "{\"x\":1}".into()
                },
                SseEvent {
                    event: None,
                    data: "[DONE]".into()
                }
            ]
        );
    }

    #[test]
    fn unterminated_event_is_flushed_at_the_end() {
        let mut p = SseParser::default();
        assert!(p.feed(b"data: tail").is_empty());
        assert_eq!(p.finish().len(), 1);
    }

    #[test]
    fn each_event_s_start_in_the_stream_is_known() {
        let mut p = SseParser::default();
        let first = b"data: a\n\n: ping\n\ndata: b\r\n\r\ndata: [DO";
        assert_eq!(p.feed(first), vec![data("a"), data("b")]);
        // The comment is no event; `b` begins after the blank line that ends it.
        assert_eq!(p.starts(), [0, 17]);
        assert_eq!(p.feed(b"NE]\n\n"), vec![data("[DONE]")]);
        assert_eq!(p.starts(), [first.len() as u64 - 9]);
        let mut p = SseParser::default();
        assert!(p.feed(b"\xEF\xBB").is_empty());
        assert_eq!(
            p.feed(b"\xBFdata: x\n\ndata: y\n\n"),
            vec![data("x"), data("y")]
        );
        assert_eq!(p.starts(), [0, 12]);
    }

    fn data(d: &str) -> SseEvent {
        SseEvent {
            event: None,
            data: d.into(),
        }
    }

    /// Every event of `stream` fed in pieces of `size` bytes, then finished.
    fn parse_in(stream: &[u8], size: usize) -> (Vec<SseEvent>, SseParser) {
        let mut p = SseParser::default();
        let mut events = Vec::new();
        for piece in stream.chunks(size) {
            events.extend(p.feed(piece));
        }
        events.extend(p.finish());
        (events, p)
    }

    #[test]
    fn a_4mb_event_is_parsed_in_linear_work_whatever_the_chunking() {
        let content = "x".repeat(4 << 20);
        let stream = format!("data: {content}\n\ndata: [DONE]\n\n").into_bytes();
        for size in [1, 2048] {
            let (events, p) = parse_in(&stream, size);
            assert_eq!(events.len(), 2, "chunks of {size}");
            assert!(events[0].data == content, "chunks of {size}");
            assert_eq!(events[1], data("[DONE]"));
            // Rescanning the unfinished line on every chunk would be ~n²/(2·size) bytes: 4·10¹²
            // for 1-byte chunks, 4·10⁹ for 2 KB ones.
            let examined = p.bytes_examined();
            assert!(
                examined <= 2 * stream.len() as u64 + 16,
                "chunks of {size}: {examined} bytes examined for {} fed",
                stream.len()
            );
        }
    }

    #[test]
    fn cr_lf_and_crlf_all_end_lines_at_every_split() {
        // CR alone, LF alone and CRLF (the spec's three line ends), mixed in one stream.
        let stream =
            b"event: a\rdata: 1\r\rdata: 2\ndata: 3\n\nevent: b\r\ndata: 4\r\n\r\n: c\rdata: 5\r\r";
        let want = vec![
            SseEvent {
                event: Some("a".into()),
                data: "1".into(),
            },
            data("2\n3"),
            SseEvent {
                event: Some("b".into()),
                data: "4".into(),
            },
            data("5"),
        ];
        assert_eq!(parse_in(stream, stream.len()).0, want);
        assert_eq!(parse_in(stream, 1).0, want);
        // Two chunks split at every point: a CRLF cut between its CR and its LF is still one
        // line end, not a CR line end followed by an empty line.
        for cut in 0..=stream.len() {
            let mut p = SseParser::default();
            let mut events = p.feed(&stream[..cut]);
            events.extend(p.feed(&stream[cut..]));
            events.extend(p.finish());
            assert_eq!(events, want, "cut at {cut}");
        }
    }

    #[test]
    fn crlf_split_between_chunks_is_one_line_end() {
        let mut p = SseParser::default();
        assert!(p.feed(b"data: a\r").is_empty());
        // Were the LF a second line end, the event would end here with data "a".
        assert!(p.feed(b"\ndata: b\r").is_empty());
        assert_eq!(p.feed(b"\n\r"), vec![data("a\nb")]);
        assert_eq!(p.feed(b"\ndata: c\r\r"), vec![data("c")]);
    }

    #[test]
    fn a_bom_at_the_start_of_the_stream_is_dropped() {
        let stream = "\u{FEFF}data: first\n\ndata: second\n\n".as_bytes();
        for size in [1, 2, 3, 4, stream.len()] {
            assert_eq!(
                parse_in(stream, size).0,
                vec![data("first"), data("second")],
                "chunks of {size}"
            );
        }
        // Only at the very start: elsewhere a BOM is part of the line (an unknown field here).
        let later = "data: a\n\n\u{FEFF}data: b\n\n".as_bytes();
        assert_eq!(parse_in(later, 1).0, vec![data("a")]);
        // A stream cut inside its BOM yields nothing, not a garbage line.
        assert!(parse_in(b"\xEF\xBB", 1).0.is_empty());
    }
}
