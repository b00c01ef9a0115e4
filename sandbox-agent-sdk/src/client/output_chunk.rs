//! A followed output chunk's JSON (`{"offset":…,"stream":…,"data":…}`,
//! research/contract.md, "Output: chunks, pages, following") decoded in
//! one pass over its bytes.
//!
//! Output is mostly text whose every line ends in an escaped `\n`; a
//! generic JSON parser handles each escape as its own step. The shape the
//! server writes (fields in that order, a text chunk with no `encoding`)
//! is read here directly: the string is unescaped eight bytes at a time
//! where a word holds nothing to unescape, byte by byte elsewhere, straight
//! into the `String` handed out. Anything else (a base64 chunk, another
//! field order, invalid JSON) goes to `serde_json`, which gives the same
//! value or the error.

use ext_methods::{OutputChunk, OutputStream};

/// The chunk whose JSON is `data`.
///
/// # Errors
/// `serde_json`'s error for JSON that is not an [`OutputChunk`].
pub(super) fn decode(data: &[u8]) -> Result<OutputChunk, serde_json::Error> {
    match server_shape(data) {
        Some(chunk) => Ok(chunk),
        None => serde_json::from_slice(data),
    }
}

/// Streams by their wire names.
const STREAMS: [OutputStream; 3] = [
    OutputStream::Stdout,
    OutputStream::Stderr,
    OutputStream::Tty,
];

/// `data` as the server writes a text chunk, or `None` to leave it to
/// `serde_json`.
fn server_shape(data: &[u8]) -> Option<OutputChunk> {
    let rest = data.strip_prefix(b"{\"offset\":")?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    // JSON has no leading zeros; u64 has at most 20 digits.
    if digits == 0 || digits > 20 || (digits > 1 && rest[0] == b'0') {
        return None;
    }
    let offset = std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()?;
    let rest = rest[digits..].strip_prefix(b",\"stream\":\"")?;
    let (stream, rest) = STREAMS.iter().find_map(|stream| {
        let rest = rest
            .strip_prefix(stream.as_str().as_bytes())?
            .strip_prefix(b"\",\"data\":\"")?;
        Some((*stream, rest))
    })?;
    let (text, rest) = unescape(rest)?;
    (rest == b"}").then_some(OutputChunk {
        offset,
        stream,
        data: text,
        encoding: None,
    })
}

/// Every byte of a `u64` set to `byte`.
const fn repeat(byte: u8) -> u64 {
    u64::from_ne_bytes([byte; 8])
}

/// Whether any of the eight bytes of `word` is one to look at inside a
/// JSON string: below 0x20 (invalid there), `"` (its end) or `\` (an
/// escape). Exact: `(x - 0x01…) & !x & 0x80…` is non-zero iff some byte of
/// `x` is zero, `(x - 0x20…) & !x & 0x80…` iff some byte is below 0x20.
/// The server's escaper uses the same test (`acp-runtime`, `json_string`).
fn needs_a_look(word: u64) -> bool {
    let high = repeat(0x80);
    let below_space = word.wrapping_sub(repeat(0x20)) & !word;
    let quote = word ^ repeat(b'"');
    let quote = quote.wrapping_sub(repeat(0x01)) & !quote;
    let backslash = word ^ repeat(b'\\');
    let backslash = backslash.wrapping_sub(repeat(0x01)) & !backslash;
    (below_space | quote | backslash) & high != 0
}

/// The JSON string whose body starts `input` (after its opening quote),
/// unescaped, and the bytes after its closing quote; `None` when it is
/// unterminated, holds a raw control byte, an unknown escape, a lone
/// surrogate or invalid UTF-8 (`serde_json` then names the error).
fn unescape(input: &[u8]) -> Option<(String, &[u8])> {
    let mut out = Vec::with_capacity(input.len());
    let mut at = 0;
    loop {
        if let Some(word) = input.get(at..at + 8) {
            let value = u64::from_ne_bytes(word.try_into().ok()?);
            if !needs_a_look(value) {
                out.extend_from_slice(word);
                at += 8;
                continue;
            }
        }
        // This word byte by byte (an escape may end past it).
        let stop = (at + 8).min(input.len());
        if at == stop {
            return None;
        }
        while at < stop {
            match input[at] {
                b'"' => {
                    let text = String::from_utf8(out).ok()?;
                    return Some((text, &input[at + 1..]));
                }
                b'\\' => {
                    let (escaped, length) = escape(input.get(at + 1..)?)?;
                    match escaped {
                        Escaped::Byte(byte) => out.push(byte),
                        Escaped::Char(c) => {
                            out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                        }
                    }
                    at += 1 + length;
                }
                0..0x20 => return None,
                byte => {
                    out.push(byte);
                    at += 1;
                }
            }
        }
    }
}

/// What one escape stands for.
enum Escaped {
    Byte(u8),
    Char(char),
}

/// The escape whose letter starts `input` (after the backslash), and how
/// many bytes it took (RFC 8259 section 7).
fn escape(input: &[u8]) -> Option<(Escaped, usize)> {
    let byte = match *input.first()? {
        b'n' => b'\n',
        b't' => b'\t',
        b'r' => b'\r',
        b'"' => b'"',
        b'\\' => b'\\',
        b'/' => b'/',
        b'b' => 0x08,
        b'f' => 0x0c,
        b'u' => {
            let unit = hex4(input.get(1..5)?)?;
            return match unit {
                0xD800..0xDC00 => {
                    let low = input.get(5..11)?;
                    let low = match low.strip_prefix(b"\\u") {
                        Some(digits) => hex4(digits)?,
                        None => return None,
                    };
                    if !(0xDC00..0xE000).contains(&low) {
                        return None;
                    }
                    let c = char::from_u32(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00))?;
                    Some((Escaped::Char(c), 11))
                }
                _ => Some((Escaped::Char(char::from_u32(unit)?), 5)),
            };
        }
        _ => return None,
    };
    Some((Escaped::Byte(byte), 1))
}

/// Four hex digits as a number.
fn hex4(digits: &[u8]) -> Option<u32> {
    digits.iter().try_fold(0, |value, &digit| {
        let nibble = char::from(digit).to_digit(16)?;
        Some(value << 4 | nibble)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the server writes for a text chunk (field order of
    /// `OutputChunk`, no `encoding`).
    fn wire(offset: u64, stream: OutputStream, text: &str) -> Vec<u8> {
        let chunk = OutputChunk::of(offset, stream, text.as_bytes());
        serde_json::to_vec(&chunk).expect("serializes")
    }

    #[test]
    fn text_chunks_decode_as_serde_json_decodes_them() {
        let texts = [
            "",
            "y\n",
            "y\ny\ny\ny\ny\ny\ny\ny\ny\ny\n",
            "plain text longer than one word, no escapes at all",
            "\"quoted\" \\ back\tslash\r\n\u{8}\u{c}",
            "\u{1b}[31mred\u{1b}[0m \u{0} \u{1f}",
            "é€😀 and ✓, the last at a word's end: 1234567😀",
        ];
        for (at, text) in texts.iter().enumerate() {
            for stream in STREAMS {
                let json = wire(at as u64 * 1000, stream, text);
                let fast = server_shape(&json);
                assert!(fast.is_some(), "{}", String::from_utf8_lossy(&json));
                assert_eq!(fast, serde_json::from_slice(&json).ok());
            }
        }
    }

    #[test]
    fn every_ascii_byte_across_word_boundaries() {
        let mut rng = fastrand::Rng::with_seed(3);
        for _ in 0..2000 {
            let length = rng.usize(0..40);
            let text: String = (0..length).map(|_| char::from(rng.u8(0..0x80))).collect();
            let json = wire(rng.u64(..), STREAMS[rng.usize(..3)], &text);
            let fast = server_shape(&json).expect("the server's shape");
            assert_eq!(fast.data, text);
        }
    }

    #[test]
    fn escapes_serde_json_reads_and_the_server_does_not_write() {
        let json = br#"{"offset":0,"stream":"stdout","data":"\/ \u00e9 \uD83D\uDE00 \u20AC"}"#;
        let fast = server_shape(json).expect("decoded here");
        assert_eq!(fast.data, "/ é 😀 €");
        assert_eq!(Some(fast), serde_json::from_slice(json).ok());
    }

    #[test]
    fn other_shapes_and_invalid_json_go_to_serde_json() {
        let base64 = br#"{"offset":3,"stream":"stderr","data":"/w==","encoding":"base64"}"#;
        assert!(server_shape(base64).is_none());
        let chunk = decode(base64).expect("a base64 chunk");
        assert_eq!(chunk.bytes().ok(), Some(vec![0xff]));
        let reordered = br#"{"stream":"tty","offset":1,"data":"a\nb"}"#;
        assert_eq!(decode(reordered).expect("valid").data, "a\nb");
        for invalid in [
            &br#"{"offset":01,"stream":"stdout","data":"x"}"#[..],
            br#"{"offset":1,"stream":"stdout","data":"x"#,
            br#"{"offset":1,"stream":"stdout","data":"a\qb"}"#,
            br#"{"offset":1,"stream":"stdout","data":"\uD800 lone"}"#,
            b"{\"offset\":1,\"stream\":\"stdout\",\"data\":\"raw \n newline\"}",
            b"{\"offset\":1,\"stream\":\"stdout\",\"data\":\"\xff\"}",
            br#"{"offset":1,"stream":"pipe","data":"x"}"#,
        ] {
            assert!(server_shape(invalid).is_none());
            assert!(
                decode(invalid).is_err(),
                "{}",
                String::from_utf8_lossy(invalid)
            );
        }
    }
}
