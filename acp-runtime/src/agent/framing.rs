//! Newline-delimited framing of agent output with a maximum line length.
//!
//! ACP over stdio is one JSON-RPC object per line. A line longer than the
//! limit is not buffered: the decoder drops its bytes as they arrive, keeps a
//! short prefix, and yields [`Line::TooLong`] once the line ends, so one huge
//! line costs at most `max` bytes of memory and the next line is read normally.
//! Lines are bytes, not `String`: JSON parsing checks UTF-8 anyway.

use bytes::{Buf, Bytes, BytesMut};
use tokio_util::codec::Decoder;

/// Bytes of an unusable line kept for its `_sandboxagent/agent/unparsed`
/// report (an over-long line here, an unparsable one in the router).
pub const PREFIX_BYTES: usize = 1024;

/// One line of agent output.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A complete line without its `\n` (and without a trailing `\r`).
    Message(Bytes),
    /// A line over the limit; its bytes were discarded.
    TooLong {
        /// The first bytes of the line.
        prefix: Bytes,
        /// Its full length in bytes.
        length: usize,
    },
}

/// Splits a byte stream into [`Line`]s of at most `max` bytes.
#[derive(Debug)]
pub struct LineDecoder {
    max: usize,
    /// Where to resume looking for `\n` in the buffer.
    scanned: usize,
    /// Set while dropping the rest of an over-long line.
    discarding: Option<(Bytes, usize)>,
}

impl LineDecoder {
    /// A decoder for lines of at most `max` bytes.
    pub fn new(max: usize) -> Self {
        Self {
            max,
            scanned: 0,
            discarding: None,
        }
    }
}

impl Decoder for LineDecoder {
    type Item = Line;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Line>, std::io::Error> {
        loop {
            let newline = memchr::memchr(b'\n', &buf[self.scanned..]).map(|i| self.scanned + i);
            if let Some((prefix, length)) = self.discarding.take() {
                let Some(end) = newline else {
                    self.discarding = Some((prefix, length + buf.len()));
                    buf.clear();
                    self.scanned = 0;
                    return Ok(None);
                };
                buf.advance(end + 1);
                self.scanned = 0;
                return Ok(Some(Line::TooLong {
                    prefix,
                    length: length + end,
                }));
            }
            match newline {
                Some(end) => {
                    self.scanned = 0;
                    let mut line = buf.split_to(end + 1);
                    line.truncate(end);
                    if line.last() == Some(&b'\r') {
                        line.truncate(end - 1);
                    }
                    if line.len() > self.max {
                        let prefix = Bytes::copy_from_slice(&line[..PREFIX_BYTES.min(line.len())]);
                        let length = line.len();
                        return Ok(Some(Line::TooLong { prefix, length }));
                    }
                    return Ok(Some(Line::Message(line.freeze())));
                }
                None if buf.len() > self.max => {
                    let prefix = Bytes::copy_from_slice(&buf[..PREFIX_BYTES.min(buf.len())]);
                    self.discarding = Some((prefix, buf.len()));
                    buf.clear();
                    self.scanned = 0;
                }
                None => {
                    self.scanned = buf.len();
                    return Ok(None);
                }
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Line>, std::io::Error> {
        if let Some(line) = self.decode(buf)? {
            return Ok(Some(line));
        }
        self.scanned = 0;
        if let Some((prefix, length)) = self.discarding.take() {
            return Ok(Some(Line::TooLong { prefix, length }));
        }
        if buf.is_empty() {
            return Ok(None);
        }
        // A last line without a trailing newline still counts.
        let line = buf.split().freeze();
        if line.len() > self.max {
            let prefix = line.slice(..PREFIX_BYTES.min(line.len()));
            return Ok(Some(Line::TooLong {
                prefix,
                length: line.len(),
            }));
        }
        Ok(Some(Line::Message(line)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(max: usize, chunks: &[&[u8]]) -> Vec<Line> {
        let mut decoder = LineDecoder::new(max);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for chunk in chunks {
            buf.extend_from_slice(chunk);
            while let Some(line) = decoder.decode(&mut buf).expect("decode") {
                out.push(line);
            }
        }
        while let Some(line) = decoder.decode_eof(&mut buf).expect("eof") {
            out.push(line);
        }
        out
    }

    fn msg(text: &str) -> Line {
        Line::Message(Bytes::copy_from_slice(text.as_bytes()))
    }

    #[test]
    fn splits_lines_across_chunks_and_strips_cr() {
        let lines = decode_all(100, &[b"{\"a\"", b":1}\r\n{\"b\":2}\n", b"tail"]);
        assert_eq!(lines, vec![msg("{\"a\":1}"), msg("{\"b\":2}"), msg("tail")]);
    }

    #[test]
    fn over_long_line_is_reported_and_the_next_line_survives() {
        let long = [b'x'; 50];
        let lines = decode_all(10, &[&long[..20], &long[20..], b"\nok\n"]);
        assert_eq!(lines.len(), 2);
        let Line::TooLong { prefix, length } = &lines[0] else {
            panic!("expected TooLong, got {:?}", lines[0]);
        };
        assert_eq!(*length, 50);
        assert_eq!(prefix.len(), 20);
        assert_eq!(lines[1], msg("ok"));
    }

    #[test]
    fn over_long_line_in_one_chunk() {
        let lines = decode_all(4, &[b"123456789\nab\n"]);
        assert!(matches!(lines[0], Line::TooLong { length: 9, .. }));
        assert_eq!(lines[1], msg("ab"));
    }

    #[test]
    fn over_long_line_cut_by_eof() {
        let lines = decode_all(4, &[b"123456789"]);
        assert!(matches!(lines[..], [Line::TooLong { length: 9, .. }]));
    }
}
