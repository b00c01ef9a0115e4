//! A process's retained output: one byte sequence across its streams,
//! numbered by byte offset from the process's first byte, held in a ring of
//! at most `capacity` bytes (research/contract.md, "Processes and
//! terminals"). Older bytes leave the ring whole chunks at a time; a reader
//! that asks for them learns how many it missed (`dropped`), never a silent
//! gap.

use bytes::Bytes;
use ext_methods::OutputChunk;
pub use ext_methods::OutputStream;
use std::collections::VecDeque;

/// One chunk as the ring holds it: the bytes of one read.
#[derive(Debug, Clone)]
struct Chunk {
    /// Offset of the chunk's first byte.
    offset: u64,
    /// Its stream.
    stream: OutputStream,
    /// Its bytes.
    data: Bytes,
}

/// One chunk of a [`Page`]: a slice of the ring's bytes (shared, not
/// copied), encoded for the wire only by whoever sends it.
#[derive(Debug, Clone)]
pub struct PageChunk {
    /// Offset of the chunk's first byte.
    pub offset: u64,
    /// Its stream.
    pub stream: OutputStream,
    /// Its bytes.
    pub data: Bytes,
}

impl PageChunk {
    /// The offset after the chunk's last byte (a followed event's `id:`).
    pub fn end(&self) -> u64 {
        self.offset + self.data.len() as u64
    }

    /// The chunk as the wire carries it (`{offset, stream, data,
    /// encoding?}`: text when UTF-8, else base64).
    pub fn to_wire(&self) -> OutputChunk {
        OutputChunk::of(self.offset, self.stream, &self.data)
    }
}

/// What a read from an offset finds.
#[derive(Debug, Clone, Default)]
pub struct Page {
    /// The chunks from the offset on.
    pub chunks: Vec<PageChunk>,
    /// The offset to read from next.
    pub next_offset: u64,
    /// Bytes between the asked offset and the oldest retained byte that
    /// the ring no longer holds (0 when nothing was missed).
    pub dropped: u64,
}

/// What a raw read from an offset finds ([`Output::read_bytes`]).
#[derive(Debug, Clone, Default)]
pub struct BytesPage {
    /// The bytes from the offset on.
    pub data: Bytes,
    /// The offset to read from next.
    pub next_offset: u64,
    /// Bytes between the asked offset and the oldest retained byte that
    /// the ring no longer holds (0 when nothing was missed).
    pub dropped: u64,
}

/// The ring (module doc).
#[derive(Debug)]
pub struct Output {
    /// Retained chunks, oldest first, contiguous.
    chunks: VecDeque<Chunk>,
    /// Offset of the oldest retained byte.
    start: u64,
    /// Offset after the newest byte: every byte the process wrote.
    end: u64,
    /// Bytes in `chunks`.
    retained: usize,
    /// Most bytes retained.
    capacity: usize,
    /// Bytes written to stdout and stderr (a terminal counts as stdout).
    written: [u64; 2],
}

impl Output {
    /// An empty ring of `capacity` bytes (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self {
            chunks: VecDeque::new(),
            start: 0,
            end: 0,
            retained: 0,
            capacity: capacity.max(1),
            written: [0, 0],
        }
    }

    /// Every byte written so far (the offset the next byte gets).
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Bytes the ring holds now.
    pub fn retained(&self) -> usize {
        self.retained
    }

    /// Bytes written to `stream` so far (a terminal's count as stdout's).
    pub fn written(&self, stream: OutputStream) -> u64 {
        self.written[usize::from(stream == OutputStream::Stderr)]
    }

    /// Appends `data` read from `stream`, dropping the oldest chunks (or
    /// the front of a chunk larger than the whole ring) to stay within
    /// the capacity.
    pub fn push(&mut self, stream: OutputStream, mut data: Bytes) {
        if data.is_empty() {
            return;
        }
        let length = data.len() as u64;
        self.written[usize::from(stream == OutputStream::Stderr)] += length;
        let mut offset = self.end;
        self.end += length;
        if data.len() > self.capacity {
            let cut = data.len() - self.capacity;
            data = data.slice(cut..);
            offset += cut as u64;
        }
        self.retained += data.len();
        self.chunks.push_back(Chunk {
            offset,
            stream,
            data,
        });
        while self.retained > self.capacity {
            let Some(oldest) = self.chunks.pop_front() else {
                break;
            };
            self.retained -= oldest.data.len();
        }
        self.start = self.chunks.front().map_or(self.end, |chunk| chunk.offset);
    }

    /// The chunks from `from` on, at most about `limit` bytes (at least one
    /// chunk's worth when any is there; a chunk cut at the limit is cut at
    /// a UTF-8 character boundary when it is text). `from` past the end
    /// reads nothing.
    pub fn read(&self, from: u64, limit: usize) -> Page {
        let from = from.min(self.end);
        let dropped = self.start.saturating_sub(from);
        let from = from.max(self.start);
        let mut page = Page {
            chunks: Vec::new(),
            next_offset: from,
            dropped,
        };
        // Chunks are contiguous: the first one that ends after `from`.
        let first = self
            .chunks
            .partition_point(|chunk| chunk.offset + chunk.data.len() as u64 <= from);
        let mut budget = limit.max(1);
        for chunk in self.chunks.range(first..) {
            if budget == 0 {
                break;
            }
            let skip = usize::try_from(from.saturating_sub(chunk.offset)).unwrap_or(0);
            let rest = &chunk.data[skip..];
            let mut take = rest.len().min(budget);
            if take < rest.len() {
                take = char_boundary(rest, take);
            }
            page.chunks.push(PageChunk {
                offset: chunk.offset + skip as u64,
                stream: chunk.stream,
                data: chunk.data.slice(skip..skip + take),
            });
            page.next_offset = chunk.offset + (skip + take) as u64;
            budget -= take;
            if take < rest.len() {
                break;
            }
        }
        page
    }

    /// The bytes from `from` on, at most `limit` (at least 1), as they
    /// are, across chunks and streams: what a terminal shows
    /// (research/contract.md, "Terminal WebSocket"). `from` past the end
    /// reads nothing.
    pub fn read_bytes(&self, from: u64, limit: usize) -> BytesPage {
        let from = from.min(self.end);
        let dropped = self.start.saturating_sub(from);
        let from = from.max(self.start);
        let first = self
            .chunks
            .partition_point(|chunk| chunk.offset + chunk.data.len() as u64 <= from);
        let mut budget = limit.max(1);
        let mut parts = Vec::new();
        for chunk in self.chunks.range(first..) {
            if budget == 0 {
                break;
            }
            let skip = usize::try_from(from.saturating_sub(chunk.offset)).unwrap_or(0);
            let take = (chunk.data.len() - skip).min(budget);
            parts.push(chunk.data.slice(skip..skip + take));
            budget -= take;
        }
        let length: usize = parts.iter().map(Bytes::len).sum();
        // One chunk is handed on as it is (shared, no copy).
        let data = match parts.len() {
            0 => Bytes::new(),
            1 => parts.swap_remove(0),
            _ => Bytes::from(parts.concat()),
        };
        BytesPage {
            data,
            next_offset: from + length as u64,
            dropped,
        }
    }

    /// The newest at most `max` retained bytes, cut at a UTF-8 character
    /// boundary, and whether anything older than them was written (cut off
    /// here, or already dropped by the ring): what ACP's `terminal/output`
    /// answers.
    pub fn tail(&self, max: usize) -> (Vec<u8>, bool) {
        let mut out = Vec::new();
        for chunk in &self.chunks {
            out.extend_from_slice(&chunk.data);
        }
        let mut truncated = self.start > 0;
        if out.len() > max {
            let mut cut = out.len() - max;
            while cut < out.len() && is_continuation(out[cut]) {
                cut += 1;
            }
            out.drain(..cut);
            truncated = true;
        }
        (out, truncated)
    }
}

/// The longest prefix of `data` no longer than `at` that does not end in
/// the middle of a UTF-8 character, unless that prefix would be empty.
fn char_boundary(data: &[u8], at: usize) -> usize {
    let mut cut = at;
    while cut > 0 && cut > at.saturating_sub(3) && is_continuation(data[cut]) {
        cut -= 1;
    }
    if cut == 0 { at } else { cut }
}

/// Whether `byte` continues a UTF-8 character (`10xxxxxx`).
fn is_continuation(byte: u8) -> bool {
    byte & 0xC0 == 0x80
}

/// How many bytes of `data` to hand on now: all of them, except a UTF-8
/// character that its last bytes start but do not finish (kept back for the
/// next read, so a chunk never splits a character it could keep whole).
pub fn complete_prefix(data: &[u8]) -> usize {
    let floor = data.len().saturating_sub(3);
    for at in (floor..data.len()).rev() {
        let byte = data[at];
        if is_continuation(byte) {
            continue;
        }
        let needs = match byte {
            0xF0..=0xF7 => 4,
            0xE0..=0xEF => 3,
            0xC0..=0xDF => 2,
            _ => 1,
        };
        return if data.len() - at < needs {
            at
        } else {
            data.len()
        };
    }
    data.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(page: &Page) -> String {
        page.chunks.iter().map(|c| c.to_wire().data).collect()
    }

    #[test]
    fn reads_from_any_offset_and_reports_what_the_ring_dropped() {
        let mut output = Output::new(8);
        output.push(OutputStream::Stdout, Bytes::from_static(b"abcd"));
        output.push(OutputStream::Stderr, Bytes::from_static(b"efgh"));
        let page = output.read(2, 100);
        assert_eq!(text(&page), "cdefgh");
        assert_eq!(page.next_offset, 8);
        assert_eq!(page.chunks[0].offset, 2);
        assert_eq!(page.chunks[1].stream, OutputStream::Stderr);
        output.push(OutputStream::Stdout, Bytes::from_static(b"ij"));
        // "abcd" left whole: 6 retained, 4 dropped.
        let page = output.read(0, 100);
        assert_eq!(page.dropped, 4);
        assert_eq!(text(&page), "efghij");
        assert_eq!(output.read(10, 100).chunks.len(), 0);
        assert_eq!(output.read(99, 100).next_offset, 10);
        assert_eq!(output.written(OutputStream::Stdout), 6);
        assert_eq!(output.written(OutputStream::Stderr), 4);
    }

    #[test]
    fn a_chunk_larger_than_the_ring_keeps_its_end() {
        let mut output = Output::new(4);
        output.push(OutputStream::Tty, Bytes::from_static(b"0123456789"));
        let page = output.read(0, 100);
        assert_eq!(page.dropped, 6);
        assert_eq!(text(&page), "6789");
        assert_eq!(page.chunks[0].offset, 6);
    }

    #[test]
    fn a_limit_cuts_at_a_character_boundary() {
        let mut output = Output::new(100);
        output.push(OutputStream::Stdout, Bytes::from("aé€b"));
        let page = output.read(0, 4);
        assert_eq!(text(&page), "aé");
        assert_eq!(page.next_offset, 3);
        let rest = output.read(page.next_offset, 100);
        assert_eq!(text(&rest), "€b");
    }

    #[test]
    fn bytes_that_are_not_text_are_base64() {
        let mut output = Output::new(100);
        output.push(OutputStream::Stdout, Bytes::from_static(&[0xff, 0x00]));
        let page = output.read(0, 100);
        assert_eq!(
            page.chunks[0].to_wire().encoding,
            Some(ext_methods::Encoding::Base64)
        );
        assert_eq!(page.chunks[0].to_wire().data, "/wA=");
    }

    #[test]
    fn an_unfinished_character_is_kept_back() {
        assert_eq!(complete_prefix(b"abc"), 3);
        assert_eq!(complete_prefix("aé".as_bytes()), 3);
        assert_eq!(complete_prefix(&"aé".as_bytes()[..2]), 1);
        assert_eq!(complete_prefix(&"€".as_bytes()[..2]), 0);
        assert_eq!(complete_prefix(&[0xff, 0xfe]), 2);
    }

    #[test]
    fn raw_reads_join_chunks_and_report_what_the_ring_dropped() {
        let mut output = Output::new(6);
        output.push(OutputStream::Stdout, Bytes::from_static(b"abcd"));
        output.push(OutputStream::Stderr, Bytes::from_static(&[0xff, b'f']));
        let page = output.read_bytes(1, 4);
        assert_eq!(&page.data[..], b"bcd\xff");
        assert_eq!((page.next_offset, page.dropped), (5, 0));
        output.push(OutputStream::Stdout, Bytes::from_static(b"ghijk"));
        // "abcd" and "\xfff" left whole: 5 retained, from offset 6 on.
        let page = output.read_bytes(0, 100);
        assert_eq!((&page.data[..], page.dropped), (&b"ghijk"[..], 6));
        assert_eq!(page.next_offset, 11);
        assert!(output.read_bytes(11, 100).data.is_empty());
        assert_eq!(output.read_bytes(99, 100).next_offset, 11);
    }

    #[test]
    fn the_tail_is_the_newest_bytes() {
        let mut output = Output::new(100);
        output.push(OutputStream::Stdout, Bytes::from("héllo"));
        assert_eq!(output.tail(100), (b"h\xc3\xa9llo".to_vec(), false));
        assert_eq!(output.tail(5), ("éllo".as_bytes().to_vec(), true));
        // 4 bytes would start inside "é": the cut moves past it.
        assert_eq!(output.tail(4), (b"llo".to_vec(), true));
    }
}
