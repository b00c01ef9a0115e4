//! The request and response types every route shares, and the helpers
//! that make and read them (a leaf: the routes import it, it imports no
//! route).

use crate::error::Error;
use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full, Limited};
use hyper::body::Incoming;
use std::convert::Infallible;

/// Response body type of every route.
pub type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>;

/// A request as the routes see it: the body is `Some` until a route takes it
/// with [`read_body`]; [`super::handle`] discards what no route read.
pub type HttpRequest = Request<Option<Incoming>>;

/// A response with a complete body.
pub fn full(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Body> {
    let mut response = Response::new(Full::new(body).boxed_unsync());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// A response without a body.
pub fn empty(status: StatusCode) -> Response<Body> {
    let mut response = Response::new(Empty::new().boxed_unsync());
    *response.status_mut() = status;
    response
}

/// Takes the request body out of `request` and reads all of it, at most
/// `limit` bytes within `timeout`. A body taken before reads as empty.
///
/// # Errors
/// 413 past `limit` (judged from `Content-Length` first, then while reading),
/// 408 when the body does not arrive within `timeout` (a client that sends
/// headers and then nothing must not hold the connection forever), 400 when
/// the body breaks off.
pub async fn read_body(
    request: &mut HttpRequest,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<Bytes, Error> {
    let too_large = Error::PayloadTooLarge { limit };
    if declared_length(request.headers()).is_some_and(|length| length > limit as u64) {
        return Err(too_large);
    }
    let Some(body) = request.body_mut().take() else {
        return Ok(Bytes::new());
    };
    match tokio::time::timeout(timeout, Limited::new(body, limit).collect()).await {
        Err(_) => Err(Error::RequestTimeout { timeout }),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => Err(too_large),
        Ok(Err(error)) => Err(Error::InvalidRequest(format!(
            "cannot read the request body: {error}"
        ))),
    }
}

/// The request's `Content-Length`, when it has a valid one.
pub(crate) fn declared_length(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
}
