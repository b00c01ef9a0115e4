//! The `/v2/fs/*` routes (research/contract.md, "Host file system"): the
//! file system operations of [`crate::fs`] as plain HTTP, and the only way
//! bytes move: `GET`/`PUT /v2/fs/file` and `POST /v2/fs/upload-batch`, all
//! streamed in constant memory.
//!
//! The query of every route is `application/x-www-form-urlencoded`: `path`,
//! `sessionId` (or `session_id`), and `recursive` on `DELETE /v2/fs/entry`.

use super::body::{Body, HttpRequest, empty, full, read_body};
use super::conditional;
use super::headers::is_json_content;
use super::problem::Problem;
use super::routes::FS_PREFIX;
use crate::archive::Limits;
use crate::error::Error;
use crate::fs::{self, Scope, batch, ops, transfer};
use crate::protocol::APPLICATION_JSON;
use crate::runtime::Runtime;
use bytes::Bytes;
use ext_methods::{
    FsDeleteParams, FsEntries, FsEntry, FsMoveParams, FsMoveResult, FsPathResult,
    FsUploadBatchResult, FsWriteResult,
};
use futures::{Stream, StreamExt};
use http::header::{
    ACCEPT_RANGES, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, ETAG, LAST_MODIFIED, RANGE,
};
use http::{HeaderValue, Method, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

/// Largest JSON body of `POST /v2/fs/move`, in bytes.
const MOVE_BODY_LIMIT: usize = 64 * 1024;
/// Bytes read from disk per body chunk of a download.
const READ_CHUNK_BYTES: usize = 256 * 1024;

/// Serves `/v2/fs/{name}` with `method`: the operations of the host file
/// system API by name (research/contract.md, "Host file system").
///
/// # Errors
/// 404 for an unknown name, 405 for a method the name does not take, and
/// each operation's own.
pub async fn serve(
    runtime: &Arc<Runtime>,
    request: &mut HttpRequest,
    name: &str,
    method: &Method,
) -> Result<Response<Body>, Error> {
    let path = name;
    let query = Query::parse(request.uri().query())?;
    match (path, method) {
        ("entries", &Method::GET | &Method::HEAD) => entries(runtime, query).await,
        ("stat", &Method::GET | &Method::HEAD) => stat(runtime, query).await,
        ("mkdir", &Method::POST) => mkdir(runtime, query).await,
        ("move", &Method::POST) => rename(runtime, request, query).await,
        ("entry", &Method::DELETE) => delete(runtime, query).await,
        ("file", &Method::GET | &Method::HEAD) => read(runtime, request, &query, method).await,
        ("file", &Method::PUT) => write(runtime, request, &query).await,
        ("upload-batch", &Method::POST) => upload_batch(runtime, request, &query).await,
        ("entries" | "stat" | "file", _) => Err(Error::MethodNotAllowed(if path == "file" {
            "GET, PUT"
        } else {
            "GET"
        })),
        ("mkdir" | "move" | "upload-batch", _) => Err(Error::MethodNotAllowed("POST")),
        ("entry", _) => Err(Error::MethodNotAllowed("DELETE")),
        _ => Err(Error::NotFound(format!("{FS_PREFIX}{path}"))),
    }
}

/// The query of a `/v2/fs/*` route.
#[derive(Debug, Default)]
struct Query {
    path: Option<String>,
    session_id: Option<String>,
    recursive: bool,
}

impl Query {
    /// # Errors
    /// 400 for a `recursive` that is not `true`/`false`/`1`/`0`.
    fn parse(query: Option<&str>) -> Result<Self, Error> {
        let mut parsed = Self::default();
        for (key, value) in super::query::pairs(query)? {
            match &*key {
                "path" => parsed.path = Some(value.into_owned()),
                "sessionId" | "session_id" => parsed.session_id = Some(value.into_owned()),
                "recursive" => {
                    parsed.recursive = match &*value {
                        "true" | "1" => true,
                        "false" | "0" | "" => false,
                        _ => {
                            return Err(Error::InvalidRequest(format!(
                                "recursive must be true or false, got {value:?}"
                            )));
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(parsed)
    }

    /// The scope of the request's `sessionId` (read from the store first
    /// when memory does not hold the session).
    async fn scope(&self, runtime: &Runtime) -> Result<Scope, Error> {
        if let Some(id) = &self.session_id {
            runtime.recall(None, id).await?;
        }
        runtime.fs_scope(self.session_id.as_deref(), None)
    }

    fn required_path(&self) -> Result<String, Error> {
        self.path
            .clone()
            .ok_or_else(|| Error::InvalidPath("the path query parameter is required".to_owned()))
    }
}

/// `GET /v2/fs/entries?path=`: a directory's entries.
#[utoipa::path(
    get,
    path = "/v2/fs/entries",
    summary = "List a directory.",
    description = "The entries of a directory (not `.` and `..`), sorted by name; `truncated` past 10,000.",
    tag = "fs",
    params(
        ("path" = Option<String>, Query, description = "The directory (default `.`): absolute, or relative to the session's `cwd`."),
        ("sessionId" = Option<String>, Query, description = "The session whose `cwd` relative paths start from."),
    ),
    responses(
        (status = 200, description = "The directory's entries, sorted by name.", body = FsEntries),
        (status = 400, response = Problem),
        (status = 401, response = Problem),
        (status = 403, response = Problem),
        (status = 404, response = Problem),
        (status = 409, response = Problem),
        (status = 500, response = Problem),
        (status = 503, response = Problem),
    )
)]
async fn entries(runtime: &Runtime, query: Query) -> Result<Response<Body>, Error> {
    let scope = query.scope(runtime).await?;
    json(&blocking(move || ops::list(&scope, query.path.as_deref())).await?)
}

/// `GET /v2/fs/stat?path=`: one entry.
#[utoipa::path(
    get,
    path = "/v2/fs/stat",
    summary = "Describe an entry.",
    tag = "fs",
    params(
        ("path" = String, Query, description = "Absolute, or relative to the session's `cwd`."),
        ("sessionId" = Option<String>, Query, description = "The session whose `cwd` relative paths start from."),
    ),
    responses(
        (status = 200, description = "The entry.", body = FsEntry),
        (status = 400, response = Problem),
        (status = 401, response = Problem),
        (status = 403, response = Problem),
        (status = 404, response = Problem),
        (status = 409, response = Problem),
        (status = 500, response = Problem),
        (status = 503, response = Problem),
    )
)]
async fn stat(runtime: &Runtime, query: Query) -> Result<Response<Body>, Error> {
    let scope = query.scope(runtime).await?;
    let path = query.required_path()?;
    json(&blocking(move || ops::stat(&scope, &path)).await?)
}

/// `POST /v2/fs/mkdir?path=`: a directory and its missing parents.
#[utoipa::path(
    post,
    path = "/v2/fs/mkdir",
    summary = "Make a directory.",
    description = "Makes the directory and its missing parents.",
    tag = "fs",
    params(
        ("path" = String, Query, description = "Absolute, or relative to the session's `cwd`."),
        ("sessionId" = Option<String>, Query, description = "The session whose `cwd` relative paths start from."),
    ),
    responses(
        (status = 200, description = "The directory exists now.", body = FsPathResult),
        (status = 400, response = Problem),
        (status = 401, response = Problem),
        (status = 403, response = Problem),
        (status = 404, response = Problem),
        (status = 409, response = Problem),
        (status = 500, response = Problem),
        (status = 503, response = Problem),
        (status = 507, response = Problem),
    )
)]
async fn mkdir(runtime: &Runtime, query: Query) -> Result<Response<Body>, Error> {
    let scope = query.scope(runtime).await?;
    let path = query.required_path()?;
    json(&blocking(move || ops::mkdir(&scope, &path)).await?)
}

/// `POST /v2/fs/move` with `{from, to, overwrite?, sessionId?}`.
#[utoipa::path(
    post,
    path = "/v2/fs/move",
    summary = "Move or rename an entry.",
    description = "Moves `from` to `to`; an existing `to` is replaced only with `overwrite: true` (else 409 `already-exists`).",
    operation_id = "move",
    tag = "fs",
    params(("sessionId" = Option<String>, Query, description = "The session whose `cwd` relative paths start from; the body's `sessionId` wins.")),
    request_body = FsMoveParams,
    responses(
        (status = 200, description = "Moved.", body = FsMoveResult),
(status = 400, response = Problem),
        (status = 401, response = Problem),
        (status = 403, response = Problem),
        (status = 404, response = Problem),
        (status = 408, response = Problem),
        (status = 409, response = Problem),
        (status = 413, response = Problem),
        (status = 415, response = Problem),
        (status = 500, response = Problem),
        (status = 503, response = Problem),
        (status = 507, response = Problem),
    )
)]
async fn rename(
    runtime: &Runtime,
    request: &mut HttpRequest,
    query: Query,
) -> Result<Response<Body>, Error> {
    let body = read_body(request, MOVE_BODY_LIMIT, runtime.config.read_timeout).await?;
    if !is_json_content(request.headers()) {
        return Err(Error::UnsupportedMediaType);
    }
    let mut params: FsMoveParams = serde_json::from_slice(&body).map_err(|error| {
        Error::InvalidRequest(format!(
            "the body must be {{\"from\": string, \"to\": string, \"overwrite\"?: bool}}: {error}"
        ))
    })?;
    crate::protocol::check_decodable(&body)
        .map_err(|error| Error::InvalidRequest(format!("invalid request body: {error}")))?;
    if params.session_id.is_none() {
        params.session_id = query.session_id;
    }
    if let Some(id) = &params.session_id {
        runtime.recall(None, id).await?;
    }
    let scope = runtime.fs_scope(params.session_id.as_deref(), None)?;
    json(&blocking(move || ops::rename(&scope, &params)).await?)
}

/// `DELETE /v2/fs/entry?path=&recursive=`.
#[utoipa::path(
    delete,
    path = "/v2/fs/entry",
    summary = "Delete an entry.",
    description = "Deletes a file, a symlink (never its target) or a directory (a non-empty one with `recursive=true` only, else 409 `directory-not-empty`).",
    operation_id = "deleteEntry",
    tag = "fs",
    params(
        ("path" = String, Query, description = "Absolute, or relative to the session's `cwd`."),
        ("recursive" = Option<bool>, Query, description = "Delete a non-empty directory with everything in it."),
        ("sessionId" = Option<String>, Query, description = "The session whose `cwd` relative paths start from."),
    ),
    responses(
        (status = 200, description = "Deleted.", body = FsPathResult),
        (status = 400, response = Problem),
        (status = 401, response = Problem),
        (status = 403, response = Problem),
        (status = 404, response = Problem),
        (status = 409, response = Problem),
        (status = 500, response = Problem),
        (status = 503, response = Problem),
    )
)]
async fn delete(runtime: &Runtime, query: Query) -> Result<Response<Body>, Error> {
    let scope = query.scope(runtime).await?;
    let params = FsDeleteParams {
        path: query.required_path()?,
        recursive: query.recursive,
        session_id: None,
    };
    json(&blocking(move || ops::delete(&scope, &params)).await?)
}

/// Runs a blocking file system call on the blocking pool.
async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(call)
        .await
        .map_err(|error| Error::FsIo(error.to_string()))?
}

fn json(value: &impl Serialize) -> Result<Response<Body>, Error> {
    let body = serde_json::to_vec(value)
        .map_err(|e| Error::FsIo(format!("cannot serialize the answer: {e}")))?;
    Ok(full(StatusCode::OK, APPLICATION_JSON, Bytes::from(body)))
}

/// `GET /v2/fs/file?path=`: the bytes, with `Content-Length`, `ETag`,
/// `Last-Modified` and `Accept-Ranges`; one `Range` → 206 (several ranges
/// are answered with the whole file, which RFC 9110 section 14.2 allows),
/// unless an `If-Range` names another validator: then 200 with the whole
/// current file; a matching `If-None-Match` → 304 ([`conditional`]). The
/// preconditions are judged against the descriptor that is then read, so
/// the `ETag` sent is the one of the bytes sent.
///
/// # Errors
/// 400, 403, 404, 409 `is-a-directory`, 412 (`If-Match`), 416.
#[utoipa::path(
    get,
    path = "/v2/fs/file",
    summary = "Download a file.",
    description = "The file's bytes, with `ETag`, `Last-Modified` and `Accept-Ranges`. One `Range` answers 206 (several ranges the whole file, as RFC 9110 section 14.2 allows) unless `If-Range` names another validator; a matching `If-None-Match` answers 304, a failing `If-Match` 412. `HEAD` answers the same headers without the bytes.",
    operation_id = "readFile",
    tag = "fs",
    params(
        ("path" = String, Query, description = "Absolute, or relative to the session's `cwd`."),
        ("sessionId" = Option<String>, Query, description = "The session whose `cwd` relative paths start from."),
        ("Range" = Option<String>, Header, description = "One `bytes=` range (RFC 9110 section 14.2)."),
        ("If-Match" = Option<String>, Header, description = "Answer only when the `ETag` matches (else 412)."),
        ("If-None-Match" = Option<String>, Header, description = "A matching `ETag` answers 304."),
        ("If-Range" = Option<String>, Header, description = "Apply `Range` only when this validator matches."),
    ),
    responses(
        (status = 200, description = "The whole file.", body = String, content_type = "application/octet-stream"),
        (status = 206, description = "The range asked for.", body = String, content_type = "application/octet-stream"),
        (status = 304, description = "The `If-None-Match` validator matches."),
        (status = 400, response = Problem),
        (status = 401, response = Problem),
        (status = 403, response = Problem),
        (status = 404, response = Problem),
        (status = 409, response = Problem),
        (status = 412, response = Problem),
        (status = 416, response = Problem),
        (status = 500, response = Problem),
        (status = 503, response = Problem),
    )
)]
async fn read(
    runtime: &Arc<Runtime>,
    request: &HttpRequest,
    query: &Query,
    method: &Method,
) -> Result<Response<Body>, Error> {
    let scope = query.scope(runtime).await?;
    let path = query.required_path()?;
    let opened = blocking(move || transfer::open(&scope, &path)).await?;
    let size = opened.meta.len();
    let etag = opened.etag();
    let mut headers = http::HeaderMap::new();
    headers.insert(ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if let Ok(value) = HeaderValue::from_str(&etag) {
        headers.insert(ETAG, value);
    }
    if let Some(value) = opened
        .meta
        .modified()
        .ok()
        .and_then(|time| HeaderValue::from_str(&http_date(time)).ok())
    {
        headers.insert(LAST_MODIFIED, value);
    }
    let range_applies = match conditional::evaluate_read(request.headers(), &etag)? {
        conditional::Read::NotModified => {
            let mut response = empty(StatusCode::NOT_MODIFIED);
            response.headers_mut().extend(headers);
            return Ok(response);
        }
        conditional::Read::Proceed { range_applies } => range_applies,
    };
    let range = match request.headers().get(RANGE).and_then(|v| v.to_str().ok()) {
        Some(value) if range_applies => parse_range(value, size)?,
        _ => None,
    };
    let (status, start, length) = match range {
        Some((start, end)) => {
            let value = format!("bytes {start}-{end}/{size}");
            if let Ok(value) = HeaderValue::from_str(&value) {
                headers.insert(CONTENT_RANGE, value);
            }
            (StatusCode::PARTIAL_CONTENT, start, end - start + 1)
        }
        None => (StatusCode::OK, 0, size),
    };
    headers.insert(CONTENT_LENGTH, HeaderValue::from(length));
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    let mut response = if method == Method::HEAD {
        empty(status)
    } else {
        runtime.metrics.fs_read(length);
        let mut file = tokio::fs::File::from_std(opened.file);
        let real = query.path.clone().unwrap_or_default();
        file.seek(std::io::SeekFrom::Start(start))
            .await
            .map_err(|error| Error::from_io(&error, std::path::Path::new(&real)))?;
        let chunks =
            tokio_util::io::ReaderStream::with_capacity(file.take(length), READ_CHUNK_BYTES);
        // A read error mid-body ends the body short of its Content-Length:
        // hyper then closes the connection, and the client sees a
        // truncated transfer rather than a wrong file.
        let frames = chunks
            .take_while(move |chunk| {
                if let Err(error) = chunk {
                    tracing::warn!(%error, path = %real, "file read failed mid-body");
                }
                std::future::ready(chunk.is_ok())
            })
            .filter_map(|chunk| std::future::ready(chunk.ok().map(|c| Ok(Frame::data(c)))));
        let mut response = Response::new(StreamBody::new(frames).boxed_unsync());
        *response.status_mut() = status;
        response
    };
    response.headers_mut().extend(headers);
    Ok(response)
}

/// One `bytes=` range of a `size`-byte file, as inclusive `(first, last)`;
/// `None`: serve the whole file (not a bytes range, several ranges, or a
/// syntax this server does not read, which RFC 9110 section 14.2 lets it
/// ignore).
///
/// # Errors
/// 416 when the range starts at or past the end (or asks a suffix of an
/// empty file).
fn parse_range(value: &str, size: u64) -> Result<Option<(u64, u64)>, Error> {
    let Some(spec) = value.trim().strip_prefix("bytes=") else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return Ok(None);
    };
    let number = |text: &str| {
        (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
            .then(|| text.parse::<u64>().ok())
            .flatten()
    };
    let unsatisfiable = Err(Error::RangeNotSatisfiable { size });
    match (first.trim(), last.trim()) {
        ("", suffix) => match number(suffix) {
            None => Ok(None),
            Some(0) => unsatisfiable,
            Some(_) if size == 0 => unsatisfiable,
            Some(n) => Ok(Some((size.saturating_sub(n), size - 1))),
        },
        (first, last) => {
            let Some(first) = number(first) else {
                return Ok(None);
            };
            let last = match last {
                "" => size.saturating_sub(1),
                last => match number(last) {
                    Some(last) if last >= first => last.min(size.saturating_sub(1)),
                    _ => return Ok(None),
                },
            };
            if first >= size {
                return unsatisfiable;
            }
            Ok(Some((first, last)))
        }
    }
}

/// The request body as a stream of chunks, each awaited at most
/// `--read-timeout-ms` (a client that stops sending gets 408, and its
/// upload is discarded).
fn body_stream(
    request: &mut HttpRequest,
    timeout: Duration,
) -> impl Stream<Item = Result<Bytes, Error>> + Unpin + Send + 'static {
    let body = request.body_mut().take();
    // Fused: the body may be drained after the writer saw its end.
    Box::pin(
        futures::stream::unfold(body, move |body| async move {
            let mut body = body?;
            loop {
                match tokio::time::timeout(timeout, body.frame()).await {
                    Err(_) => return Some((Err(Error::RequestTimeout { timeout }), None)),
                    Ok(None) => return None,
                    Ok(Some(Err(error))) => {
                        let error =
                            Error::InvalidRequest(format!("cannot read the request body: {error}"));
                        return Some((Err(error), None));
                    }
                    Ok(Some(Ok(frame))) => {
                        if let Ok(data) = frame.into_data() {
                            return Some((Ok(data), Some(body)));
                        }
                    }
                }
            }
        })
        .fuse(),
    )
}

/// 413 when `Content-Length` already says the body is over `limit`.
fn check_declared_length(request: &HttpRequest, limit: u64) -> Result<(), Error> {
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit) {
        return Err(Error::PayloadTooLarge {
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
        });
    }
    Ok(())
}

/// `PUT /v2/fs/file?path=` with the raw bytes → `{path, bytes_written,
/// bytesWritten}`.
///
/// # Errors
/// 400, 403, 408, 409 `is-a-directory`, 413, 507.
#[utoipa::path(
    put,
    path = "/v2/fs/file",
    summary = "Upload a file.",
    description = "Writes the body to the path, streamed, creating or replacing the file; `If-Match` and `If-None-Match` make it conditional (412 when they fail).",
    operation_id = "writeFile",
    tag = "fs",
    params(
        ("path" = String, Query, description = "Absolute, or relative to the session's `cwd`."),
        ("sessionId" = Option<String>, Query, description = "The session whose `cwd` relative paths start from."),
        ("If-Match" = Option<String>, Header, description = "Write only when the current file's `ETag` matches (else 412)."),
        ("If-None-Match" = Option<String>, Header, description = "`*`: write only when no file is there (else 412)."),
    ),
    request_body(content = String, content_type = "application/octet-stream", description = "The file's new bytes."),
    responses(
        (status = 200, description = "Written.", body = FsWriteResult),
        (status = 400, response = Problem),
        (status = 401, response = Problem),
        (status = 403, response = Problem),
        (status = 404, response = Problem),
        (status = 408, response = Problem),
        (status = 409, response = Problem),
        (status = 412, response = Problem),
        (status = 413, response = Problem),
        (status = 500, response = Problem),
        (status = 503, response = Problem),
        (status = 507, response = Problem),
    )
)]
async fn write(
    runtime: &Arc<Runtime>,
    request: &mut HttpRequest,
    query: &Query,
) -> Result<Response<Body>, Error> {
    let limit = runtime.config.max_upload_bytes;
    check_declared_length(request, limit)?;
    let scope = query.scope(runtime).await?;
    let path = query.required_path()?;
    let mut body = body_stream(request, runtime.config.read_timeout);
    // Preconditions are judged against the file as it is before the body
    // is read; a writer that renames in between still wins (not atomic
    // with the final rename; research/contract.md, "Host file system").
    if conditional::has_write_preconditions(request.headers()) {
        let (check_scope, check_path) = (scope.clone(), path.clone());
        let current = blocking(move || match transfer::open(&check_scope, &check_path) {
            Ok(opened) => Ok(Some(opened.etag())),
            Err(Error::FileNotFound(_)) => Ok(None),
            Err(error) => Err(error),
        })
        .await;
        let judged = current
            .and_then(|current| conditional::evaluate_write(request.headers(), current.as_deref()));
        if let Err(error) = judged {
            drain(&mut body, &error, runtime).await;
            return Err(error);
        }
    }
    match transfer::write(scope, path, &mut body, limit).await {
        Ok((written, bytes)) => {
            runtime.metrics.fs_written(bytes);
            json(&FsWriteResult::new(fs::shown(&written), bytes))
        }
        Err(error) => {
            drain(&mut body, &error, runtime).await;
            Err(error)
        }
    }
}

/// `POST /v2/fs/upload-batch?path=DIR` with a tar body (gzip accepted) →
/// `{paths, truncated}`.
///
/// # Errors
/// 400 `invalid-archive`, 403, 408, 409, 413, 415 (`Content-Type` not an
/// archive type, so no cross-site form can post one), 507.
#[utoipa::path(
    post,
    path = "/v2/fs/upload-batch",
    summary = "Unpack a tar archive into a directory.",
    description = "The body is a tar stream (gzip allowed), unpacked under `path`; an archive that is not a safe, readable tar is refused (400 `invalid-archive`).",
    operation_id = "uploadBatch",
    tag = "fs",
    params(
        ("path" = String, Query, description = "The directory to unpack into."),
        ("sessionId" = Option<String>, Query, description = "The session whose `cwd` relative paths start from."),
    ),
    request_body(
        description = "A tar stream (gzip allowed).",
        content((String = "application/x-tar"), (String = "application/gzip")),
    ),
    responses(
        (status = 200, description = "Unpacked.", body = FsUploadBatchResult),
        (status = 400, response = Problem),
        (status = 401, response = Problem),
        (status = 403, response = Problem),
        (status = 404, response = Problem),
        (status = 408, response = Problem),
        (status = 409, response = Problem),
        (status = 413, response = Problem),
        (status = 415, response = Problem),
        (status = 500, response = Problem),
        (status = 503, response = Problem),
        (status = 507, response = Problem),
    )
)]
async fn upload_batch(
    runtime: &Arc<Runtime>,
    request: &mut HttpRequest,
    query: &Query,
) -> Result<Response<Body>, Error> {
    if !super::headers::is_archive_content(request.headers()) {
        return Err(Error::UnsupportedArchiveType);
    }
    let limit = runtime.config.max_upload_bytes;
    check_declared_length(request, limit)?;
    let scope = query.scope(runtime).await?;
    let path = query.required_path()?;
    let limits = Limits {
        max_bytes: runtime.config.max_unpacked_bytes,
        max_entries: runtime.config.max_upload_entries,
    };
    // The body's own failure (408, 413 on the compressed bytes) is kept
    // here and answered instead of the unpacker's "cannot read".
    let failure = Arc::new(parking_lot::Mutex::new(None::<Error>));
    let kept = failure.clone();
    let mut received = 0u64;
    let body = body_stream(request, runtime.config.read_timeout).map(move |chunk| {
        let chunk = chunk.and_then(|chunk| {
            received += chunk.len() as u64;
            if received > limit {
                return Err(Error::PayloadTooLarge {
                    limit: usize::try_from(limit).unwrap_or(usize::MAX),
                });
            }
            Ok(chunk)
        });
        chunk.map_err(|error| {
            let message = error.to_string();
            *kept.lock() = Some(error);
            std::io::Error::other(message)
        })
    });
    let mut reader = tokio_util::io::SyncIoBridge::new(tokio_util::io::StreamReader::new(body));
    let (unpacked, reader) = tokio::task::spawn_blocking(move || {
        (batch::unpack(&scope, &path, &mut reader, limits), reader)
    })
    .await
    .map_err(|error| Error::FsIo(error.to_string()))?;
    if let Some(error) = failure.lock().take() {
        return Err(error);
    }
    if let Err(error) = &unpacked {
        let mut rest = reader.into_inner().into_inner();
        drain(&mut rest, error, runtime).await;
    }
    json(&unpacked?)
}

/// Reads and drops what is left of a request body after `error` (up to
/// `--max-body-bytes` more, each chunk within `--read-timeout-ms`), so the
/// client, still sending, reads the problem instead of a broken pipe: a
/// socket closed with unread bytes is reset, and the reset can reach the
/// client before the answer. This holds for a body cut off past the upload
/// cap (413) too. A body that is late or broken is not waited for; past
/// the bound the problem response closes the connection (`http::handle`).
async fn drain<S, T, E>(body: &mut S, error: &Error, runtime: &Runtime)
where
    S: Stream<Item = Result<T, E>> + Unpin,
    T: AsRef<[u8]>,
{
    if matches!(
        error,
        Error::RequestTimeout { .. } | Error::InvalidRequest(_)
    ) {
        return;
    }
    let mut left = runtime.config.max_body_bytes;
    while let Ok(Some(Ok(chunk))) =
        tokio::time::timeout(runtime.config.read_timeout, body.next()).await
    {
        match left.checked_sub(chunk.as_ref().len()) {
            Some(rest) => left = rest,
            None => return,
        }
    }
}

/// An HTTP-date (RFC 9110 section 5.6.7, IMF-fixdate), e.g.
/// `Sun, 06 Nov 1994 08:49:37 GMT`.
fn http_date(time: SystemTime) -> String {
    let seconds = time
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let days = seconds / 86_400;
    let of_day = seconds % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{}, {day:02} {} {year} {:02}:{:02}:{:02} GMT",
        WEEKDAYS[(days % 7) as usize],
        MONTHS[(month - 1) as usize],
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_dates_are_imf_fixdate() {
        let time = UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(http_date(time), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(http_date(UNIX_EPOCH), "Thu, 01 Jan 1970 00:00:00 GMT");
    }

    #[test]
    fn ranges_follow_rfc_9110() {
        assert_eq!(parse_range("bytes=0-9", 100).ok(), Some(Some((0, 9))));
        assert_eq!(parse_range("bytes=90-", 100).ok(), Some(Some((90, 99))));
        assert_eq!(parse_range("bytes=-10", 100).ok(), Some(Some((90, 99))));
        assert_eq!(parse_range("bytes=50-500", 100).ok(), Some(Some((50, 99))));
        assert_eq!(parse_range("bytes=0-1,5-6", 100).ok(), Some(None));
        assert_eq!(parse_range("items=0-1", 100).ok(), Some(None));
        assert!(parse_range("bytes=100-", 100).is_err());
        assert!(parse_range("bytes=-5", 0).is_err());
    }
}
