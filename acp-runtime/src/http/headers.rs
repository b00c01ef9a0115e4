//! Header checks: bearer auth, `Accept` negotiation, `Content-Type`,
//! `Last-Event-ID`, and CORS.

use crate::error::Error;
use crate::protocol::APPLICATION_JSON;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue};
use subtle::ConstantTimeEq;

/// `Last-Event-ID` (SSE spec) request header.
pub const LAST_EVENT_ID: &str = "last-event-id";

/// Checks `Authorization: Bearer <token>` in constant time
/// (research/contract.md, "Auth and CORS").
///
/// # Errors
/// [`Error::InvalidRequest`] (400) for two or more `Authorization` fields:
/// which one a proxy in front checked is unknown, so none is picked;
/// [`Error::Unauthorized`] when the header is missing or the token differs.
pub fn check_bearer(headers: &HeaderMap, token: &str) -> Result<(), Error> {
    let presented = single_authorization(headers)?
        .and_then(|value| value.to_str().ok())
        .and_then(|value| {
            let (scheme, credentials) = value.trim().split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| credentials.trim())
        })
        .ok_or(Error::Unauthorized)?;
    if bool::from(presented.as_bytes().ct_eq(token.as_bytes())) {
        Ok(())
    } else {
        Err(Error::Unauthorized)
    }
}

/// The one `Authorization` field of the request, if any.
///
/// # Errors
/// [`Error::InvalidRequest`] when there are several.
pub fn single_authorization(headers: &HeaderMap) -> Result<Option<&HeaderValue>, Error> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(Error::InvalidRequest(
            "the request has more than one Authorization header; send exactly one".to_owned(),
        ));
    }
    Ok(first)
}

/// Whether `Accept` allows `media_type` (a `type/subtype` without
/// parameters); no `Accept` at all counts as `*/*`.
///
/// RFC 9110 section 12.5.1: of the ranges that match, the most specific one
/// (`type/subtype`, then `type/*`, then `*/*`) gives the weight, and weight
/// `q=0` means "not acceptable", so `application/json;q=0, */*` excludes
/// `application/json`. Matching is case-insensitive; parameters other than
/// `q` do not narrow a range here, and of equally specific ranges the highest
/// weight counts. A weight that does not parse counts as 1.
pub fn accepts(headers: &HeaderMap, media_type: &str) -> bool {
    let values = headers.get_all(ACCEPT);
    let mut each = values.iter();
    let Some(first) = each.next() else {
        return true;
    };
    // What clients send on every request: the type itself, or `*/*`, alone.
    if each.next().is_none()
        && (first.as_bytes().eq_ignore_ascii_case(media_type.as_bytes()) || first == "*/*")
    {
        return true;
    }
    let (wanted_type, _) = media_type.split_once('/').unwrap_or((media_type, ""));
    // (specificity, weight) of the best matching range so far.
    let mut best: Option<(u8, f32)> = None;
    for range in values
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
    {
        let mut parts = range.split(';');
        let media_range = parts.next().unwrap_or("").trim();
        let specificity = if media_range.eq_ignore_ascii_case(media_type) {
            2
        } else if media_range
            .strip_suffix("/*")
            .is_some_and(|t| t.eq_ignore_ascii_case(wanted_type))
        {
            1
        } else if media_range == "*/*" {
            0
        } else {
            continue;
        };
        let weight = parts.find_map(weight).unwrap_or(1.0);
        best = match best {
            Some((s, w)) if s > specificity || (s == specificity && w >= weight) => Some((s, w)),
            _ => Some((specificity, weight)),
        };
    }
    best.is_some_and(|(_, weight)| weight > 0.0)
}

/// Whether `Accept` names `media_type` itself (not by a wildcard) with a
/// weight above 0: how a scraper asks `GET /metrics` for OpenMetrics.
pub fn names(headers: &HeaderMap, media_type: &str) -> bool {
    headers
        .get_all(ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|range| {
            let mut parts = range.split(';');
            parts
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case(media_type))
                && parts.find_map(weight).is_none_or(|q| q > 0.0)
        })
}

/// The weight of a `q=` parameter of an `Accept` range (RFC 9110 section
/// 12.4.2), 1 when it does not parse; `None` for any other parameter.
fn weight(param: &str) -> Option<f32> {
    let (name, value) = param.split_once('=')?;
    if !name.trim().eq_ignore_ascii_case("q") {
        return None;
    }
    Some(
        value
            .trim()
            .parse::<f32>()
            .ok()
            .filter(|q| q.is_finite())
            .map_or(1.0, |q| q.clamp(0.0, 1.0)),
    )
}

/// Whether `Content-Type` is `application/json` (parameters such as
/// `charset` allowed).
pub fn is_json_content(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case(APPLICATION_JSON))
}

/// Whether `Content-Type` names a tar archive, gzipped or not:
/// `application/x-tar`, `application/gzip` or its older `application/x-gzip`
/// (parameters allowed). None of them is a type a cross-site form or
/// `fetch` may send without a CORS preflight (research/contract.md, "Host
/// file system").
pub fn is_archive_content(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media| {
            let media = media.trim();
            [
                "application/x-tar",
                "application/gzip",
                "application/x-gzip",
            ]
            .iter()
            .any(|archive| media.eq_ignore_ascii_case(archive))
        })
}

/// The one value of header `name`, or `None` when absent.
///
/// # Errors
/// [`Error::InvalidRequest`] (400) when the header is sent more than once:
/// none is picked (research/contract.md, "Edge rules").
pub fn single<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a HeaderValue>, Error> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(Error::InvalidRequest(format!(
            "the {name} header is sent more than once; send it once"
        )));
    }
    Ok(first)
}

/// Parses `Last-Event-ID`: absent is `None`; anything but a non-negative
/// integer, or the header twice, is a 400.
///
/// # Errors
/// [`Error::InvalidLastEventId`].
pub fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, Error> {
    let Some(value) = single(headers, LAST_EVENT_ID)? else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .map(str::trim)
        .filter(|text| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|text| text.parse::<u64>().ok())
        .map(Some)
        .ok_or_else(|| {
            Error::InvalidLastEventId(format!(
                "Last-Event-ID must be a non-negative integer sequence number, got {:?}",
                String::from_utf8_lossy(value.as_bytes())
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(name: &'static str, value: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(name, HeaderValue::from_static(value));
        headers
    }

    #[test]
    fn accept_negotiation() {
        assert!(accepts(&HeaderMap::new(), "application/json"));
        assert!(accepts(&headers("accept", "*/*"), "application/json"));
        assert!(accepts(
            &headers("accept", "application/*"),
            "application/json"
        ));
        assert!(accepts(
            &headers("accept", "text/html, application/json;q=0.5"),
            "application/json"
        ));
        assert!(!accepts(
            &headers("accept", "text/html"),
            "application/json"
        ));
        assert!(!accepts(
            &headers("accept", "application/json;q=0"),
            "application/json"
        ));
        assert!(accepts(
            &headers("accept", "text/event-stream"),
            "text/event-stream"
        ));
        assert!(!accepts(
            &headers("accept", "application/json"),
            "text/event-stream"
        ));
    }

    #[test]
    fn accept_most_specific_range_decides() {
        let json = "application/json";
        let sse = "text/event-stream";
        // A more specific q=0 range excludes what a wildcard would allow.
        for (accept, media_type) in [
            ("application/json;q=0, */*", json),
            ("*/*, application/json;q=0", json),
            ("application/json; q=0, application/*", json),
            ("application/*;q=0, */*", json),
            ("text/event-stream;q=0, text/*", sse),
            ("text/event-stream;Q=0.000, */*;q=1", sse),
            ("text/*;q=0, */*", sse),
            ("*/*;q=0", json),
        ] {
            assert!(!accepts(&headers("accept", accept), media_type), "{accept}");
        }
        // A more specific range with a weight allows what a wildcard excludes.
        for (accept, media_type) in [
            ("*/*;q=0, application/json", json),
            ("application/*;q=0, application/json;q=0.1", json),
            ("text/*;q=0, text/event-stream;q=0.5", sse),
            ("APPLICATION/JSON", json),
            ("application/json; charset=utf-8", json),
            ("application/json;q=0, application/json;q=1", json),
            ("text/html;q=0, */*", json),
            ("application/json;q=bogus", json),
            ("application/json;level=1;q=0.2", json),
        ] {
            assert!(accepts(&headers("accept", accept), media_type), "{accept}");
        }
        // Several Accept field lines form one list.
        let mut map = HeaderMap::new();
        map.append("accept", HeaderValue::from_static("*/*"));
        map.append("accept", HeaderValue::from_static("application/json;q=0"));
        assert!(!accepts(&map, json));
    }

    #[test]
    fn bearer() {
        assert!(check_bearer(&headers("authorization", "Bearer s3cret"), "s3cret").is_ok());
        assert!(check_bearer(&headers("authorization", "bearer  s3cret "), "s3cret").is_ok());
        assert!(check_bearer(&headers("authorization", "Bearer s3cre"), "s3cret").is_err());
        assert!(check_bearer(&headers("authorization", "Basic s3cret"), "s3cret").is_err());
        assert!(check_bearer(&HeaderMap::new(), "s3cret").is_err());
        let mut twice = headers("authorization", "Bearer s3cret");
        twice.append("authorization", HeaderValue::from_static("Bearer s3cret"));
        assert!(matches!(
            check_bearer(&twice, "s3cret"),
            Err(Error::InvalidRequest(_))
        ));
    }

    #[test]
    fn last_event_id_values() {
        assert_eq!(last_event_id(&HeaderMap::new()).ok(), Some(None));
        assert_eq!(
            last_event_id(&headers(LAST_EVENT_ID, " 42 ")).ok(),
            Some(Some(42))
        );
        for bad in ["abc", "-1", "1.5", "", "99999999999999999999999"] {
            let mut map = HeaderMap::new();
            map.insert(LAST_EVENT_ID, HeaderValue::from_str(bad).expect("header"));
            assert!(last_event_id(&map).is_err(), "{bad}");
        }
    }

    #[test]
    fn json_content_type() {
        assert!(is_json_content(&headers(
            "content-type",
            "application/json; charset=utf-8"
        )));
        assert!(!is_json_content(&headers("content-type", "text/plain")));
        assert!(!is_json_content(&HeaderMap::new()));
    }

    #[test]
    fn archive_content_type() {
        for archive in [
            "application/x-tar",
            "application/gzip",
            "Application/X-GZIP",
            "application/x-tar; charset=binary",
        ] {
            assert!(
                is_archive_content(&headers("content-type", archive)),
                "{archive}"
            );
        }
        for other in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/octet-stream",
        ] {
            assert!(
                !is_archive_content(&headers("content-type", other)),
                "{other}"
            );
        }
        assert!(!is_archive_content(&HeaderMap::new()));
    }
}
