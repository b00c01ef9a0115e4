//! The host file system API on [`SandboxAgentClient`]
//! (research/contract.md, "Host file system"): list, stat, mkdir, move and
//! delete as plain JSON calls, and bytes streamed both ways over
//! `GET`/`PUT /v2/fs/file` and `POST /v2/fs/upload-batch`. None of them
//! needs the connection to an agent.
//!
//! Transfers have no total time limit (a 2 GiB file takes what it takes);
//! [`ClientOptions::request_timeout`](crate::ClientOptions::request_timeout)
//! bounds the wait for the server's answer to start.

use super::SandboxAgentClient;
use crate::error::Error;
use bytes::Bytes;
use ext_methods::{
    FsEntries, FsEntry, FsMoveParams, FsMoveResult, FsPathResult, FsUploadBatchResult,
    FsWriteResult,
};
use futures::{Stream, StreamExt, TryStreamExt};
use reqwest::Method;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::AsyncRead;

/// Stands for "no total limit" on a transfer (reqwest's per-request timeout
/// replaces the client's and cannot be turned off): 100 years.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// Bytes read from a local reader per upload chunk (a file read through
/// tokio costs a trip to the blocking pool per read).
const UPLOAD_CHUNK_BYTES: usize = 256 * 1024;

/// A path on the server: absolute, or relative to a session's `cwd`
/// ([`FsPath::in_session`]) or else the server's working directory. Built
/// from `&str`, `String`, `&Path` or `PathBuf`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsPath {
    path: String,
    session_id: Option<String>,
}

impl FsPath {
    /// The same path, relative to `session_id`'s working directory.
    pub fn in_session(mut self, session_id: impl Into<String>) -> Self {
        self.session_id = Some(session_id.into());
        self
    }

    fn query(&self) -> Vec<(&str, &str)> {
        let mut query = vec![("path", self.path.as_str())];
        if let Some(session) = &self.session_id {
            query.push(("sessionId", session.as_str()));
        }
        query
    }
}

impl From<&str> for FsPath {
    fn from(path: &str) -> Self {
        path.to_owned().into()
    }
}

impl From<String> for FsPath {
    fn from(path: String) -> Self {
        Self {
            path,
            session_id: None,
        }
    }
}

impl From<&Path> for FsPath {
    fn from(path: &Path) -> Self {
        path.to_string_lossy().into_owned().into()
    }
}

impl From<PathBuf> for FsPath {
    fn from(path: PathBuf) -> Self {
        path.as_path().into()
    }
}

/// How many times [`SandboxAgentClient::continue_fs_download`] resumes one
/// download that broke off before it gives up.
pub const FS_RESUME_ATTEMPTS: u32 = 3;

/// The bytes of a file being downloaded ([`SandboxAgentClient::read_fs_file_stream`],
/// [`SandboxAgentClient::resume_fs_file_stream`]), as a stream of chunks;
/// memory stays at one chunk.
pub struct FsDownload {
    content_length: Option<u64>,
    etag: Option<String>,
    offset: u64,
    chunks: Pin<Box<dyn Stream<Item = Result<Bytes, Error>> + Send>>,
}

impl FsDownload {
    /// The size in bytes of this body, as the server announced it
    /// (`Content-Length`): the whole file, or what is left of it after
    /// [`offset`](Self::offset).
    pub fn content_length(&self) -> Option<u64> {
        self.content_length
    }

    /// The file's strong `ETag`: the version these bytes are of. Give it to
    /// [`resume_fs_file_stream`](SandboxAgentClient::resume_fs_file_stream)
    /// if the download breaks off.
    pub fn etag(&self) -> Option<&str> {
        self.etag.as_deref()
    }

    /// Where in the file the first chunk belongs, in bytes: 0 for a whole
    /// file. A resumed download starts at the offset asked for, or at 0 when
    /// the file changed since (the server then sends the whole new file,
    /// and what was received before must be thrown away, never appended
    /// to).
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

impl std::fmt::Debug for FsDownload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsDownload")
            .field("content_length", &self.content_length)
            .field("etag", &self.etag)
            .field("offset", &self.offset)
            .finish_non_exhaustive()
    }
}

impl Stream for FsDownload {
    type Item = Result<Bytes, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.chunks.as_mut().poll_next(cx)
    }
}

impl SandboxAgentClient {
    /// `GET /v2/fs/entries`: the entries of a directory, sorted by name; of
    /// a directory with more than [`ext_methods::MAX_LIST_ENTRIES`] (10,000),
    /// the first that many by name.
    ///
    /// # Errors
    /// [`Error::Http`] with the problem type: 400 `invalid-path`, 403
    /// `outside-root` / `permission-denied`, 404 `file-not-found` /
    /// `unknown-session`, 409 `not-a-directory`; as
    /// [`health`](Self::health) otherwise.
    pub async fn list_fs_entries(&self, dir: impl Into<FsPath>) -> Result<Vec<FsEntry>, Error> {
        let dir = dir.into();
        let list: FsEntries = self
            .fs_json(Method::GET, "entries", &dir.query(), None)
            .await?;
        Ok(list.entries)
    }

    /// `GET /v2/fs/stat`: one entry (a symlink reported as its target).
    ///
    /// # Errors
    /// As [`list_fs_entries`](Self::list_fs_entries).
    pub async fn stat_fs(&self, path: impl Into<FsPath>) -> Result<FsEntry, Error> {
        let path = path.into();
        self.fs_json(Method::GET, "stat", &path.query(), None).await
    }

    /// `POST /v2/fs/mkdir`: creates a directory and its parents (an
    /// existing one is fine); returns its absolute path.
    ///
    /// # Errors
    /// As [`list_fs_entries`](Self::list_fs_entries); 409 `already-exists`
    /// when a file is there.
    pub async fn mkdir_fs(&self, dir: impl Into<FsPath>) -> Result<String, Error> {
        let dir = dir.into();
        let made: FsPathResult = self
            .fs_json(Method::POST, "mkdir", &dir.query(), None)
            .await?;
        Ok(made.path)
    }

    /// `POST /v2/fs/move`: renames `from` to `to` (the session of `from`
    /// applies to both); `overwrite` replaces an existing `to`.
    ///
    /// # Errors
    /// As [`list_fs_entries`](Self::list_fs_entries); 409 `already-exists`
    /// without `overwrite`.
    pub async fn move_fs(
        &self,
        from: impl Into<FsPath>,
        to: &str,
        overwrite: bool,
    ) -> Result<FsMoveResult, Error> {
        let from = from.into();
        let params = FsMoveParams {
            from: from.path,
            to: to.to_owned(),
            overwrite,
            session_id: from.session_id,
        };
        let body = serde_json::to_vec(&params).map_err(|e| Error::InvalidOptions(e.to_string()))?;
        self.fs_json(Method::POST, "move", &[], Some(body)).await
    }

    /// `DELETE /v2/fs/entry`: removes a file, a symlink (not its target) or
    /// an empty directory; with `recursive`, a directory and everything in
    /// it. Returns the absolute path removed.
    ///
    /// # Errors
    /// As [`list_fs_entries`](Self::list_fs_entries); 409
    /// `directory-not-empty` without `recursive`.
    pub async fn delete_fs_entry(
        &self,
        path: impl Into<FsPath>,
        recursive: bool,
    ) -> Result<String, Error> {
        let path = path.into();
        let mut query = path.query();
        if recursive {
            query.push(("recursive", "true"));
        }
        let deleted: FsPathResult = self.fs_json(Method::DELETE, "entry", &query, None).await?;
        Ok(deleted.path)
    }

    /// `GET /v2/fs/file`: the file's bytes as a stream of chunks.
    ///
    /// # Errors
    /// As [`list_fs_entries`](Self::list_fs_entries); 409 `is-a-directory`.
    /// A transfer cut off midway ends the stream with
    /// [`Error::ConnectionLost`]; continue it with
    /// [`resume_fs_file_stream`](Self::resume_fs_file_stream).
    pub async fn read_fs_file_stream(&self, path: impl Into<FsPath>) -> Result<FsDownload, Error> {
        self.download(path.into(), None).await
    }

    /// Continues a download that broke off after `from` bytes:
    /// `GET /v2/fs/file` with `Range: bytes=from-` and `If-Range: etag`
    /// (the [`etag`](FsDownload::etag) of the first answer; RFC 9110
    /// section 13.1.5). While the file is that version the rest of it comes
    /// ([`offset`](FsDownload::offset) is `from`); once it changed the
    /// server sends the whole new file instead (`offset` is 0): start over
    /// with it, never append it to the bytes of the old version.
    ///
    /// # Errors
    /// As [`read_fs_file_stream`](Self::read_fs_file_stream); 416
    /// `range-not-satisfiable` when `from` is at or past the end of the
    /// unchanged file; [`Error::InvalidResponse`] for a partial answer
    /// that does not start at `from`.
    pub async fn resume_fs_file_stream(
        &self,
        path: impl Into<FsPath>,
        from: u64,
        etag: &str,
    ) -> Result<FsDownload, Error> {
        self.download(path.into(), Some((from, etag))).await
    }

    /// What to do when `error` ended `broken` after `received` bytes: when
    /// the transfer broke off (and `resumes`, counted here, has not reached
    /// [`FS_RESUME_ATTEMPTS`]) the continuation, by
    /// [`resume_fs_file_stream`](Self::resume_fs_file_stream) with the
    /// first answer's `ETag`: check its [`offset`](FsDownload::offset)
    /// (0: the file changed, start over). Otherwise `error` itself.
    ///
    /// # Errors
    /// `error` when it is not a broken transfer, the download has no `ETag`
    /// or the attempts are used up; else as
    /// [`resume_fs_file_stream`](Self::resume_fs_file_stream).
    pub async fn continue_fs_download(
        &self,
        path: impl Into<FsPath>,
        broken: &FsDownload,
        error: Error,
        received: u64,
        resumes: &mut u32,
    ) -> Result<FsDownload, Error> {
        match broken.etag() {
            Some(etag) if error.is_connection_lost() && *resumes < FS_RESUME_ATTEMPTS => {
                *resumes += 1;
                let etag = etag.to_owned();
                self.resume_fs_file_stream(path, received, &etag).await
            }
            _ => Err(error),
        }
    }

    /// `GET /v2/fs/file`, collected: the whole file in memory (use
    /// [`read_fs_file_stream`](Self::read_fs_file_stream) for big files).
    /// A transfer that breaks off is resumed (up to three times) with
    /// `If-Range`, so the bytes are always of one version of the file: the
    /// rest of the same version, or the whole new one when it changed.
    ///
    /// # Errors
    /// As [`read_fs_file_stream`](Self::read_fs_file_stream).
    pub async fn read_fs_file(&self, path: impl Into<FsPath>) -> Result<Vec<u8>, Error> {
        let path = path.into();
        let mut download = self.read_fs_file_stream(path.clone()).await?;
        let mut bytes = Vec::with_capacity(
            usize::try_from(download.content_length().unwrap_or(0).min(1 << 26)).unwrap_or(0),
        );
        let mut resumes = 0;
        while let Some(chunk) = download.next().await {
            match chunk {
                Ok(chunk) => bytes.extend_from_slice(&chunk),
                Err(error) => {
                    download = self
                        .continue_fs_download(
                            path.clone(),
                            &download,
                            error,
                            bytes.len() as u64,
                            &mut resumes,
                        )
                        .await?;
                    if download.offset() == 0 {
                        bytes.clear();
                    }
                }
            }
        }
        Ok(bytes)
    }

    /// `GET /v2/fs/file`, whole or (with `resume`: offset and `ETag`) the
    /// rest of the same version.
    async fn download(
        &self,
        path: FsPath,
        resume: Option<(u64, &str)>,
    ) -> Result<FsDownload, Error> {
        let response = self
            .fs_transfer(Method::GET, "file", &path.query(), |request| match resume {
                Some((from, etag)) => request
                    .header(reqwest::header::RANGE, format!("bytes={from}-"))
                    .header(reqwest::header::IF_RANGE, etag),
                None => request,
            })
            .await?;
        let header = |name| {
            response
                .headers()
                .get(name)
                .and_then(|value: &reqwest::header::HeaderValue| value.to_str().ok())
                .map(str::to_owned)
        };
        let etag = header(reqwest::header::ETAG);
        let offset = match resume {
            Some((from, _)) if response.status() == reqwest::StatusCode::PARTIAL_CONTENT => {
                let range = header(reqwest::header::CONTENT_RANGE).unwrap_or_default();
                if !range.starts_with(&format!("bytes {from}-")) {
                    return Err(Error::InvalidResponse {
                        what: "GET /v2/fs/file".to_owned(),
                        message: format!(
                            "asked for the bytes from {from} on, got Content-Range {range:?}"
                        ),
                    });
                }
                from
            }
            _ => 0,
        };
        let content_length = response.content_length();
        let chunks = response
            .bytes_stream()
            .map_err(|error| Error::ConnectionLost {
                message: format!("the download broke off: {error}"),
                source: Some(Box::new(error)),
            });
        Ok(FsDownload {
            content_length,
            etag,
            offset,
            chunks: Box::pin(chunks),
        })
    }

    /// `PUT /v2/fs/file` with `bytes`: the file is replaced whole (written
    /// beside it and renamed into place); parents are created.
    ///
    /// # Errors
    /// As [`list_fs_entries`](Self::list_fs_entries); 409 `is-a-directory`,
    /// 413 past the server's `--max-upload-bytes`, 507 disk full.
    pub async fn write_fs_file(
        &self,
        path: impl Into<FsPath>,
        bytes: impl Into<Bytes>,
    ) -> Result<FsWriteResult, Error> {
        self.put_fs_file(path.into(), reqwest::Body::from(bytes.into()))
            .await
    }

    /// `PUT /v2/fs/file` streamed from `reader` (a file, a pipe, a socket),
    /// in constant memory.
    ///
    /// # Errors
    /// As [`write_fs_file`](Self::write_fs_file).
    pub async fn write_fs_file_from(
        &self,
        path: impl Into<FsPath>,
        reader: impl AsyncRead + Send + 'static,
    ) -> Result<FsWriteResult, Error> {
        self.put_fs_file(path.into(), streamed(reader)).await
    }

    /// `PUT /v2/fs/file` with `body` as the file's bytes.
    async fn put_fs_file(&self, path: FsPath, body: reqwest::Body) -> Result<FsWriteResult, Error> {
        self.fs_upload(Method::PUT, "file", path, "application/octet-stream", body)
            .await
    }

    /// `POST /v2/fs/upload-batch`: unpacks the tar stream `archive` (gzip
    /// accepted) into the directory `dir` (created). The answer lists the
    /// paths unpacked (at most 1000; `truncated` says when there were more).
    ///
    /// # Errors
    /// As [`write_fs_file`](Self::write_fs_file); 400 `invalid-archive` for
    /// an unsafe entry (absolute path, `..`, a link out) or a broken archive.
    pub async fn upload_fs_batch(
        &self,
        dir: impl Into<FsPath>,
        archive: impl AsyncRead + Send + 'static,
    ) -> Result<FsUploadBatchResult, Error> {
        let body = streamed(archive);
        self.fs_upload(
            Method::POST,
            "upload-batch",
            dir.into(),
            "application/x-tar",
            body,
        )
        .await
    }

    /// [`upload_fs_batch`](Self::upload_fs_batch) of the local directory
    /// `local`: its contents are tarred on the fly (nothing is buffered
    /// whole) and unpacked into `dir`. Symlinks are sent as symlinks.
    ///
    /// # Errors
    /// As [`upload_fs_batch`](Self::upload_fs_batch);
    /// [`Error::InvalidOptions`] when `local` cannot be read.
    pub async fn upload_fs_dir(
        &self,
        dir: impl Into<FsPath>,
        local: impl Into<PathBuf>,
    ) -> Result<FsUploadBatchResult, Error> {
        let local = local.into();
        if !local.is_dir() {
            return Err(Error::InvalidOptions(format!(
                "{} is not a directory",
                local.display()
            )));
        }
        let (reader, writer) = tokio::io::simplex(256 * 1024);
        let packer = tokio::task::spawn_blocking(move || {
            let mut builder = tar::Builder::new(tokio_util::io::SyncIoBridge::new(writer));
            builder.follow_symlinks(false);
            builder.append_dir_all(".", &local)?;
            builder.into_inner().map(drop)
        });
        let uploaded = self.upload_fs_batch(dir, reader).await;
        match packer.await {
            Ok(Err(error)) if uploaded.is_ok() => Err(Error::InvalidOptions(format!(
                "cannot tar the directory: {error}"
            ))),
            _ => uploaded,
        }
    }

    /// One JSON exchange with a `/v2/fs/*` route.
    async fn fs_json<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        route: &str,
        query: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Result<T, Error> {
        self.check_disposed()?;
        let what = format!("{method} /v2/fs/{route}");
        let mut request = self.control.request(method, &["v2", "fs", route], query);
        if let Some(body) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body);
        }
        let call = async {
            let response = crate::control::ControlPlane::exchange(request).await?;
            crate::control::ControlPlane::json(response, &what).await
        };
        self.control_call(&what, call).await
    }

    /// A streaming exchange: no total limit, the answer's head awaited at
    /// most the request timeout; the response on 2xx.
    async fn fs_transfer(
        &self,
        method: Method,
        route: &str,
        query: &[(&str, &str)],
        body: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, Error> {
        self.check_disposed()?;
        let what = format!("{method} /v2/fs/{route}");
        let method_is_get = method == Method::GET;
        let request = body(
            self.control
                .request(method, &["v2", "fs", route], query)
                .timeout(TRANSFER_TIMEOUT),
        );
        let exchange = crate::control::ControlPlane::exchange(request);
        // An upload's answer comes after its whole body: only a download's
        // head wait is bounded.
        match self.shared.options.request_timeout {
            Some(limit) if method_is_get => {
                tokio::time::timeout(limit, exchange)
                    .await
                    .map_err(|_| Error::Timeout {
                        what,
                        after: Some(limit),
                        source: None,
                    })?
            }
            _ => exchange.await,
        }
    }

    /// An upload: the body streamed, the JSON answer read.
    async fn fs_upload<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        route: &str,
        path: FsPath,
        content_type: &'static str,
        body: reqwest::Body,
    ) -> Result<T, Error> {
        let what = format!("{method} /v2/fs/{route}");
        let response = self
            .fs_transfer(method, route, &path.query(), |request| {
                request
                    .header(reqwest::header::CONTENT_TYPE, content_type)
                    .body(body)
            })
            .await?;
        crate::control::ControlPlane::json(response, &what).await
    }
}

/// A request body read from `reader` in [`UPLOAD_CHUNK_BYTES`] chunks, in
/// constant memory.
fn streamed(reader: impl AsyncRead + Send + 'static) -> reqwest::Body {
    reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::with_capacity(
        reader,
        UPLOAD_CHUNK_BYTES,
    ))
}
