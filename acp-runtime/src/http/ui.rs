//! The inspector at `/ui/`: a single page (HTML, CSS, ES modules) compiled
//! into the binary, same origin as the API it speaks (research/contract.md,
//! "Inspector"). No Node.js, bundler or network at build or run time: the
//! browser loads the page's modules as they are written, from
//! [`ASSETS`]. The one library, xterm.js (the Terminal view), is vendored
//! as its published ES module under `ui/vendor/` (research/decisions.md,
//! "The inspector's terminal is xterm.js").
//!
//! The assets are public (they hold no data); every API call the page
//! makes carries the bearer token like any other client's.

use super::body::{Body, full};
use crate::error::Error;
use bytes::Bytes;
use http::header::{CACHE_CONTROL, LOCATION};
use http::{HeaderValue, Method, Response, StatusCode};

const HTML: &str = "text/html; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
/// The type a module script must have (the HTML standard accepts only a
/// JavaScript MIME type for one, and `nosniff` forbids guessing).
const JAVASCRIPT: &str = "text/javascript; charset=utf-8";

/// One file under `/ui/`.
struct Asset {
    /// Its path after `/ui/`, as the page names it.
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

/// `asset!(name, content type)`: the file `ui/{name}`, compiled in, served
/// as `/ui/{name}`; the name is written once, so the two cannot differ.
macro_rules! asset {
    ($name:literal, $content_type:expr) => {
        Asset {
            name: $name,
            content_type: $content_type,
            body: include_str!(concat!("../../ui/", $name)),
        }
    };
}

/// Every file the inspector serves; any other name is 404. A module that
/// the page imports but that is missing here fails the page in the
/// browser, and tests/v2_api/tests/inspector.rs, which follows every
/// import from the page.
const ASSETS: &[Asset] = &[
    asset!("index.html", HTML),
    asset!("style.css", CSS),
    // The page's script, an ES module; its opening comment lists the
    // modules below it and their layering.
    asset!("app.js", JAVASCRIPT),
    asset!("router.js", JAVASCRIPT),
    asset!("agents.js", JAVASCRIPT),
    asset!("health.js", JAVASCRIPT),
    asset!("sessions.js", JAVASCRIPT),
    asset!("session.js", JAVASCRIPT),
    asset!("files.js", JAVASCRIPT),
    asset!("processes.js", JAVASCRIPT),
    asset!("terminal.js", JAVASCRIPT),
    asset!("question.js", JAVASCRIPT),
    asset!("output.js", JAVASCRIPT),
    asset!("connection.js", JAVASCRIPT),
    asset!("pager.js", JAVASCRIPT),
    asset!("http.js", JAVASCRIPT),
    asset!("meta.js", JAVASCRIPT),
    asset!("sse.js", JAVASCRIPT),
    asset!("links.js", JAVASCRIPT),
    asset!("process.js", JAVASCRIPT),
    asset!("storage.js", JAVASCRIPT),
    asset!("dom.js", JAVASCRIPT),
    // xterm.js 6.0.0 (`@xterm/xterm`, MIT, `ui/vendor/xterm.LICENSE`) as
    // published: the Terminal view imports it when it opens.
    asset!("vendor/xterm.mjs", JAVASCRIPT),
    asset!("vendor/xterm.css", CSS),
];

/// What the page may load and talk to: only this origin. Inline styles are
/// allowed because xterm.js writes its colours and cell sizes as `<style>`
/// elements and `style` attributes; scripts stay this origin's files only.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
     connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The asset a `/ui/…` path names: `/ui/` is the page.
fn asset(path: &str) -> Option<&'static Asset> {
    let name = match path.strip_prefix("/ui/")? {
        "" => "index.html",
        name => name,
    };
    ASSETS.iter().find(|asset| asset.name == name)
}

/// Answers `/ui` and `/ui/…`.
///
/// `/ui` redirects (308) to `/ui/`; `/ui/` (the page) and each of
/// [`ASSETS`] as `/ui/{name}` are served for `GET` and `HEAD`.
///
/// # Errors
/// 405 for another verb, 404 for an unknown asset.
pub fn page(method: &Method, path: &str) -> Result<Response<Body>, Error> {
    if *method != Method::GET && *method != Method::HEAD {
        return Err(Error::MethodNotAllowed("GET"));
    }
    if path == "/ui" {
        let mut response = full(StatusCode::PERMANENT_REDIRECT, "text/plain", Bytes::new());
        response
            .headers_mut()
            .insert(LOCATION, HeaderValue::from_static("/ui/"));
        return Ok(response);
    }
    let Some(asset) = asset(path) else {
        return Err(Error::NotFound(path.to_owned()));
    };
    let mut response = full(
        StatusCode::OK,
        asset.content_type,
        Bytes::from_static(asset.body.as_bytes()),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Every page file in `ui/` (HTML, CSS, scripts) is in [`ASSETS`]: a
    /// module added to the directory but not to the table would be a 404.
    #[test]
    fn every_file_of_the_page_is_served() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("ui");
        let mut pending = vec![root.clone()];
        let mut files = Vec::new();
        while let Some(dir) = pending.pop() {
            for entry in std::fs::read_dir(&dir).expect("read ui/") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    pending.push(path);
                } else if matches!(
                    path.extension().and_then(|e| e.to_str()),
                    Some("html" | "css" | "js" | "mjs")
                ) {
                    let name = path.strip_prefix(&root).expect("under ui/");
                    files.push(name.to_str().expect("UTF-8 name").replace('\\', "/"));
                }
            }
        }
        assert!(files.len() > 3, "{files:?}");
        for name in files {
            assert!(
                ASSETS.iter().any(|asset| asset.name == name),
                "ui/{name} is not in ASSETS"
            );
        }
    }

    #[test]
    fn names_map_to_assets() {
        assert_eq!(asset("/ui/").map(|a| a.name), Some("index.html"));
        assert_eq!(asset("/ui/index.html").map(|a| a.name), Some("index.html"));
        assert_eq!(
            asset("/ui/sse.js").map(|a| a.content_type),
            Some(JAVASCRIPT)
        );
        assert!(asset("/ui/nope.js").is_none());
        assert!(asset("/ui//app.js").is_none());
        assert!(asset("/ui/vendor/xterm.LICENSE").is_none());
    }
}
