//! The inspector at `/ui/`: a single page (HTML, CSS, ES modules) compiled
//! into the binary, same origin as the API it speaks (research/contract.md,
//! "Inspector"). No Node.js, bundler or network at build or run time; the
//! one library, xterm.js (the Terminal view), is vendored as its published
//! ES module under `ui/vendor/` (research/decisions.md, "The inspector's
//! terminal is xterm.js").
//!
//! The assets are public (they hold no data); every API call the page
//! makes carries the bearer token like any other client's.

use super::body::{Body, full};
use crate::error::Error;
use bytes::Bytes;
use http::header::{CACHE_CONTROL, LOCATION};
use http::{HeaderValue, Method, Response, StatusCode};

/// The page.
const INDEX: &str = include_str!("../../ui/index.html");
/// Its script (an ES module).
const APP: &str = include_str!("../../ui/app.js");
/// Its style sheet.
const STYLE: &str = include_str!("../../ui/style.css");
/// xterm.js 6.0.0 (`@xterm/xterm`, MIT, `ui/vendor/xterm.LICENSE`) as
/// published: the Terminal view imports it when it opens.
const XTERM: &str = include_str!("../../ui/vendor/xterm.mjs");
/// xterm.js's style sheet, as published.
const XTERM_STYLE: &str = include_str!("../../ui/vendor/xterm.css");

/// What the page may load and talk to: only this origin. Inline styles are
/// allowed because xterm.js writes its colours and cell sizes as `<style>`
/// elements and `style` attributes; scripts stay this origin's files only.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
     connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Answers `/ui` and `/ui/…`.
///
/// `/ui` redirects (308) to `/ui/`; the page, `app.js`, `style.css` and
/// `vendor/xterm.{mjs,css}` are served for `GET` and `HEAD`.
///
/// # Errors
/// 405 for another verb, 404 for an unknown asset.
pub fn page(method: &Method, path: &str) -> Result<Response<Body>, Error> {
    if *method != Method::GET && *method != Method::HEAD {
        return Err(Error::MethodNotAllowed("GET"));
    }
    let (content_type, body) = match path {
        "/ui" => {
            let mut response = full(StatusCode::PERMANENT_REDIRECT, "text/plain", Bytes::new());
            response
                .headers_mut()
                .insert(LOCATION, HeaderValue::from_static("/ui/"));
            return Ok(response);
        }
        "/ui/" | "/ui/index.html" => ("text/html; charset=utf-8", INDEX),
        "/ui/app.js" => ("text/javascript; charset=utf-8", APP),
        "/ui/style.css" => ("text/css; charset=utf-8", STYLE),
        "/ui/vendor/xterm.mjs" => ("text/javascript; charset=utf-8", XTERM),
        "/ui/vendor/xterm.css" => ("text/css; charset=utf-8", XTERM_STYLE),
        _ => return Err(Error::NotFound(path.to_owned())),
    };
    let mut response = full(
        StatusCode::OK,
        content_type,
        Bytes::from_static(body.as_bytes()),
    );
    let headers = response.headers_mut();
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        http::header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        http::header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    Ok(response)
}
