//! JSON string literals written straight into a frame, byte for byte what
//! `serde_json` writes: the followed output of a process is mostly text
//! whose every line ends in an escaped `\n`, and `serde_json`'s writer pays
//! two buffer writes per escape, the largest item in the server's profile
//! of a fast follower (research/benchmarks.md, "The follow, escaped once").

/// What each byte becomes inside a JSON string (RFC 8259 §7, in
/// `serde_json`'s choices): 0 = itself; `u` = `\u00XX`; any other letter
/// follows a backslash (`\n`, `\"`, …).
static ESCAPE: [u8; 256] = {
    let mut table = [0_u8; 256];
    let mut byte = 0;
    while byte < 0x20 {
        table[byte] = b'u';
        byte += 1;
    }
    table[0x08] = b'b';
    table[0x09] = b't';
    table[0x0a] = b'n';
    table[0x0c] = b'f';
    table[0x0d] = b'r';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table
};

/// Every byte of a `u64` set to `byte`.
const fn repeat(byte: u8) -> u64 {
    u64::from_ne_bytes([byte; 8])
}

/// Whether any of the eight bytes of `word` must be escaped: one below
/// 0x20, a `"` or a `\`. Exact, not a hint: `(x - 0x01…) & !x & 0x80…` is
/// non-zero iff some byte of `x` is zero, and `(x - 0x20…) & !x & 0x80…`
/// iff some byte is below 0x20 (both only for bytes ≤ 0x80 in the
/// subtrahend, as here).
fn needs_escape(word: u64) -> bool {
    let high = repeat(0x80);
    let below_space = word.wrapping_sub(repeat(0x20)) & !word;
    let quote = word ^ repeat(b'"');
    let quote = quote.wrapping_sub(repeat(0x01)) & !quote;
    let backslash = word ^ repeat(b'\\');
    let backslash = backslash.wrapping_sub(repeat(0x01)) & !backslash;
    (below_space | quote | backslash) & high != 0
}

/// Appends `text` to `out` as a JSON string, quotes included.
pub fn put(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    // Enough for text whose escapes are all two bytes long (`\n`): one
    // reservation for the common case, `extend` grows for `\u00XX`.
    out.reserve(bytes.len() * 2 + 2);
    out.push(b'"');
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let value = u64::from_ne_bytes([
            word[0], word[1], word[2], word[3], word[4], word[5], word[6], word[7],
        ]);
        if needs_escape(value) {
            put_bytes(out, word);
        } else {
            out.extend_from_slice(word);
        }
    }
    put_bytes(out, words.remainder());
    out.push(b'"');
}

/// Appends `bytes` (at most eight) escaped one at a time, through a buffer
/// on the stack: one append per word instead of one per byte.
fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    // Eight bytes of six (`\u00XX`) at most.
    let mut buffer = [0_u8; 48];
    let mut length = 0;
    for &byte in bytes.iter().take(8) {
        match ESCAPE[usize::from(byte)] {
            0 => {
                buffer[length] = byte;
                length += 1;
            }
            b'u' => {
                buffer[length..length + 6].copy_from_slice(&[
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[usize::from(byte >> 4)],
                    HEX[usize::from(byte & 0xf)],
                ]);
                length += 6;
            }
            letter => {
                buffer[length] = b'\\';
                buffer[length + 1] = letter;
                length += 2;
            }
        }
    }
    out.extend_from_slice(&buffer[..length]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours(text: &str) -> String {
        let mut out = Vec::new();
        put(&mut out, text);
        String::from_utf8(out).expect("escaped text is UTF-8")
    }

    #[test]
    fn every_ascii_byte_is_written_as_serde_json_writes_it() {
        for byte in 0_u8..0x80 {
            let text = char::from(byte).to_string();
            for sample in [
                text.clone(),
                text.repeat(9),
                format!("abcdefg{text}hijklmnop"),
            ] {
                assert_eq!(
                    ours(&sample),
                    serde_json::to_string(&sample).expect("serializes"),
                    "byte {byte:#04x}"
                );
            }
        }
    }

    #[test]
    fn text_of_every_shape_is_written_as_serde_json_writes_it() {
        // A deterministic mix of plain runs, escapes, controls and
        // multi-byte characters across the eight-byte boundaries.
        let pieces = [
            "y\n",
            "plain ascii",
            "\"",
            "\\",
            "\t",
            "\u{1}",
            "\u{1f}",
            "\u{7f}",
            "é",
            "€",
            "😀",
            "\r\n",
            "",
            "01234567",
            "/",
        ];
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..2000 {
            let mut sample = String::new();
            for _ in 0..(state % 40) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                sample.push_str(pieces[(state % pieces.len() as u64) as usize]);
            }
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            assert_eq!(
                ours(&sample),
                serde_json::to_string(&sample).expect("serializes")
            );
        }
    }

    #[test]
    fn what_it_writes_reads_back_as_the_text() {
        let text = "yes\ny\n\"q\" \\ \u{0} é€😀 tab\tend";
        let back: String = serde_json::from_str(&ours(text)).expect("reads back");
        assert_eq!(back, text);
    }
}
