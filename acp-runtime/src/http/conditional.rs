//! Conditional requests (RFC 9110 section 13) on a file read: `If-Match`,
//! `If-None-Match` and `If-Range` against the file's strong `ETag`
//! (research/contract.md, "Host file system", reads).
//!
//! Pure functions over the request headers and the current validator: no
//! I/O here, so every rule has a unit test beside it.

use crate::error::Error;
use http::HeaderMap;
use http::header::{IF_MATCH, IF_NONE_MATCH, IF_RANGE};

/// What the preconditions of a `GET`/`HEAD` say, in the order of RFC 9110
/// section 13.2.2 (`If-Unmodified-Since` and `If-Modified-Since` are not
/// evaluated: the `ETag` is the validator here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Read {
    /// Answer 304: `If-None-Match` matched.
    NotModified,
    /// Answer the file. `range_applies` is false when `If-Range` did not
    /// match (RFC 9110 section 13.1.5): a `Range` is then ignored and the
    /// whole current file is sent with 200, never a part of another
    /// version.
    Proceed {
        /// Whether a `Range` header may be honoured.
        range_applies: bool,
    },
}

/// Evaluates the preconditions of a read of the file whose current strong
/// validator is `etag` (with its quotes, e.g. `"1a-2b-3c"`).
///
/// # Errors
/// [`Error::PreconditionFailed`] (412) when `If-Match` matches no current
/// `ETag` (strong comparison, RFC 9110 section 13.1.1: a weak tag never
/// matches; a field that does not parse matches nothing).
pub(crate) fn evaluate_read(headers: &HeaderMap, etag: &str) -> Result<Read, Error> {
    if let Some(lists) = field(headers, IF_MATCH) {
        let matched = lists.iter().any(|list| match Tags::parse(list) {
            Some(Tags::Any) => true,
            Some(Tags::List(tags)) => tags.iter().any(|tag| tag.strong_eq(etag)),
            None => false,
        });
        if !matched {
            return Err(Error::PreconditionFailed(format!(
                "If-Match names no current ETag of the file (it is {etag} now)"
            )));
        }
    }
    if let Some(lists) = field(headers, IF_NONE_MATCH) {
        // Weak comparison (RFC 9110 section 13.1.2).
        let matched = lists.iter().any(|list| match Tags::parse(list) {
            Some(Tags::Any) => true,
            Some(Tags::List(tags)) => tags.iter().any(|tag| tag.opaque == etag),
            None => false,
        });
        if matched {
            return Ok(Read::NotModified);
        }
    }
    let range_applies = match field(headers, IF_RANGE).as_deref() {
        None => true,
        // One entity-tag, compared strongly; an HTTP-date (this server's
        // Last-Modified has one-second resolution, too coarse to be a strong
        // validator), a weak tag, a list or anything else is false.
        Some([value]) => matches!(
            Tags::parse(value),
            Some(Tags::List(tags)) if tags.len() == 1 && tags[0].strong_eq(etag)
        ),
        Some(_) => false,
    };
    Ok(Read::Proceed { range_applies })
}

/// Whether a request carries a precondition a write evaluates.
pub(crate) fn has_write_preconditions(headers: &HeaderMap) -> bool {
    headers.contains_key(IF_MATCH) || headers.contains_key(IF_NONE_MATCH)
}

/// Evaluates the preconditions of a write (`PUT`) of the file whose current
/// strong validator is `current` (`None`: no file there), RFC 9110 sections
/// 13.1.1 and 13.1.2: `If-Match` must name the current `ETag` (strong
/// comparison; `*` needs a file), `If-None-Match` must name none of it
/// (`*`: create only).
///
/// # Errors
/// [`Error::PreconditionFailed`] (412) when either does not hold.
pub(crate) fn evaluate_write(headers: &HeaderMap, current: Option<&str>) -> Result<(), Error> {
    if let Some(lists) = field(headers, IF_MATCH) {
        let matched = current.is_some_and(|etag| {
            lists.iter().any(|list| match Tags::parse(list) {
                Some(Tags::Any) => true,
                Some(Tags::List(tags)) => tags.iter().any(|tag| tag.strong_eq(etag)),
                None => false,
            })
        });
        if !matched {
            return Err(Error::PreconditionFailed(match current {
                Some(_) => "If-Match names no current ETag of the file".to_owned(),
                None => "If-Match, and there is no file at the path".to_owned(),
            }));
        }
    }
    if let Some(lists) = field(headers, IF_NONE_MATCH)
        && let Some(etag) = current
    {
        let matched = lists.iter().any(|list| match Tags::parse(list) {
            Some(Tags::Any) => true,
            Some(Tags::List(tags)) => tags.iter().any(|tag| tag.opaque == etag),
            None => false,
        });
        if matched {
            return Err(Error::PreconditionFailed(
                "If-None-Match matches the file that is there".to_owned(),
            ));
        }
    }
    Ok(())
}

/// Every field line of `name` as text (a line that is not visible ASCII
/// reads as empty, which parses as no tag), or `None` when absent.
fn field(headers: &HeaderMap, name: http::HeaderName) -> Option<Vec<&str>> {
    let lines: Vec<&str> = headers
        .get_all(name)
        .iter()
        .map(|value| value.to_str().unwrap_or(""))
        .collect();
    (!lines.is_empty()).then_some(lines)
}

/// An entity-tag (RFC 9110 section 8.8.3): `[W/]"opaque"`.
#[derive(Debug, PartialEq, Eq)]
struct EntityTag<'a> {
    weak: bool,
    /// The opaque tag with its double quotes, as this server sends it.
    opaque: &'a str,
}

impl EntityTag<'_> {
    /// Strong comparison: both strong and the same opaque tag.
    fn strong_eq(&self, etag: &str) -> bool {
        !self.weak && self.opaque == etag
    }
}

/// The value of `If-Match` / `If-None-Match`: `*` or a list of tags.
#[derive(Debug, PartialEq, Eq)]
enum Tags<'a> {
    Any,
    List(Vec<EntityTag<'a>>),
}

impl<'a> Tags<'a> {
    /// Parses one field line; `None` when it is not `*` or a
    /// comma-separated list of entity-tags (a comma may sit inside the
    /// quotes, so the line is not split on commas first).
    fn parse(value: &'a str) -> Option<Self> {
        if value.trim() == "*" {
            return Some(Self::Any);
        }
        let mut tags = Vec::new();
        let mut rest = value;
        loop {
            rest = rest.trim_start_matches([' ', '\t', ',']);
            if rest.is_empty() {
                return Some(Self::List(tags));
            }
            let (weak, quoted) = match rest.strip_prefix("W/") {
                Some(quoted) => (true, quoted),
                None => (false, rest),
            };
            let inner = quoted.strip_prefix('"')?;
            let end = inner.find('"')?;
            let opaque = &quoted[..end + 2];
            if !inner[..end]
                .bytes()
                .all(|b| b == 0x21 || (0x23..=0x7e).contains(&b) || b >= 0x80)
            {
                return None;
            }
            tags.push(EntityTag { weak, opaque });
            rest = &quoted[end + 2..];
            let after = rest.trim_start_matches([' ', '\t']);
            if !after.is_empty() && !after.starts_with(',') {
                return None;
            }
            rest = after;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const ETAG: &str = "\"1a-14-65f0a1b2c\"";

    fn headers(fields: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in fields {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn writes_need_the_current_tag_or_no_file() {
        let ok = |fields: &[(&'static str, &'static str)], current: Option<&str>| {
            evaluate_write(&headers(fields), current).is_ok()
        };
        assert!(ok(&[], Some(ETAG)));
        assert!(ok(&[("if-match", ETAG)], Some(ETAG)));
        assert!(!ok(&[("if-match", "\"old\"")], Some(ETAG)));
        assert!(!ok(&[("if-match", "W/\"1a-14-65f0a1b2c\"")], Some(ETAG)));
        assert!(ok(&[("if-match", "*")], Some(ETAG)));
        assert!(!ok(&[("if-match", "*")], None));
        assert!(ok(&[("if-none-match", "*")], None));
        assert!(!ok(&[("if-none-match", "*")], Some(ETAG)));
        assert!(ok(&[("if-none-match", "\"old\"")], Some(ETAG)));
    }

    fn read(fields: &[(&'static str, &'static str)]) -> Option<Read> {
        evaluate_read(&headers(fields), ETAG).ok()
    }

    const WHOLE: Option<Read> = Some(Read::Proceed {
        range_applies: false,
    });
    const PART: Option<Read> = Some(Read::Proceed {
        range_applies: true,
    });

    #[test]
    fn entity_tag_lists_parse() {
        assert_eq!(Tags::parse(" * "), Some(Tags::Any));
        assert_eq!(
            Tags::parse("\"a\", W/\"b,c\" ,\"\""),
            Some(Tags::List(vec![
                EntityTag {
                    weak: false,
                    opaque: "\"a\""
                },
                EntityTag {
                    weak: true,
                    opaque: "\"b,c\""
                },
                EntityTag {
                    weak: false,
                    opaque: "\"\""
                },
            ]))
        );
        for bad in ["a", "\"a", "\"a\" b", "w/\"a\"", "\"a b\"", "*, \"a\""] {
            assert_eq!(Tags::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn if_range_honours_the_range_only_for_the_same_strong_tag() {
        assert_eq!(read(&[]), PART);
        assert_eq!(read(&[("if-range", "\"1a-14-65f0a1b2c\"")]), PART);
        assert_eq!(read(&[("if-range", "\"1a-14-0\"")]), WHOLE);
        assert_eq!(read(&[("if-range", "W/\"1a-14-65f0a1b2c\"")]), WHOLE);
        assert_eq!(
            read(&[("if-range", "Sun, 06 Nov 1994 08:49:37 GMT")]),
            WHOLE
        );
        assert_eq!(read(&[("if-range", "*")]), WHOLE);
        assert_eq!(
            read(&[
                ("if-range", "\"1a-14-65f0a1b2c\""),
                ("if-range", "\"1a-14-65f0a1b2c\"")
            ]),
            WHOLE
        );
        assert_eq!(read(&[("if-range", "\"1a-14-65f0a1b2c\", \"x\"")]), WHOLE);
    }

    #[test]
    fn if_match_compares_strongly_and_fails_with_412() {
        assert_eq!(read(&[("if-match", "*")]), PART);
        assert_eq!(read(&[("if-match", "\"x\", \"1a-14-65f0a1b2c\"")]), PART);
        assert_eq!(read(&[("if-match", "\"x\""), ("if-match", ETAG)]), PART);
        for bad in ["\"x\"", "W/\"1a-14-65f0a1b2c\"", "garbage", ""] {
            let outcome = evaluate_read(&headers(&[("if-match", bad)]), ETAG);
            assert!(
                matches!(outcome, Err(Error::PreconditionFailed(_))),
                "{bad}: {outcome:?}"
            );
        }
    }

    #[test]
    fn if_none_match_compares_weakly() {
        assert_eq!(read(&[("if-none-match", ETAG)]), Some(Read::NotModified));
        assert_eq!(
            read(&[("if-none-match", "W/\"1a-14-65f0a1b2c\"")]),
            Some(Read::NotModified)
        );
        assert_eq!(read(&[("if-none-match", "*")]), Some(Read::NotModified));
        assert_eq!(read(&[("if-none-match", "\"x\"")]), PART);
        // If-Match is evaluated first.
        assert!(
            evaluate_read(
                &headers(&[("if-match", "\"x\""), ("if-none-match", ETAG)]),
                ETAG
            )
            .is_err()
        );
    }
}
