//! The scan that refuses what serde_json cannot decode the same way twice
//! ([`check_decodable`]): depth, numbers, escapes, and members named twice.

use super::error::{EnvelopeError, MAX_DEPTH};
use std::borrow::Cow;

/// Rejects what a JSON parser lets through but a strict agent cannot decode
/// or could read differently from the runtime, in one pass over `bytes`,
/// which must already be valid JSON:
/// - a `\uD800`–`\uDFFF` escape that is not a high surrogate followed by a
///   low one (RFC 8259 section 8.2: such a string is not Unicode; `serde_json`
///   and so every Rust agent refuse the whole message, and answer with an
///   `id: null` error that cannot be routed back, leaving the request hanging);
/// - arrays and objects nested deeper than [`MAX_DEPTH`];
/// - a number too large for an `f64` (`1e400`, a 400-digit integer), which
///   `serde_json` refuses as "number out of range";
/// - an object, at any depth, that names a member twice (escapes decoded):
///   RFC 8259 section 4 leaves duplicates to the reader, and the runtime
///   routes and checks by members it reads (`sessionId`, `_meta` and the
///   runtime's own key in it) while the agent may keep another occurrence
///   (research/contract.md, "Transport: /v2/rpc").
///
/// # Errors
/// [`EnvelopeError::Undecodable`] naming the byte offset;
/// [`EnvelopeError::DuplicateMember`] naming the member.
pub fn check_decodable(bytes: &[u8]) -> Result<(), EnvelopeError> {
    // Open containers, innermost last; an object's member names so far sit
    // in `names` from its `first` on (nested objects' names after them,
    // dropped when they close), so the scan allocates once per message.
    let mut open: Vec<Container> = Vec::new();
    let mut names: Vec<Cow<'_, [u8]>> = Vec::new();
    let mut expect_name = false;
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'"' => {
                let end = string_end(bytes, at + 1)?;
                if expect_name && let Some(Container::Object { first, set }) = open.last_mut() {
                    let name = member_name(&bytes[at + 1..end - 1]);
                    let twice = match set {
                        Some(set) => !set.insert(name.clone()),
                        None => names[*first..].contains(&name),
                    };
                    if twice {
                        return Err(EnvelopeError::DuplicateMember(
                            String::from_utf8_lossy(&name).into_owned(),
                        ));
                    }
                    names.push(name);
                    // A large object: a set from here on, so a hostile
                    // message of many members costs linear time.
                    if set.is_none() && names.len() - *first > SCANNED_NAMES {
                        *set = Some(names[*first..].iter().cloned().collect());
                    }
                    expect_name = false;
                }
                at = end;
            }
            bracket @ (b'{' | b'[') => {
                if open.len() >= MAX_DEPTH {
                    return Err(EnvelopeError::Undecodable(format!(
                        "JSON nested deeper than {MAX_DEPTH} levels (at byte {at})"
                    )));
                }
                expect_name = bracket == b'{';
                open.push(if expect_name {
                    Container::Object {
                        first: names.len(),
                        set: None,
                    }
                } else {
                    Container::Array
                });
                at += 1;
            }
            b'}' | b']' => {
                if let Some(Container::Object { first, .. }) = open.pop() {
                    names.truncate(first);
                }
                expect_name = false;
                at += 1;
            }
            b',' => {
                expect_name = matches!(open.last(), Some(Container::Object { .. }));
                at += 1;
            }
            b'-' | b'0'..=b'9' => at = number_end(bytes, at)?,
            _ => at += 1,
        }
    }
    Ok(())
}

/// Members of one object compared by a scan of its names before a set is
/// built for it.
const SCANNED_NAMES: usize = 32;

/// An open array or object of [`check_decodable`]'s scan.
enum Container<'a> {
    Array,
    Object {
        /// Where this object's member names start in the scan's list.
        first: usize,
        /// The names as a set, once there are more than [`SCANNED_NAMES`].
        set: Option<std::collections::HashSet<Cow<'a, [u8]>>>,
    },
}

/// A member name's text (the bytes between its quotes), its escapes
/// decoded: two spellings of one name (`"a"`, `"\u0061"`) compare equal.
fn member_name(raw: &[u8]) -> Cow<'_, [u8]> {
    if !raw.contains(&b'\\') {
        return Cow::Borrowed(raw);
    }
    let mut quoted = Vec::with_capacity(raw.len() + 2);
    quoted.push(b'"');
    quoted.extend_from_slice(raw);
    quoted.push(b'"');
    // Valid JSON with paired surrogates (checked by the scan): decodes.
    match serde_json::from_slice::<String>(&quoted) {
        Ok(text) => Cow::Owned(text.into_bytes()),
        Err(_) => Cow::Borrowed(raw),
    }
}

/// The longest number (in bytes, sign and fraction included) without an
/// exponent that [`number_end`] takes as fitting an `f64` without parsing
/// it: 308 integer digits at most, below `f64::MAX`.
const MAX_F64_DIGITS: usize = 308;

/// The offset just past the number starting at `at`, checking that it fits
/// an `f64` (integers that fit `u64`/`i64` always do).
fn number_end(bytes: &[u8], at: usize) -> Result<usize, EnvelopeError> {
    let length = bytes[at..]
        .iter()
        .position(|b| !matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
        .unwrap_or(bytes.len() - at);
    let end = at + length;
    // Without an exponent, fewer than 309 digits before the point always
    // fit (`f64::MAX` is about 1.8e308): ids and counts skip the parse.
    if length <= MAX_F64_DIGITS && !bytes[at..end].iter().any(|b| matches!(b, b'e' | b'E')) {
        return Ok(end);
    }
    let finite = std::str::from_utf8(&bytes[at..end])
        .ok()
        .and_then(|text| text.parse::<f64>().ok())
        .is_some_and(f64::is_finite);
    if finite {
        Ok(end)
    } else {
        Err(EnvelopeError::Undecodable(format!(
            "the number at byte {at} is out of range for a 64-bit float"
        )))
    }
}

/// The offset just past the string whose contents start at `at`, checking its
/// `\u` escapes pair up. Plain runs are skipped with `memchr`.
fn string_end(bytes: &[u8], mut at: usize) -> Result<usize, EnvelopeError> {
    let lone = |at: usize| {
        EnvelopeError::Undecodable(format!(
            "a string holds a lone UTF-16 surrogate escape at byte {at}; JSON text must be Unicode (RFC 8259 section 8.2)"
        ))
    };
    loop {
        let Some(offset) = memchr::memchr2(b'"', b'\\', &bytes[at..]) else {
            return Ok(bytes.len());
        };
        at += offset;
        if bytes[at] == b'"' {
            return Ok(at + 1);
        }
        if bytes.get(at + 1) != Some(&b'u') {
            at += 2;
            continue;
        }
        match hex_unit(bytes, at + 2) {
            Some(0xD800..=0xDBFF) => {
                let low = (bytes.get(at + 6..at + 8) == Some(b"\\u"))
                    .then(|| hex_unit(bytes, at + 8))
                    .flatten();
                if !matches!(low, Some(0xDC00..=0xDFFF)) {
                    return Err(lone(at));
                }
                at += 12;
            }
            Some(0xDC00..=0xDFFF) => return Err(lone(at)),
            _ => at += 6,
        }
    }
}

/// The four hex digits at `at` as a UTF-16 code unit.
fn hex_unit(bytes: &[u8], at: usize) -> Option<u16> {
    let digits = std::str::from_utf8(bytes.get(at..at + 4)?).ok()?;
    u16::from_str_radix(digits, 16).ok()
}

/// Leading bytes check shared by both envelope parsers: one JSON object.
pub(super) fn expect_object(bytes: &[u8]) -> Result<(), EnvelopeError> {
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => Ok(()),
        Some(b'[') => Err(EnvelopeError::NotJson(
            "batches (arrays) are not supported".to_owned(),
        )),
        None => Err(EnvelopeError::NotJson("empty body".to_owned())),
        Some(_) => Err(EnvelopeError::NotJson("expected an object".to_owned())),
    }
}
