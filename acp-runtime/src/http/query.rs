//! A request's query string, read strictly: what `form_urlencoded` reads
//! leniently (a name given twice, where it keeps each; bytes that are not
//! UTF-8 once percent-decoded, which it turns into U+FFFD) is refused, so a
//! client is never answered for a query other than the one it sent
//! (research/contract.md, "Transport: /v2/rpc", "Edge rules").

use crate::error::Error;
use percent_encoding::percent_decode_str;
use std::borrow::Cow;

/// One decoded `name=value` pair of a query.
pub type Pair<'a> = (Cow<'a, str>, Cow<'a, str>);

/// The query's `name=value` pairs in order, decoded as
/// `application/x-www-form-urlencoded` (WHATWG URL, section 5.1: `+` is a
/// space, `%XX` a byte; a pair without `=` has an empty value; empty pairs
/// are skipped).
///
/// # Errors
/// [`Error::InvalidRequest`] (400) for a name that appears twice (an alias
/// counting as its name: `session_id` as `sessionId`), or a name
/// or value that is not UTF-8 once decoded.
pub fn pairs(query: Option<&str>) -> Result<Vec<Pair<'_>>, Error> {
    let mut pairs: Vec<Pair<'_>> = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = decode(name)?;
        if pairs
            .iter()
            .any(|(seen, _)| canonical(seen) == canonical(&name))
        {
            return Err(Error::InvalidRequest(format!(
                "query parameter {name} is given more than once; send it once"
            )));
        }
        let value = decode(value)?;
        pairs.push((name, value));
    }
    Ok(pairs)
}

/// The name a parameter is known by: `session_id` is an alias of
/// `sessionId` on every route that reads it, so both together name one
/// parameter twice.
fn canonical(name: &str) -> &str {
    match name {
        "session_id" => "sessionId",
        other => other,
    }
}

fn decode(raw: &str) -> Result<Cow<'_, str>, Error> {
    let invalid =
        || Error::InvalidRequest(format!("query {raw:?} is not UTF-8 once percent-decoded"));
    if !raw.contains('+') {
        return percent_decode_str(raw).decode_utf8().map_err(|_| invalid());
    }
    let spaced = raw.replace('+', " ");
    percent_decode_str(&spaced)
        .decode_utf8()
        .map(|decoded| Cow::Owned(decoded.into_owned()))
        .map_err(|_| invalid())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_pairs_in_order() {
        let read = pairs(Some("path=%2Ftmp%2Fa+b&recursive&x=%C3%A9")).expect("valid");
        let read: Vec<(&str, &str)> = read.iter().map(|(k, v)| (&**k, &**v)).collect();
        assert_eq!(read, [("path", "/tmp/a b"), ("recursive", ""), ("x", "é")]);
        assert!(pairs(None).expect("empty").is_empty());
        assert!(pairs(Some("&&")).expect("empty pairs").is_empty());
    }

    #[test]
    fn refuses_a_repeated_name_and_bytes_that_are_not_utf8() {
        for query in [
            "path=a&path=b",
            "path=a&p%61th=b",
            "sessionId=a&session_id=b",
            "a=%FF",
            "%FF=1",
        ] {
            let error = pairs(Some(query)).expect_err(query);
            assert!(
                matches!(error, Error::InvalidRequest(_)),
                "{query}: {error}"
            );
        }
    }
}
