//! Problem details (RFC 9457): the one place where an [`Error`] becomes an
//! `application/problem+json` response, with the status and problem type
//! [`Error::status`] and [`Error::kind`] give it.

use super::body::{Body, full};
use crate::error::{Error, TYPE_PREFIX};
use http::header::{ALLOW, CONNECTION, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use http::{HeaderValue, Response};
use serde::Serialize;

/// `Content-Type` of problem responses.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem document: the body of every error answer of the
/// plain-HTTP routes (and, as a response of the OpenAPI document, what each
/// operation's 4xx and 5xx statuses carry).
#[derive(Debug, Serialize, utoipa::ToSchema, utoipa::ToResponse)]
#[response(
    description = "Problem details (RFC 9457); `type` names the problem.",
    content_type = "application/problem+json"
)]
pub struct Problem {
    /// `urn:sandbox-agent:error:<kind>`.
    #[serde(rename = "type")]
    #[schema(example = "urn:sandbox-agent:error:invalid-request")]
    pub kind: String,
    /// Short summary of the problem type (the status' reason phrase).
    pub title: &'static str,
    /// The HTTP status, repeated.
    pub status: u16,
    /// What happened and what to do about it.
    pub detail: String,
}

/// The problem document of `error`, serialized.
pub fn document(error: &Error) -> Vec<u8> {
    let status = error.status();
    let problem = Problem {
        kind: format!("{TYPE_PREFIX}{}", error.kind()),
        title: status.canonical_reason().unwrap_or("Error"),
        status: status.as_u16(),
        detail: error.to_string(),
    };
    serde_json::to_vec(&problem).unwrap_or_default()
}

/// The problem response for `error`, with the headers its status calls for.
pub fn response(error: &Error) -> Response<Body> {
    let mut response = full(error.status(), PROBLEM_JSON, document(error).into());
    let headers = response.headers_mut();
    match error {
        Error::Unauthorized => {
            headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        Error::MethodNotAllowed(allow) => {
            headers.insert(ALLOW, HeaderValue::from_static(allow));
        }
        Error::RequestTimeout { .. } | Error::PayloadTooLarge { .. } => {
            // RFC 9110 sections 15.5.9 and 15.5.14: the rest of the body is
            // not read, so the server closes the connection, and says so.
            headers.insert(CONNECTION, HeaderValue::from_static("close"));
        }
        Error::RangeNotSatisfiable { size } => {
            // RFC 9110 section 14.4: the current length, for the next try.
            if let Ok(value) = HeaderValue::from_str(&format!("bytes */{size}")) {
                headers.insert(http::header::CONTENT_RANGE, value);
            }
        }
        Error::TooManyConnections { .. } | Error::ShuttingDown => {
            headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        _ => {}
    }
    debug_assert!(headers.contains_key(CONTENT_TYPE));
    response
}
